// The model on configs the fixtures do not cover (other sizes, layer tables, gate variants, group
// counts, AttnRes block sizes, MXFP4), on every backend row: random-weight checkpoints written with
// real tensor names, then one prompt run three ways that must agree: a single prefill (chunked KDA,
// expanded MLA), a prefill in two pieces, and a short prefill followed by token-by-token decode
// (recurrent KDA, absorbed MLA over the latent pages, conv state carried). A row other than the
// CPU also matches the CPU's single prefill (a reduced-precision row under the CPU's routing).
#include <gtest/gtest.h>

#include "backend_cases.h"
#include "bf16_reference.h"
#include "model/model.h"
#include "model_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::BackendCase;
using testing::ErrorShape;

struct Variant {
  const char* name;
  const char* preset;
  Json text_patch;  // merged into the text config
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class ModelConsistency : public ::testing::TestWithParam<std::tuple<Variant, BackendCase>> {};

// Logits of `ids` run in the given pieces on a fresh sequence; [T, V] host F32 of every position.
Tensor run_pieces(Model& m, std::span<const int32_t> ids, const std::vector<int64_t>& cuts) {
  auto cache = Cache::create(m.config(), m.backend(), CacheOptions{1, 16, 64 << 20});
  KL_CHECK(cache.ok(), cache.status().to_string());
  const SeqId s = (*cache)->open().value();
  Tensor all = Tensor::empty(DType::kF32, {static_cast<int64_t>(ids.size()), m.config().vocab_size});
  int64_t begin = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const int64_t end = i < cuts.size() ? cuts[i] : static_cast<int64_t>(ids.size());
    auto r = m.forward_one(**cache, s, ids.subspan(begin, end - begin), LogitsMode::kAll);
    KL_CHECK(r.ok(), r.status().to_string());
    std::memcpy(all.f32() + begin * all.dim(1), r->f32(), r->nbytes());
    begin = end;
  }
  return all;
}

TEST_P(ModelConsistency, PrefillPiecesAndDecodeAgree) {
  const auto& [v, row] = GetParam();
  auto be = make_backend(BackendOptions{row.device, row.dtype});
  if (!be.ok()) GTEST_SKIP() << row.name << ": " << be.status().to_string();
  auto cpu = make_backend(BackendOptions{});
  ASSERT_TRUE(cpu.ok());
  const testing::ScratchDir scratch;
  const Json config = testing::patched_preset(v.preset, v.text_patch);
  const size_t moe_layers = testing::moe_layers(parse_model_config(config, "the test config").value());
  std::vector<int32_t> ids;
  // Logits of the prompt run in `cuts` pieces on `backend` (a fresh model and sequence).
  auto run = [&](Backend& backend, const std::vector<int64_t>& cuts) {
    auto model = Model::load(scratch.str(), backend);
    KL_CHECK(model.ok(), model.status().to_string());
    return run_pieces(**model, ids, cuts);
  };

  // A float32 row decides its own routing and meets kModelPaths (test_util.h). A reduced-precision
  // row runs under the CPU reference's routing, within six times the error em of a bf16 evaluation
  // on the CPU (tests/model/bf16_reference.h): the comparisons here are between two bf16 runs, each about em
  // from the reference plus what the emulation leaves out (the device kernels' bf16 operands: the
  // KDA state and W/U in the chunked prefill, the MLA latent in decode), which a chaotic draw
  // amplifies. On the H200, k3_block3_lowrank draws had decode and prefill 3.1 em apart (em 0.17),
  // 3.3 em apart (em 0.105, decode position 61) and 5.0 em apart (em 0.156, decode position 43; all
  // in 2026-12-01): the bound is six em. The float32 rows are the exactness check. Random K3 checkpoints
  // are chaotic in bf16 (em over five draws each, CPU: kimi_linear 0.007, k3 0.12-0.36, k3_mxfp4
  // 0.10-0.42, k3_block3_lowrank 0.29-0.40; on the H200 sixteen k3_block3_lowrank draws in a row
  // stayed over 0.15): the checkpoint is redrawn until em < 0.15, at most 16 times, and the
  // calmest draw is kept; em ≥ 0.5 (a bound near the size of the logits) fails.
  testing::RouteTrace::Record routes;
  Tensor reference, emu_all;  // the fp32 reference and the bf16 emulation of the whole prompt
  double tol = testing::kModelPaths.rel(DType::kF32);
  // The prompt on the CPU with bf16 storage, under the reference's routing.
  auto emulated = [&](const std::vector<int64_t>& cuts) {
    testing::Bf16Storage bf16(**cpu);
    testing::RouteTrace replay(bf16, testing::RouteTrace::Mode::kReplay, routes, moe_layers);
    return run(replay, cuts);
  };
  uint64_t calmest = 0;
  double calmest_em = INFINITY;
  for (int draw = 0;; ++draw) {
    const uint64_t seed = draw < 16 ? testing::fresh_seed() : calmest;  // the last pass redoes the calmest
    ids = testing::random_ids(config, 75, seed);
    testing::write_untied_checkpoint(config, scratch.str(), {ids}, seed);
    if (row.device == Device::kCpu) break;
    testing::RouteTrace record(**cpu, testing::RouteTrace::Mode::kRecord, routes, moe_layers);
    reference = run(record, {});
    if (row.dtype == DType::kF32) break;
    emu_all = emulated({});
    const double em = testing::error_stats(emu_all, reference).worst();
    if (em < calmest_em) calmest_em = em, calmest = seed;
    if (em < 0.15 || draw == 16) {
      std::printf("[ em ] %.4f (draw %d)\n", em, draw);
      ASSERT_LT(em, 0.5) << "no draw whose bf16 emulation stays near the fp32 reference";
      tol = std::max(testing::kModel.rel(row.dtype), 6 * em);
      break;
    }
  }
  auto on_row = [&](const std::vector<int64_t>& cuts) {
    if (row.dtype == DType::kF32) return run(**be, cuts);
    testing::RouteTrace replay(**be, testing::RouteTrace::Mode::kReplay, routes, moe_layers);
    return run(replay, cuts);
  };

  std::vector<int64_t> one_by_one;
  for (int64_t i = 3; i < 75; ++i) one_by_one.push_back(i);
  if (row.device != Device::kCpu) {
    // The bound is also three times what the CPU's own decode differs from its own prefill, position
    // by position (bf16 rows: its bf16 emulation's, k3_block3_lowrank 0.02-0.08): how much a draw
    // amplifies the roundings of two evaluation orders is measured, not guessed. A float32 row
    // needs it as well: the H100 measured 1.0e-3 at decode position 14 of a k3_block3_lowrank draw
    // (seed 3364213178, 2026-12-05) against the fixed 5e-4.
    const bool f32 = row.dtype == DType::kF32;
    const Tensor own_all = f32 ? reference : emu_all;
    const Tensor own_dec = f32 ? run(**cpu, one_by_one) : emulated(one_by_one);
    double ed = 0;
    for (int64_t i = 3; i < 75; ++i)
      ed = std::max(ed, testing::error_stats(own_dec.rows(i, i + 1), own_all.rows(i, i + 1)).worst());
    std::printf("[ ed ] %.4f\n", ed);
    tol = std::max(tol, 3 * ed);
  }
  const Tensor all = on_row({});
  EXPECT_TRUE(testing::all_close(on_row({70}).rows(70, 75), all.rows(70, 75), tol, ErrorShape::kAmplified))
      << "piecewise prefill";
  const Tensor dec = on_row(one_by_one);
  for (int64_t i = 3; i < 75; ++i)
    ASSERT_TRUE(testing::all_close(dec.rows(i, i + 1), all.rows(i, i + 1), tol, ErrorShape::kAmplified))
        << "decode position " << i;
  if (row.device != Device::kCpu) {
    EXPECT_TRUE(testing::all_close(all, reference, tol, ErrorShape::kAmplified)) << "against the CPU";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ModelConsistency,
    ::testing::Combine(::testing::Values(
        Variant{"kimi_linear", "kimi-linear-tiny", Json::object()},
        Variant{"kimi_linear_wide", "kimi-linear-tiny",
                Json{{"hidden_size", 96}, {"num_hidden_layers", 4}, {"num_attention_heads", 3},
                     {"num_experts", 12}, {"num_experts_per_token", 3}, {"num_expert_group", 3}, {"topk_group", 1},
                     {"num_shared_experts", 0}, {"first_k_dense_replace", 2}, {"kv_lora_rank", 24},
                     {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 8}, {"v_head_dim", 12},
                     {"linear_attn_config", {{"num_heads", 3}, {"head_dim", 16}, {"short_conv_kernel_size", 3},
                                             {"kda_layers", {2, 3}}, {"full_attn_layers", {1, 4}}}}}},
        Variant{"kimi_linear_lb_gate", "kimi-linear-tiny",
                Json{{"hidden_act", "situ"}, {"activation_situ_beta", 2.0},
                     {"linear_attn_config", {{"gate_lower_bound", -3.0}}}}},
        Variant{"k3", "k3-tiny", Json::object()},
        Variant{"k3_block3_lowrank", "k3-tiny",
                Json{{"attn_res_block_size", 3}, {"num_hidden_layers", 7}, {"q_lora_rank", nullptr},
                     {"latent_moe_use_norm", false}, {"moe_layer_freq", 2},
                     {"num_experts", 8}, {"num_experts_per_token", 2}, {"num_shared_experts", 1},
                     {"routed_expert_hidden_size", 32}, {"activation_situ_linear_beta", nullptr},
                     {"linear_attn_config", {{"use_full_rank_gate", false}, {"kda_layers", {1, 3, 4, 5, 7}},
                                             {"full_attn_layers", {2, 6}}}}}},
        Variant{"k3_mxfp4", "k3-tiny-mxfp4", Json{{"num_expert_group", 4}, {"topk_group", 2}}}),
        ::testing::ValuesIn(testing::backend_cases())),
    [](const auto& info) { return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name; });

}  // namespace
}  // namespace klinear
