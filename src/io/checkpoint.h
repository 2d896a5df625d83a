// Checkpoint: a Hugging Face checkpoint directory as a set of named host tensors, loaded strictly.
//
// The model asks for every parameter it needs by canonical name and shape (take*); the checkpoint
// answers with zero-copy views into the memory-mapped shards, or with a fused host tensor built
// from several parts. finish() then fails if any tensor of the checkpoint was never asked for, so
// a typo, a missing fused part, a wrong shape or an unknown tensor is an error naming the tensor
// and its file, and nothing ever runs on uninitialised weights.
//
// Canonical names are the flat Kimi Linear ones ("model.layers.3.self_attn.q_proj.weight",
// "lm_head.weight"): the K3 prefixes `language_model.` and `model.language_model.` are stripped
// and `vision_tower.*` / `mm_projector.*` are skipped (MODEL.md 2.2).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/json.h"
#include "io/safetensors.h"

namespace klinear {

// What a parameter's stored dtype may be: a float weight (F32, BF16, F16), or the U8 bytes of a
// packed format (MXFP4 nibbles and E8M0 scales).
enum class StoredAs { kFloat, kU8 };

// Which part of a tensor a rank reads (model/shard.h says which): all of it, or block `index` of
// `count` equal blocks of its first dimension (a view of the mapped file: only those bytes are
// read) or of its last (copied row by row).
enum class Along { kWhole, kRows, kColumns };
struct Slice {
  Along along = Along::kWhole;
  int64_t index = 0, count = 1;
};
// The part `slice` of host tensor `t` (a view for kWhole and kRows); the dimension must divide.
Tensor slice_of(const Tensor& t, const Slice& slice);

class Checkpoint {
 public:
  // Opens `dir`/model.safetensors.index.json (sharded) or `dir`/model.safetensors.
  static Result<Checkpoint> open(const std::string& dir);

  // The tensor `name`, which must have `shape` and a dtype of the `stored` kind; its part `slice`.
  Result<Tensor> take(const std::string& name, const Shape& shape, StoredAs stored = StoredAs::kFloat,
                      const Slice& slice = {});
  // Marks `name`, which must exist, as another rank's (its experts under expert parallelism):
  // finish() does not count it as unused, and nothing of it is read.
  Status leave(const std::string& name);
  // Whether the checkpoint holds `name` (does not mark it used).
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The stored shape of `name`, if present (does not mark it used).
  std::optional<Shape> shape_of(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? std::nullopt : std::optional<Shape>(it->second.entry->shape);
  }
  // Concatenation along dim 0 of `parts` (the part `slice` of each), each with its expected shape
  // (same trailing dims). Parts of one dtype keep it; mixed dtypes are converted to F32.
  Result<Tensor> take_concat(const std::vector<std::string>& parts, const std::vector<Shape>& shapes,
                             StoredAs stored = StoredAs::kFloat, const Slice& slice = {});
  // Stacks `parts` (all of `shape`) into one [parts.size(), shape...] tensor.
  Result<Tensor> take_stacked(const std::vector<std::string>& parts, const Shape& shape,
                              StoredAs stored = StoredAs::kFloat);
  // A per-head vector stored as [H], [1, 1, H, 1] or zero-padded [>H] (KDA A_log, MODEL.md D7):
  // returns the first H entries as F32 [H]; a non-zero padding entry is an error.
  Result<Tensor> take_head_vector(const std::string& name, int64_t heads, const Slice& slice = {});

  // OK when every tensor has been taken; otherwise names the first unused ones and their files.
  Status finish() const;

  // Tensors holding values that are not finite (NaN or Inf in a float tensor, an E8M0 scale of
  // 0xFF, an E4M3 NaN), for `klinear info --verify`: every tensor is read once, in name order.
  // U8 tensors named `*.weight_scale` are MXFP4 block scales (E8M0 bytes, MODEL.md 2.3).
  struct NonFinite {
    std::string name;  // as stored in the file
    std::string file;
    int64_t count = 0;        // non-finite elements
    int64_t first_index = 0;  // flat index of the first one
  };
  std::vector<NonFinite> scan_non_finite() const;

  // Statistics for `klinear info`: parameter count and bytes by dtype over the whole checkpoint.
  struct DtypeStats { int64_t tensors = 0, params = 0, bytes = 0; };
  std::map<DType, DtypeStats> stats() const;

 private:
  struct Ref {
    const SafetensorsFile* file;
    const SafetensorsEntry* entry;
  };
  Result<Ref> find(const std::string& name, const Shape* shape, StoredAs stored);

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Ref> tensors_;  // canonical name -> location
  std::set<std::string> used_;
};

// The parsed model.safetensors.index.json: the shard files in first-use order and the shard of
// each tensor. Corruption naming `where` when `weight_map` is missing, a value is not a string or
// a shard name is not a plain file name (empty, ".", "..", or containing '/').
struct ShardIndex {
  std::vector<std::string> shards;
  std::map<std::string, std::string> weight_map;  // tensor -> shard
};
Result<ShardIndex> parse_shard_index(const Json& doc, const std::string& where);

// Maps a checkpoint tensor name to its canonical name; empty for tensors klinear skips.
std::string canonical_tensor_name(const std::string& name);

}  // namespace klinear
