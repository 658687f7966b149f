// Float64 oracle for dsa/numerics.h: the formats defined from their bit fields, and rounding
// by searching the representable values (no bit tricks shared with the library).
#pragma once
#include <cstdint>

namespace oracle {

double e4m3_value(uint8_t code);   // NaN for 0x7f / 0xff
// Nearest finite e4m3 value of x, ties to the even code; |x| >= 464, inf and NaN give NaN
// (0x7f with x's sign), the contract of dsa::float_to_e4m3.
uint8_t e4m3_encode(double x);
double bf16_value(uint16_t code);
// Nearest bf16 of x, ties to the even code, overflow to inf (IEEE round to nearest even).
// NaN gives 0x7fc0 with x's sign (callers check only "is a quiet NaN").
uint16_t bf16_encode(double x);
// Smallest power of two s with 448 * s >= max(amax, 1e-4f) (NaN amax takes the floor).
double ue8m0_scale(double amax);
bool is_power_of_two(double x);
// One e4m3 step at the magnitude of |v| (v in e4m3 units, |v| <= 448).
double e4m3_step(double v);

}  // namespace oracle
