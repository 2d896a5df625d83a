#include "runtime/step_executor.h"

#include <algorithm>
#include <atomic>
#include <vector>

namespace klinear {

namespace {
// A host array as a tensor (no copy).
template <typename T>
Tensor host_view(DType dtype, std::vector<T>& v) {
  return Tensor::wrap(dtype, {static_cast<int64_t>(v.size())}, v.data(), nullptr, Device::kCpu);
}
// The SampleArgs arrays of `draws`, in host vectors.
struct DrawArrays {
  std::vector<float> temperature, top_p;
  std::vector<int32_t> top_k, seed, counter;
  explicit DrawArrays(std::span<const SampleRow> draws) {
    for (const SampleRow& d : draws) {
      temperature.push_back(d.temperature);
      top_p.push_back(d.top_p);
      top_k.push_back(d.top_k);
      seed.push_back(static_cast<int32_t>(static_cast<uint32_t>(d.seed)));
      seed.push_back(static_cast<int32_t>(static_cast<uint32_t>(d.seed >> 32)));
      counter.push_back(d.counter);
    }
  }
};
constexpr int kBucketBits = 20;  // graph key = executor id << kBucketBits | bucket
}  // namespace

StepExecutor::StepExecutor(Model& model, Cache& cache) : model_(model), cache_(cache) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id++;
}

StepExecutor::~StepExecutor() {
  if (!out_.empty()) model_.backend().clear_graphs();
}

Result<StepOutput> StepExecutor::run(Batch& batch, std::span<const SampleRow> draws) {
  KL_CHECK(draws.empty() || draws.size() == batch.logit_rows.size(),
           "step: " + std::to_string(draws.size()) + " draws for " + std::to_string(batch.logit_rows.size()) + " rows");
  if (fixed_shape(batch)) return run_fixed(batch, draws);
  Backend& be = model_.backend();
  StepOutput out;
  KL_ASSIGN_OR_RETURN(out.logits, model_.forward(batch, cache_));
  if (!draws.empty()) {
    DrawArrays d(draws);
    const int64_t r = static_cast<int64_t>(draws.size());
    out.ids = be.alloc(DType::kI32, {r});
    be.sample(SampleArgs{out.logits, be.to_device(host_view(DType::kF32, d.temperature), DType::kF32),
                         be.to_device(host_view(DType::kI32, d.top_k), DType::kI32),
                         be.to_device(host_view(DType::kF32, d.top_p), DType::kF32),
                         be.to_device(host_view(DType::kI32, d.seed), DType::kI32).view({r, 2}),
                         be.to_device(host_view(DType::kI32, d.counter), DType::kI32), out.ids});
  }
  return out;
}

bool StepExecutor::fixed_shape(const Batch& batch) const {
  return batch.num_decode == batch.layout.num_seqs() && batch.layout.snap_seq.empty() && !model_.check_finite() &&
         batch.layout.num_seqs() <= kMaxBucket;
}

Result<StepOutput> StepExecutor::run_fixed(Batch& batch, std::span<const SampleRow> draws) {
  Backend& be = model_.backend();
  auto bucket_of = [](int64_t n) {
    int64_t b = 1;
    while (b < n) b *= 2;
    return b;
  };
  // A step holds at most one row per state slot: the buffers are sized for the cache's largest bucket.
  // The page table's columns: a power of two (at least 16) covering the step's longest sequence, never
  // fewer than earlier steps had (a change recaptures every bucket, so they only grow), at most the
  // cache's bound per sequence. Writing the bound itself (16,384 columns at a 1 M-token context) cost
  // a batch of 256 a 16.8 MB table built and uploaded every step.
  const int64_t n = batch.layout.num_seqs(), bucket = bucket_of(n);
  const int64_t need = bucket_of(std::max<int64_t>(batch.layout.max_pages, 16));
  const int64_t cols = std::min(cache_.max_pages_per_seq(), std::max(need, cols_));
  const int64_t M = bucket_of(std::min(kMaxBucket, cache_.sizes().slots));
  // I32 regions at fixed offsets (the page table last, so a step writes only what its bucket reads).
  enum Region { kIds, kCu, kCached, kSlots, kRows, kTopK, kSeed, kCounter, kTable, kRegions };
  const int64_t size[kRegions] = {M, M + 1, M, M, M, M, 2 * M, M, M * cols};
  int64_t at[kRegions + 1] = {0};
  for (int r = 0; r < kRegions; ++r) at[r + 1] = at[r] + size[r];
  if (!i32_.defined() || cols_ != cols) {
    // Graphs captured over the old buffers are stale.
    be.clear_graphs();
    cols_ = cols;
    i32_ = be.alloc_persistent(DType::kI32, {at[kRegions]});
    f32_ = be.alloc_persistent(DType::kF32, {2 * M});
    out_.clear();
  }
  be.begin_step();
  cache_.pad(batch, bucket, cols);
  std::vector<SampleRow> rows(draws.begin(), draws.end());
  rows.resize(static_cast<size_t>(bucket));  // greedy for the padding (and for every row without draws)
  const DrawArrays d(rows);
  std::vector<int32_t> i32(static_cast<size_t>(at[kTable] + bucket * cols));
  const SeqLayout& L = batch.layout;
  auto put = [&](Region r, const std::vector<int32_t>& v) { std::copy(v.begin(), v.end(), i32.begin() + at[r]); };
  put(kIds, batch.ids);
  put(kCu, L.cu_seqlens);
  put(kCached, L.cached);
  put(kSlots, L.slots);
  put(kRows, batch.logit_rows);
  put(kTopK, d.top_k);
  put(kSeed, d.seed);
  put(kCounter, d.counter);
  put(kTable, L.page_table);
  std::vector<float> f32(d.temperature);
  f32.resize(static_cast<size_t>(M));
  f32.insert(f32.end(), d.top_p.begin(), d.top_p.end());
  be.write(host_view(DType::kI32, i32), i32_.rows(0, static_cast<int64_t>(i32.size())));
  be.write(host_view(DType::kF32, f32), f32_.rows(0, static_cast<int64_t>(f32.size())));

  auto region = [&](Region r, int64_t len) { return i32_.rows(at[r], at[r] + len); };
  SeqLayout::Device dev{region(kCu, bucket + 1), region(kCached, bucket), region(kSlots, bucket),
                        region(kTable, bucket * cols).view({bucket, cols}), region(kIds, 0), region(kIds, 0),
                        region(kIds, 0)};
  batch.layout.dev = dev;
  batch.decode.dev = dev;
  Status failed;
  auto body = [&] {
    // The padding's sequences sit in the scratch slot, whose pools kda_decode (pad_slot) neither reads
    // nor writes.
    StepOutput out;
    Result<Tensor> lg = model_.logits(batch, cache_, region(kIds, bucket), region(kRows, bucket));
    if (!lg.ok()) {
      failed = lg.status();
      return;
    }
    out.logits = *lg;
    out.ids = be.alloc(DType::kI32, {bucket});
    be.sample(SampleArgs{out.logits, f32_.rows(0, bucket), region(kTopK, bucket), f32_.rows(M, M + bucket),
                         region(kSeed, 2 * bucket).view({bucket, 2}), region(kCounter, bucket), out.ids});
    out_[bucket] = out;
  };
  be.plan_step(batch.layout);
  KL_RETURN_IF_ERROR(be.run_graph(static_cast<int64_t>(id_ << kBucketBits) | bucket, body));
  KL_RETURN_IF_ERROR(failed);
  cache_.advance(batch);
  const StepOutput& out = out_.at(bucket);
  return StepOutput{out.logits.rows(0, n), draws.empty() ? Tensor() : out.ids.rows(0, n)};
}

}  // namespace klinear
