// Built against an installed DSA: the umbrella header, the version and one operation.
#include <dsa/dsa.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  std::printf("dsa %s, backends:", dsa::version());
  for (const auto& b : dsa::compiled_backends()) std::printf(" %s", b.c_str());
  std::printf("\n");
  if (std::strcmp(dsa::version(), DSA_PACKAGE_VERSION) != 0) {
    std::printf("dsa::version() is '%s', the CMake package says '%s'\n", dsa::version(), DSA_PACKAGE_VERSION);
    return 1;
  }

  // quantize_fp8 on 2 rows of 128: row 0 has amax 7/8 (scale 2^-9: 0.875 / 448 = 1/512),
  // row 1 has amax 448 (scale 1). Every value below is exactly representable, so the FP8
  // round trip must reproduce it.
  std::vector<float> x(2 * 128);
  for (int i = 0; i < 128; ++i) {
    x[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i % 8) / 8.0f;
    x[128 + i] = (i % 3 ? 448.0f : -2.0f);
  }
  std::vector<uint8_t> q(2 * 128);
  std::vector<float> scale(2);
  dsa::QuantizeFp8Params p;
  p.x = dsa::make_tensor(x.data(), dsa::DType::kF32, {2, 128});
  p.out = dsa::make_tensor(q.data(), dsa::DType::kE4M3, {2, 128});
  p.scale = dsa::make_tensor(scale.data(), dsa::DType::kF32, {2, 1});
  p.group = 128;
  dsa::Status st = dsa::quantize_fp8(p);
  if (!st.ok()) {
    std::printf("quantize_fp8 failed: %s\n", st.to_string().c_str());
    return 1;
  }
  if (scale[0] != std::ldexp(1.0f, -9) || scale[1] != 1.0f) {
    std::printf("unexpected scales %g %g\n", scale[0], scale[1]);
    return 1;
  }
  for (int i = 0; i < 256; ++i) {
    float back = dsa::e4m3_to_float(q[i]) * scale[i / 128];
    if (back != x[i]) {
      std::printf("element %d: %g came back as %g\n", i, x[i], back);
      return 1;
    }
  }
  // And a bad argument comes back as a Status naming it, not a crash.
  p.group = 100;
  st = dsa::quantize_fp8(p);
  if (st.ok()) {
    std::printf("quantize_fp8 accepted group 100\n");
    return 1;
  }
  std::printf("rejected as expected: %s\nconsumer OK\n", st.to_string().c_str());
  return 0;
}
