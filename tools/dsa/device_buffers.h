// Buffers for `dsa run`: every buffer has a host copy (inputs are generated there, checks read
// it) and a backend copy the ops see. On the CPU backend the two are the same memory; with
// CUDA (DSA_WITH_CUDA) the backend copy comes from cudaMalloc and moves by explicit copies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsa/types.h"

namespace dsa_cli {

class Buffer {
 public:
  Buffer(dsa::Device device, size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  bool ok() const { return ok_; }
  size_t bytes() const { return bytes_; }
  dsa::Device device() const { return device_; }
  void* dev() { return dev_; }          // what the ops get
  uint8_t* host() { return host_.data(); }
  template <typename T> T* host_as() { return reinterpret_cast<T*>(host_.data()); }

  // host -> backend and backend -> host (no-ops on the CPU). False on a device error.
  bool upload();
  bool download();

 private:
  dsa::Device device_;
  size_t bytes_ = 0;
  std::vector<uint8_t> host_;
  void* dev_ = nullptr;
  bool ok_ = true;
};

// Waits for the device's queued work (no-op on the CPU). Fills *err on failure.
bool device_sync(dsa::Device device, std::string* err);
// Last device error text, or "" (CPU).
std::string device_error_string();

}  // namespace dsa_cli
