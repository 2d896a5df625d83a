// Fuzzes SafetensorsFile::parse (header length, header JSON, dtypes, shapes, offsets, tiling):
// any input is either rejected with a Status or yields entries whose byte ranges are in bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto f = klinear::SafetensorsFile::parse(bytes, "fuzz.safetensors");
  if (!f.ok()) return 0;
  const uint64_t header_len = size >= 8 ? data[0] | uint64_t{data[1]} << 8 | uint64_t{data[2]} << 16 |
                                              uint64_t{data[3]} << 24 | uint64_t{data[4]} << 32 |
                                              uint64_t{data[5]} << 40 | uint64_t{data[6]} << 48 |
                                              uint64_t{data[7]} << 56
                                        : 0;
  for (const auto& e : f->entries()) {
    KL_CHECK(e.begin <= e.end && 8 + header_len + e.end <= size, "entry out of bounds: " + e.name);
    const klinear::Tensor t = f->tensor(e);
    KL_CHECK(t.nbytes() == e.end - e.begin, "tensor bytes differ from the offsets: " + e.name);
    KL_CHECK(f->find(e.name) == &e, "index lookup: " + e.name);
  }
  return 0;
}
