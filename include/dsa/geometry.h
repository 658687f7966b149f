// Model geometry presets (SPEC §2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsa/status.h"

namespace dsa {

constexpr int kLatentDim = 512;      // kv_lora_rank: the "nope" part of the MLA cache, = value dim
constexpr int kRopeDim = 64;         // qk_rope_head_dim
constexpr int kQkDim = kLatentDim + kRopeDim;  // 576: absorbed query / key width
constexpr int kIndexHeadDim = 128;   // indexer head dim: [rope 64 | pass 64]
constexpr int kIndexRopeDim = 64;

enum class RopeStyle : int32_t {
  kHalfSplit = 0,    // NeoX: pairs (x[i], x[i + 32]) for i < 32 (DeepSeek-V3.2)
  kInterleaved = 1,  // pairs (x[2i], x[2i + 1]) (GLM-5)
};

// How a layer's indexer works.
enum class IndexerRole : int32_t {
  kFull = 0,    // owns an indexer and its K cache; scores its own top-k
  kShared = 1,  // owns no indexer cache; reuses the top-k of the last full layer
  kMtp = 2,     // MTP draft layer: scores where kv_len > topk; identity indices, unscored, where it fits
};
const char* indexer_role_name(IndexerRole role);

struct ModelGeometry {
  std::string name;
  int num_heads = 0;          // attention heads H
  int kv_lora_rank = kLatentDim;
  int qk_rope_head_dim = kRopeDim;
  int qk_nope_head_dim = 0;
  int v_head_dim = 0;
  int q_lora_rank = 0;
  int index_heads = 0;        // H_idx
  int index_head_dim = kIndexHeadDim;
  int topk = 2048;
  RopeStyle index_rope = RopeStyle::kHalfSplit;
  int num_layers = 0;
  int num_mtp_layers = 0;
  bool shared_indexer_pattern = false;  // GLM-5.2: full iff max(i - 3 + 1, 0) % 4 == 0
  int64_t max_positions = 0;
  double sm_scale = 0.0;      // softmax scale of the absorbed attention

  // Role of main layer `layer` (0-based); layers >= num_layers are MTP layers.
  IndexerRole layer_role(int layer) const;
  // Number of main layers that own an indexer K cache (MTP layers own one too).
  int num_indexer_cache_layers() const;
};

// "deepseek-v3.2", "glm-5", "glm-5.2".
Status geometry_preset(const std::string& name, ModelGeometry* out);
std::vector<std::string> geometry_preset_names();

}  // namespace dsa
