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
#include <vector>

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

// How far `a` is from the reference `b` (host F32 tensors of the same size), two ways:
//   global: max|a − b| / max|b|;
//   worst row (rows = numel / last dim): max over rows of ‖a_r − b_r‖ / ‖b_r‖, so one bad row is
//     not hidden by a global maximum elsewhere; rows whose reference norm is below 1e-2 of the
//     largest row's are measured against that floor instead (their relative error is rounding noise).
// NaN or Inf anywhere in `a` or in the reference `b` is a failure before any tolerance, and so is
// an all-zero reference (the comparison would be vacuous): `problem` says which.
struct ErrorStats {
  std::string problem;  // empty when the comparison is meaningful
  double global = 0, worst_row = 0;
  int64_t row = 0;      // the worst row
  double worst() const { return problem.empty() ? std::max(global, worst_row) : INFINITY; }
};

inline ErrorStats error_stats(const Tensor& a, const Tensor& b) {
  ErrorStats s;
  if (a.numel() != b.numel() || b.rank() == 0) {
    s.problem = "size " + std::to_string(a.numel()) + " vs " + std::to_string(b.numel());
    return s;
  }
  const int64_t width = b.dim(-1), rows = width == 0 ? 0 : b.numel() / width;
  std::vector<double> err(static_cast<size_t>(rows)), ref(static_cast<size_t>(rows));
  double max_diff = 0, max_ref = 0, max_row_ref = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double e2 = 0, b2 = 0;
    for (int64_t j = 0; j < width; ++j) {
      const float x = a.f32()[r * width + j], y = b.f32()[r * width + j];
      if (!std::isfinite(x) || !std::isfinite(y)) {
        s.problem = std::string(std::isfinite(x) ? "non-finite reference " : "non-finite value ") +
                    std::to_string(std::isfinite(x) ? y : x) + " in row " + std::to_string(r);
        return s;
      }
      const double d = double(x) - y;
      max_diff = std::max(max_diff, std::fabs(d));
      max_ref = std::max(max_ref, std::fabs(double(y)));
      e2 += d * d;
      b2 += double(y) * y;
    }
    err[r] = std::sqrt(e2);
    ref[r] = std::sqrt(b2);
    max_row_ref = std::max(max_row_ref, ref[r]);
  }
  if (max_ref == 0) {
    s.problem = "reference is all zeros (test would be vacuous)";
    return s;
  }
  s.global = max_diff / max_ref;
  for (int64_t r = 0; r < rows; ++r) {
    const double rel = err[r] / std::max(ref[r], 1e-2 * max_row_ref);
    if (rel > s.worst_row) s.worst_row = rel, s.row = r;
  }
  return s;
}

// The global check alone.
inline ::testing::AssertionResult close_rel(const Tensor& a, const Tensor& b, double tol) {
  const ErrorStats s = error_stats(a, b);
  if (!s.problem.empty()) return ::testing::AssertionFailure() << s.problem;
  if (s.global > tol) return ::testing::AssertionFailure() << "max|a-b|/max|b| = " << s.global << " > " << tol;
  return ::testing::AssertionSuccess() << "rel " << s.global;
}

// The per-row check alone.
inline ::testing::AssertionResult close_rows(const Tensor& a, const Tensor& b, double tol) {
  const ErrorStats s = error_stats(a, b);
  if (!s.problem.empty()) return ::testing::AssertionFailure() << s.problem;
  if (s.worst_row > tol)
    return ::testing::AssertionFailure() << "row " << s.row << ": relative RMS error " << s.worst_row << " > " << tol;
  return ::testing::AssertionSuccess() << "worst row rel " << s.worst_row;
}

// Both checks: the global max-abs relative error and the per-row relative RMS error.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double tol) {
  auto g = close_rel(a, b, tol);
  if (!g) return g;
  return close_rows(a, b, tol);
}

// A gtest parameter name from a fixture or preset name ("k3-tiny" -> "k3_tiny").
inline std::string identifier(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
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
