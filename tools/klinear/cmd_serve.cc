// Serving subcommands: serve (the OpenAI-compatible server), run (the offline batch runner over a
// JSONL file) and bench-serve (load against a running server). serve and run share one engine
// set-up: the model, its tokenizer and chat format, and the cache budgets.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <thread>

#include "backend/backend.h"
#include "io/file.h"
#include "io/json.h"
#include "io/line_reader.h"
#include "cli_util.h"
#include "commands.h"
#include "chat/chat_format.h"
#include "io/tokenizer.h"
#include "model/model.h"
#include "runtime/cache_budget.h"
#include "runtime/chat_session.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"
#include "runtime/model_world.h"
#include "runtime/rank_runner.h"
#include "dist/mpi_comm.h"
#include "bench_client.h"
#include "server/http_server.h"
#include "server/openai.h"

namespace klinear::cli {

namespace {

volatile std::sig_atomic_t g_signal = 0;
// The first SIGINT/SIGTERM asks for a drain; a second one leaves at once (a drain that hangs must
// not need SIGKILL).
void on_signal(int sig) {
  if (g_signal) {
    static const char message[] = "klinear: second signal: exiting without draining\n";
    (void)!write(STDERR_FILENO, message, sizeof(message) - 1);
    _exit(130);
  }
  g_signal = sig;
}

void install_signal_handlers() {
  g_signal = 0;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a dead server
}

// "1073741824", "512M", "4G", "4GiB" (binary units) -> bytes, at most 2^63 - 1 (a larger one wrapped,
// or threw out of std::stoull).
Result<uint64_t> parse_bytes(const std::string& text, const std::string& flag) {
  const size_t digits = std::min(text.find_first_not_of("0123456789"), text.size());
  std::string unit = text.substr(digits);
  if (unit.size() == 3 && unit.substr(1) == "iB") unit = unit.substr(0, 1);
  const std::map<std::string, int> shifts{{"", 0}, {"K", 10}, {"M", 20}, {"G", 30}, {"T", 40}};
  const auto it = shifts.find(unit);
  if (digits == 0 || it == shifts.end())
    return Status::InvalidArgument(flag + ": '" + text + "' is not a size; expected bytes with an optional K, M, G or T");
  const int64_t most = INT64_MAX >> it->second;
  auto v = parse_int(std::string_view(text).substr(0, digits), IntRange{0, most}, flag);
  if (!v.ok())
    return Status::InvalidArgument(flag + ": '" + text + "' is more than the largest size, " + std::to_string(most) +
                                   unit + " (2^63 - 1 bytes)");
  return static_cast<uint64_t>(*v) << it->second;
}

// ---- shared engine set-up

// State slots for prefix-cache snapshots when --prefix-snapshot-slots is not given: a quarter of the
// running sequences'. Each costs a whole state slot (41.4 MiB for the 48B model) taken from the
// latent pages: as many as the running ones (this default before) left 256 sequences of the 48B
// model on an H200 room for 1.39 M tokens at once, where 256 prompts of 8k + 1k generated need 2.36 M;
// a quarter leaves ~2.4 M. A hot prefix keeps its snapshots (each hit refreshes them).
int64_t default_snapshot_slots(int64_t max_num_seqs) { return (max_num_seqs + 3) / 4; }

// Largest --max-queue (the HTTP thread pool is the queue plus the running sequences).
constexpr int64_t kMaxQueue = 16384;
// Largest --max-num-tokens: a step of a whole 1M-token context (the step arena grows with it).
constexpr int64_t kMaxNumTokens = int64_t{1} << 20;
// --max-body-bytes: from a small chat request to a 1M-token prompt as JSON ids (~8 MB) many times over.
constexpr IntRange kBodyBytes{1 << 10, 1 << 30};

struct EngineArgs {
  std::string model_dir, device = "cpu", dtype, tokenizer, load_format = "safetensors";
  std::optional<int64_t> max_num_tokens;           // not given: default_max_num_tokens(device)
  std::optional<int64_t> max_step_attention;       // not given: default_max_step_attention(device)
  int64_t max_num_seqs = 16, page_size = 64;
  std::string cache_memory;                        // empty: by memory fraction on CUDA, else the Cache's default
  std::optional<double> gpu_memory_utilization;    // the fraction (0.9 on CUDA when not given)
  bool no_prefix_cache = false;
  int64_t prefix_snapshot_interval = 256;
  std::optional<int64_t> prefix_snapshot_slots;    // not given: default_snapshot_slots(max_num_seqs)
  std::string cuda_graphs = "on";
  std::string attention_kernels = "best";
  std::optional<int64_t> max_model_len;            // not given: Engine::sequence_capacity
  bool truncate_prompt = false;
  bool batch_invariant = false;
  ParallelArgs parallel;
};

void add_engine_args(CLI::App* sub, EngineArgs& a, const char* max_seqs_flag) {
  sub->add_option("--model", a.model_dir, "checkpoint directory (config.json + safetensors)")->required();
  add_device_options(sub, a.device, a.dtype);
  add_parallel_options(sub, a.parallel);
  sub->add_option("--tokenizer", a.tokenizer, "tokenizer directory (default: the model directory, if it has one)");
  sub->add_option("--load-format", a.load_format,
                  "safetensors, or dummy: seeded random weights made on the device from config.json alone")
      ->check(parsed_by(parse_load_format, "safetensors|dummy"))
      ->capture_default_str();
  sub->add_option("--max-num-tokens", a.max_num_tokens,
                  "tokens per engine step (decodes + prefill chunks; default " +
                      std::to_string(default_max_num_tokens(Device::kCuda)) + " on CUDA, " +
                      std::to_string(default_max_num_tokens(Device::kCpu)) + " on the CPU)")
      ->check(int_in({1, kMaxNumTokens}));
  sub->add_option("--max-step-attention", a.max_step_attention,
                  "query-key pairs a step's prefill chunks attend over in each attention layer, so a long "
                  "context's chunks shrink and every step stays short (0: no bound; default " +
                      std::to_string(default_max_step_attention(Device::kCuda)) + " on CUDA, " +
                      std::to_string(default_max_step_attention(Device::kCpu)) + " on the CPU)")
      ->check(int_in({0, INT64_MAX}));
  sub->add_option(max_seqs_flag, a.max_num_seqs, "sequences running at once (state slots)")
      ->check(int_in({1, kMaxFlagCount}))
      ->capture_default_str();
  sub->add_option("--cache-memory", a.cache_memory, "memory for the caches: state slots first, the rest latent pages "
                                                    "(bytes, or with K/M/G/T; 0: room for every sequence at the full "
                                                    "context, at most a quarter of the free memory; not given: "
                                                    "--gpu-memory-utilization on CUDA, 0 on the CPU)");
  sub->add_option("--gpu-memory-utilization", a.gpu_memory_utilization,
                  "without --cache-memory: the fraction of the device memory free at start-up that weights, the step "
                  "arena (profiled with a step of --max-num-tokens) and the caches may use; the caches get what is "
                  "left (default 0.9 on CUDA; on the CPU only when given)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--page-size", a.page_size, "tokens per latent cache page")->capture_default_str();
  sub->add_flag("--no-prefix-cache", a.no_prefix_cache,
                "turn prefix caching off (on by default: prompt pages and KDA state snapshots are kept for reuse, "
                "evicted least recently used first)");
  sub->add_option("--prefix-snapshot-interval", a.prefix_snapshot_interval,
                  "tokens between the prefix cache's KDA state snapshots (a multiple of 64)")->capture_default_str();
  sub->add_option("--prefix-snapshot-slots", a.prefix_snapshot_slots,
                  "state slots beside the running sequences' in which the prefix cache keeps KDA snapshots, each "
                  "taking a state slot's memory from the latent pages (default: a quarter of the sequences at once, "
                  "rounded up)")
      ->check(int_in({1, kMaxFlagCount}));
  add_cuda_options(sub, a.cuda_graphs, a.attention_kernels);
  add_batch_invariant_option(sub, a.batch_invariant);
  sub->add_option("--max-model-len", a.max_model_len,
                  "tokens one sequence may hold, prompt and generated (default: the model's context or what the "
                  "cache holds, whichever is smaller); longer prompts are refused or, with --truncate-prompt, cut")
      ->check(int_in({1, INT32_MAX}));
  sub->add_flag("--truncate-prompt", a.truncate_prompt,
                "a prompt too long for --max-model-len keeps its last tokens (as many as leave room for max_tokens) "
                "instead of being refused; a request's truncate_prompt_tokens overrides it");
}

// The settings file's fields run and serve take (before they run): the page size and the
// sequences at once, and for run (`max_tokens` given) a request's default tokens to generate.
Status take_engine_settings(const CLI::App& sub, EngineArgs& a, int* max_tokens) {
  KL_RETURN_IF_ERROR(take_setting(sub, a.parallel, "pa_block_size", "--page-size", a.page_size));
  KL_RETURN_IF_ERROR(take_setting(sub, a.parallel, "batch_size_per_rank", "--max-num-seqs", a.max_num_seqs));
  return max_tokens ? take_setting(sub, a.parallel, "max_new_tokens", "--max-tokens", *max_tokens) : Status();
}

// Over ranks (runtime/rank_runner.h) rank 0 serves through a LeaderRunner; the other ranks have
// no engine and follow (follow()).
struct Serving {
  std::unique_ptr<Backend> backend;
  ModelWorld world;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // behind a pointer: the engine keeps its address
  ChatFormat format = ChatFormat::kKimiK2;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<LeaderRunner> leader;  // rank 0 of several
  std::unique_ptr<Engine> engine;        // rank 0

  // On ranks other than 0: runs rank 0's schedule until it stops; the exit code. A signal (mpirun
  // passes Ctrl-C to every rank) is rank 0's to act on: it drains, then stops the followers.
  int follow(const char* cmd) {
    std::signal(SIGINT, SIG_IGN);
    std::signal(SIGTERM, SIG_IGN);
    const Status s = follow_leader(*runner, *world.host);
    return s.ok() ? 0 : fail(cmd, s);
  }
};

Result<Serving> make_serving(const EngineArgs& a, int64_t max_queue, const char* cmd) {
  uint64_t memory = 0;
  if (!a.cache_memory.empty()) {
    KL_ASSIGN_OR_RETURN(memory, parse_bytes(a.cache_memory, "--cache-memory"));
  }
  BackendOptions bo;
  KL_ASSIGN_OR_RETURN(bo.device, parse_device(a.device));
  bo.gpu = launched_by_mpi() ? launcher_local_rank() : -1;
  const int64_t max_num_tokens = a.max_num_tokens.value_or(default_max_num_tokens(bo.device));
  KL_RETURN_IF_ERROR(check_page_size(a.page_size));
  const BatchInvariance invariance = a.batch_invariant ? BatchInvariance::kOn : BatchInvariance::kOff;
  if (a.batch_invariant && max_num_tokens < 64)
    return Status::InvalidArgument("--max-num-tokens " + std::to_string(max_num_tokens) +
                                   ": --batch-invariant prefills in pieces of 64 tokens, so a step needs at least 64");
  bo.batch_invariance = invariance;
  KL_ASSIGN_OR_RETURN(bo.dtype, parse_compute_dtype(a.dtype, bo.device));
  KL_ASSIGN_OR_RETURN(bo.graphs, parse_cuda_graphs(a.cuda_graphs));
  KL_ASSIGN_OR_RETURN(bo.attention, parse_attention_kernels(a.attention_kernels));
  if (!a.cache_memory.empty() && a.gpu_memory_utilization)
    return Status::InvalidArgument("give --cache-memory or --gpu-memory-utilization, not both");
  const bool by_fraction = a.cache_memory.empty() && (bo.device == Device::kCuda || a.gpu_memory_utilization);
  Serving s;
  KL_ASSIGN_OR_RETURN(s.backend, make_backend(bo));
  const uint64_t free_at_start = s.backend->available_bytes();
  KL_ASSIGN_OR_RETURN(const LoadFormat format, parse_load_format(a.load_format));
  KL_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(a.model_dir));
  KL_ASSIGN_OR_RETURN(ParallelSizes sizes, run_parallel(a.parallel));
  KL_ASSIGN_OR_RETURN(s.world, open_model_world(sizes, config, *s.backend));
  if (s.world.leader()) note_unused_settings(a.parallel);
  KL_ASSIGN_OR_RETURN(s.model, Model::load(a.model_dir, *s.backend, format, s.world.model_ranks()));
  if (by_fraction) {
    KL_RETURN_IF_ERROR(profile_step(*s.model, max_num_tokens, a.max_num_seqs, a.page_size));
    const MemoryFraction f{a.gpu_memory_utilization.value_or(0.9), free_at_start, s.backend->available_bytes()};
    auto budget = cache_budget(f);
    if (!budget.ok()) return budget.status().with_context("--gpu-memory-utilization");
    memory = *budget;
    std::fprintf(stderr, "klinear %s: cache budget %.1f MiB: %.2f of the %.1f MiB free at start-up, less %.1f MiB of weights "
                 "and step arena\n", cmd, memory / 1048576.0, f.fraction, f.free_at_start / 1048576.0,
                 (f.free_at_start - std::min(f.free_at_start, f.free_after_load)) / 1048576.0);
  }
  const std::string tok_dir = a.tokenizer.empty() ? a.model_dir : a.tokenizer;
  auto tok = Tokenizer::load(tok_dir);
  if (tok.ok()) s.tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
  else if (!a.tokenizer.empty()) return tok.status().with_context("--tokenizer");
  else std::fprintf(stderr, "klinear %s: no tokenizer in %s: token-id prompts only\n", cmd, a.model_dir.c_str());
  const ModelConfig& c = s.model->config();
  s.format = chat_format_for(c);
  const PrefixCacheOptions prefix{a.no_prefix_cache ? PrefixCaching::kOff : PrefixCaching::kOn, a.prefix_snapshot_interval,
                                  invariance};
  if (a.prefix_snapshot_slots && a.no_prefix_cache)
    return Status::InvalidArgument("--prefix-snapshot-slots is for the prefix cache, which --no-prefix-cache turns off");
  const int64_t snapshot_slots =
      prefix.mode == PrefixCaching::kOn ? a.prefix_snapshot_slots.value_or(default_snapshot_slots(a.max_num_seqs)) : 0;
  const int64_t slots = a.max_num_seqs + snapshot_slots;
  KL_ASSIGN_OR_RETURN(s.runner, ModelRunner::create(*s.model, CacheOptions{slots, a.page_size, memory}, prefix));
  EngineOptions eo;
  eo.scheduler = {max_num_tokens, a.max_num_seqs, prefix.mode == PrefixCaching::kOn ? prefix.snapshot_interval : 0,
                  a.max_step_attention.value_or(default_max_step_attention(bo.device)), invariance};
  eo.max_queue = max_queue;
  const int64_t capacity = Engine::sequence_capacity(*s.runner);
  if (a.max_model_len && *a.max_model_len > capacity)
    return Status::InvalidArgument("--max-model-len " + std::to_string(*a.max_model_len) + ": a sequence here holds at most " +
                                   std::to_string(capacity) + " tokens (the model's context " +
                                   std::to_string(s.runner->max_model_len()) + ", or the cache: raise --cache-memory)");
  eo.max_model_len = a.max_model_len.value_or(0);
  for (int64_t id : c.eos_token_ids) eo.eos_ids.push_back(static_cast<int32_t>(id));
  if (!s.world.leader()) return s;
  StepRunner* runner = s.runner.get();
  if (s.world.size() > 1) runner = (s.leader = std::make_unique<LeaderRunner>(*s.runner, *s.world.host)).get();
  s.engine = std::make_unique<Engine>(*runner, s.tokenizer.get(), eo);
  const CacheSizes& z = s.runner->sizes();
  std::fprintf(stderr,
               "klinear %s: cache %.1f MiB: %.2f MiB per state slot, %.1f KiB per token; %lld slots (%lld for prefix "
               "snapshots), %lld pages of %lld tokens: at most %lld sequences and %lld tokens at once (%lld per sequence)\n",
               cmd, z.bytes() / 1048576.0, z.bytes_per_slot / 1048576.0,
               z.bytes_per_page / 1024.0 / std::max<int64_t>(z.page_size, 1), (long long)z.slots, (long long)snapshot_slots,
               (long long)z.pages, (long long)z.page_size, (long long)std::min(z.slots, a.max_num_seqs),
               (long long)(z.pages * z.page_size), (long long)s.engine->max_sequence_tokens());
  return s;
}

// ---- serve
struct ServeArgs {
  EngineArgs engine;
  ServerOptions server;
  std::string api_key_file;
  int64_t max_queue = 256;
  double shutdown_timeout_s = 30;
  std::string allowed_origins;  // JSON list or comma-separated
  bool disable_log_stats = false, disable_log_requests = false;
};

// --allowed-origins: vLLM's JSON list ('["*"]') or a comma-separated list.
Result<std::vector<std::string>> parse_origins(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  if (text.front() == '[') {
    KL_ASSIGN_OR_RETURN(Json list, parse_json(text, "--allowed-origins"));
    if (!list.is_array()) return Status::InvalidArgument("--allowed-origins: expected a JSON list of origins, got " + text);
    for (const Json& o : list) {
      if (!o.is_string() || o.get<std::string>().empty())
        return Status::InvalidArgument("--allowed-origins: every origin must be a non-empty string, got " + o.dump());
      out.push_back(o.get<std::string>());
    }
    return out;
  }
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find(',', at), text.size());
    std::string o = text.substr(at, end - at);
    o.erase(0, o.find_first_not_of(' '));
    o.erase(o.find_last_not_of(' ') + 1);
    if (o.empty()) return Status::InvalidArgument("--allowed-origins: an empty origin in '" + text + "'");
    out.push_back(o);
    at = end + 1;
  }
  return out;
}

// The periodic stats line (vLLM's "Avg prompt throughput ..."): throughput since the last line,
// sequences running and waiting, cache use. Quiet while nothing happens.
class StatsLine {
 public:
  explicit StatsLine(const EngineMetrics& m) : last_(m), at_(std::chrono::steady_clock::now()) {}
  void maybe_print(const EngineMetrics& m, double every_s) {
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - at_).count();
    if (dt < every_s) return;
    const uint64_t prompt = m.prefix_query_tokens - last_.prefix_query_tokens;
    const uint64_t generated = m.generation_tokens - last_.generation_tokens;
    if (prompt || generated || m.running || m.waiting) {
      const CacheUsage& c = m.cache;
      std::fprintf(stderr, "klinear serve: prompt %.1f tok/s, generation %.1f tok/s; running %lld, waiting %lld; cache "
                   "pages %.1f%%, state slots %.1f%% in use; prefix-cache hits %.1f%%\n", prompt / dt, generated / dt,
                   static_cast<long long>(m.running), static_cast<long long>(m.waiting),
                   c.pages_total ? 100.0 * (1.0 - double(c.pages_free) / double(c.pages_total)) : 0.0,
                   c.slots_total ? 100.0 * (1.0 - double(c.slots_free) / double(c.slots_total)) : 0.0,
                   m.prefix_query_tokens ? 100.0 * double(m.prefix_hit_tokens) / double(m.prefix_query_tokens) : 0.0);
    }
    last_ = m;
    at_ = now;
  }

 private:
  EngineMetrics last_;
  std::chrono::steady_clock::time_point at_;
};

// The API key: --api-key, else --api-key-file (its first line; the command line shows in `ps`),
// else the environment's KLINEAR_API_KEY; none of them: no authentication. A key that is empty
// where it was given would turn authentication off without a word: refused.
Result<std::string> api_key(const ServeArgs& a) {
  if (!a.server.api_key.empty()) {
    if (!a.api_key_file.empty()) return Status::InvalidArgument("--api-key and --api-key-file: give one of them");
    return a.server.api_key;
  }
  if (!a.api_key_file.empty()) {
    auto text = read_regular_file(a.api_key_file, 64 << 10);
    if (!text.ok()) return text.status().with_context("--api-key-file");
    std::string key = text->substr(0, text->find_first_of("\r\n"));
    if (key.empty()) return Status::InvalidArgument("--api-key-file: " + a.api_key_file + " holds an empty key");
    return key;
  }
  const char* env = std::getenv("KLINEAR_API_KEY");
  if (env && !*env) return Status::InvalidArgument("KLINEAR_API_KEY is set but empty, which would turn authentication off");
  return std::string(env ? env : "");
}

// The model's id in the API by default: the checkpoint directory's name.
std::string model_name_of(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir.substr(dir.find_last_of('/') + 1);
}

int run_serve(const ServeArgs& a) {
  auto key = api_key(a);
  if (!key.ok()) return fail("serve", key.status());
  auto s = make_serving(a.engine, a.max_queue, "serve");
  if (!s.ok()) return fail("serve", s.status());
  if (!s->world.leader()) return s->follow("serve");
  ServerOptions so = a.server;
  so.api_key = *key;
  auto origins = parse_origins(a.allowed_origins);
  if (!origins.ok()) return fail("serve", origins.status());
  so.allowed_origins = std::move(origins).value();
  so.model_root = a.engine.model_dir;
  so.log_requests = !a.disable_log_requests;
  if (a.engine.truncate_prompt) so.truncate_prompt = -1;
  if (so.model_name.empty()) so.model_name = model_name_of(a.engine.model_dir);
  so.http_threads = static_cast<int>(std::max<int64_t>(64, a.max_queue + a.engine.max_num_seqs));
  HttpServer server(*s->engine, s->tokenizer.get(), s->format, so);
  install_signal_handlers();
  std::atomic<bool> engine_done{false};
  std::thread engine_thread([&] {
    s->engine->serve();
    engine_done = true;
  });
  Status started = server.start();
  if (!started.ok()) {
    s->engine->request_stop();
    engine_thread.join();
    return fail("serve", started);
  }
  std::fprintf(stderr, "klinear serve: serving '%s' on http://%s:%d (Ctrl-C drains and exits)\n", so.model_name.c_str(),
               so.host.c_str(), server.port());
  StatsLine stats(s->engine->metrics());
  while (!g_signal) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!a.disable_log_stats) stats.maybe_print(s->engine->metrics(), 10.0);
  }
  std::fprintf(stderr, "klinear serve: signal %d: finishing in-flight requests (at most %g s; a second signal exits "
               "at once)\n", static_cast<int>(g_signal), a.shutdown_timeout_s);
  server.drain();
  s->engine->request_stop();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.shutdown_timeout_s);
  while (!engine_done && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!engine_done) {
    std::fprintf(stderr, "klinear serve: --shutdown-timeout (%g s) passed: cancelling the requests still running\n",
                 a.shutdown_timeout_s);
    s->engine->cancel_all();
  }
  engine_thread.join();
  server.stop();
  std::fprintf(stderr, "klinear serve: drained, exiting\n");
  return 0;
}

// ---- run
struct RunArgs {
  EngineArgs engine;
  std::string input, output;
  GenerateOptions defaults;
  float min_p = 0, presence_penalty = 0, frequency_penalty = 0, repetition_penalty = 1;
};

// Lines read ahead of the first one not yet written: enough to keep --max-batch sequences running
// while earlier lines finish, few enough that memory does not grow with the input (issue 34 item 9).
int64_t read_ahead_lines(int64_t max_batch) { return std::clamp<int64_t>(8 * max_batch, 64, 16384); }

// One input line on its way to the output, where it is written in input order once done.
struct LineResult {
  int64_t line = 0;
  Json id;                                              // the line's "id", else its number
  Json custom_id;                                       // a batch-format line's custom_id, else null
  bool done = false, blank = false, refused = false;  // blank: nothing written; refused: an error record
  Json out;
};

// What the lines add up to over the run.
struct RunTotals {
  int64_t refused = 0, submitted = 0, finished = 0, in_tokens = 0, out_tokens = 0;
  std::vector<double> ttft_s;
};

struct RunContext {
  const RunArgs& args;
  Serving& serving;
  Json defaults;  // the CLI's sampling flags; each line's fields override them
  std::string model_name;  // the batch format's responses name it
  RunTotals totals;
};

// A line's request, checked and ready to submit: the fields as the server reads them, the line's
// own defaults (the CLI's sampling flags) under them.
struct LineRequest {
  ApiRequest api;
  RequestSpec spec;
};

Result<LineRequest> prepare_line(ApiKind kind, const Json& fields, RunContext& ctx) {
  Json merged = ctx.defaults;
  const ReleaseJsonOnExit release_merged{merged};
  merged.update(fields);
  Serving& s = ctx.serving;
  std::string param;
  KL_ASSIGN_OR_RETURN(ApiRequest req, parse_api_request(kind, s.format, merged, &param));
  if (req.spec.n != 1 || req.stream) return Status::InvalidArgument("n > 1 and stream are not supported by klinear run");
  RequestSpec spec = req.spec;
  KL_ASSIGN_OR_RETURN(spec.prompt, request_prompt_ids(req, s.tokenizer.get(), s.format));
  KL_RETURN_IF_ERROR(fit_prompt(req, ctx.args.engine.truncate_prompt ? std::optional<int64_t>(-1) : std::nullopt,
                                s.engine->max_sequence_tokens(), spec.prompt).status());
  spec.stop.max_tokens = req.max_tokens.value_or(ctx.args.defaults.max_tokens);
  if (kind == ApiKind::kChat && s.tokenizer)
    if (auto marker = s.tokenizer->special_id(chat_stop_marker(s.format))) spec.stop.stop_ids.push_back(*marker);
  return LineRequest{std::move(req), std::move(spec)};
}

// The sink's bookkeeping at a request's last event: the line is done, the totals grow.
void count_line_end(const EngineEvent& e, LineResult& res, RunTotals& totals) {
  res.done = true;
  totals.ttft_s.push_back(e.stats.ttft_s);
  totals.in_tokens += e.stats.prompt_tokens;
  totals.out_tokens += e.stats.completion_tokens;
}

// A line of vLLM's offline batch format (OpenAI's Batch API input:
// {"custom_id", "method": "POST", "url": "/v1/chat/completions" or "/v1/completions", "body": {...}}),
// answered with the Batch API's output line: {"id", "custom_id", "response": {"status_code",
// "request_id", "body": the OpenAI response}, "error"}.
Status submit_batch_line(const Json& line, RunContext& ctx, LineResult& res) {
  if (!line.contains("custom_id") || !line["custom_id"].is_string())
    return Status::InvalidArgument("a batch line needs a string 'custom_id'");
  res.custom_id = line["custom_id"];
  const std::string url = line.value("url", "");
  if (url != "/v1/chat/completions" && url != "/v1/completions")
    return Status::InvalidArgument("'url' must be /v1/chat/completions or /v1/completions, got " + json_excerpt(line.value("url", Json())));
  if (line.contains("method") && line["method"] != "POST")
    return Status::InvalidArgument("'method' must be POST, got " + json_excerpt(line["method"]));
  for (const auto& [key, v] : line.items())
    if (key != "custom_id" && key != "url" && key != "method" && key != "body")
      return Status::InvalidArgument("'" + key + "' is not a field of a batch line (custom_id, method, url, body)");
  if (!line.contains("body") || !line["body"].is_object()) return Status::InvalidArgument("a batch line needs an object 'body'");
  const ApiKind kind = url == "/v1/chat/completions" ? ApiKind::kChat : ApiKind::kCompletion;
  KL_ASSIGN_OR_RETURN(LineRequest req, prepare_line(kind, line["body"], ctx));
  Serving& s = ctx.serving;
  if (req.api.echo && !s.tokenizer) return Status::NotSupported("field 'echo' needs the prompt's text: this model has no tokenizer");
  const std::string request_id = (kind == ApiKind::kChat ? "chatcmpl-batch-" : "cmpl-batch-") + std::to_string(res.line);
  auto builder = std::make_shared<ResponseBuilder>(req.api, s.format, request_id, ctx.model_name, s.tokenizer.get(),
                                                   req.spec.prompt);
  RunTotals& totals = ctx.totals;
  KL_RETURN_IF_ERROR(s.engine->submit(std::move(req.spec), [&res, &totals, builder, request_id](const EngineEvent& e) {
    builder->chunks(e);
    if (e.end == RequestEnd::kRunning) return;
    const bool failed = e.end == RequestEnd::kFailed;
    res.out = Json{{"id", "batch_req_" + std::to_string(res.line)}, {"custom_id", res.custom_id}};
    res.out["response"] = failed ? Json(nullptr)
                                 : Json{{"status_code", 200}, {"request_id", request_id}, {"body", builder->response(e.stats)}};
    res.out["error"] = failed ? Json{{"code", "server_error"}, {"message", e.error.to_string()}} : Json(nullptr);
    count_line_end(e, res, totals);
  }).status());
  ++totals.submitted;
  return {};
}

// Submits the request of one line with a sink that fills `res` (a blank line is only marked done).
// An error is the line's own: the caller writes it as the line's error record.
Status submit_line(const std::string& text, RunContext& ctx, LineResult& res) {
  if (text.find_first_not_of(" \t\r") == std::string::npos) {
    res.blank = res.done = true;
    return {};
  }
  KL_ASSIGN_OR_RETURN(Json line, parse_json(text, "line"));
  const ReleaseJsonOnExit release_line{line};
  if (!line.is_object()) return Status::InvalidArgument("expected a JSON object");
  if (line.contains("custom_id") || line.contains("body")) return submit_batch_line(line, ctx, res);
  if (line.contains("id")) res.id = line["id"];
  line.erase("id");  // the line's own fields; the rest is a request's
  if (line.contains("prompt_ids")) {
    line["prompt"] = line["prompt_ids"];
    line.erase("prompt_ids");
  }
  const ApiKind kind = line.contains("messages") ? ApiKind::kChat : ApiKind::kCompletion;
  KL_ASSIGN_OR_RETURN(LineRequest req, prepare_line(kind, line, ctx));
  if (req.api.echo)  // this line's result has no place for it; the batch format's responses do
    return Status::InvalidArgument("field 'echo' is for lines of the batch format (custom_id, url, body)");
  res.out = Json{{"id", res.id}, {"text", ""}, {"ids", Json::array()}};
  RunTotals& totals = ctx.totals;
  KL_RETURN_IF_ERROR(ctx.serving.engine->submit(std::move(req.spec), [&res, &totals](const EngineEvent& e) {
    res.out["text"] = res.out["text"].get<std::string>() + e.text;
    for (const TokenOutput& t : e.tokens) res.out["ids"].push_back(t.id);
    if (e.finish) res.out["finish_reason"] = *e.finish == FinishReason::kStop ? "stop" : "length";
    if (e.end == RequestEnd::kRunning) return;
    res.out["prompt_tokens"] = e.stats.prompt_tokens;
    res.out["completion_tokens"] = e.stats.completion_tokens;
    if (e.end == RequestEnd::kFailed) res.out["error"] = e.error.to_string();
    count_line_end(e, res, totals);
  }).status());
  ++totals.submitted;
  return {};
}

int run_run(const RunArgs& a) {
  auto reader = LineReader::open(a.input);
  if (!reader.ok()) return fail("run", reader.status());
  // The output is truncated when opened: never the input itself (under any name), and only once the
  // model has loaded, so a run that fails before it leaves an existing output as it was.
  std::error_code ec;
  if (std::filesystem::equivalent(a.input == "-" ? "/dev/stdin" : a.input, a.output, ec))
    return fail("run", Status::InvalidArgument("--output " + a.output + " is the input file " + a.input +
                                               ": writing results would destroy it"));
  // The engine's queue holds every line of the read-ahead window, so a submit never finds it full.
  const int64_t read_ahead = read_ahead_lines(a.engine.max_num_seqs);
  auto s = make_serving(a.engine, read_ahead + 1, "run");
  if (!s.ok()) return fail("run", s.status());
  if (!s->world.leader()) return s->follow("run");
  std::ofstream out(a.output, std::ios::trunc);
  if (!out) return fail("run", Status::IOError(a.output + ": cannot open for writing"));

  RunContext ctx{a, *s,
                 Json{{"max_tokens", a.defaults.max_tokens},   {"temperature", a.defaults.sampling.temperature},
                      {"top_k", a.defaults.sampling.top_k},    {"top_p", a.defaults.sampling.top_p},
                      {"seed", a.defaults.sampling.seed},      {"ignore_eos", a.defaults.ignore_eos},
                      {"min_p", a.min_p},                      {"presence_penalty", a.presence_penalty},
                      {"frequency_penalty", a.frequency_penalty}, {"repetition_penalty", a.repetition_penalty}},
                 model_name_of(a.engine.model_dir),
                 {}};
  RunTotals& totals = ctx.totals;
  // Lines read and not yet written, in input order. A deque: the sinks hold references to its
  // elements, which pushing at the back and popping at the front leave valid.
  std::deque<LineResult> window;
  // A line that cannot run gets an error record in its place in the output (and a line on stderr):
  // nothing the user gave is dropped without a trace.
  auto read_line = [&]() -> Result<bool> {
    KL_ASSIGN_OR_RETURN(std::optional<Line> line, reader->next());
    if (!line) return false;
    LineResult& res = window.emplace_back();
    res.line = line->number;
    res.id = line->number;
    Status st = line->error;
    try {
      if (st.ok()) st = submit_line(line->text, ctx, res);
    } catch (const std::bad_alloc&) {  // a failed allocation refuses this line; the run goes on
      st = Status::ResourceExhausted("out of memory reading a line of " + std::to_string(line->text.size()) + " bytes");
    }
    if (!st.ok()) {
      std::fprintf(stderr, "klinear run: %s line %lld: %s (an error record written)\n", reader->name().c_str(),
                   (long long)res.line, st.to_string().c_str());
      res.out = res.custom_id.is_null()
                    ? Json{{"id", res.id}, {"line", res.line}, {"error", st.to_string()}}
                    : Json{{"id", "batch_req_" + std::to_string(res.line)}, {"custom_id", res.custom_id}, {"response", nullptr},
                           {"error", {{"code", "invalid_request"}, {"message", st.to_string()}}}};
      res.refused = res.done = true;
      ++totals.refused;
    }
    return true;
  };
  auto flush_ready = [&] {
    for (; !window.empty() && window.front().done; window.pop_front()) {
      const LineResult& res = window.front();
      if (res.blank) continue;
      out << res.out.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
      if (!res.refused) ++totals.finished;
    }
    out.flush();
  };

  install_signal_handlers();
  const bool progress = isatty(STDERR_FILENO);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  bool input_done = false;
  Status read_error;
  while (!g_signal) {
    while (!input_done && static_cast<int64_t>(window.size()) < read_ahead) {
      auto more = read_line();
      if (!more.ok()) read_error = more.status();
      input_done = !more.ok() || !*more;
    }
    flush_ready();
    if (!s->engine->has_work()) {
      if (input_done) break;
      continue;  // every line read so far is written: read on
    }
    s->engine->step();
    flush_ready();
    if (progress)
      std::fprintf(stderr, "\r%lld/%lld requests done, %lld tokens out, %.1f tokens/s ", (long long)totals.finished,
                   (long long)totals.submitted, (long long)totals.out_tokens, totals.out_tokens / std::max(elapsed(), 1e-9));
  }
  flush_ready();
  if (progress) std::fputs("\n", stderr);
  if (!out.good())  // a full disk (or /dev/full): the results did not reach the file
    return fail("run", Status::ResourceExhausted(a.output + ": writing the results failed (" +
                                                 std::to_string(totals.finished) + " lines counted as written)"));
  const double secs = elapsed();
  std::vector<double>& ttft = totals.ttft_s;
  std::sort(ttft.begin(), ttft.end());
  auto pct = [&](double p) { return ttft.empty() ? 0.0 : 1e3 * ttft[std::min(ttft.size() - 1, size_t(p * ttft.size()))]; };
  std::fprintf(stderr,
               "klinear run: %lld requests (%lld lines refused, an error record each), %lld input and %lld output tokens in %.2f s: %.1f output "
               "tokens/s, %.1f total tokens/s; time to first token p50 %.1f ms, p90 %.1f ms, p99 %.1f ms\n",
               (long long)totals.finished, (long long)totals.refused, (long long)totals.in_tokens, (long long)totals.out_tokens,
               secs, totals.out_tokens / std::max(secs, 1e-9), (totals.in_tokens + totals.out_tokens) / std::max(secs, 1e-9),
               pct(0.5), pct(0.9), pct(0.99));
  if (!read_error.ok()) return fail("run", read_error);  // the lines read before it ran and are written
  if (g_signal) {
    std::fprintf(stderr, "klinear run: interrupted; %lld finished lines are in %s\n", (long long)totals.finished,
                 a.output.c_str());
    return 130;
  }
  return totals.refused ? 2 : 0;
}

// ---- bench-serve
int run_bench_serve(const BenchOptions& o) {
  auto r = run_bench(o);
  if (!r.ok()) return fail("bench-serve", r.status());
  std::fputs(bench_report(o, *r).c_str(), stdout);
  return r->failed ? 1 : 0;
}

}  // namespace

void add_serve_commands(CLI::App& app, int& exit_code) {
  {
    auto a = std::make_shared<ServeArgs>();
    CLI::App* sub = app.add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API (chat and text "
                                                "completions, streaming, tokenize, metrics)");
    add_engine_args(sub, a->engine, "--max-num-seqs");
    sub->add_option("--host", a->server.host, "address to bind")->capture_default_str();
    sub->add_option("--port", a->server.port, "port to bind (0: any free port)")
        ->check(int_in({0, 65535}))
        ->capture_default_str();
    // An empty key would turn authentication off without a word: refused.
    sub->add_option("--api-key", a->server.api_key, "require 'Authorization: Bearer KEY' on /v1/* and tokenize routes")
        ->check(CLI::Validator(
            [](std::string& key) {
              return key.empty() ? std::string("is empty, which would turn authentication off (leave the flag out for none)")
                                 : std::string();
            },
            "non-empty"));
    sub->add_option("--api-key-file", a->api_key_file, "read the API key from this file's first line (default: "
                                                       "the environment's KLINEAR_API_KEY, if set)");
    sub->add_option("--shutdown-timeout", a->shutdown_timeout_s,
                    "seconds a SIGINT/SIGTERM waits for in-flight requests before cancelling them (/health is 503 "
                    "meanwhile)")
        ->check(number_in(0, 86400))
        ->capture_default_str();
    // Each waiting request holds an HTTP thread (the pool is sized as the queue plus the running
    // sequences), so the queue is bounded where a thread pool still starts.
    sub->add_option("--max-queue", a->max_queue, "requests waiting for admission before new ones get 503")
        ->check(int_in({1, kMaxQueue}))
        ->capture_default_str();
    sub->add_option("--served-model-name", a->server.model_name, "model id in the API (default: the model directory's name)");
    sub->add_option("--allowed-origins", a->allowed_origins,
                    "origins browsers may call from (CORS): a JSON list as vLLM takes it ('[\"*\"]') or "
                    "comma-separated (default: none, no CORS headers)");
    sub->add_flag("--disable-log-requests", a->disable_log_requests, "no stderr line per finished request");
    sub->add_flag("--disable-log-stats", a->disable_log_stats,
                  "no periodic stderr line (every 10 s while busy) of throughput, queue and cache use");
    sub->add_option("--max-body-bytes", a->server.max_body_bytes, "largest request body (413 above)")
        ->check(int_in(kBodyBytes))
        ->capture_default_str();
    // Slow clients (issue 34): totals, not per read, so a trickle cannot stretch them.
    sub->add_option("--header-timeout", a->server.header_timeout_s,
                    "seconds a request's line and headers may take to arrive, from the connection's open or its "
                    "previous response (408 after; an idle keep-alive connection closes)")
        ->check(number_in(0.01, 86400))
        ->capture_default_str();
    sub->add_option("--body-timeout", a->server.body_timeout_s,
                    "seconds a request's body may take to arrive after its headers (408 after)")
        ->check(number_in(0.01, 86400))
        ->capture_default_str();
    sub->add_option("--max-slow-connections-per-client", a->server.max_slow_connections_per_client,
                    "connections of one client address that may be partway through sending their headers at once "
                    "(429 for the next)")
        ->check(int_in({1, 65536}))
        ->capture_default_str();
    sub->callback([a, sub, &exit_code] {
      const Status s = take_engine_settings(*sub, a->engine, nullptr);
      exit_code = s.ok() ? run_serve(*a) : fail("serve", s);
    });
  }
  {
    auto a = std::make_shared<RunArgs>();
    CLI::App* sub = app.add_subcommand("run", "offline batch generation: one JSON request per input line (prompt, "
                                              "prompt_ids or messages, optional sampling fields; or vLLM's and OpenAI's "
                                              "batch format: custom_id, url, body), results in input order");
    add_engine_args(sub, a->engine, "--max-num-seqs,--max-batch");  // vLLM's name; --max-batch kept
    sub->add_option("--input", a->input, "input JSONL file (-: stdin), read as it runs; a line over 64 MiB "
                                             "gets an error record")->required();
    sub->add_option("--output", a->output, "output JSONL file (id, text, ids, finish_reason, token counts)")->required();
    add_generate_options(sub, a->defaults);
    // Checked here, in the ranges of the request fields they default (parse_api_request): unchecked,
    // a bad value failed every line, each naming the JSON field.
    sub->add_option("--min-p", a->min_p, "drop ids less likely than min-p times the most likely")
        ->check(number_in(0, 1))
        ->capture_default_str();
    sub->add_option("--presence-penalty", a->presence_penalty, "penalty on ids already generated")
        ->check(number_in(-2, 2))
        ->capture_default_str();
    sub->add_option("--frequency-penalty", a->frequency_penalty, "penalty per repetition of a generated id")
        ->check(number_in(-2, 2))
        ->capture_default_str();
    sub->add_option("--repetition-penalty", a->repetition_penalty, "divides the logits of ids seen in prompt or output")
        ->check(number_in(1e-3, 100))
        ->capture_default_str();
    sub->callback([a, sub, &exit_code] {
      const Status s = take_engine_settings(*sub, a->engine, &a->defaults.max_tokens);
      exit_code = s.ok() ? run_run(*a) : fail("run", s);
    });
  }
  {
    auto a = std::make_shared<BenchOptions>();
    CLI::App* sub = app.add_subcommand("bench-serve", "load a running server with concurrent streaming requests; prints "
                                                      "throughput and latency percentiles");
    sub->add_option("--url", a->url, "server base URL")->capture_default_str();
    sub->add_option("--api-key", a->api_key, "API key of the server");
    sub->add_option("--concurrency", a->concurrency, "requests in flight at once")->capture_default_str();
    sub->add_option("--requests", a->requests, "requests in all")->capture_default_str();
    sub->add_option("--input-len", a->input_len, "prompt tokens per request")->capture_default_str();
    sub->add_option("--output-len", a->output_len, "generated tokens per request")->capture_default_str();
    sub->add_option("--prefix-len", a->prefix_len, "leading prompt tokens shared by all requests")->capture_default_str();
    sub->add_option("--seed", a->seed, "seed of the random prompts (default: a fresh one per run, printed)");
    sub->callback([a, &exit_code] { exit_code = run_bench_serve(*a); });
  }
}

}  // namespace klinear::cli
