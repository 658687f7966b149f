#include "oracle/oracle_indexer_prep.h"

#include <cmath>
#include <cstring>

#include "oracle/oracle_numerics.h"

namespace oracle {

void rope(double* x, const float* cs, bool half_split) {
  for (int i = 0; i < 32; ++i) {
    const int ia = half_split ? i : 2 * i;
    const int ib = half_split ? i + 32 : 2 * i + 1;
    const double a = x[ia], b = x[ib], c = cs[i], s = cs[32 + i];
    x[ia] = a * c - b * s;
    x[ib] = b * c + a * s;
  }
}

void hadamard128(const double* x, double* y) {
  for (int i = 0; i < 128; ++i) {
    double acc = 0;
    for (int j = 0; j < 128; ++j) acc += (__builtin_popcount(i & j) % 2 ? -x[j] : x[j]);
    y[i] = acc / std::sqrt(128.0);
  }
}

std::vector<double> prep_vector(const std::vector<double>& x, const float* cs, bool half_split,
                                bool hadamard) {
  std::vector<double> v = x;
  rope(v.data(), cs, half_split);
  if (!hadamard) return v;
  std::vector<double> y(128);
  hadamard128(v.data(), y.data());
  return y;
}

double quantize_group(const double* v, int64_t n, uint8_t* codes) {
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  const double s = ue8m0_scale(amax);
  for (int64_t i = 0; i < n; ++i) {
    double y = v[i] / s;
    y = y > 448 ? 448 : (y < -448 ? -448 : y);
    codes[i] = e4m3_encode(y);
  }
  return s;
}

float gate_constant(int64_t heads) {
  return static_cast<float>(1.0 / std::sqrt(128.0 * static_cast<double>(heads)));
}

static void put_bf16(std::vector<uint8_t>& out, size_t at, double v) {
  uint16_t b = bf16_encode(v);
  out[at] = static_cast<uint8_t>(b & 0xff);  // little endian, as the engines' buffers
  out[at + 1] = static_cast<uint8_t>(b >> 8);
}

std::vector<uint8_t> mla_token_bytes(const double* kv_c, const double* k_pe, bool fp8) {
  if (!fp8) {
    std::vector<uint8_t> out(1152);
    for (int i = 0; i < 512; ++i) put_bf16(out, 2 * i, kv_c[i]);
    for (int i = 0; i < 64; ++i) put_bf16(out, 1024 + 2 * i, k_pe[i]);
    return out;
  }
  std::vector<uint8_t> out(656);
  for (int g = 0; g < 4; ++g) {
    double v[128];
    for (int i = 0; i < 128; ++i) v[i] = bf16_value(bf16_encode(kv_c[g * 128 + i]));
    float s = static_cast<float>(quantize_group(v, 128, out.data() + g * 128));
    std::memcpy(out.data() + 512 + 4 * g, &s, 4);
  }
  for (int i = 0; i < 64; ++i) put_bf16(out, 528 + 2 * i, k_pe[i]);
  return out;
}

std::vector<double> mla_token_values(const double* kv_c, const double* k_pe, bool fp8) {
  std::vector<double> out(576);
  for (int g = 0; g < 4; ++g) {
    double v[128];
    uint8_t codes[128];
    for (int i = 0; i < 128; ++i) v[i] = bf16_value(bf16_encode(kv_c[g * 128 + i]));
    double s = fp8 ? quantize_group(v, 128, codes) : 1.0;
    for (int i = 0; i < 128; ++i) out[g * 128 + i] = fp8 ? e4m3_value(codes[i]) * s : v[i];
  }
  for (int i = 0; i < 64; ++i) out[512 + i] = bf16_value(bf16_encode(k_pe[i]));
  return out;
}

}  // namespace oracle
