#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "io/checkpoint.h"

namespace klinear {

Result<LoadFormat> parse_load_format(const std::string& name) {
  if (name == "safetensors") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return Status::InvalidArgument("load format '" + name + "' is not one of: safetensors, dummy");
}

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, Backend& backend, LoadFormat format) {
  KL_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  std::optional<Checkpoint> ckpt;
  // Refuse up front rather than die of OOM half-way: every weight element (an MXFP4 byte holds
  // two) takes weight_element_bytes() on the backend.
  uint64_t elements = 0;
  if (format == LoadFormat::kSafetensors) {
    KL_ASSIGN_OR_RETURN(ckpt, Checkpoint::open(dir));
    for (const auto& [dtype, s] : ckpt->stats()) elements += static_cast<uint64_t>(dtype == DType::kU8 ? 2 * s.bytes : s.params);
  } else {
    elements = count_parameters(config, backend);
  }
  const uint64_t need = elements * backend.weight_element_bytes(), have = backend.available_bytes();
  if (need > have) {
    auto gib = [](uint64_t b) { return std::to_string(b >> 30) + "." + std::to_string(((b >> 20) & 1023) * 10 / 1024); };
    return Status::ResourceExhausted(dir + ": the weights need about " + gib(need) + " GiB on the " + backend.name() +
                                     " backend, " + gib(have) + " GiB is available");
  }
  KL_ASSIGN_OR_RETURN(ModelWeights weights,
                      ckpt ? load_weights(config, *ckpt, backend) : dummy_weights(config, backend));
  return std::make_unique<Model>(std::move(config), std::move(weights), backend);
}

Tensor Model::attn_res_read(std::vector<Tensor> candidates, const Tensor& query) {
  if (candidates.size() == 1) return candidates[0];  // MODEL.md 7.1: one candidate is returned unchanged
  Tensor out = act(candidates[0].shape());
  backend_.attn_res_read(candidates, query, static_cast<float>(config_.rms_norm_eps), out);
  return out;
}

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
}  // namespace

Result<Tensor> Model::forward(Batch& batch, Cache& cache) {
  KL_ASSIGN_OR_RETURN(StepOutput out, step(batch, cache));
  return out.logits;
}

Result<StepOutput> Model::step(Batch& batch, Cache& cache, std::span<const SampleRow> draws) {
  KL_CHECK(draws.empty() || draws.size() == batch.logit_rows.size(),
           "step: " + std::to_string(draws.size()) + " draws for " + std::to_string(batch.logit_rows.size()) + " rows");
  if (fixed_shape(batch)) return decode_step(batch, cache, draws);
  Backend& be = backend_;
  be.begin_step();
  be.upload_layout(batch.layout);
  be.upload_layout(batch.decode);
  be.upload_layout(batch.prefill);
  StepOutput out;
  KL_ASSIGN_OR_RETURN(out.logits, logits(batch, cache, be.to_device(host_view(DType::kI32, batch.ids), DType::kI32),
                                         be.to_device(host_view(DType::kI32, batch.logit_rows), DType::kI32)));
  cache.advance(batch);
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

bool Model::fixed_shape(const Batch& batch) const {
  return batch.num_decode == batch.layout.num_seqs() && batch.layout.snap_seq.empty() && !check_finite_ &&
         batch.layout.num_seqs() <= kMaxBucket;
}

Result<StepOutput> Model::decode_step(Batch& batch, Cache& cache, std::span<const SampleRow> draws) {
  Backend& be = backend_;
  auto bucket_of = [](int64_t n) {
    int64_t b = 1;
    while (b < n) b *= 2;
    return b;
  };
  // A step holds at most one row per state slot: the buffers are sized for the cache's largest bucket.
  // The page table's columns: a power of two (at least 16) covering the step's longest sequence, never
  // fewer than this cache's earlier steps had (a change recaptures every bucket, so they only grow),
  // at most the cache's bound per sequence. Writing the bound itself (16,384 columns at a 1 M-token
  // context) cost a batch of 256 a 16.8 MB table built and uploaded every step.
  const bool same_cache = decode_.cache_id == cache.id();
  const int64_t n = batch.layout.num_seqs(), bucket = bucket_of(n);
  const int64_t need = bucket_of(std::max<int64_t>(batch.layout.max_pages, 16));
  const int64_t cols = std::min(cache.max_pages_per_seq(), std::max(need, same_cache ? decode_.cols : 0));
  const int64_t M = bucket_of(std::min(kMaxBucket, cache.sizes().slots));
  // I32 regions at fixed offsets (the page table last, so a step writes only what its bucket reads).
  enum Region { kIds, kCu, kCached, kSlots, kRows, kTopK, kSeed, kCounter, kTable, kRegions };
  const int64_t size[kRegions] = {M, M + 1, M, M, M, M, 2 * M, M, M * cols};
  int64_t at[kRegions + 1] = {0};
  for (int r = 0; r < kRegions; ++r) at[r + 1] = at[r] + size[r];
  if (!same_cache || decode_.cols != cols) {
    // Graphs captured over another cache's pools and these buffers are stale.
    be.clear_graphs();
    decode_ = DecodeBuffers{cache.id(), cols, be.alloc_persistent(DType::kI32, {at[kRegions]}),
                            be.alloc_persistent(DType::kF32, {2 * M}), {}};
  }
  be.begin_step();
  cache.pad(batch, bucket, cols);
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
  be.write(host_view(DType::kI32, i32), decode_.i32.rows(0, static_cast<int64_t>(i32.size())));
  be.write(host_view(DType::kF32, f32), decode_.f32.rows(0, static_cast<int64_t>(f32.size())));

  auto region = [&](Region r, int64_t len) { return decode_.i32.rows(at[r], at[r] + len); };
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
    Result<Tensor> lg = logits(batch, cache, region(kIds, bucket), region(kRows, bucket));
    if (!lg.ok()) {
      failed = lg.status();
      return;
    }
    out.logits = *lg;
    out.ids = be.alloc(DType::kI32, {bucket});
    be.sample(SampleArgs{out.logits, decode_.f32.rows(0, bucket), region(kTopK, bucket), decode_.f32.rows(M, M + bucket),
                         region(kSeed, 2 * bucket).view({bucket, 2}), region(kCounter, bucket), out.ids});
    decode_.out[bucket] = out;
  };
  be.plan_step(batch.layout);
  KL_RETURN_IF_ERROR(be.run_graph(bucket, body));
  KL_RETURN_IF_ERROR(failed);
  cache.advance(batch);
  const StepOutput& out = decode_.out.at(bucket);
  return StepOutput{out.logits.rows(0, n), draws.empty() ? Tensor() : out.ids.rows(0, n)};
}

Result<Tensor> Model::logits(Batch& batch, Cache& cache, const Tensor& ids, const Tensor& logit_rows) {
  const ModelConfig& c = config_;
  Backend& be = backend_;
  const int64_t N = batch.layout.num_rows(), D = c.hidden_size;
  KL_CHECK(N == static_cast<int64_t>(batch.ids.size()) && N > 0, "forward: batch not from Cache::plan");
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor h = act({N, D});
  be.embedding(ids, weights_.embed, h);

  Status finite;  // the first non-finite sublayer output, with check_finite_
  auto checked = [&](int64_t l, const char* part, Tensor out) {
    if (!check_finite_ || !finite.ok()) return out;
    const Tensor host = be.to_host(out);
    for (int64_t i = 0; i < host.numel(); ++i)
      if (!std::isfinite(host.f32()[i])) {
        finite = Status::Corruption("layer " + std::to_string(l) + " (" + (c.mixer(l) == Mixer::kKda ? "KDA" : "MLA") +
                                    " mixer, " + (c.ffn(l) == Ffn::kDense ? "dense" : "MoE") + " FFN): the " + part +
                                    " output is not finite (" + std::to_string(host.f32()[i]) + " at row " +
                                    std::to_string(i / host.dim(-1)) + ")");
        break;
      }
    return out;
  };
  auto mixer = [&](int64_t l, const Tensor& xn) {
    const LayerWeights& lw = weights_.layers[l];
    return checked(l, "mixer", lw.mixer == Mixer::kKda ? kda(lw.kda, xn, l, batch, cache) : mla(lw.mla, xn, l, batch, cache));
  };
  auto ffn = [&](int64_t l, const Tensor& xn) {
    const LayerWeights& lw = weights_.layers[l];
    return checked(l, "FFN", lw.ffn == Ffn::kDense ? mlp(lw.mlp, xn) : moe(lw.moe, xn));
  };
  auto normed = [&](const Tensor& x, const Tensor& w) {
    Tensor y = act(x.shape());
    be.rms_norm(x, w, eps, y);
    return y;
  };

  Tensor x;  // the input to the final norm
  if (!c.has_attn_res()) {
    // MODEL.md 6: pre-norm residual stream. Each sublayer's temporaries are dead once its output is
    // added into h, so their step memory is given back (the mixers write their state into the
    // cache pools, never into step memory a later layer reads). An add that the next sublayer's
    // norm follows is one add_rms_norm writing that sublayer's input into xn, allocated before the
    // marks so every release leaves it; the last FFN's add stays a plain add (the final norm runs
    // on the selected rows only).
    const Tensor xn = normed(h, weights_.layers[0].input_norm);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& lw = weights_.layers[l];
      Arena::Mark mark = be.step_mark();
      be.add_rms_norm(AddNormArgs{h, mixer(l, xn), lw.post_norm, eps, xn});
      be.step_release(mark);
      mark = be.step_mark();
      const Tensor f = ffn(l, xn);
      if (l + 1 < c.num_layers) be.add_rms_norm(AddNormArgs{h, f, weights_.layers[l + 1].input_norm, eps, xn});
      else be.add(h, f);
      be.step_release(mark);
    }
    x = h;
  } else {
    // MODEL.md 7.2: sealed blocks + the live partial sum p; each sublayer reads a softmax mix of them.
    const int64_t B = c.attn_res_block_size;
    std::vector<Tensor> blocks;
    Tensor p = h;
    auto with_partial = [&](const Tensor& partial) {
      std::vector<Tensor> v = blocks;
      v.push_back(partial);
      return v;
    };
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& lw = weights_.layers[l];
      Tensor xa = blocks.empty() ? p : attn_res_read(with_partial(p), lw.attn_res_query);
      const bool sealed = l % B == 0;
      if (sealed) blocks.push_back(p);
      Tensor a = mixer(l, normed(xa, lw.input_norm));
      // p never aliases a sealed block here: sealing replaces p by the fresh mixer output.
      if (sealed) p = a;
      else be.add(p, a);
      Tensor xm = attn_res_read(with_partial(p), lw.mlp_res_query);
      be.add(p, ffn(l, normed(xm, lw.post_norm)));
    }
    x = attn_res_read(with_partial(p), weights_.output_res_query);
  }
  KL_RETURN_IF_ERROR(finite);

  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  Tensor selected = act({R, D});
  be.gather_rows(x, logit_rows, selected);
  Tensor logits = be.alloc(DType::kF32, {R, c.vocab_size});
  be.linear(normed(selected, weights_.final_norm), weights_.lm_head, logits);
  return logits;
}

Result<Tensor> Model::forward_one(Cache& cache, SeqId seq, std::span<const int32_t> ids, LogitsMode mode) {
  const SeqStep step{seq, ids, mode};
  KL_ASSIGN_OR_RETURN(Batch batch, cache.plan(std::span<const SeqStep>(&step, 1)));
  KL_ASSIGN_OR_RETURN(Tensor logits, forward(batch, cache));
  return backend_.to_host(logits);
}

}  // namespace klinear
