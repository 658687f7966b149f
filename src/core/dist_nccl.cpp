// The NCCL communicator (dsa/dist.h). Built only with DSA_NCCL (DSA_WITH_NCCL defined).
#if defined(DSA_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "dsa/dist.h"

namespace dsa {
namespace dist {
namespace {

Status nccl_status(const char* op, ncclResult_t r) {
  if (r == ncclSuccess) return Status::Ok();
  return Status(StatusCode::kDeviceError, std::string(op) + ": NCCL: " + ncclGetErrorString(r));
}

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t c, int rank, int size, int dev) : c_(c), rank_(rank), size_(size), dev_(dev) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return cuda_device(dev_); }
  Status all_gather(const void* send, void* recv, size_t bytes, void* stream) override {
    return nccl_status("nccl.all_gather",
                       ncclAllGather(send, recv, bytes, ncclUint8, c_, static_cast<cudaStream_t>(stream)));
  }
  Status all_reduce_f32(const float* send, float* recv, size_t count, ReduceOp op, void* stream) override {
    return nccl_status("nccl.all_reduce_f32",
                       ncclAllReduce(send, recv, count, ncclFloat32, op == ReduceOp::kSum ? ncclSum : ncclMax, c_,
                                     static_cast<cudaStream_t>(stream)));
  }
  Status group_start() override { return nccl_status("nccl.group_start", ncclGroupStart()); }
  Status group_end() override { return nccl_status("nccl.group_end", ncclGroupEnd()); }

 private:
  ncclComm_t c_;
  int rank_, size_, dev_;
};

}  // namespace

bool nccl_available() { return true; }

Status make_nccl_communicator(void* nccl_comm, int device_index, std::unique_ptr<Communicator>* out) {
  const char* op = "make_nccl_communicator";
  if (nccl_comm == nullptr || out == nullptr)
    return Status(StatusCode::kInvalidArgument, std::string(op) + ": nccl_comm, out: expected non-null");
  ncclComm_t c = static_cast<ncclComm_t>(nccl_comm);
  int rank = 0, size = 0, dev = -1;
  Status s = nccl_status(op, ncclCommUserRank(c, &rank));
  if (s.ok()) s = nccl_status(op, ncclCommCount(c, &size));
  if (s.ok()) s = nccl_status(op, ncclCommCuDevice(c, &dev));
  if (!s.ok()) return s;
  if (dev != device_index)
    return Status(StatusCode::kInvalidArgument, std::string(op) + ": device_index: expected the communicator's CUDA device " +
                                                    std::to_string(dev) + ", got " + std::to_string(device_index));
  *out = std::make_unique<NcclComm>(c, rank, size, dev);
  return Status::Ok();
}

}  // namespace dist
}  // namespace dsa
#endif  // DSA_WITH_NCCL
