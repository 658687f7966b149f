// Launchers of the indexer logits family: indexer_logits (flat keys), indexer_logits_paged.
// Kernel choice, in order:
//  * sm_90a device, H_idx <= 64, 16-byte aligned q and keys (paged: page size 64): the Hopper
//    FP8 wgmma kernel (indexer_logits_wgmma.cuh); prefill row blocks (flat, and paged rows) run
//    its overlap form (each tile's MMA in two halves, the epilogue under the tensor cores: 3-8%
//    faster on the H200, docs/perf.md round 3), decode blocks its decode form;
//  * H_idx <= 64: the mma.sync f16 tensor-core kernel (grid: x = row, y = column chunk);
//  * otherwise: the SIMT kernel.
// DSA_CUDA_LOGITS forces one: "mma" (mma.sync), "simt"; "wgmma_mma_only" runs the wgmma
// kernel without its epilogue (flat only; a timing hook: logits are left unwritten);
// "wgmma_serial" runs the prefill row blocks with the serial epilogue (after each tile's MMA;
// the default until round 3), "wgmma_overlap" the default overlap form. Paged decode blocks:
// "wgmma_decode_serial" (one CTA per SM), "wgmma_decode_2cta" (the default: two CTAs per SM for
// blocks of next_n x heads <= 64 columns); see logits_wg::DecodeForm.
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
  kNone, kSimt, kMma, kWgmmaMmaOnly, kWgmmaOverlap, kWgmmaSerial,
  kWgmmaDecodeSerial, kWgmmaDecode2Cta
};

// DSA_CUDA_LOGITS=simt|mma|wgmma_mma_only|wgmma_overlap|wgmma_serial|wgmma_decode_{serial,2cta}
// (diagnosis on a new device, tests, the bench hook).
// Read once per call (tests switch it between calls).
Forced forced_kernel() {
  const char* v = std::getenv("DSA_CUDA_LOGITS");
  if (v == nullptr) return Forced::kNone;
  if (std::strcmp(v, "simt") == 0) return Forced::kSimt;
  if (std::strcmp(v, "mma") == 0) return Forced::kMma;
  if (std::strcmp(v, "wgmma_mma_only") == 0) return Forced::kWgmmaMmaOnly;
  if (std::strcmp(v, "wgmma_overlap") == 0) return Forced::kWgmmaOverlap;
  if (std::strcmp(v, "wgmma_serial") == 0) return Forced::kWgmmaSerial;
  if (std::strcmp(v, "wgmma_decode_serial") == 0) return Forced::kWgmmaDecodeSerial;
  if (std::strcmp(v, "wgmma_decode_2cta") == 0) return Forced::kWgmmaDecode2Cta;
  return Forced::kNone;
}
// Prefill row blocks take the overlap form unless the serial one (or the timing hook) is asked.
bool decode_forced(Forced f) {
  return f == Forced::kWgmmaDecodeSerial || f == Forced::kWgmmaDecode2Cta;
}
bool overlap_rows(Forced f) { return f == Forced::kNone || f == Forced::kWgmmaOverlap || decode_forced(f); }
logits_wg::DecodeForm decode_form(Forced f) {
  return f == Forced::kWgmmaDecodeSerial ? logits_wg::DecodeForm::kSerial
         : f == Forced::kWgmmaDecode2Cta ? logits_wg::DecodeForm::kTwoCtas
                                         : logits_wg::DecodeForm::kDefault;
}
bool wgmma_allowed(int64_t heads, Forced f) {
  return heads <= 64 &&
         (f == Forced::kNone || f == Forced::kWgmmaMmaOnly || f == Forced::kWgmmaOverlap || f == Forced::kWgmmaSerial ||
          decode_forced(f)) &&
         hopper::current_device_is_sm90a();
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
    const StatusCode st =
        logits_wg::launch_flat(p, forced == Forced::kWgmmaMmaOnly, overlap_rows(forced), &served);
    if (served) {
      note_kernel(forced == Forced::kWgmmaMmaOnly ? "indexer_logits.wgmma_fp8_mma_only"
                  : overlap_rows(forced)          ? "indexer_logits.wgmma_fp8_overlap"
                                                  : "indexer_logits.wgmma_fp8");
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
  if (forced != Forced::kSimt && forced != Forced::kMma && forced != Forced::kWgmmaMmaOnly && p.skip_rows_up_to == 0 &&
      wgmma_allowed(p.q.shape[1], forced)) {
    bool served = false;
    const bool overlap = overlap_rows(forced);
    const StatusCode st = logits_wg::launch_paged(p, overlap, decode_form(forced), &served);
    if (served) {
      // The overlap variant serves the prefill-shaped row blocks; decode blocks have their own.
      const bool rows = p.row_seq.present() || p.next_n > 4;
      note_kernel(rows ? (overlap ? "indexer_logits_paged.wgmma_fp8_rows_overlap" : "indexer_logits_paged.wgmma_fp8_rows")
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
