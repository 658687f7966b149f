// The absorbed form's projections on CUDA (dsa/mha.h: mla_absorb_q, mla_up_project; cuBLAS,
// src/cuda/mla_project.cu) against a float64 oracle written here from SPEC §5b and against
// the CPU backend on the same inputs: both geometries (qk_nope 128 / v 128 at H 16 and 128,
// qk_nope 192 / v 256 at H 4 and 64), T = 0, 1, 7, 300, bf16 and f32 outputs, contiguous and
// strided layouts (q_nope / q_pe split from one fused buffer, padded weight and latent rows
// holding NaN, padded output rows). q_pe copied bit-exactly; sentinel bytes around and between
// output rows untouched; reruns bit-identical; a CUDA graph replay equal to the eager run with
// no allocation node in the graph; f32 inputs and rows cuBLAS cannot take refused by name.
//
// Tolerance: any order of f32 summation of K terms is within K·2^-24 of the sum of |terms|
// (cuBLAS's order is its own, unlike the CPU backend's), plus 2^-8 of the value for a bf16
// output's rounding; GPU against CPU backend within twice that.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_util.h"

namespace {

using namespace dsa;
using dsa_gpu_test::DeviceBuffer;

constexpr int64_t kLatent = 512, kRope = 64, kWeightLd = 520;  // strided layout: padded weight rows
constexpr size_t kGuard = 256;                                   // sentinel bytes either side
constexpr int kSentinel = 0x7B;
constexpr uint16_t kBf16NaN = 0x7FC0;

struct Geo {
  int64_t nope, v, H;
};
const Geo kGeos[] = {{128, 128, 16}, {128, 128, 128}, {192, 256, 4}, {192, 256, 64}};
const int64_t kTs[] = {0, 1, 7, 300};

float bf(uint16_t b) { return bf16_to_float(b); }

// One case's inputs, bf16; the weight also widened to f32 for the oracle.
struct Inputs {
  int64_t T, H, nope, v;
  std::vector<uint16_t> qn, qp, lat, w;  // [T, H, nope], [T, H, 64], [T, H, 512], [H (nope + v), 512]
  std::vector<float> wf;
  Inputs(uint64_t seed, int64_t T_, const Geo& g) : T(T_), H(g.H), nope(g.nope), v(g.v) {
    dsa_test::Rng rng(seed);
    qn = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(T * H * nope)));
    qp = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(T * H * kRope)));
    lat = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(T * H * kLatent)));
    w = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(rows() * kLatent), 0.05f));
    wf = dsa_test::from_bf16(w);
  }
  int64_t rows() const { return H * (nope + v); }
};

// A device output of `bytes` with kGuard sentinel bytes either side.
struct Guarded {
  DeviceBuffer buf;
  size_t bytes;
  explicit Guarded(size_t n) : buf(n + 2 * kGuard, kSentinel), bytes(n) {}
  void* data() const { return buf.as<uint8_t>() + kGuard; }
  void refill() { EXPECT_EQ(cudaMemset(buf.data(), kSentinel, buf.size()), cudaSuccess); }
  std::vector<uint8_t> all() const { return buf.download<uint8_t>(); }
};

// A strided view of `dims` with element strides `strides`.
TensorDesc view(void* data, DType dt, std::initializer_list<int64_t> dims, std::initializer_list<int64_t> strides) {
  TensorDesc t = make_tensor(data, dt, dims, cuda_device(0));
  int i = 0;
  for (int64_t s : strides) t.stride[i++] = s;
  return t;
}

// The weight on the device: contiguous, or rows padded to kWeightLd with NaN (a read past
// column 511 would show in the output).
struct DevWeight {
  DeviceBuffer buf;
  int64_t ld;
  DevWeight(const Inputs& in, bool strided) : ld(strided ? kWeightLd : kLatent) {
    std::vector<uint16_t> h(static_cast<size_t>(in.rows() * ld), kBf16NaN);
    for (int64_t r = 0; r < in.rows(); ++r)
      std::memcpy(&h[static_cast<size_t>(r * ld)], &in.w[static_cast<size_t>(r * kLatent)], kLatent * 2);
    buf = DeviceBuffer(h);
  }
  TensorDesc desc(const Inputs& in) { return view(buf.data(), DType::kBF16, {in.rows(), kLatent}, {ld, 1}); }
};

// One GPU run's output bytes (guards included), read back as values of [T, H, width] with
// head stride hs.
struct Result {
  DType dt;
  int64_t H, hs;
  std::vector<uint8_t> bytes;
  size_t elem() const { return dt == DType::kBF16 ? 2 : 4; }
  size_t offset(int64_t t, int64_t h, int64_t c) const {
    return kGuard + static_cast<size_t>((t * H + h) * hs + c) * elem();
  }
  double at(int64_t t, int64_t h, int64_t c) const {
    const size_t o = offset(t, h, c);
    if (dt == DType::kBF16) {
      uint16_t b;
      std::memcpy(&b, &bytes[o], 2);
      return bf(b);
    }
    float f;
    std::memcpy(&f, &bytes[o], 4);
    return f;
  }
  // Every byte outside the elements [t, h, 0:width) still holds the sentinel.
  ::testing::AssertionResult untouched_outside(int64_t T, int64_t width) const {
    std::vector<bool> written(bytes.size(), false);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const size_t o = offset(t, h, 0);
        for (size_t i = 0; i < static_cast<size_t>(width) * elem(); ++i) written[o + i] = true;
      }
    for (size_t i = 0; i < bytes.size(); ++i)
      if (!written[i] && bytes[i] != kSentinel)
        return ::testing::AssertionFailure() << "byte " << i << " (guard " << kGuard << ") outside the output was written";
    return ::testing::AssertionSuccess();
  }
};

// Counts mismatches and keeps the first one's description.
struct Mismatches {
  int64_t count = 0;
  std::string first;
  void check(double got, double want, double tol, const char* what, int64_t t, int64_t h, int64_t c) {
    if (std::isfinite(got) && std::fabs(got - want) <= tol) return;
    if (count++ > 0) return;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s[%lld, %lld, %lld]: got %.9g, want %.9g (tolerance %.3g)", what,
                  static_cast<long long>(t), static_cast<long long>(h), static_cast<long long>(c), got, want, tol);
    first = buf;
  }
};

// Two runs of `op` into a fresh guarded output ([T, H, *] with head stride hs) on `stream`:
// the first's bytes; the second must give the same bits.
template <typename P, typename MakeParams>
Result run_twice(Status (*op)(const P&), MakeParams make, DType dt, int64_t T, int64_t H, int64_t hs,
                 cudaStream_t stream) {
  Result r{dt, H, hs, {}};
  Guarded out(static_cast<size_t>(T * H * hs) * r.elem());
  P p = make(out.data());
  p.stream = stream;
  Status st = op(p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(dsa_gpu_test::device_clean());
  r.bytes = out.all();
  out.refill();
  st = op(p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(dsa_gpu_test::same_bits(out.all(), r.bytes, "rerun"));
  return r;
}

// A host output for the CPU backend: bf16 or f32 storage, read back as values.
struct HostOut {
  DType dt;
  std::vector<uint16_t> o16;
  std::vector<float> o32;
  HostOut(DType d, size_t n) : dt(d), o16(d == DType::kBF16 ? n : 0), o32(d == DType::kBF16 ? 0 : n) {}
  TensorDesc desc(std::initializer_list<int64_t> dims) {
    return dt == DType::kBF16 ? dsa_test::t_bf16(o16.data(), dims) : dsa_test::t_f32(o32.data(), dims);
  }
  std::vector<float> values() const { return dt == DType::kBF16 ? dsa_test::from_bf16(o16) : o32; }
};

double tolerance(double abs_sum, double want, int64_t terms, bool bf16_out) {
  return static_cast<double>(terms) * std::ldexp(abs_sum, -24) + (bf16_out ? std::ldexp(std::fabs(want), -8) : 0.0) +
         1e-30;
}

// ---- mla_absorb_q ----

struct AbsorbDev {
  const Inputs& in;
  bool strided;
  DeviceBuffer q;  // contiguous: q_nope then q_pe; strided: fused [T, H, nope + 64]
  DevWeight w;
  AbsorbDev(const Inputs& i, bool s) : in(i), strided(s), w(i, s) {
    const int64_t n = in.T * in.H;
    std::vector<uint16_t> h(static_cast<size_t>(n * (in.nope + kRope)));
    if (strided) {
      for (int64_t r = 0; r < n; ++r) {
        std::memcpy(&h[static_cast<size_t>(r * (in.nope + kRope))], &in.qn[static_cast<size_t>(r * in.nope)], in.nope * 2);
        std::memcpy(&h[static_cast<size_t>(r * (in.nope + kRope) + in.nope)], &in.qp[static_cast<size_t>(r * kRope)], kRope * 2);
      }
    } else {
      std::memcpy(h.data(), in.qn.data(), in.qn.size() * 2);
      std::memcpy(h.data() + in.qn.size(), in.qp.data(), in.qp.size() * 2);
    }
    q = DeviceBuffer(h);
  }
  int64_t out_hs() const { return strided ? 580 : 576; }  // 580 bf16: rows not 16-byte aligned
  MlaAbsorbQParams params(void* out, DType dt) {
    MlaAbsorbQParams p;
    uint16_t* base = q.as<uint16_t>();
    const int64_t T = in.T, H = in.H, nope = in.nope;
    if (strided) {
      const int64_t f = nope + kRope;
      p.q_nope = view(base, DType::kBF16, {T, H, nope}, {H * f, f, 1});
      p.q_pe = view(base + nope, DType::kBF16, {T, H, kRope}, {H * f, f, 1});
    } else {
      p.q_nope = view(base, DType::kBF16, {T, H, nope}, {H * nope, nope, 1});
      p.q_pe = view(base + T * H * nope, DType::kBF16, {T, H, kRope}, {H * kRope, kRope, 1});
    }
    p.kv_b_proj = w.desc(in);
    p.v_dim = in.v;
    p.q_out = view(out, dt, {T, H, 576}, {H * out_hs(), out_hs(), 1});
    return p;
  }
  Result run(DType dt, cudaStream_t stream = nullptr) {
    return run_twice(&mla_absorb_q, [&](void* out) { return params(out, dt); }, dt, in.T, in.H, out_hs(), stream);
  }
};

// The CPU backend on host copies of the same inputs (contiguous), as values [T, H, 576].
std::vector<float> cpu_absorb(const Inputs& in, DType dt) {
  std::vector<uint16_t> qn = in.qn, qp = in.qp;
  HostOut out(dt, static_cast<size_t>(in.T * in.H * 576));
  MlaAbsorbQParams p;
  p.q_nope = dsa_test::t_bf16(qn.data(), {in.T, in.H, in.nope});
  p.q_pe = dsa_test::t_bf16(qp.data(), {in.T, in.H, kRope});
  p.kv_b_proj = make_tensor(in.w.data(), DType::kBF16, {in.rows(), kLatent});
  p.v_dim = in.v;
  p.q_out = out.desc({in.T, in.H, 576});
  const Status st = mla_absorb_q(p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out.values();
}

void check_absorb(const Inputs& in) {
  std::vector<Result> gpu;
  for (bool strided : {false, true}) {
    AbsorbDev d(in, strided);
    for (DType dt : {DType::kBF16, DType::kF32}) {
      gpu.push_back(d.run(dt));
      EXPECT_TRUE(gpu.back().untouched_outside(in.T, 576)) << (strided ? "strided " : "contiguous ") << dtype_name(dt);
    }
  }
  const std::vector<float> cpu16 = cpu_absorb(in, DType::kBF16), cpu32 = cpu_absorb(in, DType::kF32);
  Mismatches oracle, vs_cpu, pe;
  std::vector<double> s(kLatent), a(kLatent);
  for (int64_t t = 0; t < in.T; ++t)
    for (int64_t h = 0; h < in.H; ++h) {
      std::fill(s.begin(), s.end(), 0.0);
      std::fill(a.begin(), a.end(), 0.0);
      const uint16_t* q = &in.qn[static_cast<size_t>((t * in.H + h) * in.nope)];
      for (int64_t d = 0; d < in.nope; ++d) {
        const double x = bf(q[d]);
        const float* wr = &in.wf[static_cast<size_t>((h * (in.nope + in.v) + d) * kLatent)];
        for (int64_t c = 0; c < kLatent; ++c) {
          const double y = x * wr[c];
          s[c] += y;
          a[c] += std::fabs(y);
        }
      }
      const size_t row = static_cast<size_t>((t * in.H + h) * 576);
      for (const Result& r : gpu) {
        const bool b16 = r.dt == DType::kBF16;
        const std::vector<float>& cpu = b16 ? cpu16 : cpu32;
        for (int64_t c = 0; c < kLatent; ++c) {
          const double tol = tolerance(a[c], s[c], in.nope, b16);
          const double got = r.at(t, h, c);
          oracle.check(got, s[c], tol, "q_abs vs oracle", t, h, c);
          vs_cpu.check(got, cpu[row + c], 2 * tol, "q_abs vs CPU backend", t, h, c);
        }
        // q_pe: the bf16 bits themselves, or their exact f32 widening.
        for (int64_t e = 0; e < kRope; ++e) {
          const uint16_t want = in.qp[static_cast<size_t>((t * in.H + h) * kRope + e)];
          const size_t o = r.offset(t, h, kLatent + e);
          bool same;
          if (b16) {
            same = std::memcmp(&r.bytes[o], &want, 2) == 0;
          } else {
            const uint32_t bits = static_cast<uint32_t>(want) << 16;
            same = std::memcmp(&r.bytes[o], &bits, 4) == 0;
          }
          if (!same) pe.check(NAN, bf(want), 0, "q_pe copy", t, h, kLatent + e);
          if (cpu[row + kLatent + e] != bf(want)) pe.check(cpu[row + kLatent + e], bf(want), 0, "CPU q_pe", t, h, e);
        }
      }
    }
  EXPECT_EQ(oracle.count, 0) << oracle.first;
  EXPECT_EQ(vs_cpu.count, 0) << vs_cpu.first;
  EXPECT_EQ(pe.count, 0) << pe.first;
}

// ---- mla_up_project ----

struct UpDev {
  const Inputs& in;
  bool strided;
  DeviceBuffer lat;  // contiguous [T, H, 512], or [T, H, 576] with NaN in columns 512..575
  DevWeight w;
  UpDev(const Inputs& i, bool s) : in(i), strided(s), w(i, s) {
    const int64_t n = in.T * in.H, ld = lat_hs();
    std::vector<uint16_t> h(static_cast<size_t>(n * ld), kBf16NaN);
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(&h[static_cast<size_t>(r * ld)], &in.lat[static_cast<size_t>(r * kLatent)], kLatent * 2);
    lat = DeviceBuffer(h);
  }
  int64_t lat_hs() const { return strided ? 576 : kLatent; }
  int64_t out_hs() const { return strided ? in.v + 8 : in.v; }
  MlaUpProjectParams params(void* out, DType dt) {
    MlaUpProjectParams p;
    p.latent = view(lat.data(), DType::kBF16, {in.T, in.H, kLatent}, {in.H * lat_hs(), lat_hs(), 1});
    p.kv_b_proj = w.desc(in);
    p.qk_nope = in.nope;
    p.out = view(out, dt, {in.T, in.H, in.v}, {in.H * out_hs(), out_hs(), 1});
    return p;
  }
  Result run(DType dt, cudaStream_t stream = nullptr) {
    return run_twice(&mla_up_project, [&](void* out) { return params(out, dt); }, dt, in.T, in.H, out_hs(), stream);
  }
};

std::vector<float> cpu_up(const Inputs& in, DType dt) {
  std::vector<uint16_t> lat = in.lat;
  HostOut out(dt, static_cast<size_t>(in.T * in.H * in.v));
  MlaUpProjectParams p;
  p.latent = dsa_test::t_bf16(lat.data(), {in.T, in.H, kLatent});
  p.kv_b_proj = make_tensor(in.w.data(), DType::kBF16, {in.rows(), kLatent});
  p.qk_nope = in.nope;
  p.out = out.desc({in.T, in.H, in.v});
  const Status st = mla_up_project(p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out.values();
}

void check_up(const Inputs& in) {
  std::vector<Result> gpu;
  for (bool strided : {false, true}) {
    UpDev d(in, strided);
    for (DType dt : {DType::kBF16, DType::kF32}) {
      gpu.push_back(d.run(dt));
      EXPECT_TRUE(gpu.back().untouched_outside(in.T, in.v)) << (strided ? "strided " : "contiguous ") << dtype_name(dt);
    }
  }
  const std::vector<float> cpu16 = cpu_up(in, DType::kBF16), cpu32 = cpu_up(in, DType::kF32);
  Mismatches oracle, vs_cpu;
  std::vector<double> l(kLatent);
  for (int64_t t = 0; t < in.T; ++t)
    for (int64_t h = 0; h < in.H; ++h) {
      for (int64_t c = 0; c < kLatent; ++c) l[c] = bf(in.lat[static_cast<size_t>((t * in.H + h) * kLatent + c)]);
      for (int64_t e = 0; e < in.v; ++e) {
        const float* wr = &in.wf[static_cast<size_t>((h * (in.nope + in.v) + in.nope + e) * kLatent)];
        double s = 0, a = 0;
        for (int64_t c = 0; c < kLatent; ++c) {
          const double y = l[c] * wr[c];
          s += y;
          a += std::fabs(y);
        }
        const size_t i = static_cast<size_t>((t * in.H + h) * in.v + e);
        for (const Result& r : gpu) {
          const bool b16 = r.dt == DType::kBF16;
          const double tol = tolerance(a, s, kLatent, b16);
          const double got = r.at(t, h, e);
          oracle.check(got, s, tol, "out vs oracle", t, h, e);
          vs_cpu.check(got, (b16 ? cpu16 : cpu32)[i], 2 * tol, "out vs CPU backend", t, h, e);
        }
      }
    }
  EXPECT_EQ(oracle.count, 0) << oracle.first;
  EXPECT_EQ(vs_cpu.count, 0) << vs_cpu.first;
}

std::string label(const Geo& g, int64_t T) {
  return "qk_nope " + std::to_string(g.nope) + " v " + std::to_string(g.v) + " H " + std::to_string(g.H) + " T " +
         std::to_string(T);
}

TEST(GpuMlaProject, AbsorbMatchesOracleAndCpuBackend) {
  DSA_REQUIRE_GPU();
  uint64_t seed = 700;
  for (const Geo& g : kGeos)
    for (int64_t T : kTs) {
      SCOPED_TRACE(label(g, T));
      check_absorb(Inputs(seed++, T, g));
    }
}

TEST(GpuMlaProject, UpProjectMatchesOracleAndCpuBackend) {
  DSA_REQUIRE_GPU();
  uint64_t seed = 800;
  for (const Geo& g : kGeos)
    for (int64_t T : kTs) {
      SCOPED_TRACE(label(g, T));
      check_up(Inputs(seed++, T, g));
    }
}

// The compute-sanitizer subset: both GEMMs, all four q_pe copy kernels (bf16 / f32 out,
// 16-byte and element paths), both geometries, a few rows.
TEST(GpuMlaProject, SanitizerSmall) {
  DSA_REQUIRE_GPU();
  for (const Geo& g : {Geo{128, 128, 3}, Geo{192, 256, 2}}) {
    SCOPED_TRACE(label(g, 5));
    const Inputs in(900 + g.nope, 5, g);
    check_absorb(in);
    check_up(in);
  }
}

// Captured on a stream and replayed: the same bytes as the eager run, and the graph holds no
// allocation (cuBLAS runs without a workspace).
TEST(GpuMlaProject, GraphCaptureEqualsEager) {
  DSA_REQUIRE_GPU();
  const Geo g{192, 256, 4};
  const Inputs in(950, 37, g);
  AbsorbDev ad(in, false);
  UpDev ud(in, false);
  cudaStream_t s;
  DSA_CUDA_OK(cudaStreamCreate(&s));  // blocking: orders with the tests' default-stream memsets
  const Result ea = ad.run(DType::kBF16, s);  // eager, and the warm-up (the device's cuBLAS handle)
  const Result eu = ud.run(DType::kF32, s);
  Guarded qa(static_cast<size_t>(in.T * in.H * 576) * 2), ou(static_cast<size_t>(in.T * in.H * in.v) * 4);
  MlaAbsorbQParams pa = ad.params(qa.data(), DType::kBF16);
  MlaUpProjectParams pu = ud.params(ou.data(), DType::kF32);
  pa.stream = pu.stream = s;
  cudaGraph_t graph;
  DSA_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status sa = mla_absorb_q(pa);
  const Status su = mla_up_project(pu);
  DSA_CUDA_OK(cudaStreamEndCapture(s, &graph));
  DSA_ASSERT_OK(sa);
  DSA_ASSERT_OK(su);
  size_t n = 0;
  DSA_CUDA_OK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  DSA_CUDA_OK(cudaGraphGetNodes(graph, nodes.data(), &n));
  EXPECT_GE(n, 3u) << "two GEMMs and the q_pe copy";
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    DSA_CUDA_OK(cudaGraphNodeGetType(node, &type));
    EXPECT_NE(type, cudaGraphNodeTypeMemAlloc) << "the captured ops allocate";
    EXPECT_NE(type, cudaGraphNodeTypeMemFree);
  }
  cudaGraphExec_t exec;
  DSA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    qa.refill();
    ou.refill();
    DSA_CUDA_OK(cudaGraphLaunch(exec, s));
    DSA_CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(dsa_gpu_test::same_bits(qa.all(), ea.bytes, "absorb: replay vs eager"));
    EXPECT_TRUE(dsa_gpu_test::same_bits(ou.all(), eu.bytes, "up-project: replay vs eager"));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// One row takes any row stride (cuBLAS's leading dimension is then free); the launcher names
// its kernel; T = 0 launches nothing.
TEST(GpuMlaProject, SingleRowAnyStrideKernelNameEmpty) {
  DSA_REQUIRE_GPU();
  const Geo g{128, 128, 3};
  const Inputs in(960, 1, g);
  AbsorbDev ad(in, false);
  const Result ref = ad.run(DType::kF32);
  Guarded out(static_cast<size_t>(in.H * 576) * 4);
  MlaAbsorbQParams p = ad.params(out.data(), DType::kF32);
  p.q_nope.stride[0] = 3;  // extent 1: never stepped
  p.q_out.stride[0] = 5;
  DSA_ASSERT_OK(mla_absorb_q(p));
  EXPECT_STREQ(last_kernel_name(), "mla_absorb_q.cublas");
  EXPECT_TRUE(dsa_gpu_test::same_bits(out.all(), ref.bytes, "T = 1, odd row strides"));

  UpDev ud(in, false);
  const Result uref = ud.run(DType::kBF16);
  Guarded uo(static_cast<size_t>(in.H * in.v) * 2);
  MlaUpProjectParams u = ud.params(uo.data(), DType::kBF16);
  u.latent.stride[0] = 7;
  u.out.stride[0] = 1;
  DSA_ASSERT_OK(mla_up_project(u));
  EXPECT_STREQ(last_kernel_name(), "mla_up_project.cublas");
  EXPECT_TRUE(dsa_gpu_test::same_bits(uo.all(), uref.bytes, "T = 1, odd row strides"));

  p.q_nope.shape[0] = p.q_pe.shape[0] = p.q_out.shape[0] = 0;
  DSA_ASSERT_OK(mla_absorb_q(p));
  EXPECT_STREQ(last_kernel_name(), "");
  u.latent.shape[0] = u.out.shape[0] = 0;
  DSA_ASSERT_OK(mla_up_project(u));
  EXPECT_STREQ(last_kernel_name(), "");
  EXPECT_TRUE(dsa_gpu_test::device_clean());
}

TEST(GpuMlaProject, UnsupportedOnCudaNamesTheArgumentAndWhatExists) {
  DSA_REQUIRE_GPU();
  const int64_t T = 4, H = 2, nope = 128, v = 128;
  DeviceBuffer qn(T * H * nope * 4), qp(T * H * kRope * 4), lat(T * H * kLatent * 4), w(H * (nope + v) * kLatent * 2),
      out(T * H * 576 * 4), up(T * H * v * 4);
  auto refused = [](const Status& st, std::initializer_list<const char*> needles) {
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
    for (const char* n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message();
  };
  MlaAbsorbQParams p;
  p.q_nope = dsa_gpu_test::dev_tensor(qn, DType::kF32, {T, H, nope});
  p.q_pe = dsa_gpu_test::dev_tensor(qp, DType::kF32, {T, H, kRope});
  p.kv_b_proj = dsa_gpu_test::dev_tensor(w, DType::kBF16, {H * (nope + v), kLatent});
  p.v_dim = v;
  p.q_out = dsa_gpu_test::dev_tensor(out, DType::kF32, {T, H, 576});
  refused(mla_absorb_q(p), {"mla_absorb_q: q_nope: dtype f32 on cuda:0", "takes bf16", "CPU backend"});
  p.q_nope.dtype = p.q_pe.dtype = DType::kBF16;
  p.q_nope.stride[0] = 64;  // rows overlapping (an input may): no leading dimension for cuBLAS
  refused(mla_absorb_q(p), {"mla_absorb_q: q_nope: on cuda:0", "stride[0]", "qk_nope = 128", "got 64"});

  MlaUpProjectParams u;
  u.latent = dsa_gpu_test::dev_tensor(lat, DType::kF32, {T, H, kLatent});
  u.kv_b_proj = p.kv_b_proj;
  u.qk_nope = nope;
  u.out = dsa_gpu_test::dev_tensor(up, DType::kBF16, {T, H, v});
  refused(mla_up_project(u), {"mla_up_project: latent: dtype f32 on cuda:0", "takes bf16"});
  u.latent.dtype = DType::kBF16;
  u.latent.stride[0] = 0;  // every row the same latent: fine on the CPU, not a cuBLAS layout
  refused(mla_up_project(u), {"mla_up_project: latent: on cuda:0", "stride[0]", "512"});
  EXPECT_TRUE(dsa_gpu_test::device_clean());
}

}  // namespace
