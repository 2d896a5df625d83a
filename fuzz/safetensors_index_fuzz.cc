// Fuzzes the model.safetensors.index.json parser: shard names that escape the directory must be
// rejected; everything else is a Status, never a crash.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto doc = klinear::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "index");
  if (!doc.ok()) return 0;
  auto index = klinear::parse_shard_index(*doc, "index");
  if (!index.ok()) return 0;
  for (const std::string& shard : index->shards)
    KL_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "..", "escaping shard " + shard);
  for (const auto& [tensor, shard] : index->weight_map)
    KL_CHECK(std::find(index->shards.begin(), index->shards.end(), shard) != index->shards.end(), "unlisted shard");
  return 0;
}
