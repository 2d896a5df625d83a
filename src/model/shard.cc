#include "model/shard.h"

#include <map>
#include <vector>

namespace klinear {

namespace {

std::string num(int64_t n) { return std::to_string(n); }

// InvalidArgument "<setting> <degree> does not divide the <n> <what>" when it does not.
Status divides(const char* setting, int degree, int64_t n, const std::string& what) {
  if (n % degree == 0) return Status();
  return Status::InvalidArgument(std::string(setting) + " " + num(degree) + " does not divide the " + num(n) + " " +
                                 what);
}

}  // namespace

Result<ParallelSizes> parse_parallel_config(const Json& pc) {
  if (!pc.is_object()) return Status::InvalidArgument("parallel_config: expected an object, got " + pc.dump());
  std::map<std::string, int> v = {{"world_size", 1},   {"attn_tp_size", 1},   {"attn_dp_size", 1},
                                  {"moe_tp_size", 1},  {"moe_ep_size", 1},    {"dense_tp_size", -1},
                                  {"shared_tp_size", -1}, {"oproj_tp_size", -1}, {"embed_tp_size", -1},
                                  {"lmhead_tp_size", -1}};
  for (const auto& [name, value] : pc.items()) {
    auto it = v.find(name);
    if (it == v.end()) {
      std::string known;
      for (const auto& [k, unused] : v) known += (known.empty() ? "" : ", ") + k;
      return Status::InvalidArgument("parallel_config." + name + ": not a setting klinear knows (known: " + known + ")");
    }
    if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > 1 << 20)
      return Status::InvalidArgument("parallel_config." + name + ": expected a positive integer, got " + value.dump());
    it->second = value.get<int>();
  }
  const int tp = v["attn_tp_size"];
  if (v["moe_tp_size"] != 1)
    return Status::InvalidArgument("parallel_config.moe_tp_size " + num(v["moe_tp_size"]) +
                                   ": MoE tensor parallelism is fixed at 1 (split the experts with moe_ep_size)");
  for (const char* same : {"dense_tp_size", "shared_tp_size", "oproj_tp_size"})
    if (v[same] != -1 && v[same] != tp)
      return Status::InvalidArgument(std::string("parallel_config.") + same + " " + num(v[same]) +
                                     " must equal attn_tp_size " + num(tp) +
                                     " (the dense FFN, the shared experts and o_proj follow the attention TP)");
  ParallelSizes s;
  s.world = v["world_size"];
  s.tensor = tp;
  s.data = v["attn_dp_size"];
  s.expert = v["moe_ep_size"];
  s.embed = v["embed_tp_size"] == -1 ? tp : v["embed_tp_size"];
  s.lm_head = v["lmhead_tp_size"] == -1 ? tp : v["lmhead_tp_size"];
  return s;
}

Status check_parallel(const ModelConfig& c, const ParallelSizes& s) {
  for (auto [name, d] : {std::pair{"tensor_parallel_size", s.tensor}, {"data_parallel_size", s.data},
                         {"expert_parallel_size", s.expert}, {"embed_tp_size", s.embed}, {"lmhead_tp_size", s.lm_head}})
    if (d < 1) return Status::InvalidArgument(std::string(name) + " " + num(d) + ": expected at least 1");
  if (s.tensor * s.data != s.world)
    return Status::InvalidArgument("tensor_parallel_size " + num(s.tensor) + " x data_parallel_size " + num(s.data) +
                                   " = " + num(s.tensor * s.data) + " ranks, the launch has world_size " + num(s.world));
  if (s.data > 1)
    return Status::NotSupported("data_parallel_size " + num(s.data) +
                                ": data-parallel attention (requests sharded over ranks) is not built yet; use "
                                "tensor_parallel_size " + num(s.world));
  if (s.expert != 1 && s.expert != s.world)
    return Status::NotSupported("expert_parallel_size " + num(s.expert) + " with world_size " + num(s.world) +
                                ": experts are split over every rank or none for now");
  for (auto [name, d] : {std::pair{"embed_tp_size", s.embed}, {"lmhead_tp_size", s.lm_head}})
    if (d != 1 && d != s.tensor)
      return Status::InvalidArgument(std::string(name) + " " + num(d) + ": expected 1 or tensor_parallel_size " +
                                     num(s.tensor));
  KL_RETURN_IF_ERROR(divides("tensor_parallel_size", s.tensor, c.kda_heads, "KDA heads"));
  KL_RETURN_IF_ERROR(divides("tensor_parallel_size", s.tensor, c.mla_heads, "MLA heads"));
  KL_RETURN_IF_ERROR(divides("tensor_parallel_size", s.tensor, c.intermediate_size, "dense intermediate_size"));
  KL_RETURN_IF_ERROR(divides("tensor_parallel_size", s.tensor, c.moe_intermediate_size * c.num_shared_experts,
                             "shared-expert intermediate (moe_intermediate_size x num_shared_experts)"));
  if (c.num_experts > 0) KL_RETURN_IF_ERROR(divides("expert_parallel_size", s.expert, c.num_experts, "routed experts"));
  else if (s.expert > 1)
    return Status::InvalidArgument("expert_parallel_size " + num(s.expert) + ": the model has no routed experts");
  KL_RETURN_IF_ERROR(divides("embed_tp_size", s.embed, c.vocab_size, "vocabulary entries (vocab_size)"));
  KL_RETURN_IF_ERROR(divides("lmhead_tp_size", s.lm_head, c.vocab_size, "vocabulary entries (vocab_size)"));
  if (c.tie_word_embeddings && s.embed != s.lm_head)
    return Status::InvalidArgument("embed_tp_size " + num(s.embed) + " and lmhead_tp_size " + num(s.lm_head) +
                                   ": the model ties its lm head to the embedding, so they must be equal");
  return Status();
}

ModelShard shard_of(const ParallelSizes& s, int rank) {
  auto part = [&](int degree) { return degree == 1 ? Part{} : Part{rank % degree, degree}; };
  return ModelShard{part(s.tensor), part(s.expert), part(s.embed), part(s.lm_head)};
}

ModelConfig rank_config(const ModelConfig& config, const ModelShard& shard) {
  ModelConfig c = config;
  c.kda_heads = shard.heads.size(config.kda_heads);
  c.mla_heads = shard.heads.size(config.mla_heads);
  return c;
}

}  // namespace klinear
