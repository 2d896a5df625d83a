// Model subcommands: logits, generate, info, init. Each is a thin call into src/.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "backend/backend.h"
#include "cli_util.h"
#include "commands.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/npy.h"
#include "model/model.h"
#include "model/weights.h"
#include "io/presets.h"
#include "chat/chat_format.h"
#include "io/tokenizer.h"
#include "runtime/chat_session.h"
#include "runtime/generate.h"
#include "runtime/model_world.h"
#include "dist/mpi_comm.h"

namespace klinear::cli {

namespace {

struct ModelArgs {
  std::string model_dir;
  std::string device = "cpu";
  std::string dtype;  // empty: float32 on the CPU, bfloat16 on CUDA
  int64_t page_size = 64;
  bool check_finite = false;
  std::string load_format = "safetensors";
  std::string cuda_graphs = "on";
  std::string attention_kernels = "best";
  bool batch_invariant = false;
  ParallelArgs parallel;
};

// The settings file's fields the model commands take (before they run): the page size, and for
// generate and chat (`max_tokens` given) the tokens to generate.
Status take_model_settings(const CLI::App& sub, ModelArgs& a, int* max_tokens) {
  KL_RETURN_IF_ERROR(take_setting(sub, a.parallel, "pa_block_size", "--page-size", a.page_size));
  return max_tokens ? take_setting(sub, a.parallel, "max_new_tokens", "--max-tokens", *max_tokens) : Status();
}

void add_model_args(CLI::App* sub, ModelArgs& a) {
  sub->add_option("--model", a.model_dir, "checkpoint directory (config.json + safetensors)")->required();
  add_device_options(sub, a.device, a.dtype);
  sub->add_option("--page-size", a.page_size, "positions per page of the MLA latent cache")->capture_default_str();
  add_batch_invariant_option(sub, a.batch_invariant);
  sub->add_option("--load-format", a.load_format,
                  "safetensors, or dummy: seeded random weights from config.json alone (real shapes, no download)")
      ->check(parsed_by(parse_load_format, "safetensors|dummy"))
      ->capture_default_str();
  sub->add_flag("--check-finite", a.check_finite,
                "check every layer's output and name the first one that is not finite (slower)");
  add_cuda_options(sub, a.cuda_graphs, a.attention_kernels);
  add_parallel_options(sub, a.parallel);
}

// Every rank of a launch runs the same command on its part of the model (the same steps, the
// tokens agreed through Model::first_rank_token); rank 0 writes the files and stdout.
struct LoadedModel {
  std::unique_ptr<Backend> backend;
  ModelWorld world;
  std::unique_ptr<Model> model;
  CacheOptions cache_options;  // one sequence
};

// The model's cache for one sequence, with that sequence open.
struct OneSequence {
  std::unique_ptr<Cache> cache;
  SeqId seq = 0;
};
Result<OneSequence> open_sequence(const LoadedModel& m) {
  OneSequence s;
  KL_ASSIGN_OR_RETURN(s.cache, Cache::create(m.model->config(), *m.backend, m.cache_options));
  KL_ASSIGN_OR_RETURN(s.seq, s.cache->open());
  return s;
}

Result<LoadedModel> load(const ModelArgs& a) {
  BackendOptions o;
  KL_ASSIGN_OR_RETURN(o.device, parse_device(a.device));
  KL_ASSIGN_OR_RETURN(o.dtype, parse_compute_dtype(a.dtype, o.device));
  KL_ASSIGN_OR_RETURN(o.graphs, parse_cuda_graphs(a.cuda_graphs));
  KL_ASSIGN_OR_RETURN(o.attention, parse_attention_kernels(a.attention_kernels));
  o.batch_invariance = a.batch_invariant ? BatchInvariance::kOn : BatchInvariance::kOff;
  KL_RETURN_IF_ERROR(check_page_size(a.page_size));
  o.gpu = launched_by_mpi() ? launcher_local_rank() : -1;
  LoadedModel m;
  KL_ASSIGN_OR_RETURN(m.backend, make_backend(o));
  KL_ASSIGN_OR_RETURN(LoadFormat format, parse_load_format(a.load_format));
  KL_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(a.model_dir));
  KL_ASSIGN_OR_RETURN(ParallelSizes sizes, run_parallel(a.parallel));
  KL_ASSIGN_OR_RETURN(m.world, open_model_world(sizes, config, *m.backend));
  if (m.world.leader()) note_unused_settings(a.parallel);
  KL_ASSIGN_OR_RETURN(m.model, Model::load(a.model_dir, *m.backend, format, m.world.model_ranks()));
  m.model->set_check_finite(a.check_finite);
  m.cache_options.page_size = a.page_size;
  return m;
}

// ---- logits
struct LogitsArgs {
  ModelArgs model;
  std::string ids, then, out;
};

int run_logits(const LogitsArgs& a) {
  auto ids = parse_id_list(a.ids, "--ids");
  if (!ids.ok()) return fail("logits", ids.status());
  std::vector<int32_t> then;
  if (!a.then.empty()) {
    auto t = parse_id_list(a.then, "--then");
    if (!t.ok()) return fail("logits", t.status());
    then = *t;
  }
  auto m = load(a.model);
  if (!m.ok()) return fail("logits", m.status());
  auto seq = open_sequence(*m);
  if (!seq.ok()) return fail("logits", seq.status());
  const auto start = std::chrono::steady_clock::now();
  auto logits = m->model->forward_one(*seq->cache, seq->seq, *ids, LogitsMode::kAll);
  if (logits.ok() && !then.empty()) logits = m->model->forward_one(*seq->cache, seq->seq, then, LogitsMode::kAll);
  if (!logits.ok()) return fail("logits", logits.status());
  const int64_t first = seq->cache->tokens(seq->seq) - logits->dim(0);
  if (Status finite = check_finite_logits(*logits, first); !finite.ok()) return fail("logits", finite);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!m->world.leader()) return 0;
  Status s = write_npy(a.out, *logits);
  if (!s.ok()) return fail("logits", s);
  const int64_t tokens = seq->cache->tokens(seq->seq);
  std::fprintf(stderr, "klinear logits: %lld tokens in %.3f s (%.1f tokens/s), wrote %s %s\n",
               static_cast<long long>(tokens), secs, static_cast<double>(tokens) / secs, a.out.c_str(),
               shape_to_string(logits->shape()).c_str());
  return 0;
}

// ---- info
struct InfoArgs {
  std::string model_dir;
  bool verify = false;
  std::string load_format = "safetensors";
  ParallelArgs parallel;
  int64_t context = 0;        // --context: tokens a sequence holds (0: no cache total)
  int64_t max_num_seqs = 1;   // --max-num-seqs: sequences at that context
};

// With a layout over ranks (or --context): what one rank holds of the weights and caches (every
// rank holds an equal part), beside the whole model, as the CUDA backend holds them by default
// (bfloat16 weights and activations, MXFP4 routed experts packed); with --context, the
// caches of --max-num-seqs sequences of that many tokens (the MLA latent by the token, no pages'
// rounding).
Status print_rank_plan(const ModelConfig& c, const InfoArgs& a) {
  KL_ASSIGN_OR_RETURN(ParallelSizes sizes, run_parallel(a.parallel));
  note_unused_settings(a.parallel);
  sizes.world = sizes.tensor * sizes.data;
  if (sizes.expert == 0) sizes.expert = sizes.world;
  if (sizes.world == 1 && sizes.expert == 1 && sizes.embed == 1 && sizes.lm_head == 1 && a.context == 0)
    return Status();
  KL_RETURN_IF_ERROR(check_parallel(c, sizes));
  const ModelShard shard = shard_of(sizes, 0);
  std::printf("\nper rank over %d ranks: tensor %d, expert %d, embedding %d, lm head %d (bfloat16)\n", sizes.world,
              sizes.tensor, sizes.expert, sizes.embed, sizes.lm_head);
  const std::string caches = a.context ? "caches MiB at " + std::to_string(a.max_num_seqs) + " x " +
                                             std::to_string(a.context) + " tokens"
                                       : "";
  std::printf("%-10s %15s %12s %18s %16s  %s\n", "", "parameters", "weight GiB", "KDA state MiB/seq", "MLA KiB/token",
              caches.c_str());
  for (const auto& [name, part] : {std::pair{"one rank", ModelShard{}}, {"each rank", shard}}) {
    const WeightCount n = count_weights(c, WeightStorage{}, part);
    const CacheSizes cs = cache_unit_sizes(rank_config(c, part), DType::kBF16, 1);
    const double cache_bytes = static_cast<double>(a.max_num_seqs) *
                               (static_cast<double>(cs.bytes_per_slot) + static_cast<double>(a.context) * cs.bytes_per_page);
    std::printf("%-10s %15llu %12.2f %18.2f %16.2f", name, static_cast<unsigned long long>(n.parameters),
                static_cast<double>(n.total_bytes()) / (1u << 30), cs.bytes_per_slot / 1048576.0, cs.bytes_per_page / 1024.0);
    if (a.context) std::printf("  %.2f", cache_bytes / (1u << 20));
    std::printf("\n");
  }
  return Status();
}

// --verify: every weight read once; each tensor holding NaN/Inf (or an E8M0 scale of 0xFF) is
// named on stderr. Returns the exit code: 0 when all are finite, 1 otherwise.
int verify_weights(const Checkpoint& ckpt) {
  const auto bad = ckpt.scan_non_finite();
  for (const auto& b : bad)
    std::fprintf(stderr, "klinear info: %s: tensor '%s' has %lld non-finite value(s), the first at flat index %lld\n",
                 b.file.c_str(), b.name.c_str(), static_cast<long long>(b.count), static_cast<long long>(b.first_index));
  if (!bad.empty()) {
    std::fprintf(stderr, "klinear info: --verify: %zu tensor(s) hold non-finite values\n", bad.size());
    return 1;
  }
  std::printf("\nverify: every weight is finite\n");
  return 0;
}

int run_info(const InfoArgs& a) {
  auto cfg = load_model_config(a.model_dir);
  if (!cfg.ok()) return fail("info", cfg.status());
  auto format = parse_load_format(a.load_format);
  if (!format.ok()) return fail("info", format.status());
  std::optional<Checkpoint> ckpt;
  if (*format == LoadFormat::kSafetensors) {
    auto opened = Checkpoint::open(a.model_dir);
    if (!opened.ok()) return fail("info", opened.status());
    ckpt = std::move(opened).value();
  }
  const ModelConfig& c = *cfg;
  std::printf("model_type %s%s\n", c.model_type.c_str(), c.nested_text_config ? " (text_config nested)" : "");
  std::printf("hidden %lld, layers %lld, vocab %lld, eps %g\n", (long long)c.hidden_size, (long long)c.num_layers,
              (long long)c.vocab_size, c.rms_norm_eps);
  std::printf("KDA: %lld heads x %lld, conv %lld, gate %s, output gate %s\n", (long long)c.kda_heads,
              (long long)c.kda_head_dim, (long long)c.conv_kernel,
              c.kda_gate == KdaGate::kSoftplus ? "softplus" : ("lower-bound " + Json(c.gate_lower_bound).dump()).c_str(),
              c.kda_output_gate == KdaOutputGate::kFullRank ? "full-rank" : "low-rank");
  std::printf("MLA: %lld heads, q_lora %lld, kv_lora %lld, nope/rope/v %lld/%lld/%lld, output gate %s\n",
              (long long)c.mla_heads, (long long)c.q_lora_rank, (long long)c.kv_lora_rank, (long long)c.qk_nope_dim,
              (long long)c.qk_rope_dim, (long long)c.v_head_dim, c.mla_output_gate ? "yes" : "no");
  std::printf("FFN: %s, dense intermediate %lld; MoE %lld experts top-%lld, intermediate %lld, %lld shared, "
              "groups %lld keep %lld, scale %g%s%s\n",
              c.activation == Activation::kSitu ? "SiTU-GLU" : "SwiGLU", (long long)c.intermediate_size,
              (long long)c.num_experts, (long long)c.experts_per_token, (long long)c.moe_intermediate_size,
              (long long)c.num_shared_experts, (long long)c.num_expert_group, (long long)c.topk_group,
              c.routed_scaling_factor, c.has_latent_moe() ? (", latent " + std::to_string(c.routed_expert_hidden_size)).c_str() : "",
              c.expert_format == ExpertFormat::kMxfp4 ? ", MXFP4 experts" : "");
  std::printf("AttnRes: %s\n", c.has_attn_res() ? ("block size " + std::to_string(c.attn_res_block_size)).c_str() : "none");
  std::printf("\nlayer  mixer  ffn    attn_res_block\n");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    std::printf("%5lld  %-5s  %-5s  %s\n", (long long)l, c.mixer(l) == Mixer::kKda ? "KDA" : "MLA",
                c.ffn(l) == Ffn::kDense ? "dense" : "MoE",
                c.has_attn_res() ? (std::to_string(l / c.attn_res_block_size) + (l % c.attn_res_block_size == 0 ? " (seal)" : "")).c_str() : "-");
  }
  if (Status plan = print_rank_plan(c, a); !plan.ok()) return fail("info", plan);
  // What the weights take on the device (the CUDA backend's bfloat16, MXFP4 experts packed).
  const WeightCount held = count_weights(c, WeightStorage{});
  std::printf("\non the device (bfloat16, MXFP4 experts packed): %llu parameters\ndtype              bytes\n",
              static_cast<unsigned long long>(held.parameters));
  for (const auto& [dtype, b] : held.bytes)
    std::printf("%-8s %14llu (%.2f GiB)\n", dtype == DType::kU8 ? "MXFP4" : dtype_name(dtype),
                static_cast<unsigned long long>(b), static_cast<double>(b) / (1u << 30));
  std::printf("total    %14llu (%.2f GiB)\n", static_cast<unsigned long long>(held.total_bytes()),
              static_cast<double>(held.total_bytes()) / (1u << 30));
  if (!ckpt) return 0;
  std::printf("\nin the checkpoint");
  int64_t params = 0, bytes = 0;
  std::printf("\ndtype     tensors        params          bytes\n");
  for (const auto& [dtype, s] : ckpt->stats()) {
    std::printf("%-8s %8lld %13lld %14lld\n", dtype_name(dtype), (long long)s.tensors, (long long)s.params, (long long)s.bytes);
    params += s.params;
    bytes += s.bytes;
  }
  std::printf("total             %13lld %14lld\n", (long long)params, (long long)bytes);
  return a.verify ? verify_weights(*ckpt) : 0;
}

// ---- init
struct InitArgs {
  std::string preset, out, tokenizer;
  uint64_t seed = 0;
  bool config_only = false;
};

// With --tokenizer the checkpoint gets the tokenizer's vocabulary and special ids, and carries
// the tokenizer files, like a real checkpoint directory.
Status adopt_tokenizer(const std::string& tokenizer_dir, const std::string& out, Json& config) {
  KL_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(tokenizer_dir));
  Json& text = config.contains("text_config") ? config["text_config"] : config;
  text["vocab_size"] = tok.vocab_size();
  for (Json* j : {&config, &text}) {
    if (auto bos = tok.bos_id()) (*j)["bos_token_id"] = *bos;
    if (auto eos = tok.special_id("<|im_end|>")) (*j)["eos_token_id"] = *eos;
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  for (const char* f : {"tiktoken.model", "tokenizer_config.json", "NOTICE.md"}) {
    const std::string src = tokenizer_dir + "/" + f;
    KL_ASSIGN_OR_RETURN(PathKind kind, path_kind(src));  // no throwing std::filesystem::exists
    if (kind == PathKind::kMissing) continue;
    std::filesystem::copy_file(src, out + "/" + f, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return Status::IOError(out + "/" + f + ": copy failed: " + ec.message());
  }
  return Status();
}

int run_init(const InitArgs& a) {
  auto cfg = preset_config(a.preset);
  if (!cfg.ok()) return fail("init", cfg.status());
  // Without --tokenizer a preset of the real vocabulary gets the repository's tokenizer files, so
  // `generate --prompt` works on the directory as it is.
  std::string tokenizer = a.tokenizer;
  if (const auto own = preset_tokenizer(a.preset); tokenizer.empty() && own) {
    tokenizer = std::string(KLINEAR_TOKENIZERS_DIR) + "/" + *own;
    if (!std::filesystem::is_directory(tokenizer)) {
      std::fprintf(stderr, "klinear init: %s is not here (a klinear built elsewhere?): the checkpoint gets no tokenizer "
                   "files; pass --tokenizer DIR\n", tokenizer.c_str());
      tokenizer.clear();
    }
  }
  if (!tokenizer.empty()) {
    Status t = adopt_tokenizer(tokenizer, a.out, *cfg);
    if (!t.ok()) return fail("init", t);
  }
  if (a.config_only) {
    std::error_code ec;
    std::filesystem::create_directories(a.out, ec);
    std::ofstream f(a.out + "/config.json");
    f << cfg->dump(2) << "\n";
    if (!f) return fail("init", Status::IOError(a.out + "/config.json: cannot write"));
    std::fprintf(stderr, "klinear init: wrote the %s config.json to %s (run it with --load-format dummy)\n",
                 a.preset.c_str(), a.out.c_str());
    return 0;
  }
  // A checkpoint is written from memory: refuse one larger than a quarter of it (the real-size
  // presets are for --config-only and --load-format dummy).
  auto parsed = parse_model_config(*cfg, a.preset);
  if (!parsed.ok()) return fail("init", parsed.status());
  auto cpu = make_backend(BackendOptions{});
  const uint64_t bytes = 2 * count_parameters(*parsed), limit = (*cpu)->available_bytes() / 4;
  if (bytes > limit)
    return fail("init", Status::ResourceExhausted("preset " + a.preset + " would write about " +
                                                  std::to_string(bytes >> 30) + " GiB of weights (limit " +
                                                  std::to_string(limit >> 30) +
                                                  " GiB); use --config-only and run it with --load-format dummy"));
  Status s = write_random_checkpoint(*cfg, a.out, a.seed);
  if (!s.ok()) return fail("init", s);
  std::fprintf(stderr, "klinear init: wrote a random-weight %s checkpoint to %s\n", a.preset.c_str(), a.out.c_str());
  return 0;
}

// ---- generate
struct GenerateArgs {
  ModelArgs model;
  std::string prompt_ids, prompt, tokenizer, system;
  bool chat = false;
  GenerateOptions options;
  bool json = false;
};

// The prompt ids: --prompt-ids as given, or --prompt encoded (as plain text, or rendered as one
// user message of the checkpoint's chat format with --chat).
Result<std::vector<int32_t>> prompt_ids(const GenerateArgs& a, const Tokenizer* tok, const ModelConfig& c) {
  if (!a.prompt_ids.empty()) return parse_id_list(a.prompt_ids, "--prompt-ids");
  if (!a.chat) return tok->encode(a.prompt);
  std::vector<ChatMessage> messages;
  if (!a.system.empty()) messages.push_back(ChatMessage{"system", a.system, {}, "", ""});
  messages.push_back(ChatMessage{"user", a.prompt, {}, "", ""});
  KL_ASSIGN_OR_RETURN(auto segments, render_chat_segments(chat_format_for(c), messages, ChatOptions{}));
  return encode_chat(*tok, segments);
}

int run_generate(const GenerateArgs& a) {
  if (Status s = validate_generate_options(a.options); !s.ok()) return fail("generate", s);
  if (a.prompt_ids.empty() == a.prompt.empty())
    return fail("generate", Status::InvalidArgument(std::string("--prompt-ids and --prompt: expected exactly one, got ") +
                                                    (a.prompt.empty() ? "neither" : "both")));
  if (a.chat && a.prompt.empty())
    return fail("generate", Status::InvalidArgument("--chat: expected --prompt text to render as a user message, got "
                                                    "--prompt-ids"));
  auto m = load(a.model);
  if (!m.ok()) return fail("generate", m.status());
  std::optional<Tokenizer> tok;
  if (!a.prompt.empty() || !a.tokenizer.empty()) {
    auto t = Tokenizer::load(a.tokenizer.empty() ? a.model.model_dir : a.tokenizer);
    if (!t.ok()) return fail("generate", t.status().with_context("tokenizer (use --tokenizer DIR)"));
    tok = std::move(t).value();
  }
  auto ids = prompt_ids(a, tok ? &*tok : nullptr, m->model->config());
  if (!ids.ok()) return fail("generate", ids.status());
  GenerateOptions options = a.options;
  if (a.chat)
    if (auto stop = tok->special_id(chat_stop_marker(chat_format_for(m->model->config())))) options.stop_ids.push_back(*stop);
  std::optional<StreamDecoder> stream;
  const bool leader = m->world.leader();
  const bool stream_text = tok && !a.json && leader;
  if (stream_text) stream.emplace(*tok);
  auto on_token = [&](int32_t id) {
    if (stream_text && !is_stop_token(m->model->config(), options, id)) {
      std::fputs(stream->push(id).c_str(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  auto s = open_sequence(*m);
  if (!s.ok()) return fail("generate", s.status());
  StepExecutor executor(*m->model, *s->cache);
  auto result = generate(executor, s->seq, *ids, options, on_token);
  if (!result.ok()) return fail("generate", result.status());
  if (!leader) return 0;
  if (stream_text) {
    std::printf("%s\n", stream->finish().c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "klinear generate: %lld prompt tokens, %zu generated, prefill %.3f s, decode %.1f tokens/s\n",
                 static_cast<long long>(result->prompt_tokens), result->ids.size(), result->prefill_seconds,
                 result->ids.size() / std::max(result->decode_seconds, 1e-9));
    return 0;
  }
  std::string text;
  if (tok) text = tok->decode(result->ids);
  print_generation(*result, a.json, tok ? &text : nullptr);
  return 0;
}

// ---- chat
struct ChatArgs {
  ModelArgs model;
  std::string tokenizer, system;
  GenerateOptions options;
};

int run_chat(const ChatArgs& a) {
  if (Status s = validate_generate_options(a.options); !s.ok()) return fail("chat", s);  // before the first message
  auto m = load(a.model);
  if (!m.ok()) return fail("chat", m.status());
  if (m->world.size() > 1)
    return fail("chat", Status::NotSupported("chat over " + std::to_string(m->world.size()) +
                                             " ranks: the other ranks would not see the typed messages; use serve"));
  auto tok = Tokenizer::load(a.tokenizer.empty() ? a.model.model_dir : a.tokenizer);
  if (!tok.ok()) return fail("chat", tok.status().with_context("tokenizer (use --tokenizer DIR)"));
  auto created = ChatSession::create(*m->model, m->cache_options, *tok, chat_format_for(m->model->config()), a.system);
  if (!created.ok()) return fail("chat", created.status());
  ChatSession& session = **created;
  std::fprintf(stderr, "klinear chat: type a message and press Enter; /reset starts a new conversation; an empty "
                       "line or end of input quits.\n");
  std::string line;
  while (true) {
    std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line.empty()) break;
    if (line == "/reset") {
      Status s = session.reset();
      if (!s.ok()) return fail("chat", s);
      std::fprintf(stderr, "klinear chat: a new conversation\n");
      continue;
    }
    auto reply = session.turn(line, a.options, [](const std::string& piece) {
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    });
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (!reply.ok()) {
      // The session is as it was before the message: say why and go on.
      std::fprintf(stderr, "klinear chat: %s\n", reply.status().to_string().c_str());
      continue;
    }
    if (reply->finish == FinishReason::kContext)
      std::fprintf(stderr, "klinear chat: the conversation now fills the model's context (%lld tokens); /reset "
                           "starts a new one\n",
                   static_cast<long long>(session.tokens()));
  }
  std::fprintf(stderr, "klinear chat: %lld tokens in the conversation state\n", static_cast<long long>(session.tokens()));
  return 0;
}

}  // namespace

void add_model_commands(CLI::App& app, int& exit_code) {
  {
    auto a = std::make_shared<LogitsArgs>();
    CLI::App* sub = app.add_subcommand("logits", "run token ids and write the float32 logits of every position of "
                                                 "the last step as a [T, vocab] .npy file");
    add_model_args(sub, a->model);
    sub->add_option("--ids", a->ids, "comma-separated token ids, run from an empty state")->required();
    sub->add_option("--then", a->then, "ids run as a second step from the state the first left");
    sub->add_option("--out", a->out, "output .npy path")->required();
    sub->callback([a, sub, &exit_code] {
      const Status s = take_model_settings(*sub, a->model, nullptr);
      exit_code = s.ok() ? run_logits(*a) : fail("logits", s);
    });
  }
  {
    auto a = std::make_shared<GenerateArgs>();
    CLI::App* sub = app.add_subcommand("generate", "generate tokens after a prompt");
    add_model_args(sub, a->model);
    sub->add_option("--prompt-ids", a->prompt_ids, "comma-separated prompt token ids");
    sub->add_option("--prompt", a->prompt, "prompt text (encoded with the tokenizer; streamed output)");
    sub->add_flag("--chat", a->chat, "render --prompt as a user message of the checkpoint's chat format");
    sub->add_option("--system", a->system, "system message with --chat");
    sub->add_option("--tokenizer", a->tokenizer, "tokenizer directory (default: the model directory)");
    add_generate_options(sub, a->options);
    sub->add_flag("--json", a->json, "print one JSON object with the generated ids (and text) and timings");
    sub->callback([a, sub, &exit_code] {
      const Status s = take_model_settings(*sub, a->model, &a->options.max_tokens);
      exit_code = s.ok() ? run_generate(*a) : fail("generate", s);
    });
  }
  {
    auto a = std::make_shared<ChatArgs>();
    a->options.max_tokens = 256;
    a->options.sampling.temperature = 0.6f;
    CLI::App* sub = app.add_subcommand("chat", "interactive multi-turn chat; the sequence state is kept between "
                                               "turns, so each turn runs only its new tokens");
    add_model_args(sub, a->model);
    sub->add_option("--tokenizer", a->tokenizer, "tokenizer directory (default: the model directory)");
    sub->add_option("--system", a->system, "system message (default: the chat format's own)");
    add_generate_options(sub, a->options);
    sub->callback([a, sub, &exit_code] {
      const Status s = take_model_settings(*sub, a->model, &a->options.max_tokens);
      exit_code = s.ok() ? run_chat(*a) : fail("chat", s);
    });
  }
  {
    auto a = std::make_shared<InfoArgs>();
    CLI::App* sub = app.add_subcommand("info", "print the parsed config, the layer table and parameter counts");
    sub->add_option("--model", a->model_dir, "checkpoint directory")->required();
    sub->add_option("--load-format", a->load_format, "safetensors, or dummy (config.json alone)")->capture_default_str();
    sub->add_flag("--verify", a->verify, "read every weight and name the tensors holding NaN/Inf (or an MXFP4 "
                                         "scale of 0xFF); exit 1 when there are any");
    add_parallel_options(sub, a->parallel);
    sub->add_option("--context", a->context,
                    "with it, the table also gives one rank's caches (KDA states and the MLA latent, bfloat16) for "
                    "--max-num-seqs sequences of this many tokens")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    sub->add_option("--max-num-seqs", a->max_num_seqs, "sequences at --context tokens (default 1)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
    sub->callback([a, &exit_code] { exit_code = run_info(*a); });
  }
  {
    auto a = std::make_shared<InitArgs>();
    CLI::App* sub = app.add_subcommand("init", "write a small random-weight checkpoint (config.json + "
                                               "model.safetensors with real tensor names)");
    std::string presets;
    for (const auto& n : preset_names()) presets += (presets.empty() ? "" : ", ") + n;
    sub->add_option("--preset", a->preset, "one of: " + presets)->required();
    sub->add_option("--out", a->out, "output directory")->required();
    sub->add_option("--seed", a->seed, "random seed")->check(uint64_any())->capture_default_str();
    sub->add_option("--tokenizer", a->tokenizer, "tokenizer directory: use its vocabulary and copy its files "
                                                 "into the checkpoint");
    sub->add_flag("--config-only", a->config_only, "write only config.json (for --load-format dummy)");
    sub->callback([a, &exit_code] { exit_code = run_init(*a); });
  }
}

}  // namespace klinear::cli
