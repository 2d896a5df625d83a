#include "io/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "core/checked.h"
#include "io/file.h"

namespace klinear {

Mixer ModelConfig::mixer(int64_t layer) const {
  return std::find(kda_layers.begin(), kda_layers.end(), layer + 1) != kda_layers.end() ? Mixer::kKda : Mixer::kMla;
}

Ffn ModelConfig::ffn(int64_t layer) const {
  const bool moe = num_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  return moe ? Ffn::kMoe : Ffn::kDense;
}

bool ModelConfig::is_eos(int64_t id) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), id) != eos_token_ids.end();
}

namespace {

// Small helpers that turn a missing/ill-typed field into a Status naming it.
struct Reader {
  const Json& obj;
  std::string where;

  Status req(const char* key, int64_t* out) const {
    KL_ASSIGN_OR_RETURN(*out, json_int(obj, key, where));
    return Status();
  }
  Status opt(const char* key, int64_t* out) const {
    KL_ASSIGN_OR_RETURN(auto v, json_opt_int(obj, key, where));
    if (v) *out = *v;
    return Status();
  }
  Status opt(const char* key, double* out) const {
    KL_ASSIGN_OR_RETURN(auto v, json_opt_number(obj, key, where));
    if (v) *out = *v;
    return Status();
  }
  Status opt(const char* key, float* out) const {
    double d = *out;
    KL_RETURN_IF_ERROR(opt(key, &d));
    *out = static_cast<float>(d);
    return Status();
  }
  Status opt(const char* key, bool* out) const {
    KL_ASSIGN_OR_RETURN(auto v, json_opt_bool(obj, key, where));
    if (v) *out = *v;
    return Status();
  }
};

// Bounds on config values: far above any real checkpoint (Kimi Linear 48B, K3), far below
// what would overflow a size or allocate without limit.
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int64_t kMaxWidth = 1 << 17;  // hidden size, LoRA ranks, latent expert width
constexpr int64_t kMaxLayers = 1 << 12;
constexpr int64_t kMaxHeads = 1 << 12;
constexpr int64_t kMaxHeadDim = 1 << 12;
constexpr int64_t kMaxConvKernel = 64;
constexpr int64_t kMaxIntermediate = 1 << 20;
constexpr int64_t kMaxExperts = 1 << 14;
constexpr int64_t kMaxSharedExperts = 64;
constexpr int64_t kMaxContext = int64_t{1} << 31;
constexpr int64_t kMaxTensorElems = int64_t{1} << 40;  // one tensor of 4 TB of F32
constexpr size_t kMaxEosIds = 64;
constexpr double kMinEps = 1e-12;  // smaller is zero in practice (a denormal in fp32)
constexpr double kMaxEps = 0.1;
constexpr double kMinFactor = 1e-6;  // scaling factors and SiTU betas: (0, 1e4]
constexpr double kMaxFactor = 1e4;

enum class TokenIdForm { kOne, kOneOrList };

// A token id field (`bos_token_id`, `eos_token_id`): an integer, an integral number such as 2.0
// or a decimal string such as "2" (all seen in published configs), or with kOneOrList a list of
// those; each in [0, vocab). Absent or null: nullopt. Anything else names the field and value.
Result<std::optional<std::vector<int64_t>>> token_ids(const Json& obj, const char* key, const std::string& where,
                                                      int64_t vocab, TokenIdForm form) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::vector<int64_t>>{};
  const std::string field = where + ": " + key;
  const std::string allowed = ", expected a token id in [0, " + std::to_string(vocab) + ")" +
                              (form == TokenIdForm::kOneOrList ? " or a list of them" : "");
  auto one = [&](const Json& v) -> std::optional<int64_t> {
    if (v.is_string()) {
      auto parsed = parse_int(v.get_ref<const std::string&>(), IntRange{0, vocab - 1}, field);
      return parsed.ok() ? std::optional<int64_t>(*parsed) : std::nullopt;
    }
    if (v.is_number_unsigned() || v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() >= static_cast<uint64_t>(vocab)) return std::nullopt;
      const int64_t n = v.get<int64_t>();
      return n >= 0 && n < vocab ? std::optional<int64_t>(n) : std::nullopt;
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return d >= 0 && d < static_cast<double>(vocab) && d == std::trunc(d) ? std::optional<int64_t>(static_cast<int64_t>(d))
                                                                             : std::nullopt;
    }
    return std::nullopt;
  };
  std::vector<int64_t> ids;
  if (it->is_array() && form == TokenIdForm::kOneOrList) {
    if (it->size() > kMaxEosIds)
      return Status::InvalidArgument(field + " lists " + std::to_string(it->size()) + " ids, expected at most " +
                                     std::to_string(kMaxEosIds));
    for (const Json& v : *it) {
      auto id = one(v);
      if (!id) return Status::InvalidArgument(field + " is " + it->dump() + allowed);
      ids.push_back(*id);
    }
    if (ids.empty()) return Status::InvalidArgument(field + " is an empty list" + allowed);
  } else {
    auto id = one(*it);
    if (!id) return Status::InvalidArgument(field + " is " + it->dump() + allowed);
    ids.push_back(*id);
  }
  return std::optional<std::vector<int64_t>>{std::move(ids)};
}

Status positive(const std::string& where, const char* field, int64_t v) {
  if (v <= 0) return Status::InvalidArgument(where + ": " + field + " must be positive, got " + std::to_string(v));
  return Status();
}

// A format name as vendors spell it, compared without case and punctuation ("MXFP4",
// "mxfp4-pack-quantized" and "mxfp4_pack_quantized" are one name).
std::string normalised_name(const std::string& name) {
  std::string out;
  for (char ch : name)
    if (std::isalnum(static_cast<unsigned char>(ch))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Whether a compressed-tensors scheme's weights are MXFP4's: 4-bit floats in groups of 32.
bool mxfp4_weights(const Json& group) {
  const Json* w = group.is_object() && group.contains("weights") ? &group["weights"] : nullptr;
  return w && w->is_object() && w->value("num_bits", Json()) == 4 && w->value("type", Json()) == "float" &&
         w->value("group_size", Json()) == 32;
}

// MXFP4 experts are recognised by their scheme, not by two exact strings: a method or format named
// mxfp4 in any vendor spelling, or config groups whose weights are 4-bit floats in groups of 32.
Status parse_quantization(const Json& text, const std::string& where, ModelConfig* c) {
  auto q = text.find("quantization_config");
  if (q == text.end() || q->is_null()) return Status();
  const std::string w = where + ".quantization_config";
  if (!q->is_object()) return Status::InvalidArgument(w + ": expected an object, got " + json_excerpt(*q));
  KL_ASSIGN_OR_RETURN(auto method, json_opt_string(*q, "quant_method", w));
  KL_ASSIGN_OR_RETURN(auto format, json_opt_string(*q, "format", w));
  bool mxfp4 = normalised_name(method.value_or("")).rfind("mxfp4", 0) == 0 ||
               normalised_name(format.value_or("")).rfind("mxfp4", 0) == 0;
  if (q->contains("config_groups") && (*q)["config_groups"].is_object())
    for (const auto& [name, group] : (*q)["config_groups"].items()) mxfp4 = mxfp4 || mxfp4_weights(group);
  if (mxfp4) {
    c->expert_format = ExpertFormat::kMxfp4;
    return Status();
  }
  return Status::NotSupported(w + " " + json_excerpt(*q) +
                              " is not supported: klinear reads MXFP4 experts (a method or format named mxfp4, or "
                              "weights of 4-bit floats in groups of 32)");
}

// Every count and width within sane bounds, and the sizes derived from them (tensor element
// counts) computed with checked arithmetic, before anything loops over layers, allocates or
// indexes: a layer count of 10^12 or heads near 2^60 stop here with the field named.
Status check_bounds(const ModelConfig& c, const std::string& w) {
  struct Field {
    const char* name;
    int64_t value;
    IntRange range;
  };
  const Field fields[] = {
      {"vocab_size", c.vocab_size, {1, kMaxVocab}},
      {"hidden_size", c.hidden_size, {1, kMaxWidth}},
      {"num_hidden_layers", c.num_layers, {1, kMaxLayers}},
      {"max_position_embeddings", c.max_position_embeddings, {0, kMaxContext}},
      {"num_attention_heads", c.mla_heads, {0, kMaxHeads}},
      {"q_lora_rank", c.q_lora_rank, {0, kMaxWidth}},
      {"kv_lora_rank", c.kv_lora_rank, {0, kMaxWidth}},
      {"qk_nope_head_dim", c.qk_nope_dim, {0, kMaxHeadDim}},
      {"qk_rope_head_dim", c.qk_rope_dim, {0, kMaxHeadDim}},
      {"v_head_dim", c.v_head_dim, {0, kMaxHeadDim}},
      {"linear_attn_config.num_heads", c.kda_heads, {0, kMaxHeads}},
      {"linear_attn_config.head_dim", c.kda_head_dim, {0, kMaxHeadDim}},
      {"linear_attn_config.short_conv_kernel_size", c.conv_kernel, {1, kMaxConvKernel}},
      {"intermediate_size", c.intermediate_size, {0, kMaxIntermediate}},
      {"num_experts", c.num_experts, {0, kMaxExperts}},
      {"num_experts_per_token", c.experts_per_token, {0, kMaxExperts}},
      {"moe_intermediate_size", c.moe_intermediate_size, {0, kMaxIntermediate}},
      {"num_shared_experts", c.num_shared_experts, {0, kMaxSharedExperts}},
      {"first_k_dense_replace", c.first_k_dense_replace, {0, kMaxLayers}},
      {"moe_layer_freq", c.moe_layer_freq, {1, kMaxLayers}},
      {"num_expert_group", c.num_expert_group, {1, kMaxExperts}},
      {"topk_group", c.topk_group, {0, kMaxExperts}},
      {"routed_expert_hidden_size", c.routed_expert_hidden_size, {0, kMaxWidth}},
      {"attn_res_block_size", c.attn_res_block_size, {0, kMaxLayers}},
  };
  for (const Field& f : fields) KL_RETURN_IF_ERROR(check_range(f.value, f.range, w + ": " + f.name));
  KL_RETURN_IF_ERROR(check_range(c.rms_norm_eps, kMinEps, kMaxEps, w + ": rms_norm_eps"));
  KL_RETURN_IF_ERROR(check_range(c.routed_scaling_factor, kMinFactor, kMaxFactor, w + ": routed_scaling_factor"));
  KL_RETURN_IF_ERROR(check_range(c.situ_beta, kMinFactor, kMaxFactor, w + ": activation_situ_beta"));
  if (c.situ_linear_beta)
    KL_RETURN_IF_ERROR(check_range(*c.situ_linear_beta, kMinFactor, kMaxFactor, w + ": activation_situ_linear_beta"));
  if (c.kda_gate == KdaGate::kLowerBound)
    KL_RETURN_IF_ERROR(check_range(c.gate_lower_bound, -kMaxFactor, 0.0, w + ": linear_attn_config.gate_lower_bound"));
  if (c.kda_layers.size() > static_cast<size_t>(c.num_layers))
    return Status::InvalidArgument(w + ": linear_attn_config.kda_layers has " + std::to_string(c.kda_layers.size()) +
                                   " entries for " + std::to_string(c.num_layers) + " layers");
  if (c.eos_token_ids.size() > kMaxEosIds)
    return Status::InvalidArgument(w + ": eos_token_id lists " + std::to_string(c.eos_token_ids.size()) +
                                   " ids, expected at most " + std::to_string(kMaxEosIds));
  // The largest tensors the model will ask for, as element counts.
  const int64_t qk_head = c.qk_nope_dim + c.qk_rope_dim;  // both bounded: no overflow
  KL_RETURN_IF_ERROR(checked_product({c.vocab_size, c.hidden_size}, kMaxTensorElems, w + ": embedding size").status());
  KL_RETURN_IF_ERROR(checked_product({c.kda_heads, c.kda_head_dim, c.hidden_size}, kMaxTensorElems,
                                     w + ": KDA projection size").status());
  KL_RETURN_IF_ERROR(checked_product({c.mla_heads, qk_head + c.v_head_dim, std::max(c.kv_lora_rank, c.hidden_size)},
                                     kMaxTensorElems, w + ": MLA projection size").status());
  KL_RETURN_IF_ERROR(checked_product({c.num_experts, c.moe_intermediate_size, c.expert_io_dim()}, kMaxTensorElems,
                                     w + ": stacked routed experts size").status());
  KL_RETURN_IF_ERROR(checked_product({c.num_shared_experts, c.moe_intermediate_size, c.hidden_size}, kMaxTensorElems,
                                     w + ": shared experts size").status());
  KL_RETURN_IF_ERROR(checked_product({c.intermediate_size, c.hidden_size}, kMaxTensorElems, w + ": dense MLP size").status());
  return Status();
}

Status validate(const ModelConfig& c, const std::string& w) {
  KL_RETURN_IF_ERROR(check_bounds(c, w));  // every field in its range from here on
  std::set<int64_t> kda(c.kda_layers.begin(), c.kda_layers.end());
  if (kda.size() != c.kda_layers.size())
    return Status::InvalidArgument(w + ": linear_attn_config.kda_layers has duplicates");
  for (int64_t l : c.kda_layers)
    if (l < 1 || l > c.num_layers)
      return Status::InvalidArgument(w + ": linear_attn_config.kda_layers entry " + std::to_string(l) +
                                     " is outside 1.." + std::to_string(c.num_layers) + " (the list is 1-based)");
  bool any_mla = false;
  for (int64_t l = 0; l < c.num_layers; ++l) any_mla |= c.mixer(l) == Mixer::kMla;
  if (!kda.empty()) {
    KL_RETURN_IF_ERROR(positive(w, "linear_attn_config.num_heads", c.kda_heads));
    KL_RETURN_IF_ERROR(positive(w, "linear_attn_config.head_dim", c.kda_head_dim));
    if (c.kda_gate == KdaGate::kLowerBound && !(c.gate_lower_bound < 0))
      return Status::InvalidArgument(w + ": linear_attn_config.gate_lower_bound must be negative, got " +
                                     std::to_string(c.gate_lower_bound));
  }
  if (any_mla) {
    KL_RETURN_IF_ERROR(positive(w, "num_attention_heads", c.mla_heads));
    KL_RETURN_IF_ERROR(positive(w, "kv_lora_rank", c.kv_lora_rank));
    KL_RETURN_IF_ERROR(positive(w, "qk_nope_head_dim", c.qk_nope_dim));
    KL_RETURN_IF_ERROR(positive(w, "v_head_dim", c.v_head_dim));
  }
  bool any_dense = false, any_moe = false;
  for (int64_t l = 0; l < c.num_layers; ++l) (c.ffn(l) == Ffn::kMoe ? any_moe : any_dense) = true;
  if (any_dense) KL_RETURN_IF_ERROR(positive(w, "intermediate_size", c.intermediate_size));
  if (any_moe) {
    KL_RETURN_IF_ERROR(positive(w, "num_experts_per_token", c.experts_per_token));
    KL_RETURN_IF_ERROR(positive(w, "moe_intermediate_size", c.moe_intermediate_size));
    if (c.experts_per_token > c.num_experts)
      return Status::InvalidArgument(w + ": num_experts_per_token " + std::to_string(c.experts_per_token) +
                                     " exceeds num_experts " + std::to_string(c.num_experts));
    if (c.num_experts % c.num_expert_group != 0)
      return Status::InvalidArgument(w + ": num_experts " + std::to_string(c.num_experts) +
                                     " is not divisible by num_expert_group " + std::to_string(c.num_expert_group));
    if (c.topk_group <= 0 || c.topk_group > c.num_expert_group)
      return Status::InvalidArgument(w + ": topk_group " + std::to_string(c.topk_group) + " must be in 1.." +
                                     std::to_string(c.num_expert_group));
    if (c.grouped_selection()) {
      const int64_t per_group = c.num_experts / c.num_expert_group;
      if (per_group < 2)
        return Status::InvalidArgument(w + ": grouped top-k needs at least 2 experts per group, got " +
                                       std::to_string(per_group));
      if (c.topk_group * per_group < c.experts_per_token)
        return Status::InvalidArgument(w + ": topk_group " + std::to_string(c.topk_group) + " groups of " +
                                       std::to_string(per_group) + " experts cannot hold num_experts_per_token " +
                                       std::to_string(c.experts_per_token));
    }
    if (c.expert_format == ExpertFormat::kMxfp4 && (c.expert_io_dim() % 32 != 0 || c.moe_intermediate_size % 32 != 0))
      return Status::InvalidArgument(w + ": MXFP4 experts need input widths divisible by 32 (expert input " +
                                     std::to_string(c.expert_io_dim()) + ", intermediate " +
                                     std::to_string(c.moe_intermediate_size) + ")");
  }
  if (c.bos_token_id >= c.vocab_size)  // ids are range-checked when read; this keeps the invariant local
    return Status::InvalidArgument(w + ": bos_token_id " + std::to_string(c.bos_token_id) + " is outside the vocabulary");
  return Status();
}

}  // namespace

Result<ModelConfig> parse_model_config(const Json& doc, const std::string& where) {
  if (!doc.is_object()) return Status::InvalidArgument(where + ": must be a JSON object");
  ModelConfig c;
  KL_ASSIGN_OR_RETURN(auto top_type, json_opt_string(doc, "model_type", where));
  c.model_type = top_type.value_or("");
  const Json* text = &doc;
  std::string w = where;
  auto tc = doc.find("text_config");
  if (tc != doc.end() && !tc->is_null()) {
    if (!tc->is_object()) return Status::InvalidArgument(where + ": text_config must be an object");
    text = &*tc;
    w = where + ".text_config";
    c.nested_text_config = true;
  }
  const Reader r{*text, w};
  KL_RETURN_IF_ERROR(r.req("vocab_size", &c.vocab_size));
  KL_RETURN_IF_ERROR(check_range(c.vocab_size, IntRange{1, kMaxVocab}, w + ": vocab_size"));
  KL_RETURN_IF_ERROR(r.req("hidden_size", &c.hidden_size));
  KL_RETURN_IF_ERROR(r.req("num_hidden_layers", &c.num_layers));
  KL_RETURN_IF_ERROR(r.opt("rms_norm_eps", &c.rms_norm_eps));
  KL_RETURN_IF_ERROR(r.opt("tie_word_embeddings", &c.tie_word_embeddings));
  KL_RETURN_IF_ERROR(r.opt("max_position_embeddings", &c.max_position_embeddings));
  if (c.max_position_embeddings == 0) KL_RETURN_IF_ERROR(r.opt("model_max_length", &c.max_position_embeddings));

  // Token ids: the text config first, then the top level (K3 keeps them in both).
  bool have_bos = false;
  for (const Json* src : {text, &doc}) {
    const std::string& sw = src == text ? w : where;
    if (!have_bos) {
      KL_ASSIGN_OR_RETURN(auto bos, token_ids(*src, "bos_token_id", sw, c.vocab_size, TokenIdForm::kOne));
      if (bos) c.bos_token_id = bos->front();
      have_bos = bos.has_value();
    }
    if (c.eos_token_ids.empty()) {
      KL_ASSIGN_OR_RETURN(auto eos, token_ids(*src, "eos_token_id", sw, c.vocab_size, TokenIdForm::kOneOrList));
      if (eos) c.eos_token_ids = *eos;
    }
  }

  KL_RETURN_IF_ERROR(r.opt("num_attention_heads", &c.mla_heads));
  KL_RETURN_IF_ERROR(r.opt("q_lora_rank", &c.q_lora_rank));
  KL_RETURN_IF_ERROR(r.opt("kv_lora_rank", &c.kv_lora_rank));
  KL_RETURN_IF_ERROR(r.opt("qk_nope_head_dim", &c.qk_nope_dim));
  KL_RETURN_IF_ERROR(r.opt("qk_rope_head_dim", &c.qk_rope_dim));
  KL_RETURN_IF_ERROR(r.opt("v_head_dim", &c.v_head_dim));
  KL_RETURN_IF_ERROR(r.opt("mla_use_output_gate", &c.mla_output_gate));
  bool use_nope = true, use_rope = false;
  KL_RETURN_IF_ERROR(r.opt("mla_use_nope", &use_nope));
  KL_RETURN_IF_ERROR(r.opt("mla_use_rope", &use_rope));
  if (!use_nope || use_rope)
    return Status::NotSupported(w + ": MLA with rotary embeddings (mla_use_nope=false or mla_use_rope=true) is not "
                                "supported; the Kimi Linear family is NoPE (docs/MODEL.md 5.1)");

  auto lac = text->find("linear_attn_config");
  if (lac != text->end() && !lac->is_null()) {
    const Reader l{*lac, w + ".linear_attn_config"};
    KL_RETURN_IF_ERROR(l.opt("num_heads", &c.kda_heads));
    KL_RETURN_IF_ERROR(l.opt("head_dim", &c.kda_head_dim));
    KL_RETURN_IF_ERROR(l.opt("short_conv_kernel_size", &c.conv_kernel));
    KL_ASSIGN_OR_RETURN(auto kda_layers, json_opt_int_list(*lac, "kda_layers", l.where));
    c.kda_layers = kda_layers.value_or(std::vector<int64_t>{});
    KL_ASSIGN_OR_RETURN(auto lb, json_opt_number(*lac, "gate_lower_bound", l.where));
    if (lb) {
      c.kda_gate = KdaGate::kLowerBound;
      c.gate_lower_bound = static_cast<float>(*lb);
    }
    bool full_rank = false;
    KL_RETURN_IF_ERROR(l.opt("use_full_rank_gate", &full_rank));
    c.kda_output_gate = full_rank ? KdaOutputGate::kFullRank : KdaOutputGate::kLowRank;
  }

  KL_ASSIGN_OR_RETURN(auto act, json_opt_string(*text, "hidden_act", w));
  const std::string act_name = act.value_or("silu");
  if (act_name == "silu" || act_name == "swiglu") c.activation = Activation::kSilu;
  else if (act_name == "situ") c.activation = Activation::kSitu;
  else return Status::NotSupported(w + ": hidden_act '" + act_name + "' is not supported (expected silu or situ)");
  KL_RETURN_IF_ERROR(r.opt("activation_situ_beta", &c.situ_beta));
  if (c.situ_beta == 0.0f) c.situ_beta = 1.0f;  // MODEL.md 3.2: a missing value or 0 means 1
  KL_ASSIGN_OR_RETURN(auto lin_beta, json_opt_number(*text, "activation_situ_linear_beta", w));
  if (lin_beta) c.situ_linear_beta = static_cast<float>(*lin_beta);

  KL_RETURN_IF_ERROR(r.opt("intermediate_size", &c.intermediate_size));
  KL_RETURN_IF_ERROR(r.opt("num_experts", &c.num_experts));
  KL_RETURN_IF_ERROR(r.opt("n_routed_experts", &c.num_experts));
  KL_RETURN_IF_ERROR(r.opt("num_experts_per_token", &c.experts_per_token));
  KL_RETURN_IF_ERROR(r.opt("num_experts_per_tok", &c.experts_per_token));
  KL_RETURN_IF_ERROR(r.opt("moe_intermediate_size", &c.moe_intermediate_size));
  KL_RETURN_IF_ERROR(r.opt("num_shared_experts", &c.num_shared_experts));
  KL_RETURN_IF_ERROR(r.opt("first_k_dense_replace", &c.first_k_dense_replace));
  KL_RETURN_IF_ERROR(r.opt("moe_layer_freq", &c.moe_layer_freq));
  KL_RETURN_IF_ERROR(r.opt("use_grouped_topk", &c.use_grouped_topk));
  KL_RETURN_IF_ERROR(r.opt("num_expert_group", &c.num_expert_group));
  KL_RETURN_IF_ERROR(r.opt("topk_group", &c.topk_group));
  KL_RETURN_IF_ERROR(r.opt("moe_renormalize", &c.moe_renormalize));
  KL_RETURN_IF_ERROR(r.opt("routed_scaling_factor", &c.routed_scaling_factor));
  KL_RETURN_IF_ERROR(r.opt("routed_expert_hidden_size", &c.routed_expert_hidden_size));
  KL_RETURN_IF_ERROR(r.opt("latent_moe_use_norm", &c.latent_moe_use_norm));
  KL_ASSIGN_OR_RETURN(auto router_act, json_opt_string(*text, "moe_router_activation_func", w));
  if (router_act && *router_act != "sigmoid")
    return Status::NotSupported(w + ": moe_router_activation_func '" + *router_act + "' is not supported (expected sigmoid)");
  KL_RETURN_IF_ERROR(r.opt("attn_res_block_size", &c.attn_res_block_size));
  // The NPU runner's attn_res_mode picks how it schedules AttnRes (original, fused, or two_phase for
  // any other value); every mode computes the same sums (MODEL.md 7), which klinear computes one way, so
  // each mode gives this model's output. Checked, not stored.
  KL_ASSIGN_OR_RETURN(auto attn_res_mode, json_opt_string(*text, "attn_res_mode", w));
  if (attn_res_mode && c.attn_res_block_size == 0)
    return Status::InvalidArgument(w + ": attn_res_mode '" + *attn_res_mode + "' is set but the model has no AttnRes "
                                   "blocks (attn_res_block_size 0)");
  KL_RETURN_IF_ERROR(parse_quantization(*text, w, &c));

  KL_RETURN_IF_ERROR(validate(c, w));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  KL_ASSIGN_OR_RETURN(PathKind kind, path_kind(model_dir));
  if (kind != PathKind::kDirectory)
    return Status::NotFound("model directory '" + model_dir + "' does not exist or is not a directory");
  const std::string path = model_dir + "/config.json";
  KL_ASSIGN_OR_RETURN(Json doc, read_json_file(path));
  return parse_model_config(doc, path);
}

}  // namespace klinear
