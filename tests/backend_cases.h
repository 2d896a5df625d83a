// The (backend, dtype) rows every op and model test runs over; their bounds follow the dtype
// (test_util.h's Tolerance). A test written once as TEST_P(BackendTest-derived fixture) runs on every
// row; rows whose backend this build or machine cannot make (CUDA without a GPU) are skipped with the
// reason. A CUDA row is one more line here.
//
// Inputs are made on the host (fresh seeds) and copied to the backend; outputs are poisoned with
// NaN before the op runs, so an element the op never writes fails the comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "test_util.h"

namespace klinear::testing {

struct BackendCase {
  const char* name;
  Device device;
  DType dtype;
};

inline const std::vector<BackendCase>& backend_cases() {
  static const std::vector<BackendCase> cases = {
      {"cpu_f32", Device::kCpu, DType::kF32},
      {"cuda_f32", Device::kCuda, DType::kF32},
      {"cuda_bf16", Device::kCuda, DType::kBF16},
  };
  return cases;
}

inline void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

inline std::string backend_case_name(const ::testing::TestParamInfo<BackendCase>& info) { return info.param.name; }

// A test on one backend row: the backend, and host ↔ device helpers.
class BackendTest : public ::testing::TestWithParam<BackendCase> {
 public:
  void SetUp() override {
    auto be = make_backend(BackendOptions{GetParam().device, GetParam().dtype});
    if (!be.ok()) GTEST_SKIP() << GetParam().name << ": " << be.status().to_string();
    be_ = std::move(be).value();
  }
  Backend& be() { return *be_; }
  // The bound of a comparison of `depth` (test_util.h) in this row's activation dtype.
  double tol(const Tolerance& depth = kOp) const { return depth.rel(act()); }
  DType act() const { return be_->activation_dtype(); }
  // Host tensor on the backend in the activation dtype (or `dtype`).
  Tensor dev(const Tensor& host) { return be_->to_device(host, act()); }
  Tensor dev(const Tensor& host, DType dtype) { return be_->to_device(host, dtype); }
  // Host tensor on the backend as a persistent tensor (pools, weights).
  Tensor persistent(const Tensor& host, DType dtype) {
    Tensor t = be_->alloc_persistent(dtype, host.shape());
    be_->copy(be_->to_device(host, dtype), t);
    return t;
  }
  // A step tensor filled with poison: NaN, or INT32_MIN for I32.
  Tensor poisoned(const Shape& shape, DType dtype) {
    Tensor t = be_->alloc(dtype, shape);
    be_->fill(t, dtype == DType::kI32 ? -2147483648.0f : std::numeric_limits<float>::quiet_NaN());
    return t;
  }
  Tensor poisoned(const Shape& shape) { return poisoned(shape, act()); }
  Tensor host(const Tensor& t) { return be_->to_host(t); }

  std::unique_ptr<Backend> be_;
};

// The layout of a step of sequences with new_tokens[b] rows after cached[b] positions, in state
// slots slots[b]; each sequence's pages are taken from a shuffled pool of `pages` pages, so page
// tables are not in order. upload_layout is left to the caller's backend.
inline SeqLayout make_layout(const std::vector<int32_t>& new_tokens, const std::vector<int32_t>& cached,
                             const std::vector<int32_t>& slots, int64_t page_size, int64_t pages, std::mt19937_64& rng) {
  SeqLayout l;
  l.page_size = page_size;
  l.cu_seqlens = {0};
  for (size_t b = 0; b < new_tokens.size(); ++b) {
    l.cu_seqlens.push_back(l.cu_seqlens.back() + new_tokens[b]);
    l.max_pages = std::max<int64_t>(l.max_pages, (cached[b] + new_tokens[b] + page_size - 1) / page_size);
  }
  l.cached = cached;
  l.slots = slots;
  std::vector<int32_t> pool(static_cast<size_t>(pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  for (size_t b = 0; b < new_tokens.size(); ++b) {
    const int64_t used = (cached[b] + new_tokens[b] + page_size - 1) / page_size;
    for (int64_t p = 0; p < l.max_pages; ++p) {
      KL_CHECK(p >= used || next < pool.size(), "make_layout: not enough pages");
      l.page_table.push_back(p < used ? pool[next++] : -1);
    }
  }
  return l;
}

// Instantiates a BackendTest-derived suite over every row.
#define KL_BACKEND_SUITE(Suite) \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::ValuesIn(::klinear::testing::backend_cases()), \
                           ::klinear::testing::backend_case_name)

}  // namespace klinear::testing
