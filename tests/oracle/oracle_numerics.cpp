#include "oracle/oracle_numerics.h"

#include <cmath>
#include <limits>

namespace oracle {

double e4m3_value(uint8_t code) {
  const int sign = code >> 7, e = (code >> 3) & 0xf, m = code & 7;
  double mag;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) mag = m * std::ldexp(1.0, -9);
  else mag = (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return sign ? -mag : mag;
}

uint8_t e4m3_encode(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (std::isnan(x) || a > 464.0) return sign | 0x7f;  // 464 ties to the even 448
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    double d = std::fabs(e4m3_value(static_cast<uint8_t>(c)) - a);
    if (d < best_d || (d == best_d && (c % 2 == 0))) { best = c; best_d = d; }
  }
  return static_cast<uint8_t>(sign | best);
}

double bf16_value(uint16_t code) {
  const int sign = code >> 15, e = (code >> 7) & 0xff, m = code & 0x7f;
  double mag;
  if (e == 255) mag = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) mag = m * std::ldexp(1.0, -133);
  else mag = (1.0 + m / 128.0) * std::ldexp(1.0, e - 127);
  return sign ? -mag : mag;
}

uint16_t bf16_encode(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7fc0;
  const double a = std::fabs(x);
  // Positive codes 0 .. 0x7f80 are ordered by value; 0x7f80 (inf) stands for 2^128 here, the
  // next value the format would have, so overflow rounds like any other step.
  auto value = [](int c) { return c == 0x7f80 ? std::ldexp(1.0, 128) : bf16_value(static_cast<uint16_t>(c)); };
  if (a >= std::ldexp(1.0, 128)) return sign | 0x7f80;
  int lo = 0, hi = 0x7f80;  // value(lo) <= a < value(hi)
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (value(mid) <= a) lo = mid; else hi = mid;
  }
  double dl = a - value(lo), dh = value(hi) - a;
  int c = (dl < dh || (dl == dh && lo % 2 == 0)) ? lo : hi;
  return static_cast<uint16_t>(sign | c);
}

double ue8m0_scale(double amax) {
  const double floor_v = static_cast<double>(1e-4f);
  double a = (std::isnan(amax) || amax < floor_v) ? floor_v : amax;
  double s = std::ldexp(1.0, -40);
  while (448.0 * s < a) s *= 2.0;
  return s;
}

bool is_power_of_two(double x) {
  if (!(x > 0) || std::isinf(x)) return false;
  int e;
  return std::frexp(x, &e) == 0.5;
}

double e4m3_step(double v) {
  double a = std::fabs(v);
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  int e = std::ilogb(a);
  return std::ldexp(1.0, e - 3);
}

}  // namespace oracle
