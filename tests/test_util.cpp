#include "test_util.h"

#include <limits>

namespace dsa_test {

Guarded::Guarded(size_t bytes, uint8_t fill) : size_(bytes) {
  buf_.assign(bytes + 2 * kGuard, kSentinel);
  std::memset(buf_.data() + kGuard, fill, bytes);
}

bool Guarded::intact() const {
  for (size_t i = 0; i < kGuard; ++i) {
    if (buf_[i] != kSentinel || buf_[kGuard + size_ + i] != kSentinel) return false;
  }
  return true;
}

void poison_f32(float* p, size_t n) {
  uint32_t pattern = 0x7fbadbadu;  // a NaN payload no computation produces
  for (size_t i = 0; i < n; ++i) std::memcpy(p + i, &pattern, 4);
}

void poison_bf16(uint16_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = 0xFFFFu;
}

std::vector<float> random_floats(Rng& rng, size_t n, float sd) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.normal(0.f, sd);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> o(x.size());
  for (size_t i = 0; i < x.size(); ++i) o[i] = dsa::float_to_bf16(x[i]);
  return o;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& x) {
  std::vector<float> o(x.size());
  for (size_t i = 0; i < x.size(); ++i) o[i] = dsa::bf16_to_float(x[i]);
  return o;
}

static double steps(double got, double ref, int mant_bits, int min_exp) {
  if (std::isnan(got) || std::isnan(ref)) return (std::isnan(got) && std::isnan(ref)) ? 0.0 : std::numeric_limits<double>::infinity();
  if (std::isinf(got) || std::isinf(ref)) return got == ref ? 0.0 : std::numeric_limits<double>::infinity();
  double a = std::fabs(ref);
  int e = a > 0 ? std::ilogb(a) : min_exp;
  if (e < min_exp) e = min_exp;
  double ulp = std::ldexp(1.0, e - mant_bits);
  return std::fabs(got - ref) / ulp;
}

double bf16_steps(double got, double ref) { return steps(got, ref, 7, -126); }
double f32_steps(double got, double ref) { return steps(got, ref, 23, -126); }

::testing::AssertionResult fails_naming(const dsa::Status& st,
                                        std::initializer_list<const char*> needles) {
  if (st.ok()) return ::testing::AssertionFailure() << "expected a failure, got ok";
  for (const char* n : needles) {
    if (st.message().find(n) == std::string::npos) {
      return ::testing::AssertionFailure() << "message does not name '" << n << "': " << st.message();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace dsa_test
