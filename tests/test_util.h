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

// One tolerance model for every comparison with a reference.
//
// A result computed in a dtype differs from the exact value by rounding, of two kinds on the path
// to one output element:
//   storage: values rounded to the activation dtype (the inputs as uploaded, intermediates a kernel
//     keeps in that dtype such as bf16 tensor-core operands, the outputs of earlier ops, the output
//     itself), each up to the dtype's unit roundoff u (2⁻⁸ for bf16, 2⁻²⁴ for f32) of what it carries;
//   accumulation: fp32 roundings in sums and recurrences (dot products over K, a state carried over
//     T positions, a residual stream over layers), each up to u(f32).
// Relative to the reference's scale the bound is
//     rel = u(dtype) · storage + u(f32) · accumulation,
// so a float32 row's bound is set by how deep its sums run and a bf16 row's by how often its values
// are stored. The depths of the comparisons the tests make are the named Tolerances below; a test
// that needs another says which roundings it adds (e.g. kOp.plus_storage(2)).
struct Tolerance {
  double storage = 0;       // roundings to the activation dtype on an output's path
  double accumulation = 0;  // fp32 roundings on an output's path
  double rel(DType dtype) const;
  Tolerance plus_storage(double roundings) const { return {storage + roundings, accumulation}; }
};

// The unit roundoff of `dtype` (half the distance from 1 to the next value).
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kF32: return std::ldexp(1.0, -24);
    case DType::kBF16: return std::ldexp(1.0, -8);
    case DType::kF16: return std::ldexp(1.0, -11);
    default: ADD_FAILURE() << "no unit roundoff for " << dtype_name(dtype); return 0;
  }
}

inline double Tolerance::rel(DType dtype) const {
  return unit_roundoff(dtype) * storage + unit_roundoff(DType::kF32) * accumulation;
}

// Bit for bit: copies, round trips, two loads of the same weights.
inline constexpr Tolerance kExact{};
// The same roundings with a sum in another order (a few fp32 ulps of a norm's scale), which can move
// a stored bf16 output by one ulp (2⁻⁷ relative): 1e-6 in f32, 1/128 in bf16.
inline constexpr Tolerance kReorder{2, 15};
// One op against its double-precision loop (every op test): inputs, intermediates and the output
// stored, reductions up to a few thousand long. 1e-5 in f32, 2.3e-2 in bf16.
inline constexpr Tolerance kOp{6, 160};
// A recurrence against the double one (KDA over up to 1,000 positions from a non-zero state): fp32
// rounding accumulates step after step (seen up to 4.8e-5 per state row, the CPU and the GPU alike,
// KLINEAR_TEST_SEED=2410130513), and the bf16 tensor-core path stores its state and Vn every chunk
// (seen up to 2.1e-2 on one output row of T=1000 D=128 on the H200, KLINEAR_TEST_SEED=3040425833,
// and 3.09e-2 on one row of SnapshotsAtChunkBoundariesAndEnds, lower-bound gate, d = 64,
// KLINEAR_TEST_SEED=465092885, twice). 1e-4 in f32, 4.3e-2 in bf16.
inline constexpr Tolerance kRecurrence{11, 1680};
// A whole model's logits against a reference evaluation of the same math (the fixtures' goldens, the
// CPU's run): a recurrence's depth and two layers' more storage. 1e-4 in f32, 5.1e-2 in bf16.
inline constexpr Tolerance kModel{13, 1680};
// A whole model's rows computed in another batch shape (alone against beside other sequences, a
// prefix-cache snapshot against a fresh prefill). OpenBLAS and cuBLAS compute a row of x·wᵀ
// differently for different row counts (1 row vs 40: ~4 % of outputs differ in the last bit), and
// K3's seven random layers (AttnRes, SiTU, MXFP4) amplify that: 3.05e-5 seen on the CPU (1 run in 12),
// 3.6e-5 and 5.9e-5 (a decode row, 2026-12-01) on the H200 in float32, and 1.11e-4 on the CPU (a
// 20-token prefill piece, seed 3074677373, routing margin 1.8e-4); in bf16 with the routing replayed
// 0.089 once in 240 runs on the H200 (2026-12-02, a 5-token prefill piece beside two decode rows).
// Kimi Linear stays below 1e-5; a wrong row, slot or page is off by orders more. 2e-4 in f32, 0.12
// in bf16.
inline constexpr Tolerance kModelRows{31, 3330};
// A deep model's logits through different kernels for the same math (chunked against recurrent
// KDA, expanded against absorbed MLA, the CUDA kernels against the CPU's) in float32: seen up to
// ~1.0e-4 between pieces and 3.97e-4 between the H200's whole prompt and the CPU's
// (k3_block3_lowrank, seed 1820658736, 2026-12-02); where a draw amplifies more, the test measures
// the CPU's own spread and widens the bound to it (consistency_test.cc). 5e-4 in f32.
inline constexpr Tolerance kModelPaths{13, 8380};
// The KDA backward's fp32 gradients against exact ones or each other (chunked against recurrent,
// split over ranks against whole). Globally they agree to below 1e-6 (max|a−b|/max|b|, T up to
// 1000); per row, the chunk form's dg of a chunk's first rows is the difference of sums over the
// whole chunk (dg = the reverse cumulative sum of dG, whose pair terms cancel) and is off by up to
// 7.4e-5 of the row (8 runs of the backward tests, 2026-12-06), as where a split moves the chunk
// boundaries (7.3e-5 seen over 2 ranks, 2026-12-07; dk, whose rows elsewhere agree to ~1e-6, once
// 1.49e-5 of a row over 4 ranks at T = 65, seeds 285446364 / 1990201298, 2026-12-08). 2e-4 in f32.
inline constexpr Tolerance kGradients{0, 3360};

// How far `a` is from the reference `b` (host F32 tensors of the same size), three ways:
//   global: max|a − b| / max|b|;
//   worst row (rows = numel / last dim): max over rows of ‖a_r − b_r‖ / ‖b_r‖, so one bad row is
//     not hidden by a global maximum elsewhere; rows whose reference norm is below 1e-2 of the
//     largest row's are measured against that floor instead (their relative error is rounding noise);
//   nmse: the normalised mean squared error ‖a − b‖² / ‖b‖² over the whole tensor.
// NaN or Inf anywhere in `a` or in the reference `b` is a failure before any tolerance, and so is
// an all-zero reference (the comparison would be vacuous): `problem` says which.
struct ErrorStats {
  std::string problem;  // empty when the comparison is meaningful
  double global = 0, worst_row = 0, nmse = 0;
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
  double max_diff = 0, max_ref = 0, max_row_ref = 0, sum_e2 = 0, sum_b2 = 0;
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
    sum_e2 += e2, sum_b2 += b2;
  }
  if (max_ref == 0) {
    s.problem = "reference is all zeros (test would be vacuous)";
    return s;
  }
  s.global = max_diff / max_ref;
  s.nmse = sum_e2 / sum_b2;
  for (int64_t r = 0; r < rows; ++r) {
    const double rel = err[r] / std::max(ref[r], 1e-2 * max_row_ref);
    if (rel > s.worst_row) s.worst_row = rel, s.row = r;
  }
  return s;
}

// The checks on computed statistics: a problem (NaN, size, all-zero reference) fails first.
inline ::testing::AssertionResult global_within(const ErrorStats& s, double tol) {
  if (!s.problem.empty()) return ::testing::AssertionFailure() << s.problem;
  if (s.global > tol) return ::testing::AssertionFailure() << "max|a-b|/max|b| = " << s.global << " > " << tol;
  return ::testing::AssertionSuccess() << "rel " << s.global;
}
inline ::testing::AssertionResult rows_within(const ErrorStats& s, double tol) {
  if (!s.problem.empty()) return ::testing::AssertionFailure() << s.problem;
  if (s.worst_row > tol)
    return ::testing::AssertionFailure() << "row " << s.row << ": relative RMS error " << s.worst_row << " > " << tol;
  return ::testing::AssertionSuccess() << "worst row rel " << s.worst_row;
}

// The global check alone.
inline ::testing::AssertionResult close_rel(const Tensor& a, const Tensor& b, double tol) {
  return global_within(error_stats(a, b), tol);
}

// The per-row check alone.
inline ::testing::AssertionResult close_rows(const Tensor& a, const Tensor& b, double tol) {
  return rows_within(error_stats(a, b), tol);
}

// What a comparison's error is made of, which decides how far under the bound the error over the
// whole tensor must stay (all_close's NMSE check).
enum class ErrorShape {
  // Independent roundings (one op against its double loop): most elements sit far below the worst,
  // so the whole tensor's RMS error must stay within half the bound, and an error near the bound
  // everywhere (a bias, a wrong scale) fails even where no single element or row is out.
  kRounding,
  // Roundings amplified through the layers of a random network (a model's logits): every row is
  // off alike, and one-row comparisons (a decode step) are common, so the whole tensor's RMS error
  // must stay within the bound itself.
  kAmplified,
};

// All three checks against the bound `tol` (a Tolerance's rel, or a bound a test measured): the
// global max-abs error and the worst row's RMS error within tol, and the whole tensor's relative RMS
// error (√nmse) within tol, or tol/2 for rounding errors (ErrorShape).
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double tol,
                                            ErrorShape shape = ErrorShape::kRounding) {
  const ErrorStats s = error_stats(a, b);
  if (auto g = global_within(s, tol); !g) return g;
  if (auto r = rows_within(s, tol); !r) return r;
  const double rms_bound = shape == ErrorShape::kRounding ? tol / 2 : tol;
  if (s.nmse > rms_bound * rms_bound)
    return ::testing::AssertionFailure() << "nmse " << s.nmse << " > " << rms_bound * rms_bound
                                         << " (an error over the whole tensor; worst row " << s.worst_row << ")";
  return ::testing::AssertionSuccess() << "rel " << s.global << ", worst row " << s.worst_row << ", nmse " << s.nmse;
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
