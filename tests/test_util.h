// Helpers shared by the tests: fixture paths, fresh seeds, and comparisons where NaN fails first.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>

#include "core/tensor.h"

namespace klinear::testing {

inline std::string source_path(const std::string& rel) { return std::string(KLINEAR_SOURCE_DIR) + "/" + rel; }
inline std::string fixture_path(const std::string& rel) { return source_path("tests/fixtures/" + rel); }

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

}  // namespace klinear::testing
