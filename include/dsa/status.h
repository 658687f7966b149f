// Status: the result of every public DSA entry point.
#pragma once
#include <string>
#include <utility>

namespace dsa {

// Coarse error classes. Kernels and launchers (tier 1) return only a code; the public API
// (tier 2) pairs it with a message that names the argument and what was expected.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // wrong shape, dtype, stride, alignment, range or length
  kUnsupported,         // a valid request no backend kernel implements (names what exists)
  kWorkspaceTooSmall,   // the caller's workspace is smaller than the *_workspace_size query
  kLimitExceeded,       // a step exceeds the limits declared to the planner, or a budget is impossible
  kDeviceError,         // the device runtime reported an error
  kInternal,            // a bug in DSA: please report it
  kOutOfMemory,         // a host allocation DSA needed failed (nothing was written)
};

const char* status_code_name(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: indexer_logits: q: expected dtype e4m3, got bf16"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace dsa
