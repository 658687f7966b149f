#include "dsa/status.h"

namespace dsa {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kWorkspaceTooSmall: return "workspace too small";
    case StatusCode::kLimitExceeded: return "limit exceeded";
    case StatusCode::kDeviceError: return "device error";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kOutOfMemory: return "out of memory";
  }
  return "unknown status";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace dsa
