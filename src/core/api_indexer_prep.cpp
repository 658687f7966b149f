// Public entry points of the indexer preparation family (SPEC §3.1-3): validate, pick the
// device, dispatch.
#include <cinttypes>
#include <string>

#include "core/dispatch.h"
#include "core/validate.h"
#include "dsa/indexer.h"

namespace dsa {
namespace {

// For host tensors: every position must index a row of cos_sin.
Status check_positions(const char* op, const TensorDesc& positions, int64_t max_positions) {
  if (positions.device.type != DeviceType::kCPU) return Status::Ok();
  for (int64_t t = 0; t < positions.shape[0]; ++t) {
    const int64_t v = positions.dtype == DType::kI64 ? positions.ptr<const int64_t>()[t * positions.stride[0]]
                                                     : positions.ptr<const int32_t>()[t * positions.stride[0]];
    if (v < 0 || v >= max_positions) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(op) + ": positions: expected 0 <= positions[t] < max_positions = " +
                        std::to_string(max_positions) + " (rows of cos_sin), got positions[" +
                        std::to_string(t) + "] = " + std::to_string(v));
    }
  }
  return Status::Ok();
}

bool rope_style_ok(RopeStyle r) { return r == RopeStyle::kHalfSplit || r == RopeStyle::kInterleaved; }

}  // namespace

Status quantize_fp8(const QuantizeFp8Params& p) {
  const char* op = "quantize_fp8";
  core::ArgCheck c(op);
  c.require(p.group > 0, "group", [&] { return "expected group > 0, got " + std::to_string(p.group); });
  c.tensor(p.x, "x", {DType::kF32, DType::kBF16}, {"R", "D"});
  if (!c.ok()) return c.status();
  const int64_t R = p.x.shape[0], D = p.x.shape[1];
  c.require(D % p.group == 0, "x", [&] {
    return "expected the last dim D = " + std::to_string(D) + " to be a multiple of group = " + std::to_string(p.group);
  });
  c.output(p.out, "out", {DType::kE4M3}, {{R, "R"}, {D, "D"}});
  c.output(p.scale, "scale", {DType::kF32}, {{R, "R"}, {D / p.group, "D / group"}});
  c.disjoint(p.out, "out", p.x, "x").disjoint(p.scale, "scale", p.x, "x").disjoint(p.scale, "scale", p.out, "out");
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.x, "x"}, {&p.out, "out"}, {&p.scale, "scale"}}, &dev);
  if (!st.ok()) return st;
  return core::backend_status(op, dev, DSA_DISPATCH(dev, quantize_fp8, p));
}

Status prepare_indexer_q(const PrepareIndexerQParams& p) {
  const char* op = "prepare_indexer_q";
  core::ArgCheck c(op);
  c.tensor(p.q, "q", {DType::kF32, DType::kBF16}, {"T", "H_idx", {kIndexHeadDim, "128"}});
  if (!c.ok()) return c.status();
  const int64_t T = p.q.shape[0], H = p.q.shape[1];
  c.require(H > 0, "q", [&] { return "expected H_idx > 0 heads, got shape " + core::shape_string(p.q); });
  c.tensor(p.weights, "weights", {DType::kF32, DType::kBF16}, {{T, "T"}, {H, "H_idx"}}, false);
  c.tensor(p.positions, "positions", {DType::kI32, DType::kI64}, {{T, "T"}}, false);
  c.tensor(p.cos_sin, "cos_sin", {DType::kF32}, {"max_positions", {kIndexRopeDim, "64"}});
  c.require(rope_style_ok(p.rope), "rope", "expected kHalfSplit or kInterleaved");
  c.output(p.q_out, "q_out", {DType::kE4M3}, {{T, "T"}, {H, "H_idx"}, {kIndexHeadDim, "128"}});
  c.output(p.weights_out, "weights_out", {DType::kF32}, {{T, "T"}, {H, "H_idx"}}, false);
  c.optional_output(p.q_scale, "q_scale", {DType::kF32}, {{T, "T"}, {H, "H_idx"}}, false);
  for (const auto& o : {std::make_pair(&p.q_out, "q_out"), std::make_pair(&p.weights_out, "weights_out"),
                        std::make_pair(&p.q_scale, "q_scale")}) {
    c.disjoint(*o.first, o.second, p.q, "q").disjoint(*o.first, o.second, p.weights, "weights");
    c.disjoint(*o.first, o.second, p.positions, "positions").disjoint(*o.first, o.second, p.cos_sin, "cos_sin");
  }
  c.disjoint(p.q_out, "q_out", p.weights_out, "weights_out").disjoint(p.q_out, "q_out", p.q_scale, "q_scale");
  c.disjoint(p.weights_out, "weights_out", p.q_scale, "q_scale");
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(
      op, {{&p.q, "q"}, {&p.weights, "weights"}, {&p.positions, "positions"}, {&p.cos_sin, "cos_sin"}, {&p.q_out, "q_out"}, {&p.weights_out, "weights_out"}, {&p.q_scale, "q_scale"}}, &dev);
  if (!st.ok()) return st;
  st = check_positions(op, p.positions, p.cos_sin.shape[0]);
  if (!st.ok()) return st;
  return core::backend_status(op, dev, DSA_DISPATCH(dev, prepare_indexer_q, p));
}

Status prepare_indexer_k(const PrepareIndexerKParams& p) {
  const char* op = "prepare_indexer_k";
  core::ArgCheck c(op);
  c.tensor(p.k, "k", {DType::kF32, DType::kBF16}, {"T", {kIndexHeadDim, "128"}});
  if (!c.ok()) return c.status();
  const int64_t T = p.k.shape[0];
  c.tensor(p.positions, "positions", {DType::kI32, DType::kI64}, {{T, "T"}}, false);
  c.tensor(p.cos_sin, "cos_sin", {DType::kF32}, {"max_positions", {kIndexRopeDim, "64"}});
  c.require(rope_style_ok(p.rope), "rope", "expected kHalfSplit or kInterleaved");
  c.output(p.k_out, "k_out", {DType::kE4M3}, {{T, "T"}, {kIndexHeadDim, "128"}});
  c.output(p.k_scale, "k_scale", {DType::kF32}, {{T, "T"}}, false);
  for (const auto& o : {std::make_pair(&p.k_out, "k_out"), std::make_pair(&p.k_scale, "k_scale")}) {
    c.disjoint(*o.first, o.second, p.k, "k").disjoint(*o.first, o.second, p.positions, "positions");
    c.disjoint(*o.first, o.second, p.cos_sin, "cos_sin");
  }
  c.disjoint(p.k_out, "k_out", p.k_scale, "k_scale");
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.k, "k"}, {&p.positions, "positions"}, {&p.cos_sin, "cos_sin"}, {&p.k_out, "k_out"}, {&p.k_scale, "k_scale"}}, &dev);
  if (!st.ok()) return st;
  st = check_positions(op, p.positions, p.cos_sin.shape[0]);
  if (!st.ok()) return st;
  return core::backend_status(op, dev, DSA_DISPATCH(dev, prepare_indexer_k, p));
}

}  // namespace dsa
