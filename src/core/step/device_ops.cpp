#include "core/step/device_ops.h"

#include "core/dispatch.h"

namespace dsa {
namespace core {
namespace step {

const DeviceOps& device_ops(Device dev) { return step_backend(dev.type); }

}  // namespace step
}  // namespace core
}  // namespace dsa
