// Helpers shared by the tests: fixture paths, fresh seeds, and comparisons where NaN fails first.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <numeric>
#include <random>
#include <string>

#include <sys/wait.h>

#include "core/tensor.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"

namespace klinear::testing {

inline std::string source_path(const std::string& rel) { return std::string(KLINEAR_SOURCE_DIR) + "/" + rel; }
inline std::string fixture_path(const std::string& rel) { return source_path("tests/fixtures/" + rel); }

inline const std::string& kimi_tokenizer_dir() {
  static const std::string dir = source_path("tokenizers/kimi-k2");
  return dir;
}

// The real Kimi tokenizer, loaded once per test binary (null, with a test failure, if it cannot).
inline const Tokenizer* kimi_tokenizer() {
  static const std::optional<Tokenizer> tok = []() -> std::optional<Tokenizer> {
    auto r = Tokenizer::load(kimi_tokenizer_dir());
    if (!r.ok()) {
      ADD_FAILURE() << "cannot load " << kimi_tokenizer_dir() << ": " << r.status().to_string();
      return std::nullopt;
    }
    return std::move(r).value();
  }();
  return tok ? &*tok : nullptr;
}

// The logistic sigmoid in double precision, for reference computations.
inline double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// A fresh seed per call (printed, so a failure can be replayed with KLINEAR_TEST_SEED).
inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("KLINEAR_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  const uint64_t seed = std::random_device{}();
  std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

// Random host F32 tensor with entries uniform in [lo, hi).
inline Tensor random_tensor(std::mt19937_64& rng, const Shape& shape, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = d(rng);
  return t;
}

// max|a − b| / max|b|; NaN or Inf anywhere in `a` is a failure before any tolerance.
inline ::testing::AssertionResult close_rel(const Tensor& a, const Tensor& b, double tol) {
  if (a.numel() != b.numel())
    return ::testing::AssertionFailure() << "size " << a.numel() << " vs " << b.numel();
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.f32()[i], y = b.f32()[i];
    if (!std::isfinite(x)) return ::testing::AssertionFailure() << "non-finite value " << x << " at " << i;
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(x) - y));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(y)));
  }
  if (max_ref == 0) return ::testing::AssertionFailure() << "reference is all zeros (test would be vacuous)";
  const double rel = max_diff / max_ref;
  if (rel > tol) return ::testing::AssertionFailure() << "max|a-b|/max|b| = " << rel << " > " << tol;
  return ::testing::AssertionSuccess() << "rel " << rel;
}

// A fresh directory under the system temp dir (named after the running test and unique per
// process), removed with everything in it at the end of the scope.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string tag = info ? info->name() : "x";
    std::replace(tag.begin(), tag.end(), '/', '_');
    path_ = std::filesystem::temp_directory_path() /
            ("klinear_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A router decision is discontinuous: two experts within ~1e-6 of each other at the top-k boundary
// can be picked differently by two fp32 evaluation orders, and then the logits legitimately differ.
// So every router here gets biases 0.05 apart (a random order) and gate weights scaled down to
// std 0.002, which keeps token-dependent routing weights but never puts a selection on a tie.
// Routing itself is covered by the fixtures and router_test. Rewrites `dir`/model.safetensors.
inline void separate_router_choices(const std::string& dir, uint64_t seed) {
  const std::string path = dir + "/model.safetensors";
  auto file = SafetensorsFile::open(path);
  KL_CHECK(file.ok(), file.status().to_string());
  std::mt19937_64 rng(seed);
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto ends_with = [](const std::string& s, const std::string& t) {
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  for (const SafetensorsEntry& e : file->entries()) {
    Tensor src = file->tensor(e);
    Tensor t = Tensor::empty(src.dtype(), src.shape());
    std::memcpy(t.data(), src.data(), src.nbytes());
    const bool gate = ends_with(e.name, "block_sparse_moe.gate.weight");
    const bool bias = ends_with(e.name, "gate.e_score_correction_bias");
    if (gate || bias) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      convert_to_f32(t.dtype(), t.data(), v.data(), v.size());
      if (gate) {
        for (float& x : v) x *= 0.1f;
      } else {
        std::vector<int> order(v.size());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * static_cast<float>(order[i]);
      }
      for (size_t i = 0; i < v.size(); ++i) {
        if (t.dtype() == DType::kF32) t.f32()[i] = v[i];
        else t.data_as<uint16_t>()[i] = f32_to_bf16(v[i]);
      }
    }
    tensors.emplace_back(e.name, t);
  }
  // Written beside and renamed over: the mapping of the old file stays valid until it is dropped.
  KL_CHECK(write_safetensors(path + ".tmp", tensors).ok(), "rewrite " + path);
  std::filesystem::rename(path + ".tmp", path);
}

// The klinear binary run through bash (so arguments may use quotes and redirections).
struct CliRun {
  int exit_code;  // -1 when killed by a signal
  std::string out, err;
  std::string all() const { return out + err; }
};

// `prefix` goes before the binary on the same line (e.g. "ulimit -v N; timeout 60 ").
inline CliRun run_cli_prefixed(const std::string& prefix, const std::string& args) {
  const ScratchDir dir;
  const std::string out = dir.file("out"), err = dir.file("err");
  const std::string script = dir.file("cmd.sh");
  // Braces: a redirection inside `args` (">/dev/full", ">&-") applies to klinear, not the capture.
  std::ofstream(script) << "{ " << prefix << KLINEAR_CLI_PATH << " " << args << "\n} >" << out << " 2>" << err << "\n";
  const int status = std::system(("bash " + script).c_str());
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, "", ""};
  r.out = read_text_file(out).value();
  r.err = read_text_file(err).value();
  return r;
}

inline CliRun run_cli(const std::string& args) { return run_cli_prefixed("", args); }

}  // namespace klinear::testing
