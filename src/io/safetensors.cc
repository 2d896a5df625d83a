#include "io/safetensors.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/checked.h"
#include "io/file.h"
#include "io/json.h"

namespace klinear {

namespace {

// Headers of real checkpoints are well under 1 MB; anything this big is corrupt or hostile.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) munmap(addr, size);
  }
};

constexpr uint64_t kMaxDim = 1ull << 48;  // no real tensor dimension comes near

Status parse_entry(const std::string& file, const std::string& name, const Json& v, SafetensorsEntry* e) {
  const std::string where = file + ": tensor '" + name + "'";
  if (!v.is_object()) return Status::Corruption(where + ": entry must be an object, got " + v.type_name());
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return Status::Corruption(where + ": missing string 'dtype'");
  auto parsed = parse_dtype(dt->get<std::string>());
  if (!parsed)
    return Status::Corruption(where + ": unknown dtype '" + dt->get<std::string>() +
                              "' (expected one of BF16 F16 F32 U8 I8 I32 I64 F8_E4M3 F8_E8M0)");
  e->dtype = *parsed;
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) return Status::Corruption(where + ": missing array 'shape'");
  int64_t numel = 1;
  for (const Json& d : *sh) {
    if (!d.is_number_unsigned()) return Status::Corruption(where + ": shape " + sh->dump() + " has a non-natural entry");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > kMaxDim) return Status::Corruption(where + ": shape " + sh->dump() + " has an entry above 2^48");
    auto n = checked_mul(numel, static_cast<int64_t>(dim), where + ": shape " + sh->dump());
    if (!n.ok()) return Status::Corruption(n.status().message());
    numel = *n;
    e->shape.push_back(static_cast<int64_t>(dim));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return Status::Corruption(where + ": 'data_offsets' must be two non-negative integers");
  const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
  if (end < begin)
    return Status::Corruption(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                              "] end before begin");
  auto nbytes = checked_mul(numel, static_cast<int64_t>(dtype_size(e->dtype)),
                            where + ": shape " + shape_to_string(e->shape) + " of " + dtype_name(e->dtype));
  if (!nbytes.ok()) return Status::Corruption(nbytes.status().message());
  const uint64_t bytes = static_cast<uint64_t>(*nbytes);
  if (bytes != end - begin)
    return Status::Corruption(where + ": shape " + shape_to_string(e->shape) + " of " + dtype_name(e->dtype) +
                              " needs " + std::to_string(bytes) + " bytes, data_offsets give " +
                              std::to_string(end - begin));
  e->name = name;
  e->begin = begin;
  e->end = end;
  return Status();
}

Status check_length_field(const std::string& path, uint64_t file_size) {
  if (file_size >= 8) return Status();
  return Status::Corruption(path + ": file is " + std::to_string(file_size) +
                            " bytes, too short for the 8-byte header length");
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  KL_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path));
  const uint64_t file_size = static_cast<uint64_t>(file.size());
  KL_RETURN_IF_ERROR(check_length_field(path, file_size));
  auto mapping = std::make_shared<Mapping>();
  mapping->size = file_size;
  mapping->addr = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (mapping->addr == MAP_FAILED) return Status::IOError(path + ": mmap failed: " + std::strerror(errno));
  const auto* base = static_cast<const uint8_t*>(mapping->addr);
  return from_bytes(path, base, file_size, std::move(mapping));
}

Result<SafetensorsFile> SafetensorsFile::parse(std::string bytes, const std::string& name) {
  auto owner = std::make_shared<std::string>(std::move(bytes));
  KL_RETURN_IF_ERROR(check_length_field(name, owner->size()));
  const auto* base = reinterpret_cast<const uint8_t*>(owner->data());
  const uint64_t size = owner->size();
  return from_bytes(name, base, size, std::move(owner));
}

Result<SafetensorsFile> SafetensorsFile::from_bytes(const std::string& path, const uint8_t* base, uint64_t file_size,
                                                    std::shared_ptr<void> owner) {

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > file_size - 8)
    return Status::Corruption(path + ": header length " + std::to_string(header_len) + " exceeds the " +
                              std::to_string(file_size - 8) + " bytes after the length field (truncated file?)");
  if (header_len > kMaxHeaderBytes)
    return Status::Corruption(path + ": header length " + std::to_string(header_len) + " exceeds the limit of " +
                              std::to_string(kMaxHeaderBytes));
  KL_ASSIGN_OR_RETURN(Json header, parse_json(std::string_view(reinterpret_cast<const char*>(base + 8), header_len),
                                              path + " header"));
  if (!header.is_object()) return Status::Corruption(path + ": header must be a JSON object");

  SafetensorsFile f;
  f.path_ = path;
  f.data_ = base + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Status::Corruption(path + ": __metadata__ must be an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return Status::Corruption(path + ": __metadata__ value '" + m.key() + "' is not a string");
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    KL_RETURN_IF_ERROR(parse_entry(path, it.key(), *it, &e));
    f.entries_.push_back(std::move(e));
  }
  // The byte ranges must tile [0, data_size) exactly.
  std::vector<const SafetensorsEntry*> sorted;
  for (const auto& e : f.entries_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  for (const SafetensorsEntry* e : sorted) {
    if (e->begin != expected)
      return Status::Corruption(path + ": tensor '" + e->name + "' data_offsets [" + std::to_string(e->begin) + ", " +
                                std::to_string(e->end) + "] " + (e->begin < expected ? "overlap" : "leave a gap before") +
                                " the previous tensor (expected to start at " + std::to_string(expected) + ")");
    expected = e->end;
  }
  if (expected != data_size)
    return Status::Corruption(path + ": tensors cover " + std::to_string(expected) + " bytes but the data region has " +
                              std::to_string(data_size) + (expected > data_size ? " (truncated file?)" : " (trailing bytes)"));
  // Entries in file (offset) order; JSON object keys come back sorted by name.
  std::sort(f.entries_.begin(), f.entries_.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  f.mapping_ = std::move(owner);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& e) const {
  return Tensor::wrap(e.dtype, e.shape, const_cast<uint8_t*>(data_ + e.begin), mapping_, Device::kCpu);
}

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KL_CHECK(t.device() == Device::kCpu, "write_safetensors needs host tensors");
    if (name == "__metadata__" || header.contains(name))
      return Status::InvalidArgument(path + ": tensor name '" + name + "' is reserved or repeated");
    header[name] = {{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IOError(path + ": cannot open for writing");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) out.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  out.close();
  if (!out) return Status::IOError(path + ": write failed");
  return Status();
}

}  // namespace klinear
