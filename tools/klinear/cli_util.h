// Small helpers shared by the CLI subcommands: error printing and the sampling options common to
// generate and chat (their checks included). Number parsing lives in cli_parse.h.
#pragma once

#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "cli_parse.h"
#include "core/status.h"
#include "io/json.h"
#include "model/shard.h"
#include "runtime/generate.h"
#include "runtime/settings.h"

namespace klinear::cli {

// Prints "klinear <cmd>: <status>" and returns the exit code: 2 for bad input (a missing or
// malformed file, directory, flag or id), 1 for anything else.
inline int fail(const char* cmd, const Status& s) {
  std::fprintf(stderr, "klinear %s: %s\n", cmd, s.to_string().c_str());
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruption:
    case StatusCode::kNotSupported:
    case StatusCode::kIOError: return 2;
    default: return 1;
  }
}

// Largest --max-tokens / --top-k accepted (far beyond any context or vocabulary we load).
// --cuda-graphs on|off and --attention-kernels best|own for every command that runs a model on a
// device (parsed by parse_cuda_graphs and parse_attention_kernels into BackendOptions; the CPU runs
// eagerly, on its one kernel of each op, either way).
inline void add_cuda_options(CLI::App* sub, std::string& graphs, std::string& attention) {
  sub->add_option("--cuda-graphs", graphs,
                  "on or off: run decode steps as CUDA graphs captured per batch bucket (cuda only; "
                  "the results are the same either way)")
      ->check(parsed_by(parse_cuda_graphs, "on|off"))
      ->capture_default_str();
  sub->add_option("--attention-kernels", attention,
                  "best or own: MLA attention on FlashInfer's Hopper kernels where they fit and are the faster, "
                  "or on klinear's own everywhere (cuda only; the same results within bfloat16 rounding)")
      ->check(parsed_by(parse_attention_kernels, "best|own"))
      ->capture_default_str();
}

inline constexpr int64_t kMaxFlagCount = int64_t{1} << 30;

// --device and --dtype of every command that loads a model, checked when the command line is parsed.
inline void add_device_options(CLI::App* sub, std::string& device, std::string& dtype) {
  sub->add_option("--device", device, "cpu or cuda")->check(parsed_by(parse_device, "cpu|cuda"))->capture_default_str();
  sub->add_option("--dtype", dtype, "float32 or bfloat16 (default: float32 on the CPU, bfloat16 on CUDA)")
      ->check(parsed_by([](const std::string& name) { return parse_compute_dtype(name, Device::kCpu); },
                        "float32|bfloat16"));
}

// The degrees of a model split over the ranks of an mpirun launch (model/shard.h), under vLLM's
// flag names where it has one; the seed runner's parallel_config names in the help.
struct ParallelArgs {
  int tensor = 1, data = 1, expert = 1;
  bool enable_expert = false;  // the experts over every rank
  int embed = 0, lm_head = 0;  // 0: the tensor-parallel size
  std::string settings;        // --settings FILE (runtime/settings.h): its parallel_config instead of the flags
  mutable std::shared_ptr<RunnerSettings> loaded;  // the file, read once (runner_settings)
  // The sizes the flags give (world 1 until the launch is known; expert 0: every rank).
  ParallelSizes flag_sizes() const {
    return ParallelSizes{1, tensor, data, enable_expert ? 0 : expert, embed ? embed : tensor, lm_head ? lm_head : tensor};
  }
  bool flags_given() const {
    return tensor != 1 || data != 1 || expert != 1 || enable_expert || embed != 0 || lm_head != 0;
  }
};

// The settings file (read on first use), or null without --settings.
inline Result<RunnerSettings*> runner_settings(const ParallelArgs& p) {
  if (p.settings.empty()) return static_cast<RunnerSettings*>(nullptr);
  if (!p.loaded) {
    KL_ASSIGN_OR_RETURN(RunnerSettings s, read_runner_settings(p.settings));
    p.loaded = std::make_shared<RunnerSettings>(std::move(s));
  }
  return p.loaded.get();
}

// `value` (the variable of `flag`, a subcommand's option) from the settings field `key` where the
// file has it (a positive integer, checked when read); the flag given as well is an error naming both.
template <typename Int>
Status take_setting(const CLI::App& sub, const ParallelArgs& p, const char* key, const char* flag, Int& value) {
  KL_ASSIGN_OR_RETURN(RunnerSettings* s, runner_settings(p));
  const Json* v = s ? s->take(key) : nullptr;
  if (!v) return Status();
  if (sub.count(flag) > 0)
    return Status::InvalidArgument("--settings " + p.settings + ": " + key + " and " + flag +
                                   " both set it: give one of them");
  if (v->get<int64_t>() > std::numeric_limits<Int>::max())
    return Status::InvalidArgument("--settings " + p.settings + ": " + key + " " + v->dump() + ": too large");
  value = static_cast<Int>(v->get<int64_t>());
  return Status();
}

// The layout of a run: the flags', or the settings file's parallel_config; both at once is an
// error naming them.
inline Result<ParallelSizes> run_parallel(const ParallelArgs& p) {
  KL_ASSIGN_OR_RETURN(RunnerSettings* s, runner_settings(p));
  if (!s || !s->parallel) return p.flag_sizes();
  if (p.flags_given())
    return Status::InvalidArgument("--settings " + p.settings + ": the parallel sizes come from its parallel_config "
                                   "or from the flags (--tensor-parallel-size, --data-parallel-size, "
                                   "--expert-parallel-size, --enable-expert-parallel, --embed-tp-size, "
                                   "--lmhead-tp-size), not both");
  return *s->parallel;
}

// Says on stderr which fields of the settings file no part of the command took (rank 0 alone
// calls it, after the command took its settings).
inline void note_unused_settings(const ParallelArgs& p) {
  if (!p.loaded) return;
  std::string names;
  for (const std::string& n : p.loaded->unused()) names += (names.empty() ? "" : ", ") + n;
  if (!names.empty())
    std::fprintf(stderr, "klinear: --settings %s: not used by klinear yet: %s\n", p.settings.c_str(), names.c_str());
}

// --batch-invariant (BatchInvariance): a request's results the same bits whatever it is batched with.
inline void add_batch_invariant_option(CLI::App* sub, bool& on) {
  sub->add_flag("--batch-invariant", on,
                "compute every row the same way whatever else is in the step, so a request gives the same logits "
                "and tokens alone or beside any others (CPU; slower: row-stable products, prefill chunks on "
                "64-token boundaries)");
}

inline void add_parallel_options(CLI::App* sub, ParallelArgs& p) {
  const auto degree = CLI::Range(1, 1 << 16);
  sub->add_option("--tensor-parallel-size,--tp", p.tensor,
                  "ranks the attention heads, the dense FFN and the shared experts are split over (attn_tp_size); "
                  "run under mpirun -np N")
      ->check(degree)
      ->capture_default_str();
  sub->add_option("--data-parallel-size", p.data, "data-parallel attention (attn_dp_size): not built yet beyond 1")
      ->check(degree)
      ->capture_default_str();
  sub->add_option("--expert-parallel-size", p.expert, "ranks the routed experts are split over (moe_ep_size): 1 or all")
      ->check(degree)
      ->capture_default_str();
  sub->add_flag("--enable-expert-parallel", p.enable_expert, "split the routed experts over every rank");
  sub->add_option("--embed-tp-size", p.embed, "ranks the embedding's vocabulary is split over: 1 or the tensor-parallel "
                                              "size (default)")
      ->check(degree);
  sub->add_option("--lmhead-tp-size", p.lm_head, "ranks the lm head's vocabulary is split over: 1 or the "
                                                 "tensor-parallel size (default)")
      ->check(degree);
  sub->add_option("--settings", p.settings,
                  "the seed runner's settings (JSON: model_config, parallel_config, data_config): parallel_config gives "
                  "the sizes by its names (world_size, attn_tp_size, attn_dp_size, moe_tp_size, moe_ep_size, "
                  "dense_tp_size, shared_tp_size, oproj_tp_size, embed_tp_size, lmhead_tp_size) instead of the flags "
                  "above; of the others pa_block_size, batch_size_per_rank and max_new_tokens set the page size, the "
                  "sequences at once and the tokens to generate where the command has them, the rest is checked and "
                  "named on stderr as not used yet");
}

inline void add_generate_options(CLI::App* sub, GenerateOptions& o) {
  sub->add_option("--max-tokens", o.max_tokens, "maximum number of tokens to generate")
      ->check(int_in({0, kMaxFlagCount}))
      ->capture_default_str();
  sub->add_option("--temperature", o.sampling.temperature, "sampling temperature; 0 is greedy")
      ->check(number_in(0, 1e4))
      ->capture_default_str();
  sub->add_option("--top-k", o.sampling.top_k, "sample from the k most likely tokens (0: all)")
      ->check(int_in({0, kMaxFlagCount}))
      ->capture_default_str();
  sub->add_option("--top-p", o.sampling.top_p, "nucleus sampling probability mass, in (0, 1]")
      ->check(number_in(0, 1))
      ->capture_default_str();
  sub->add_option("--seed", o.sampling.seed, "random seed for sampling")->check(uint64_any())->capture_default_str();
  sub->add_flag("--ignore-eos", o.ignore_eos, "do not stop at the end-of-sequence id");
}

// Everything generate and chat can check about their options before loading anything.
inline Status validate_generate_options(const GenerateOptions& o) {
  KL_RETURN_IF_ERROR(validate_sampling(o.sampling));
  return check_range(o.max_tokens, IntRange{0, kMaxFlagCount}, "max_tokens");
}

// Prints the generated ids: one JSON object with --json, else the ids on one line. `text` is the
// decoded text when a tokenizer is available.
inline void print_generation(const GenerateResult& r, bool json, const std::string* text) {
  if (json) {
    Json out{{"ids", r.ids},
             {"finish_reason", r.finish == FinishReason::kStop ? "stop" : "length"},
             {"context_full", r.finish == FinishReason::kContext},
             {"prompt_tokens", r.prompt_tokens},
             {"prefill_seconds", r.prefill_seconds},
             {"decode_seconds", r.decode_seconds}};
    if (text) out["text"] = *text;
    std::printf("%s\n", out.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
    return;
  }
  std::string line;
  for (size_t i = 0; i < r.ids.size(); ++i) line += (i ? "," : "") + std::to_string(r.ids[i]);
  std::printf("%s\n", line.c_str());
}

}  // namespace klinear::cli
