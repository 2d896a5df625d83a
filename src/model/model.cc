#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "dist/comm.h"
#include "io/checkpoint.h"

namespace klinear {

Result<LoadFormat> parse_load_format(const std::string& name) {
  if (name == "safetensors") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return Status::InvalidArgument("load format '" + name + "' is not one of: safetensors, dummy");
}

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, Backend& backend, LoadFormat format,
                                           const ModelRanks& ranks) {
  KL_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  KL_CHECK(ranks.shard.whole() || ranks.comm != nullptr, "a model split over ranks needs their communicator");
  if (!ranks.shard.experts.whole() && backend.device() != Device::kCpu)
    return Status::NotSupported("expert parallelism on the " + std::string(backend.name()) +
                                " backend: its MoE kernels do not skip other ranks' picks yet (the CPU backend runs it)");
  std::optional<Checkpoint> ckpt;
  if (format == LoadFormat::kSafetensors) {
    KL_ASSIGN_OR_RETURN(ckpt, Checkpoint::open(dir));
  }
  // Refuse up front rather than die of OOM half-way: the weights as the backend holds them
  // (count_weights; a checkpoint's MXFP4 bytes as they are when kept packed, else two elements
  // each). A rank of several holds its part of what the config names (the loader refuses
  // whatever else a checkpoint holds).
  const WeightStorage storage = storage_of(backend);
  uint64_t need = 0;
  if (ckpt && ranks.shard.whole()) {
    for (const auto& [dtype, s] : ckpt->stats())
      need += dtype != DType::kU8 ? static_cast<uint64_t>(s.params) * backend.weight_element_bytes()
              : storage.mxfp4 == Mxfp4Storage::kPacked ? static_cast<uint64_t>(s.bytes)
                                                        : 2 * static_cast<uint64_t>(s.bytes) * backend.weight_element_bytes();
  } else {
    need = count_weights(config, storage, ranks.shard).total_bytes();
  }
  const uint64_t have = backend.available_bytes();
  if (need > have) {
    auto gib = [](uint64_t b) { return std::to_string(b >> 30) + "." + std::to_string(((b >> 20) & 1023) * 10 / 1024); };
    return Status::ResourceExhausted(dir + ": the weights need about " + gib(need) + " GiB on the " + backend.name() +
                                     " backend, " + gib(have) + " GiB is available");
  }
  KL_ASSIGN_OR_RETURN(ModelWeights weights, ckpt ? load_weights(config, *ckpt, backend, ranks.shard)
                                                : dummy_weights(config, backend, ranks.shard));
  return std::make_unique<Model>(rank_config(config, ranks.shard), std::move(weights), backend, ranks);
}

Result<int32_t> Model::first_rank_token(int32_t token) {
  if (ranks_.comm == nullptr || ranks_.comm->size() == 1) return token;
  Tensor host = Tensor::empty(DType::kI32, {1});
  host.data_as<int32_t>()[0] = token;
  const Tensor shared = backend_.to_device(host, DType::kI32);
  KL_RETURN_IF_ERROR(ranks_.comm->broadcast(BroadcastArgs{shared, 0}));
  return backend_.to_host(shared).data_as<const int32_t>()[0];
}

void Model::sum_over_ranks(const Tensor& t) {
  if (!comm_failed_.ok()) return;
  comm_failed_ = ranks_.comm->all_reduce(AllReduceArgs{t, t, ReduceOp::kSum});
}


Tensor Model::attn_res_read(std::vector<Tensor> candidates, const Tensor& query) {
  if (candidates.size() == 1) return candidates[0];  // MODEL.md 7.1: one candidate is returned unchanged
  Tensor out = act(candidates[0].shape());
  backend_.attn_res_read(candidates, query, static_cast<float>(config_.rms_norm_eps), out);
  return out;
}

Result<Tensor> Model::forward(Batch& batch, Cache& cache) {
  Backend& be = backend_;
  be.begin_step();
  be.upload_layout(batch.layout);
  be.upload_layout(batch.decode);
  be.upload_layout(batch.prefill);
  // The host arrays as tensors (no copy), uploaded for the step.
  auto device_i32 = [&](std::vector<int32_t>& v) {
    return be.to_device(Tensor::wrap(DType::kI32, {static_cast<int64_t>(v.size())}, v.data(), nullptr, Device::kCpu),
                        DType::kI32);
  };
  KL_ASSIGN_OR_RETURN(Tensor out, logits(batch, cache, device_i32(batch.ids), device_i32(batch.logit_rows)));
  cache.advance(batch);
  return out;
}

Result<Tensor> Model::logits(const Batch& batch, Cache& cache, const Tensor& ids, const Tensor& logit_rows) {
  const ModelConfig& c = config_;
  Backend& be = backend_;
  const int64_t N = batch.layout.num_rows(), D = c.hidden_size;
  KL_CHECK(N == static_cast<int64_t>(batch.ids.size()) && N > 0, "forward: batch not from Cache::plan");
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor h = act({N, D});
  const ModelShard& shard = ranks_.shard;
  comm_failed_ = Status();
  be.embedding(EmbeddingArgs{ids, weights_.embed, shard.embed.first(c.vocab_size), c.vocab_size, h});
  if (!shard.embed.whole()) sum_over_ranks(h);

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

  const int64_t R = static_cast<int64_t>(batch.logit_rows.size()), V = c.vocab_size;
  Tensor selected = act({R, D});
  be.gather_rows(x, logit_rows, selected);
  Tensor logits = be.alloc(DType::kF32, {R, V});
  const Tensor final = normed(selected, weights_.final_norm);
  if (shard.lm_head.whole()) {
    be.linear(final, weights_.lm_head, logits);
  } else {  // each rank's columns, gathered rank after rank, then put side by side
    const int64_t n = shard.lm_head.count, cols = V / n;
    const Tensor mine = be.alloc(DType::kF32, {R, cols}), all = be.alloc(DType::kF32, {n * R, cols});
    be.linear(final, weights_.lm_head, mine);
    if (comm_failed_.ok()) comm_failed_ = ranks_.comm->all_gather(AllGatherArgs{mine, all});
    for (int64_t k = 0; k < n; ++k) be.copy_columns(all.rows(k * R, (k + 1) * R), 0, logits, k * cols, cols);
  }
  KL_RETURN_IF_ERROR(comm_failed_);
  return logits;
}

Result<Tensor> Model::forward_one(Cache& cache, SeqId seq, std::span<const int32_t> ids, LogitsMode mode) {
  const SeqStep step{seq, ids, mode};
  KL_RETURN_IF_ERROR(cache.reserve(std::span<const SeqStep>(&step, 1)));
  KL_ASSIGN_OR_RETURN(Batch batch, cache.plan(std::span<const SeqStep>(&step, 1)));
  KL_ASSIGN_OR_RETURN(Tensor logits, forward(batch, cache));
  return backend_.to_host(logits);
}

}  // namespace klinear
