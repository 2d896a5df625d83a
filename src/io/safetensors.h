// safetensors reading (memory-mapped, validated before use) and writing.
//
// Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data region. Every check a
// malicious or truncated file could fail happens in open(): the header fits in the file, the JSON
// parses, dtypes are known, shapes are non-negative and match their byte ranges (with overflow
// checks), and the byte ranges tile the data region exactly (sorted, no gap, no overlap, ending at
// the end of the file). After open() succeeds, every tensor view is in bounds.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace klinear {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin = 0;  // byte offset within the data region
  size_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors are Corruption/IOError naming the file and the tensor.
  static Result<SafetensorsFile> open(const std::string& path);
  // The same checks on a whole file held in memory (`name` appears in messages).
  static Result<SafetensorsFile> parse(std::string bytes, const std::string& name);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in file order
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A zero-copy host view of a tensor's bytes; the mapping stays alive while the view does.
  Tensor tensor(const SafetensorsEntry& e) const;

 private:
  // Validates the file at `base` (`size` bytes, >= 8) whose memory `owner` keeps alive.
  static Result<SafetensorsFile> from_bytes(const std::string& path, const uint8_t* base, uint64_t size,
                                            std::shared_ptr<void> owner);

  std::string path_;
  std::shared_ptr<void> mapping_;  // owns the mmap (or the bytes of parse())
  const uint8_t* data_ = nullptr;  // start of the data region
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes host tensors to `path` in the order given (8-byte aligned header).
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace klinear
