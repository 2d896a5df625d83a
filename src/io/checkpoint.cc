#include "io/checkpoint.h"

#include <cstring>

#include "io/file.h"
#include "io/json.h"

namespace klinear {

std::string canonical_tensor_name(const std::string& name) {
  auto starts = [&](const std::string& s, const char* p) { return s.rfind(p, 0) == 0; };
  for (const char* skip : {"vision_tower.", "mm_projector.", "model.vision_tower.", "model.mm_projector."})
    if (starts(name, skip)) return "";
  std::string n = name;
  if (starts(n, "model.language_model.")) n = n.substr(std::strlen("model.language_model."));
  else if (starts(n, "language_model.")) n = n.substr(std::strlen("language_model."));
  else return n;
  if (starts(n, "model.") || starts(n, "lm_head.")) return n;
  return "model." + n;  // vLLM's `language_model.layers.*` spelling
}

Result<ShardIndex> parse_shard_index(const Json& doc, const std::string& where) {
  ShardIndex out;
  auto wm = doc.is_object() ? doc.find("weight_map") : doc.end();
  if (wm == doc.end() || !wm->is_object()) return Status::Corruption(where + ": missing object 'weight_map'");
  std::set<std::string> seen;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) return Status::Corruption(where + ": weight_map['" + it.key() + "'] is not a string");
    const std::string shard = it->get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\0') != std::string::npos ||
        shard == "." || shard == "..")
      return Status::Corruption(where + ": shard name '" + shard + "' must be a plain file name");
    if (seen.insert(shard).second) out.shards.push_back(shard);
    out.weight_map[it.key()] = shard;
  }
  return out;
}

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  std::vector<std::string> shards;
  std::map<std::string, std::string> weight_map;  // tensor -> shard, when sharded
  const std::string index = dir + "/model.safetensors.index.json";
  KL_ASSIGN_OR_RETURN(PathKind dir_kind, path_kind(dir));
  if (dir_kind != PathKind::kDirectory)
    return Status::NotFound("checkpoint directory '" + dir + "' does not exist or is not a directory");
  KL_ASSIGN_OR_RETURN(PathKind index_kind, path_kind(index));
  KL_ASSIGN_OR_RETURN(PathKind single_kind, path_kind(dir + "/model.safetensors"));
  if (index_kind != PathKind::kMissing) {
    KL_ASSIGN_OR_RETURN(Json doc, read_json_file(index));
    KL_ASSIGN_OR_RETURN(ShardIndex parsed, parse_shard_index(doc, index));
    shards = std::move(parsed.shards);
    weight_map = std::move(parsed.weight_map);
  } else if (single_kind != PathKind::kMissing) {
    shards.push_back("model.safetensors");
  } else {
    return Status::NotFound(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  for (const std::string& shard : shards) {
    KL_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(dir + "/" + shard));
    c.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
    const SafetensorsFile* file = c.files_.back().get();
    for (const SafetensorsEntry& e : file->entries()) {
      if (!weight_map.empty()) {
        auto w = weight_map.find(e.name);
        if (w == weight_map.end() || w->second != shard)
          return Status::Corruption(file->path() + ": tensor '" + e.name + "' is not listed for this shard in " + index);
        weight_map.erase(w);
      }
      const std::string name = canonical_tensor_name(e.name);
      if (name.empty()) continue;
      auto [it, inserted] = c.tensors_.emplace(name, Ref{file, &e});
      if (!inserted)
        return Status::Corruption(file->path() + ": tensor '" + e.name + "' also appears in " + it->second.file->path());
    }
  }
  if (!weight_map.empty())
    return Status::Corruption(index + ": tensor '" + weight_map.begin()->first + "' is listed in shard '" +
                              weight_map.begin()->second + "' but that shard does not hold it");
  return c;
}

Result<Checkpoint::Ref> Checkpoint::find(const std::string& name, const Shape* shape, StoredAs stored) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return Status::NotFound(dir_ + ": missing tensor '" + name + "'");
  const Ref& r = it->second;
  if (shape != nullptr && r.entry->shape != *shape)
    return Status::InvalidArgument(r.file->path() + ": " + r.entry->name + ": shape " +
                                   shape_to_string(r.entry->shape) + ", expected " + shape_to_string(*shape));
  const DType t = r.entry->dtype;
  const bool dtype_ok = stored == StoredAs::kU8 ? t == DType::kU8
                                                : (t == DType::kF32 || t == DType::kBF16 || t == DType::kF16);
  if (!dtype_ok)
    return Status::InvalidArgument(r.file->path() + ": " + r.entry->name + ": dtype " + dtype_name(t) + ", expected " +
                                   (stored == StoredAs::kU8 ? "U8 (packed MXFP4 / E8M0)" : "F32, BF16 or F16"));
  if (used_.count(name)) return Status::InvalidArgument(r.file->path() + ": tensor '" + r.entry->name + "' loaded twice");
  used_.insert(name);
  return r;
}

Tensor slice_of(const Tensor& t, const Slice& slice) {
  if (slice.along == Along::kWhole) return t;
  const int64_t n = slice.along == Along::kRows ? t.dim(0) : t.dim(-1), part = n / slice.count;
  KL_CHECK(slice.count >= 1 && n % slice.count == 0 && slice.index >= 0 && slice.index < slice.count,
           "slice " + std::to_string(slice.index) + " of " + std::to_string(slice.count) + " of " +
               shape_to_string(t.shape()));
  if (slice.along == Along::kRows) return t.rows(slice.index * part, (slice.index + 1) * part);
  Shape shape = t.shape();
  shape.back() = part;
  Tensor out = Tensor::empty(t.dtype(), shape);
  const size_t elem = dtype_size(t.dtype()), row_bytes = static_cast<size_t>(part) * elem;
  const int64_t rows = n == 0 ? 0 : t.numel() / n;
  const auto* src = static_cast<const uint8_t*>(t.data()) + static_cast<size_t>(slice.index * part) * elem;
  auto* dst = static_cast<uint8_t*>(out.data());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * row_bytes, src + static_cast<size_t>(r * n) * elem, row_bytes);
  return out;
}

Result<Tensor> Checkpoint::take(const std::string& name, const Shape& shape, StoredAs stored, const Slice& slice) {
  KL_ASSIGN_OR_RETURN(Ref r, find(name, &shape, stored));
  return slice_of(r.file->tensor(*r.entry), slice);
}

Status Checkpoint::leave(const std::string& name) {
  if (tensors_.count(name) == 0) return Status::NotFound(dir_ + ": missing tensor '" + name + "'");
  used_.insert(name);
  return Status();
}

Result<Tensor> Checkpoint::take_concat(const std::vector<std::string>& parts, const std::vector<Shape>& shapes,
                                       StoredAs stored, const Slice& slice) {
  KL_CHECK(parts.size() == shapes.size() && !parts.empty(), "take_concat arguments");
  std::vector<Tensor> views;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto t = take(parts[i], shapes[i], stored, slice);
    if (!t.ok()) return t.status().with_context("fused tensor part " + std::to_string(i) + " of " + std::to_string(parts.size()));
    views.push_back(std::move(t).value());
  }
  DType dtype = views[0].dtype();
  for (const Tensor& v : views) {
    KL_CHECK(Shape(v.shape().begin() + 1, v.shape().end()) == Shape(views[0].shape().begin() + 1, views[0].shape().end()),
             "take_concat parts differ in trailing dims");
    if (v.dtype() != dtype) dtype = DType::kF32;
  }
  Shape out_shape = views[0].shape();
  out_shape[0] = 0;
  for (const Tensor& v : views) out_shape[0] += v.dim(0);
  Tensor out = Tensor::empty(dtype, out_shape);
  auto* dst = static_cast<uint8_t*>(out.data());
  for (const Tensor& v : views) {
    if (v.dtype() == dtype) std::memcpy(dst, v.data(), v.nbytes());
    else convert_to_f32(v.dtype(), v.data(), reinterpret_cast<float*>(dst), static_cast<size_t>(v.numel()));
    dst += static_cast<size_t>(v.numel()) * dtype_size(dtype);
  }
  return out;
}

Result<Tensor> Checkpoint::take_stacked(const std::vector<std::string>& parts, const Shape& shape,
                                        StoredAs stored) {
  std::vector<Shape> shapes(parts.size(), shape);
  KL_ASSIGN_OR_RETURN(Tensor cat, take_concat(parts, shapes, stored));
  Shape stacked = {static_cast<int64_t>(parts.size())};
  stacked.insert(stacked.end(), shape.begin(), shape.end());
  return cat.view(stacked);
}

Result<Tensor> Checkpoint::take_head_vector(const std::string& name, int64_t heads, const Slice& slice) {
  KL_ASSIGN_OR_RETURN(Ref r, find(name, nullptr, StoredAs::kFloat));
  const Shape& s = r.entry->shape;
  const int64_t n = shape_numel(s);
  const bool flat_ok = s.size() == 1 && s[0] >= heads;
  const bool four_d = s == Shape{1, 1, heads, 1};
  if (!flat_ok && !four_d)
    return Status::InvalidArgument(r.file->path() + ": " + r.entry->name + ": shape " + shape_to_string(s) +
                                   ", expected [" + std::to_string(heads) + "], [1, 1, " + std::to_string(heads) +
                                   ", 1] or a zero-padded [>" + std::to_string(heads) + "]");
  Tensor all = Tensor::empty(DType::kF32, {n});
  convert_to_f32(r.entry->dtype, r.file->tensor(*r.entry).data(), all.f32(), static_cast<size_t>(n));
  for (int64_t i = heads; i < n; ++i)
    if (all.f32()[i] != 0.0f)
      return Status::InvalidArgument(r.file->path() + ": " + r.entry->name + ": padding entry " + std::to_string(i) +
                                     " is " + std::to_string(all.f32()[i]) + ", expected 0 (only the first " +
                                     std::to_string(heads) + " entries are heads)");
  Tensor out = Tensor::empty(DType::kF32, {heads});
  std::memcpy(out.data(), all.data(), static_cast<size_t>(heads) * 4);
  return slice_of(out, slice);
}

Status Checkpoint::finish() const {
  std::string unused;
  int count = 0;
  for (const auto& [name, ref] : tensors_) {
    if (used_.count(name)) continue;
    if (++count <= 5) unused += (count > 1 ? ", " : "") + std::string("'") + ref.entry->name + "' (" + ref.file->path() + ")";
  }
  if (count == 0) return Status();
  return Status::InvalidArgument(std::to_string(count) + " checkpoint tensor(s) have no destination in the model: " +
                                 unused + (count > 5 ? ", ..." : ""));
}

namespace {

// Number of non-finite elements of `e` in `data` and the index of the first (-1 if none).
std::pair<int64_t, int64_t> count_non_finite(const SafetensorsEntry& e, const uint8_t* data) {
  const int64_t n = shape_numel(e.shape);
  const bool e8m0_scales = e.dtype == DType::kF8E8M0 ||
                           (e.dtype == DType::kU8 && e.name.size() >= 13 &&
                            e.name.compare(e.name.size() - 13, 13, ".weight_scale") == 0);
  auto bad = [&](int64_t i) -> bool {
    if (e8m0_scales) return data[i] == 0xFF;
    switch (e.dtype) {
      case DType::kF32: {
        uint32_t b;
        std::memcpy(&b, data + 4 * i, 4);
        return (b & 0x7f800000u) == 0x7f800000u;
      }
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        return (h & 0x7f80u) == 0x7f80u;
      }
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        return (h & 0x7c00u) == 0x7c00u;
      }
      case DType::kF8E4M3: return (data[i] & 0x7f) == 0x7f;
      default: return false;  // integers, packed FP4 nibbles: every bit pattern is finite
    }
  };
  int64_t count = 0, first = -1;
  for (int64_t i = 0; i < n; ++i)
    if (bad(i)) {
      if (count++ == 0) first = i;
    }
  return {count, first};
}

}  // namespace

std::vector<Checkpoint::NonFinite> Checkpoint::scan_non_finite() const {
  std::vector<NonFinite> out;
  for (const auto& [name, ref] : tensors_) {
    const Tensor view = ref.file->tensor(*ref.entry);
    const auto [count, first] = count_non_finite(*ref.entry, static_cast<const uint8_t*>(view.data()));
    if (count > 0) out.push_back(NonFinite{ref.entry->name, ref.file->path(), count, first});
  }
  return out;
}

std::map<DType, Checkpoint::DtypeStats> Checkpoint::stats() const {
  std::map<DType, DtypeStats> out;
  for (const auto& [name, ref] : tensors_) {
    DtypeStats& s = out[ref.entry->dtype];
    s.tensors += 1;
    s.params += shape_numel(ref.entry->shape);
    s.bytes += static_cast<int64_t>(ref.entry->end - ref.entry->begin);
  }
  return out;
}

}  // namespace klinear
