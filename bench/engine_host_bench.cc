// Host time of the serving engine outside the model forward: what Engine::step spends on
// scheduling, building the runner's steps, post-processing (detokenizing, stop checks, events),
// prefix-cache bookkeeping and metrics, per step, as a function of the running sequences and of
// the tokens they have generated. The forward of a tiny checkpoint on the CPU is cheap, so this
// host part is what an H200 step adds around its forward (6.4 ms per decode step at
// ~231 sequences of 8k-token prompts).
//
// Decisions: the engine's own metrics split each step into the runner's call (forward, with any
// device sampling and the runner's own bookkeeping) and the rest, so the numbers are the same ones
// /metrics reports on the H200. Every sequence gets its own random prompt (nothing shared, so the
// prefix cache holds every prompt page, as distinct 8k prompts fill it there) and generates
// --output tokens with ignore_eos. The prompts run once first (one token each) so the measured
// pass starts from them cached, as a server's second run does; without the prefix cache, one
// pass. Sequences that start together decode in lockstep, so a decode step's generated length is
// the same for all of them. Rows are windows of decode steps by generated length; a table, not a
// test.
//
// Usage: engine_host_bench [--seqs N]... [--prompt P] [--output K] [--window W] [--no-prefix-cache] MODEL_DIR
//   e.g. ./build/engine_host_bench --seqs 64 --seqs 256 --prompt 1024 --output 1000 tests/fixtures/kimi-linear-tiny/model
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"

namespace {

using namespace klinear;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "engine_host_bench: %s\n", what.c_str());
  std::exit(1);
}
template <typename T>
T value_or_die(Result<T> r) {
  if (!r.ok()) die(r.status().to_string());
  return std::move(r).value();
}

struct Args {
  std::vector<int> seqs;
  int64_t prompt = 1024, output = 1000, window = 100;
  PrefixCaching prefix = PrefixCaching::kOn;
  std::string model;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) die(f + " needs a value");
      return std::atoll(argv[++i]);
    };
    if (f == "--seqs") a.seqs.push_back(static_cast<int>(next()));
    else if (f == "--prompt") a.prompt = next();
    else if (f == "--output") a.output = next();
    else if (f == "--window") a.window = next();
    else if (f == "--no-prefix-cache") a.prefix = PrefixCaching::kOff;
    else if (!f.empty() && f[0] == '-') die("unknown flag " + f);
    else a.model = f;
  }
  if (a.model.empty()) die("usage: engine_host_bench [--seqs N]... [--prompt P] [--output K] [--window W] [--no-prefix-cache] MODEL_DIR");
  if (a.seqs.empty()) a.seqs = {64, 256};
  if (a.prompt < 1 || a.output < 1 || a.window < 1) die("--prompt, --output and --window must be >= 1");
  return a;
}

// The decode steps of one window of generated lengths: host seconds of each, and sequences.
struct Window {
  std::vector<double> host_s;
  int64_t seq_steps = 0;
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

void run(Model& model, const Args& a, int seqs) {
  const CacheSizes unit = value_or_die(Cache::create(model.config(), model.backend(), CacheOptions{1, 64, 0}))->sizes();
  const uint64_t pages = static_cast<uint64_t>((a.prompt + a.output + 63) / 64 + 1);
  // Room for every sequence, a KDA snapshot of each prompt, and their pages.
  const CacheOptions cache{2 * seqs, 64, static_cast<uint64_t>(seqs) * (2 * unit.bytes_per_slot + pages * unit.bytes_per_page)};
  auto runner = value_or_die(ModelRunner::create(model, cache, PrefixCacheOptions{a.prefix, 256}));
  EngineOptions eo;
  eo.scheduler.max_num_seqs = seqs;
  eo.scheduler.max_num_tokens = default_max_num_tokens(Device::kCpu);
  eo.scheduler.snapshot_interval = a.prefix == PrefixCaching::kOn ? 256 : 0;
  eo.max_queue = seqs;
  Engine engine(*runner, nullptr, eo);

  std::mt19937_64 rng(1234);
  const int64_t vocab = model.config().vocab_size;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(seqs), std::vector<int32_t>(static_cast<size_t>(a.prompt)));
  for (auto& p : prompts)
    for (int32_t& id : p) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  std::vector<int64_t> generated(static_cast<size_t>(seqs), 0);
  // A first pass of one token each leaves the prompts in the prefix cache (as a previous run
  // leaves them on a server); the measured pass then restores them, so its sequences decode in
  // lockstep after a short prefill of their last chunk.
  const std::vector<int64_t> passes =
      a.prefix == PrefixCaching::kOn ? std::vector<int64_t>{1, a.output} : std::vector<int64_t>{a.output};
  for (const int64_t max_tokens : passes) {
    std::fill(generated.begin(), generated.end(), 0);
    for (int i = 0; i < seqs; ++i) {
      RequestSpec s;
      s.prompt = prompts[static_cast<size_t>(i)];
      s.stop.max_tokens = max_tokens;
      s.stop.ignore_eos = true;
      int64_t* g = &generated[static_cast<size_t>(i)];
      value_or_die(engine.submit(std::move(s), [g](const EngineEvent& e) { *g += static_cast<int64_t>(e.tokens.size()); }));
    }
    if (max_tokens != passes.back()) engine.run_until_idle();
  }
  std::vector<Window> windows(static_cast<size_t>((a.output + a.window - 1) / a.window));
  const auto decode = static_cast<size_t>(StepKind::kDecode);
  EngineMetrics before = engine.metrics();
  const int64_t held = before.cache.pages_free - runner->cache().free_pages();
  while (engine.has_work()) {
    engine.step();
    const EngineMetrics after = engine.metrics();
    const StepMetrics &m0 = before.steps[decode], &m1 = after.steps[decode];
    if (m1.seconds.count() > m0.seconds.count()) {
      const double forward = m1.forward_seconds.sum() - m0.forward_seconds.sum();
      // Every running sequence decoded in this step; the first one's count stands for all.
      int64_t len = 0;
      for (int64_t g : generated) len = std::max(len, g);
      Window& w = windows[static_cast<size_t>(std::min<int64_t>(len - 1, a.output - 1) / a.window)];
      w.host_s.push_back(m1.seconds.sum() - m0.seconds.sum() - forward);
      w.seq_steps += static_cast<int64_t>(m1.tokens - m0.tokens);
    }
    before = after;
  }
  std::printf("\n%d sequences, prompt %lld, output %lld, prefix cache %s (%lld pages cached alone at the start)\n", seqs,
              static_cast<long long>(a.prompt), static_cast<long long>(a.output),
              a.prefix == PrefixCaching::kOn ? "on" : "off", static_cast<long long>(held));
  // Medians: other processes on the machine stretch some steps' host time many times over.
  std::printf("%-14s %8s %12s %18s %18s\n", "generated", "steps", "seqs/step", "host us/step p50", "host us/seq p50");
  for (size_t i = 0; i < windows.size(); ++i) {
    const Window& w = windows[i];
    if (w.host_s.empty()) continue;
    const std::string range = std::to_string(i * a.window + 1) + "-" + std::to_string(std::min<int64_t>((i + 1) * a.window, a.output));
    const double steps = static_cast<double>(w.host_s.size()), per_step = 1e6 * median(w.host_s);
    std::printf("%-14s %8zu %12.1f %18.1f %18.2f\n", range.c_str(), w.host_s.size(),
                static_cast<double>(w.seq_steps) / steps, per_step, per_step * steps / static_cast<double>(w.seq_steps));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  auto backend = value_or_die(make_backend(BackendOptions{}));
  auto model = value_or_die(Model::load(a.model, *backend));
  for (int seqs : a.seqs) run(*model, a, seqs);
  return 0;
}
