#include "dsa/geometry.h"

#include <cmath>

namespace dsa {

const char* indexer_role_name(IndexerRole role) {
  switch (role) {
    case IndexerRole::kFull: return "full";
    case IndexerRole::kShared: return "shared";
    case IndexerRole::kMtp: return "mtp";
  }
  return "unknown";
}

IndexerRole ModelGeometry::layer_role(int layer) const {
  if (layer >= num_layers) return IndexerRole::kMtp;
  if (!shared_indexer_pattern) return IndexerRole::kFull;
  int m = layer - 3 + 1;
  if (m < 0) m = 0;
  return (m % 4 == 0) ? IndexerRole::kFull : IndexerRole::kShared;
}

int ModelGeometry::num_indexer_cache_layers() const {
  int n = 0;
  for (int i = 0; i < num_layers; ++i) n += layer_role(i) == IndexerRole::kFull;
  return n;
}

static double deepseek_sm_scale(int qk_head_dim) {
  // DeepSeek-V3.2 / GLM-5: qk_head_dim^-0.5 scaled by the YaRN mscale (1 + 0.1 ln 40)^2.
  double m = 1.0 + 0.1 * std::log(40.0);
  return std::pow(static_cast<double>(qk_head_dim), -0.5) * m * m;
}

Status geometry_preset(const std::string& name, ModelGeometry* out) {
  ModelGeometry g;
  g.name = name;
  if (name == "deepseek-v3.2") {
    g.num_heads = 128;
    g.qk_nope_head_dim = 128;
    g.v_head_dim = 128;
    g.q_lora_rank = 1536;
    g.index_heads = 64;
    g.index_rope = RopeStyle::kHalfSplit;
    g.num_layers = 61;
    g.num_mtp_layers = 1;
    g.max_positions = 163840;
  } else if (name == "glm-5" || name == "glm-5.2") {
    g.num_heads = 64;
    g.qk_nope_head_dim = 192;
    g.v_head_dim = 256;
    g.q_lora_rank = 2048;
    g.index_heads = 32;
    g.index_rope = RopeStyle::kInterleaved;
    g.num_layers = 78;
    g.num_mtp_layers = 1;
    g.max_positions = name == "glm-5" ? 202752 : 1048576;
    g.shared_indexer_pattern = name == "glm-5.2";
  } else {
    std::string known;
    for (const auto& n : geometry_preset_names()) known += (known.empty() ? "" : ", ") + n;
    return Status(StatusCode::kInvalidArgument,
                  "preset: unknown model '" + name + "'; expected one of " + known);
  }
  g.sm_scale = deepseek_sm_scale(g.qk_nope_head_dim + g.qk_rope_head_dim);
  *out = g;
  return Status::Ok();
}

std::vector<std::string> geometry_preset_names() { return {"deepseek-v3.2", "glm-5", "glm-5.2"}; }

}  // namespace dsa
