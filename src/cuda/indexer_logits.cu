// Launchers of the indexer logits family: indexer_logits (flat keys), indexer_logits_paged.
// Kernel choice, in order:
//  * sm_90a device, H_idx <= 64, 16-byte aligned q and keys (paged: page size 64): the Hopper
//    FP8 wgmma kernel (indexer_logits_wgmma.cuh); prefill row blocks (flat, and paged rows) run
//    its four-consumer form (docs/perf.md round 5), decode blocks their
//    decode form (four consumers, a copy-issuing warp per consumer group: round 6);
//  * H_idx <= 64: the mma.sync f16 tensor-core kernel (grid: x = row, y = column chunk);
//  * otherwise: the SIMT kernel.
// DSA_CUDA_LOGITS forces one: "mma" (mma.sync), "simt"; "wgmma_mma_only" runs the flat wgmma
// kernel's default form without its epilogue (a timing hook: logits are left unwritten).
// Prefill row blocks: "wgmma_4wg" (the default), "wgmma_overlap" (two consumers, each tile's
// MMA in halves under the epilogue: the default of rounds 3-4), "wgmma_serial" (two consumers,
// the epilogue after each tile's MMA). Paged decode blocks: "wgmma_decode_serial" (two
// consumers, one CTA per SM), "wgmma_decode_2cta" (two CTAs per SM for blocks of next_n x heads
// <= 64 columns, the default above: round 5's default), "wgmma_decode_4wg" (four consumers,
// one copy warp), "wgmma_decode_4wg_split" (the default: the same with a copy-issuing warp per
// consumer group); see
// logits_wg::RowsForm and logits_wg::DecodeForm. A decode value leaves the row blocks at their
// default and a row value the decode blocks at theirs.
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/hopper/hopper.cuh"
#include "cuda/indexer_logits_kernels.cuh"
#include "cuda/indexer_logits_wgmma.h"

namespace dsa {
namespace gpu {
namespace {

constexpr int64_t kMaxGridY = 65535;

logits::QArgs q_args(const TensorDesc& q, const TensorDesc& w, const TensorDesc& out, int64_t col_offset) {
  logits::QArgs a{};
  a.q = static_cast<const uint8_t*>(q.data);
  a.q0 = q.stride[0];
  a.q1 = q.stride[1];
  a.w = static_cast<const float*>(w.data);
  a.w0 = w.stride[0];
  a.w1 = w.stride[1];
  a.out = out.data;
  a.out0 = out.stride[0];
  a.out_bf16 = out.dtype == DType::kBF16;
  a.rows = q.shape[0];
  a.heads = q.shape[1];
  a.width = out.shape[1];
  a.col_offset = col_offset;
  return a;
}

enum class Forced {
  kNone, kSimt, kMma, kWgmmaMmaOnly, kWgmma4Wg, kWgmmaOverlap, kWgmmaSerial,
  kWgmmaDecodeSerial, kWgmmaDecode2Cta, kWgmmaDecode4Wg, kWgmmaDecode4WgSplit
};

// DSA_CUDA_LOGITS (diagnosis on a new device, tests, the bench hook), read once per call (tests
// switch it between calls). An unknown value is the default.
Forced forced_kernel() {
  const char* v = std::getenv("DSA_CUDA_LOGITS");
  if (v == nullptr) return Forced::kNone;
  static const struct {
    const char* name;
    Forced f;
  } kNames[] = {{"simt", Forced::kSimt},
                {"mma", Forced::kMma},
                {"wgmma_mma_only", Forced::kWgmmaMmaOnly},
                {"wgmma_4wg", Forced::kWgmma4Wg},
                {"wgmma_overlap", Forced::kWgmmaOverlap},
                {"wgmma_serial", Forced::kWgmmaSerial},
                {"wgmma_decode_serial", Forced::kWgmmaDecodeSerial},
                {"wgmma_decode_2cta", Forced::kWgmmaDecode2Cta},
                {"wgmma_decode_4wg", Forced::kWgmmaDecode4Wg},
                {"wgmma_decode_4wg_split", Forced::kWgmmaDecode4WgSplit}};
  for (const auto& n : kNames)
    if (std::strcmp(v, n.name) == 0) return n.f;
  return Forced::kNone;
}
logits_wg::RowsForm rows_form(Forced f) {
  return f == Forced::kWgmmaOverlap  ? logits_wg::RowsForm::kOverlap
         : f == Forced::kWgmmaSerial ? logits_wg::RowsForm::kSerial
                                     : logits_wg::RowsForm::kFourWg;
}
logits_wg::DecodeForm decode_form(Forced f) {
  return f == Forced::kWgmmaDecodeSerial ? logits_wg::DecodeForm::kSerial
         : f == Forced::kWgmmaDecode2Cta ? logits_wg::DecodeForm::kTwoCtas
         : f == Forced::kWgmmaDecode4Wg  ? logits_wg::DecodeForm::kFourWg
         : f == Forced::kWgmmaDecode4WgSplit ? logits_wg::DecodeForm::kFourWgSplit
                                         : logits_wg::DecodeForm::kDefault;
}
bool wgmma_allowed(int64_t heads, Forced f) {
  return heads <= 64 && f != Forced::kSimt && f != Forced::kMma && hopper::current_device_is_sm90a();
}

template <class Keys>
StatusCode launch(const logits::QArgs& a, const Keys& keys, void* stream, bool paged, bool simt_forced) {
  if (a.rows == 0 || a.width == 0) return StatusCode::kOk;
  if (a.rows > 0x7fffffffLL) return StatusCode::kUnsupported;
  const cudaStream_t s = as_stream(stream);
  if (a.heads <= 64 && !simt_forced) {
    const int64_t chunks = ceil_div(a.width, logits::kMmaChunk);
    if (chunks > kMaxGridY) return StatusCode::kUnsupported;
    const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(chunks));
    note_kernel(paged ? "indexer_logits_paged.mma_sync_f16" : "indexer_logits.mma_sync_f16");
    if (a.heads <= 32) {
      logits::logits_mma_kernel<Keys, 2><<<grid, logits::kMmaThreads, 0, s>>>(a, keys);
    } else {
      logits::logits_mma_kernel<Keys, 4><<<grid, logits::kMmaThreads, 0, s>>>(a, keys);
    }
    return last_launch_status();
  }
  const int64_t tiles = ceil_div(a.width, logits::kTileKeys);
  if (tiles > kMaxGridY) return StatusCode::kUnsupported;
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(tiles));
  note_kernel(paged ? "indexer_logits_paged.simt" : "indexer_logits.simt");
  if (a.heads <= 32) {
    logits::logits_tile_kernel<Keys, 2><<<grid, logits::kThreads, 0, s>>>(a, keys);
  } else {
    logits::logits_tile_kernel<Keys, 4><<<grid, logits::kThreads, 0, s>>>(a, keys);
  }
  return last_launch_status();
}

}  // namespace

StatusCode indexer_logits(const IndexerLogitsParams& p) {
  const Forced forced = forced_kernel();
  if (wgmma_allowed(p.q.shape[1], forced)) {
    bool served = false;
    const bool mma_only = forced == Forced::kWgmmaMmaOnly;
    const StatusCode st = logits_wg::launch_flat(p, mma_only, rows_form(forced), &served);
    if (served) {
      note_kernel(mma_only ? "indexer_logits.wgmma_fp8_mma_only" : logits_wg::rows_kernel_name(false, rows_form(forced)));
      return st;
    }
  }
  logits::QArgs a = q_args(p.q, p.weights, p.logits, p.col_offset);
  logits::FlatKeys keys{};
  keys.k = static_cast<const uint8_t*>(p.k.data);
  keys.k0 = p.k.stride[0];
  keys.k_scale = static_cast<const float*>(p.k_scale.data);
  keys.ks0 = p.k_scale.stride[0];
  keys.ks = i32_vec(p.ks);
  keys.ke = i32_vec(p.ke);
  keys.n = p.k.shape[0];
  keys.aligned16 = reinterpret_cast<uintptr_t>(p.k.data) % 16 == 0 && p.k.stride[0] % 16 == 0;
  return launch(a, keys, p.stream, false, forced == Forced::kSimt);
}

StatusCode indexer_logits_paged(const IndexerLogitsPagedParams& p) {
  // skip_rows_up_to is honoured by the mma.sync and SIMT kernels (the wgmma kernel's row blocks
  // do not skip rows yet): a call that skips rows takes them.
  const Forced forced = forced_kernel();
  if (forced != Forced::kWgmmaMmaOnly && p.skip_rows_up_to == 0 && wgmma_allowed(p.q.shape[1], forced)) {
    bool served = false;
    const StatusCode st = logits_wg::launch_paged(p, rows_form(forced), decode_form(forced), &served);
    if (served) {
      const bool rows = p.row_seq.present() || p.next_n > 4;  // prefill-shaped row blocks, else decode blocks
      note_kernel(rows ? logits_wg::rows_kernel_name(true, rows_form(forced))
                       : logits_wg::decode_kernel_name(decode_form(forced), p.q.shape[1], p.next_n));
      return st;
    }
  }
  logits::QArgs a = q_args(p.q, p.weights, p.logits, p.col_offset);
  logits::PagedKeys keys{};
  keys.cache = static_cast<const uint8_t*>(p.cache.data);
  keys.block_bytes = p.cache.block_bytes();
  keys.page_size = p.cache.page_size;
  keys.num_blocks = p.cache.num_blocks;
  keys.block_table = i32_mat(p.block_table);
  keys.general = p.row_seq.present();
  keys.skip_up_to = p.skip_rows_up_to;
  if (keys.general) {
    keys.row_seq = i32_vec(p.row_seq);
    keys.row_len = i32_vec(p.row_len);
  } else {
    keys.kv_lens = i32_vec(p.kv_lens);
    keys.next_n = p.next_n;
  }
  return launch(a, keys, p.stream, true, forced == Forced::kSimt);
}

}  // namespace gpu
}  // namespace dsa
