// Checkpoint: canonical names, strict take*/finish, sharded indexes, and whole-model strictness via Model::load.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "io/presets.h"
#include "test_util.h"

namespace klinear {
namespace {

namespace fs = std::filesystem;
using TensorList = std::vector<std::pair<std::string, Tensor>>;

using testing::ScratchDir;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(CheckpointNameTest, CanonicalNames) {
  EXPECT_EQ(canonical_tensor_name("language_model.model.layers.3.self_attn.q_proj.weight"),
            "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(canonical_tensor_name("model.language_model.layers.3.mlp.up_proj.weight"),
            "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(canonical_tensor_name("model.language_model.embed_tokens.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(canonical_tensor_name("language_model.layers.0.x"), "model.layers.0.x");
  EXPECT_EQ(canonical_tensor_name("language_model.lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(canonical_tensor_name("language_model.model.norm.weight"), "model.norm.weight");
  EXPECT_EQ(canonical_tensor_name("vision_tower.encoder.blocks.0.wqkv.weight"), "");
  EXPECT_EQ(canonical_tensor_name("mm_projector.proj.0.weight"), "");
  EXPECT_EQ(canonical_tensor_name("model.layers.0.self_attn.A_log"), "model.layers.0.self_attn.A_log");
  EXPECT_EQ(canonical_tensor_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(canonical_tensor_name("something_else"), "something_else");
}

Tensor f32(Shape shape, float start = 1.0f) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
  return Tensor::from_f32(std::move(shape), v);
}

class CheckpointTest : public ::testing::Test {
 protected:
  Checkpoint open(const TensorList& tensors) {
    const Status w = write_safetensors(dir_.file("model.safetensors"), tensors);
    KL_CHECK(w.ok(), w.to_string());
    auto c = Checkpoint::open(dir_.str());
    KL_CHECK(c.ok(), c.status().to_string());
    return std::move(c).value();
  }
  ScratchDir dir_;
};

TEST_F(CheckpointTest, TakeChecksShapeAndMarksUse) {
  Checkpoint c = open({{"model.a", f32({2, 3})}, {"language_model.model.b", f32({4})}});
  EXPECT_TRUE(c.has("model.a"));
  EXPECT_TRUE(c.has("model.b"));  // canonical name of the K3 spelling
  EXPECT_FALSE(c.has("language_model.model.b"));

  auto wrong = c.take("model.a", {3, 2});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(wrong.status().message(), "model.a")) << wrong.status().message();
  EXPECT_TRUE(contains(wrong.status().message(), dir_.file("model.safetensors"))) << wrong.status().message();
  EXPECT_TRUE(contains(wrong.status().message(), "[2, 3]")) << wrong.status().message();

  auto a = c.take("model.a", {2, 3});  // a failed take does not consume the tensor
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->f32()[5], 6.0f);
  auto again = c.take("model.a", {2, 3});
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(contains(again.status().message(), "loaded twice")) << again.status().message();
  EXPECT_TRUE(contains(again.status().message(), "model.a")) << again.status().message();

  auto missing = c.take("model.zzz", {1});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), "'model.zzz'")) << missing.status().message();

  // model.b is still unused.
  Status fin = c.finish();
  ASSERT_FALSE(fin.ok());
  EXPECT_TRUE(contains(fin.message(), "language_model.model.b")) << fin.message();
  EXPECT_TRUE(contains(fin.message(), dir_.file("model.safetensors"))) << fin.message();
  EXPECT_FALSE(contains(fin.message(), "'model.a'")) << fin.message();
  ASSERT_TRUE(c.take("model.b", {4}).ok());
  EXPECT_TRUE(c.finish().ok());
}

TEST_F(CheckpointTest, SkippedTensorsAreNeitherVisibleNorRequired) {
  Checkpoint c = open({{"vision_tower.w", f32({2})}, {"mm_projector.w", f32({2})}, {"model.a", f32({1})}});
  EXPECT_FALSE(c.has("vision_tower.w"));
  ASSERT_TRUE(c.take("model.a", {1}).ok());
  EXPECT_TRUE(c.finish().ok()) << c.finish().to_string();
}

TEST_F(CheckpointTest, DuplicateCanonicalNameIsAnError) {
  ASSERT_TRUE(
      write_safetensors(dir_.file("model.safetensors"), {{"model.x", f32({1})}, {"language_model.model.x", f32({1})}})
          .ok());
  auto c = Checkpoint::open(dir_.str());
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(contains(c.status().message(), "also appears")) << c.status().message();
}

TEST_F(CheckpointTest, TakeConcat) {
  Checkpoint c = open({{"p.a", f32({2, 2}, 0.0f)}, {"p.b", f32({1, 2}, 10.0f)}, {"p.c", f32({1, 2})}});
  auto cat = c.take_concat({"p.a", "p.b"}, {{2, 2}, {1, 2}});
  ASSERT_TRUE(cat.ok()) << cat.status().to_string();
  EXPECT_EQ(cat->shape(), (Shape{3, 2}));
  EXPECT_EQ(cat->dtype(), DType::kF32);
  const std::vector<float> want = {0, 1, 2, 3, 10, 11};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(cat->f32()[i], want[i]) << i;

  auto missing = c.take_concat({"p.c", "p.missing"}, {{1, 2}, {1, 2}});
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(contains(missing.status().message(), "'p.missing'")) << missing.status().message();
  EXPECT_TRUE(contains(missing.status().message(), "part 1 of 2")) << missing.status().message();
}

TEST_F(CheckpointTest, TakeConcatMixedDtypesWidensToF32) {
  Tensor bf = Tensor::empty(DType::kBF16, {1, 2});
  bf.data_as<uint16_t>()[0] = f32_to_bf16(-3.0f);
  bf.data_as<uint16_t>()[1] = f32_to_bf16(0.5f);
  Checkpoint c = open({{"p.a", f32({1, 2}, 7.0f)}, {"p.b", bf}});
  auto cat = c.take_concat({"p.a", "p.b"}, {{1, 2}, {1, 2}});
  ASSERT_TRUE(cat.ok()) << cat.status().to_string();
  ASSERT_EQ(cat->dtype(), DType::kF32);
  EXPECT_EQ(cat->f32()[0], 7.0f);
  EXPECT_EQ(cat->f32()[2], -3.0f);
  EXPECT_EQ(cat->f32()[3], 0.5f);
}

TEST_F(CheckpointTest, TakeHeadVector) {
  Tensor padded = Tensor::from_f32({8}, {1, 2, 3, 4, 0, 0, 0, 0});
  Tensor bad_pad = Tensor::from_f32({8}, {1, 2, 3, 4, 0, 0, 0.5f, 0});
  Checkpoint c = open({{"h.flat", f32({4})}, {"h.4d", f32({1, 1, 4, 1}, 5.0f)}, {"h.padded", padded},
                       {"h.badpad", bad_pad}, {"h.short", f32({3})}, {"h.2d", f32({2, 4})}});
  for (const char* name : {"h.flat", "h.4d", "h.padded"}) {
    auto v = c.take_head_vector(name, 4);
    ASSERT_TRUE(v.ok()) << name << ": " << v.status().to_string();
    EXPECT_EQ(v->shape(), Shape{4}) << name;
    EXPECT_EQ(v->dtype(), DType::kF32);
    const float first = std::string(name) == "h.4d" ? 5.0f : 1.0f;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(v->f32()[i], first + i) << name << " " << i;
  }
  auto bad = c.take_head_vector("h.badpad", 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "padding entry 6")) << bad.status().message();
  EXPECT_TRUE(contains(bad.status().message(), "h.badpad")) << bad.status().message();
  for (const char* name : {"h.short", "h.2d"}) {
    auto w = c.take_head_vector(name, 4);
    ASSERT_FALSE(w.ok()) << name;
    EXPECT_TRUE(contains(w.status().message(), name)) << w.status().message();
    EXPECT_TRUE(contains(w.status().message(), "expected [4]")) << w.status().message();
  }
  auto missing = c.take_head_vector("h.none", 4);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, NoCheckpointFilesIsNotFound) {
  auto c = Checkpoint::open(dir_.str());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(c.status().message(), "model.safetensors")) << c.status().message();
}

void write_index(const std::string& dir, const Json& weight_map) {
  std::ofstream out(dir + "/model.safetensors.index.json");
  out << Json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
}

TEST_F(CheckpointTest, ShardedIndex) {
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  ASSERT_TRUE(write_safetensors(dir_.file(s1), {{"model.a", f32({2})}, {"model.b", f32({3})}}).ok());
  ASSERT_TRUE(write_safetensors(dir_.file(s2), {{"model.c", f32({4}, 9.0f)}, {"lm_head.weight", f32({1, 2})}}).ok());
  write_index(dir_.str(), {{"model.a", s1}, {"model.b", s1}, {"model.c", s2}, {"lm_head.weight", s2}});
  auto c = Checkpoint::open(dir_.str());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  for (const char* n : {"model.a", "model.b", "model.c", "lm_head.weight"}) EXPECT_TRUE(c->has(n)) << n;
  ASSERT_TRUE(c->take("model.a", {2}).ok());
  ASSERT_TRUE(c->take("model.b", {3}).ok());
  auto t = c->take("model.c", {4});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->f32()[3], 12.0f);
  Status fin = c->finish();
  ASSERT_FALSE(fin.ok());
  EXPECT_TRUE(contains(fin.message(), "lm_head.weight")) << fin.message();
  EXPECT_TRUE(contains(fin.message(), s2)) << fin.message();  // names the shard it lives in
  ASSERT_TRUE(c->take("lm_head.weight", {1, 2}).ok());
  EXPECT_TRUE(c->finish().ok());
  const auto stats = c->stats();
  ASSERT_EQ(stats.count(DType::kF32), 1u);
  EXPECT_EQ(stats.at(DType::kF32).tensors, 4);
  EXPECT_EQ(stats.at(DType::kF32).params, 2 + 3 + 4 + 2);
  EXPECT_EQ(stats.at(DType::kF32).bytes, 4 * 11);
}

TEST_F(CheckpointTest, IndexPointingToMissingShard) {
  ASSERT_TRUE(write_safetensors(dir_.file("one.safetensors"), {{"model.a", f32({2})}}).ok());
  write_index(dir_.str(), {{"model.a", "one.safetensors"}, {"model.b", "two.safetensors"}});
  auto c = Checkpoint::open(dir_.str());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kIOError);
  EXPECT_TRUE(contains(c.status().message(), "two.safetensors")) << c.status().message();
}

TEST_F(CheckpointTest, IndexWithPathTraversalOrBadEntries) {
  ASSERT_TRUE(write_safetensors(dir_.file("one.safetensors"), {{"model.a", f32({2})}}).ok());
  for (const char* shard : {"../one.safetensors", "sub/one.safetensors", "/etc/passwd", ".."}) {
    write_index(dir_.str(), {{"model.a", shard}});
    auto c = Checkpoint::open(dir_.str());
    ASSERT_FALSE(c.ok()) << shard;
    EXPECT_TRUE(contains(c.status().message(), "must be a plain file name")) << c.status().message();
  }
  write_index(dir_.str(), {{"model.a", 3}});
  auto c = Checkpoint::open(dir_.str());
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(contains(c.status().message(), "weight_map['model.a'] is not a string")) << c.status().message();
  std::ofstream(dir_.file("model.safetensors.index.json")) << R"({"metadata": {}})";
  auto no_map = Checkpoint::open(dir_.str());
  ASSERT_FALSE(no_map.ok());
  EXPECT_TRUE(contains(no_map.status().message(), "weight_map")) << no_map.status().message();
}

// ---- whole-model strictness: a random checkpoint of a preset, mutated, then Model::load.

class CheckpointModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto cfg = preset_config(GetParam());
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    config_ = *cfg;
    ASSERT_TRUE(write_random_checkpoint(config_, src_.str(), testing::fresh_seed()).ok());
    auto be = make_backend(BackendOptions{});
    ASSERT_TRUE(be.ok()) << be.status().to_string();
    backend_ = std::move(be).value();
  }
  // Copies the checkpoint through `edit` into dst_ and loads it.
  template <typename Edit>
  Status load_edited(Edit edit) {
    auto f = SafetensorsFile::open(src_.file("model.safetensors"));
    if (!f.ok()) return f.status();
    TensorList list;
    for (const SafetensorsEntry& e : f->entries()) list.emplace_back(e.name, f->tensor(e));
    edit(list);
    KL_RETURN_IF_ERROR(write_safetensors(dst_.file("model.safetensors"), list));
    fs::copy_file(src_.file("config.json"), dst_.file("config.json"), fs::copy_options::overwrite_existing);
    auto m = Model::load(dst_.str(), *backend_);
    return m.ok() ? Status() : m.status();
  }
  // The checkpoint spelling of a canonical name (K3 stores the text model under language_model.).
  std::string stored(const std::string& canonical) const {
    return config_.contains("text_config") ? "language_model." + canonical : canonical;
  }
  static void erase(TensorList& list, const std::string& name) {
    const size_t before = list.size();
    std::erase_if(list, [&](const auto& p) { return p.first == name; });
    KL_CHECK(list.size() + 1 == before, "tensor to drop not found: " + name);
  }

  Json config_;
  ScratchDir src_, dst_;
  std::unique_ptr<Backend> backend_;
};

TEST_P(CheckpointModelTest, UnmodifiedCopyLoads) {
  Status s = load_edited([](TensorList&) {});
  EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST_P(CheckpointModelTest, ExtraTensorIsRejected) {
  const std::string extra = stored("model.layers.0.self_attn.extra_bias");
  Status s = load_edited([&](TensorList& l) { l.emplace_back(extra, f32({4})); });
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), extra)) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "no destination")) << s.to_string();
}

TEST_P(CheckpointModelTest, MissingConvIsRejected) {
  // Layer 1 is a KDA layer in every preset.
  const std::string name = "model.layers.1.self_attn.k_conv1d.weight";
  Status s = load_edited([&](TensorList& l) { erase(l, stored(name)); });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EXPECT_TRUE(contains(s.message(), name)) << s.to_string();
}

TEST_P(CheckpointModelTest, MissingSingleExpertPartIsRejected) {
  const bool mxfp4 = GetParam() == "k3-tiny-mxfp4";
  const std::string name = std::string("model.layers.2.block_sparse_moe.experts.5.w3.") +
                           (mxfp4 ? "weight_scale" : "weight");
  Status s = load_edited([&](TensorList& l) { erase(l, stored(name)); });
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), name)) << s.to_string();
}

TEST_P(CheckpointModelTest, WrongShapeIsRejected) {
  const std::string name = stored("model.layers.0.mlp.down_proj.weight");  // [D, I] = [128, 256]
  Status s = load_edited([&](TensorList& l) {
    for (auto& [n, t] : l)
      if (n == name) t = Tensor::zeros(t.dtype(), {128, 255});
  });
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), name)) << s.to_string();
  EXPECT_TRUE(contains(s.message(), dst_.file("model.safetensors"))) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "[128, 255]")) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "[128, 256]")) << s.to_string();
}

INSTANTIATE_TEST_SUITE_P(CheckpointPresets, CheckpointModelTest,
                         ::testing::Values("kimi-linear-tiny", "k3-tiny", "k3-tiny-mxfp4"),
                         [](const auto& info) { return testing::identifier(info.param); });

}  // namespace
}  // namespace klinear
