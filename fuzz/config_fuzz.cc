// Fuzzes parse_model_config for both families: the input document as given (flat Kimi Linear, or
// K3 if it has a text_config), and when the first byte is odd also nested under `text_config`
// as K3 writes it. An accepted config must satisfy the bounds the model relies on.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "io/config.h"

namespace {

void check_config(const klinear::Json& doc) {
  auto c = klinear::parse_model_config(doc, "config.json");
  if (!c.ok()) return;
  KL_CHECK(c->vocab_size > 0 && c->vocab_size <= (1 << 24), "vocab");
  KL_CHECK(c->num_layers > 0 && c->num_layers <= 4096, "layers");
  KL_CHECK(c->bos_token_id < c->vocab_size, "bos");
  for (int64_t id : c->eos_token_ids) KL_CHECK(id >= 0 && id < c->vocab_size, "eos");
  for (int64_t l = 0; l < c->num_layers; ++l) {
    (void)c->mixer(l);
    (void)c->ffn(l);
  }
  KL_CHECK(c->rms_norm_eps > 0 && c->rms_norm_eps <= 0.1, "eps");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto doc = klinear::parse_json(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), "config.json");
  if (!doc.ok()) return 0;
  check_config(*doc);
  if (data[0] & 1) check_config(klinear::Json{{"model_type", "kimi_k3"}, {"text_config", *doc}});
  return 0;
}
