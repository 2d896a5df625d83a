// The Kimi tokenizer: tiktoken-style byte-level BPE over `tiktoken.model`, with the Kimi
// pre-tokenization pattern and the 256 special ids named by `tokenizer_config.json`.
//
// Decision: reproduce tiktoken exactly (the oracle of tests/fixtures/tokenizer) rather than a
// look-alike: the pattern runs through PCRE2 (UTF + UCP + JIT) with `\s` spelled as the Unicode
// White_Space set tiktoken's Rust regex uses, the input is cut at 400,000 characters and at
// 25,000-character runs of Python-`isspace` / non-space characters exactly as Moonshot's
// tokenization_kimi.py does, and BPE merges the lowest-ranked adjacent pair, leftmost on ties
// (a linear scan for short pieces, a heap for long ones so a 25,000-byte piece is not quadratic).
// All tables live behind one shared_ptr, so a Tokenizer is cheap to copy and share.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace klinear {

// Thread-safety: every const method may be called concurrently from any number of threads.
// Copies share the same immutable tables.
class Tokenizer {
 public:
  // How special-token names written in the text are treated by encode().
  enum class Specials {
    kAsText,  // user content: "<|im_end|>" is encoded as ordinary bytes (the default)
    kParse,   // template markers: a special's name becomes its id
  };

  // Loads `dir/tiktoken.model` (one "base64(bytes) rank" per line, ranks dense from 0) and
  // `dir/tokenizer_config.json` (special names from `added_tokens_decoder`; unnamed ids of the
  // 256-id special range become "<|reserved_token_{id}|>"; bos/eos from `bos_token`/`eos_token`).
  // Errors: NotFound when `dir` is not a directory; IOError when a file cannot be read or is not a
  // regular file; ResourceExhausted when a file exceeds its size limit (io/file.h);
  // Corruption naming the file, the line and what was expected when the contents are malformed.
  static Result<Tokenizer> load(const std::string& dir);
  // The same from the two files' contents; the names appear in error messages.
  static Result<Tokenizer> parse(std::string_view tiktoken, std::string_view config, const std::string& tiktoken_name,
                                 const std::string& config_name);

  // Token ids of `text`. No BOS/EOS is added. Input that is not valid UTF-8 is first repaired
  // the way Python's `errors="replace"` would (each maximal ill-formed subpart -> U+FFFD).
  std::vector<int32_t> encode(std::string_view text, Specials specials = Specials::kAsText) const;

  // Concatenates the ids' bytes (a special's bytes are its name) and converts to UTF-8, each
  // maximal ill-formed subpart replaced by U+FFFD as Python's `bytes.decode(errors="replace")`.
  // An id outside [0, vocab_size()) decodes to U+FFFD; call check_ids() first to reject those.
  std::string decode(std::span<const int32_t> ids) const;

  // OK, or InvalidArgument naming the first id outside [0, vocab_size()) and its position.
  Status check_ids(std::span<const int32_t> ids) const;

  // Raw bytes of one id (a special's bytes are its name); empty for an id out of range.
  std::string token_bytes(int32_t id) const;

  // Id of the special token named `name` ("<|im_end|>", "<|reserved_token_163700|>"), if any.
  std::optional<int32_t> special_id(std::string_view name) const;
  bool is_special(int32_t id) const { return id >= num_bpe_tokens() && id < vocab_size(); }

  int32_t vocab_size() const;      // BPE tokens + 256 specials: 163840 for the Kimi files
  int32_t num_bpe_tokens() const;  // the first special id: 163584 for the Kimi files
  std::optional<int32_t> bos_id() const;  // from tokenizer_config.json `bos_token`, if set
  std::optional<int32_t> eos_id() const;  // from tokenizer_config.json `eos_token`, if set

  struct Tables;  // opaque; defined in tokenizer.cc

 private:
  explicit Tokenizer(std::shared_ptr<const Tables> tables) : t_(std::move(tables)) {}
  friend class StreamDecoder;
  std::shared_ptr<const Tables> t_;
};

// Python's `not text.strip()`: true when `text` (valid UTF-8) is empty or every code point is
// whitespace by str.isspace(). Moonshot's K3 encoder uses it for blank arguments and reasoning.
bool is_python_blank(std::string_view text);

// Incremental decode for streaming generation: push() returns the text that is final so far and
// holds back an incomplete UTF-8 tail (1,172 Kimi tokens are not valid UTF-8 alone), so the
// concatenation of every push() and the final finish() equals decode() of all the ids.
// Holds a reference to the tokenizer's tables (it stays valid if the Tokenizer is destroyed).
// Not thread-safe: one decoder per stream.
// What a special id adds to the text: its name (decode()'s way), or nothing (vLLM's
// skip_special_tokens, its default).
enum class SpecialText { kShow, kSkip };

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, SpecialText specials = SpecialText::kShow);
  // Adds one id; returns the newly completed text (possibly empty). Out-of-range ids -> U+FFFD.
  std::string push(int32_t id);
  // Flushes the held-back tail (an incomplete sequence becomes U+FFFD) and resets the decoder.
  std::string finish();

 private:
  std::shared_ptr<const Tokenizer::Tables> t_;
  SpecialText specials_;
  std::string pending_;  // bytes not yet returned: at most an incomplete UTF-8 sequence
};

}  // namespace klinear
