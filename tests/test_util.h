// Shared test helpers: seeded random data, guarded buffers with sentinel bytes, and
// tolerances counted in steps (ulps) of the output dtype.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsa/dsa.h"

namespace dsa_test {

// A byte buffer with `kGuard` sentinel bytes on each side. data() is 16-byte aligned.
// intact() is false if anything wrote outside [data, data + size).
class Guarded {
 public:
  static constexpr size_t kGuard = 256;
  static constexpr uint8_t kSentinel = 0xA5;
  explicit Guarded(size_t bytes = 0, uint8_t fill = 0xCD);
  void* data() { return buf_.data() + kGuard; }
  const void* data() const { return buf_.data() + kGuard; }
  size_t size() const { return size_; }
  template <typename T> T* as() { return reinterpret_cast<T*>(data()); }
  template <typename T> const T* as() const { return reinterpret_cast<const T*>(data()); }
  bool intact() const;
  void fill(uint8_t b) { std::memset(data(), b, size_); }

 private:
  std::vector<uint8_t> buf_;
  size_t size_ = 0;
};

// Float poison values for outputs that must be written.
void poison_f32(float* p, size_t n);         // fills with a signalling-looking NaN pattern
void poison_bf16(uint16_t* p, size_t n);     // 0xFFFF (NaN)

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  float uniform(float lo = -1.f, float hi = 1.f) {
    return std::uniform_real_distribution<float>(lo, hi)(gen);
  }
  float normal(float mean = 0.f, float sd = 1.f) {
    return std::normal_distribution<float>(mean, sd)(gen);
  }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  }
};

std::vector<float> random_floats(Rng& rng, size_t n, float sd = 1.f);
std::vector<uint16_t> to_bf16(const std::vector<float>& x);
std::vector<float> from_bf16(const std::vector<uint16_t>& x);

// Distance in units of the last place of `dtype` at the reference's magnitude:
// |got - ref| / ulp(ref), where ulp(0) is the dtype's smallest normal step.
double bf16_steps(double got, double ref);
double f32_steps(double got, double ref);

// Descriptors over host buffers.
inline dsa::TensorDesc t_f32(float* p, std::initializer_list<int64_t> s) { return dsa::make_tensor(p, dsa::DType::kF32, s); }
inline dsa::TensorDesc t_bf16(uint16_t* p, std::initializer_list<int64_t> s) { return dsa::make_tensor(p, dsa::DType::kBF16, s); }
inline dsa::TensorDesc t_e4m3(uint8_t* p, std::initializer_list<int64_t> s) { return dsa::make_tensor(p, dsa::DType::kE4M3, s); }
inline dsa::TensorDesc t_i32(int32_t* p, std::initializer_list<int64_t> s) { return dsa::make_tensor(p, dsa::DType::kI32, s); }
inline dsa::TensorDesc t_i64(int64_t* p, std::initializer_list<int64_t> s) { return dsa::make_tensor(p, dsa::DType::kI64, s); }

// Expect a failed status whose message contains every one of `needles` (argument names).
::testing::AssertionResult fails_naming(const dsa::Status& st,
                                        std::initializer_list<const char*> needles);

#define DSA_ASSERT_OK(expr)                                       \
  do {                                                            \
    ::dsa::Status _st = (expr);                                   \
    ASSERT_TRUE(_st.ok()) << _st.to_string();                     \
  } while (0)

}  // namespace dsa_test
