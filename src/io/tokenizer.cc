// Kimi tokenizer implementation: loading, pre-tokenization (PCRE2), BPE, UTF-8 repair.
//
// Decision: the hot path is one PCRE2 JIT match per pre-token plus one open-addressing hash
// lookup for pieces that are whole tokens (most of them); only pieces that are not whole tokens
// run BPE. Match data and the JIT stack are per thread, so encode() stays const and lock-free.
#include "io/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_map>

#include "core/checked.h"
#include "io/file.h"
#include "io/json.h"

namespace klinear {

namespace {

constexpr int32_t kNumSpecials = 256;           // tokenization_kimi.py: num_reserved_special_tokens
// Ranks and ids stay int32 with the specials after the BPE tokens.
constexpr size_t kMaxTokenBytes = 65535;
constexpr int64_t kMaxBpeRank = std::numeric_limits<int32_t>::max() - kNumSpecials - 1;
constexpr size_t kMaxEncodeChars = 400'000;     // tokenization_kimi.py: TIKTOKEN_MAX_ENCODE_CHARS
constexpr size_t kMaxRunChars = 25'000;         // tokenization_kimi.py: MAX_NO_WHITESPACES_CHARS
constexpr size_t kLinearBpeMaxBytes = 64;       // longer pieces use the O(n log n) heap merge
constexpr const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// The Kimi pattern (tokenization_kimi.py) for PCRE2. Two rewrites, both exact:
// `[X&&[^\p{Han}]]` becomes `(?:(?!\p{sc:Han})[X])` (PCRE2 has no class intersection; `sc:`
// selects the Script property, as Rust's `\p{Han}` does, not Script_Extensions), and `\s` is
// spelled out as Unicode White_Space (what tiktoken's Rust regex means by `\s`; PCRE2's UCP `\s`
// would also match U+180E).
#define KL_WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define KL_NOT_HAN "(?!\\p{sc:Han})"
#define KL_UPPER "(?:" KL_NOT_HAN "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define KL_LOWER "(?:" KL_NOT_HAN "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define KL_CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
constexpr const char kPattern[] =
    "\\p{sc:Han}+"
    "|[^\\r\\n\\p{L}\\p{N}]?" KL_UPPER "*" KL_LOWER "+" KL_CONTRACTION
    "|[^\\r\\n\\p{L}\\p{N}]?" KL_UPPER "+" KL_LOWER "*" KL_CONTRACTION
    "|\\p{N}{1,3}"
    "| ?[^" KL_WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" KL_WS "]*[\\r\\n]+"
    "|[" KL_WS "]+(?![^" KL_WS "])"
    "|[" KL_WS "]+";
#undef KL_WS
#undef KL_NOT_HAN
#undef KL_UPPER
#undef KL_LOWER
#undef KL_CONTRACTION

// ---- UTF-8 ------------------------------------------------------------------------------------

// Length of the well-formed sequence that starts with lead byte `c` (0 if `c` cannot start one),
// and the allowed range of the second byte (Unicode Table 3-7).
struct Utf8Lead {
  int length;
  uint8_t lo, hi;
};
inline Utf8Lead utf8_lead(uint8_t c) {
  if (c < 0x80) return {1, 0, 0};
  if (c >= 0xC2 && c <= 0xDF) return {2, 0x80, 0xBF};
  if (c == 0xE0) return {3, 0xA0, 0xBF};
  if (c == 0xED) return {3, 0x80, 0x9F};
  if (c >= 0xE1 && c <= 0xEF) return {3, 0x80, 0xBF};
  if (c == 0xF0) return {4, 0x90, 0xBF};
  if (c >= 0xF1 && c <= 0xF3) return {4, 0x80, 0xBF};
  if (c == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes starting at `p` (at most `n` available) that continue a sequence led by `lead`:
// stops at the first byte that cannot continue it.
inline int utf8_valid_continuation(const uint8_t* p, size_t n, Utf8Lead lead) {
  int k = 0;
  for (; k + 1 < lead.length && static_cast<size_t>(k) < n; ++k) {
    uint8_t b = p[k];
    bool ok = k == 0 ? (b >= lead.lo && b <= lead.hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
  }
  return k;
}

// Appends `in` to `out` with every maximal ill-formed subpart replaced by U+FFFD (the rule
// CPython's UTF-8 decoder follows with errors="replace").
void append_utf8_lossy(std::string& out, std::string_view in) {
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  size_t n = in.size(), i = 0;
  while (i < n) {
    size_t run = i;  // copy ASCII runs in one append
    while (run < n && p[run] < 0x80) ++run;
    out.append(in.data() + i, run - i);
    i = run;
    if (i == n) break;
    Utf8Lead lead = utf8_lead(p[i]);
    if (lead.length == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    int k = utf8_valid_continuation(p + i + 1, n - i - 1, lead);
    if (k + 1 == lead.length) {
      out.append(in.data() + i, lead.length);
      i += lead.length;
    } else {
      out += kReplacement;
      i += 1 + k;
    }
  }
}

bool is_valid_utf8(std::string_view in) {
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  size_t n = in.size(), i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    Utf8Lead lead = utf8_lead(p[i]);
    if (lead.length == 0 || utf8_valid_continuation(p + i + 1, n - i - 1, lead) + 1 != lead.length) return false;
    i += lead.length;
  }
  return true;
}

// Bytes at the end of `buf` that are a proper prefix of a well-formed sequence (0..3): what a
// stream must hold back because the next token may complete it.
size_t utf8_incomplete_tail(std::string_view buf) {
  const auto* p = reinterpret_cast<const uint8_t*>(buf.data());
  size_t n = buf.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    uint8_t c = p[n - back];
    if (c >= 0x80 && c <= 0xBF) continue;  // a continuation byte: look further back for the lead
    Utf8Lead lead = utf8_lead(c);
    if (lead.length <= static_cast<int>(back)) return 0;  // ASCII, invalid, or already complete
    int k = utf8_valid_continuation(p + n - back + 1, back - 1, lead);
    return static_cast<size_t>(k) == back - 1 ? back : 0;
  }
  return 0;
}

// Decodes the code point at `p` of valid UTF-8; advances `i`.
inline uint32_t next_code_point(const uint8_t* p, size_t& i) {
  uint8_t c = p[i];
  if (c < 0x80) return p[i++];
  if (c < 0xE0) {
    uint32_t cp = ((c & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
    i += 2;
    return cp;
  }
  if (c < 0xF0) {
    uint32_t cp = ((c & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
    i += 3;
    return cp;
  }
  uint32_t cp = ((c & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu);
  i += 4;
  return cp;
}

// Python's str.isspace(): bidirectional class WS, B or S, or general category Zs.
inline bool py_isspace(uint32_t c) {
  if (c <= 0x20) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// Appends the pieces tokenization_kimi.py encodes separately: windows of 400,000 code points,
// each split so that no run of isspace / non-isspace code points exceeds 25,000
// (`_split_whitespaces_or_nonwhitespaces`, reproduced step for step). `text` is valid UTF-8.
void cut_text(std::string_view text, std::vector<std::string_view>& out) {
  if (text.size() <= kMaxRunChars) {  // fewer code points than bytes: no cut can apply
    out.push_back(text);
    return;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {  // one 400,000-code-point window per iteration
    size_t slice_start = i, chars = 0, run = 0, first = i;
    bool run_is_space = py_isspace(next_code_point(p, first));
    while (i < text.size() && chars < kMaxEncodeChars) {
      size_t at = i;
      bool is_space = py_isspace(next_code_point(p, i));
      ++chars;
      if (is_space != run_is_space) {
        run_is_space = is_space;
        run = 1;
      } else if (++run > kMaxRunChars) {
        out.push_back(text.substr(slice_start, at - slice_start));
        slice_start = at;
        run = 1;
      }
    }
    out.push_back(text.substr(slice_start, i - slice_start));
  }
}

// ---- base64 -----------------------------------------------------------------------------------

// Standard alphabet with '=' padding; false on any other input.
bool base64_decode(std::string_view in, std::string& out) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = in[in.size() - 2] == '=' ? 2 : 1;
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      char c = in[i + k];
      bool in_pad = i + 4 == in.size() && k >= 4 - pad;
      int8_t d = in_pad ? (c == '=' ? 0 : -1) : table[static_cast<uint8_t>(c)];
      if (d < 0) return false;
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out += static_cast<char>(v >> 16);
    if (!(i + 4 == in.size() && pad == 2)) out += static_cast<char>((v >> 8) & 0xFF);
    if (!(i + 4 == in.size() && pad >= 1)) out += static_cast<char>(v & 0xFF);
  }
  return true;
}

// ---- rank table -------------------------------------------------------------------------------

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = mix64(h ^ v);
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return mix64(h ^ v ^ 0x5555555555555555ull);
}

}  // namespace

// Byte strings -> BPE rank: open addressing with linear probing over 16-byte slots. A slot keeps
// the key's first 8 bytes inline, so a lookup of a key of at most 8 bytes (most BPE pairs) touches
// one cache line; longer keys are confirmed against the byte arena.
struct RankTable {
  struct Slot {
    uint64_t prefix = 0;  // first 8 key bytes, zero-padded
    int32_t rank = -1;    // -1: empty slot
    uint16_t length = 0;  // key length (tokens are shorter than 64 KiB)
    uint16_t tag = 0;     // high hash bits
  };
  const std::string* arena = nullptr;
  const std::vector<uint32_t>* offsets = nullptr;
  std::vector<Slot> slots;
  uint64_t mask = 0;

  static uint64_t prefix_of(const char* p, size_t n) {
    uint64_t v = 0;
    std::memcpy(&v, p, n < 8 ? n : 8);
    return v;
  }

  void build(const std::string& bytes, const std::vector<uint32_t>& token_offsets, int32_t count) {
    arena = &bytes;
    offsets = &token_offsets;
    size_t cap = 16;
    while (cap < static_cast<size_t>(count) * 2) cap <<= 1;  // load factor <= 1/2
    slots.assign(cap, Slot{});
    mask = cap - 1;
    for (int32_t r = 0; r < count; ++r) {
      const char* key = bytes.data() + token_offsets[r];
      size_t len = token_offsets[r + 1] - token_offsets[r];
      uint64_t h = hash_bytes(key, len);
      size_t i = h & mask;
      while (slots[i].rank >= 0) i = (i + 1) & mask;
      slots[i] = Slot{prefix_of(key, len), r, static_cast<uint16_t>(len), static_cast<uint16_t>(h >> 48)};
    }
  }

  // Rank of `key`, or -1.
  int32_t find(const char* key, size_t n) const {
    uint64_t h = hash_bytes(key, n);
    uint64_t prefix = prefix_of(key, n);
    uint16_t tag = static_cast<uint16_t>(h >> 48);
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots[i];
      if (s.rank < 0) return -1;
      if (s.tag != tag || s.length != n || s.prefix != prefix) continue;
      if (n <= 8 || std::memcmp(arena->data() + (*offsets)[s.rank] + 8, key + 8, n - 8) == 0) return s.rank;
    }
  }
};

// Lets the special-name map be searched with a string_view, without building a std::string.
struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Tokenizer::Tables {
  std::string bytes;              // every token's bytes, by id (specials: their names)
  std::vector<uint32_t> offsets;  // id -> [offsets[id], offsets[id + 1]) in `bytes`
  int32_t num_bpe = 0;
  RankTable ranks;
  std::unordered_map<std::string, int32_t, NameHash, std::equal_to<>> special_by_name;
  std::vector<size_t> special_lengths;         // distinct name lengths, longest first
  std::array<bool, 256> special_first_byte{};  // bytes that can start a special name
  std::optional<int32_t> bos, eos;
  const pcre2_code* regex = nullptr;  // the process-wide compiled Kimi pattern (never freed)

  Tables() = default;
  Tables(const Tables&) = delete;
  Tables& operator=(const Tables&) = delete;

  std::string_view token(int32_t id) const {
    return std::string_view(bytes).substr(offsets[id], offsets[id + 1] - offsets[id]);
  }
  int32_t vocab() const { return static_cast<int32_t>(offsets.size()) - 1; }
};

namespace {

using Tables = Tokenizer::Tables;

// ---- loading ----------------------------------------------------------------------------------

// Ranks must be dense from 0, so with n token lines every rank is below n: the table is sized by
// the line count, never by a rank (one line with rank 10^9 must not allocate gigabytes).
Status load_ranks(std::string_view text, const std::string& path, Tables& t) {
  struct Line {
    std::string bytes;
    int64_t rank;
    size_t line_no;
  };
  std::vector<Line> lines;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // tiktoken skips blank lines too
    auto where = [&] { return path + ":" + std::to_string(line_no) + ": "; };
    size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      return Status::Corruption(where() + "expected '<base64 bytes> <rank>', got '" + std::string(line.substr(0, 80)) + "'");
    std::string_view b64 = line.substr(0, space), rank_text = line.substr(space + 1);
    Line l{"", 0, line_no};
    if (!base64_decode(b64, l.bytes))
      return Status::Corruption(where() + "expected base64 token bytes, got '" + std::string(b64.substr(0, 80)) + "'");
    if (l.bytes.size() > kMaxTokenBytes)  // the rank table stores lengths in 16 bits
      return Status::Corruption(where() + "token is " + std::to_string(l.bytes.size()) + " bytes, expected at most " +
                                std::to_string(kMaxTokenBytes));
    auto rank = parse_int(rank_text, IntRange{0, kMaxBpeRank}, "rank");
    if (!rank.ok())
      return Status::Corruption(where() + "expected a rank (a non-negative integer below " + std::to_string(kMaxBpeRank + 1) +
                                "), got '" + std::string(rank_text.substr(0, 40)) + "'");
    l.rank = *rank;
    lines.push_back(std::move(l));
  }
  if (lines.empty()) return Status::Corruption(path + ": expected token lines, found none");
  std::vector<std::string> by_rank(lines.size());
  std::vector<size_t> line_of_rank(lines.size(), 0);
  for (Line& l : lines) {
    if (static_cast<size_t>(l.rank) >= lines.size()) continue;  // a rank below it is missing (reported next)
    if (line_of_rank[l.rank] != 0)
      return Status::Corruption(path + ":" + std::to_string(l.line_no) + ": rank " + std::to_string(l.rank) +
                                " already given on line " + std::to_string(line_of_rank[l.rank]));
    by_rank[l.rank] = std::move(l.bytes);
    line_of_rank[l.rank] = l.line_no;
  }
  for (size_t r = 0; r < by_rank.size(); ++r)
    if (line_of_rank[r] == 0)
      return Status::Corruption(path + ": expected dense ranks 0.." + std::to_string(by_rank.size() - 1) + " (one per token line), rank " +
                                std::to_string(r) + " is missing");
  t.num_bpe = static_cast<int32_t>(by_rank.size());
  t.offsets.assign(1, 0);
  for (const std::string& b : by_rank) {
    t.bytes += b;
    t.offsets.push_back(static_cast<uint32_t>(t.bytes.size()));
  }
  t.ranks.build(t.bytes, t.offsets, t.num_bpe);
  // Every byte must be a token: BPE starts from single bytes.
  for (int b = 0; b < 256; ++b) {
    char c = static_cast<char>(b);
    if (t.ranks.find(&c, 1) < 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      return Status::Corruption(path + ": expected a token for every single byte, byte " + hex + " has none");
    }
  }
  // Duplicate byte strings would make the rank of those bytes ambiguous.
  for (int32_t r = 0; r < t.num_bpe; ++r) {
    std::string_view tok = t.token(r);
    int32_t found = t.ranks.find(tok.data(), tok.size());
    if (found != r)
      return Status::Corruption(path + ":" + std::to_string(line_of_rank[r]) + ": token bytes duplicate line " +
                                std::to_string(line_of_rank[found]));
  }
  return Status();
}

// A special named by `bos_token` / `eos_token`: a string or {"content": string}; absent -> none.
Result<std::optional<int32_t>> special_field(const Json& cfg, const std::string& key, const std::string& path,
                                             const Tables& t) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::optional<int32_t>{};
  const Json* name = &*it;
  if (name->is_object()) {
    auto c = name->find("content");
    if (c == name->end()) return Status::Corruption(path + ": field '" + key + "' must be a string or {\"content\": string}");
    name = &*c;
  }
  if (!name->is_string())
    return Status::Corruption(path + ": field '" + key + "' must be a string, got " + name->type_name());
  auto found = t.special_by_name.find(name->get<std::string>());
  if (found == t.special_by_name.end())
    return Status::Corruption(path + ": field '" + key + "' names '" + name->get<std::string>() +
                              "', which is not a special token");
  return std::optional<int32_t>{found->second};
}

Status load_specials(std::string_view text, const std::string& path, Tables& t) {
  KL_ASSIGN_OR_RETURN(Json cfg, parse_json(text, path));
  if (!cfg.is_object()) return Status::Corruption(path + ": expected a JSON object, got " + std::string(cfg.type_name()));
  std::vector<std::string> names(kNumSpecials);
  auto dec = cfg.find("added_tokens_decoder");
  if (dec != cfg.end() && !dec->is_null()) {
    if (!dec->is_object())
      return Status::Corruption(path + ": field 'added_tokens_decoder' must be an object, got " + dec->type_name());
    for (const auto& [key, entry] : dec->items()) {
      const std::string where = path + ": added_tokens_decoder[\"" + key + "\"]: ";
      auto id_or = parse_int(key, IntRange{t.num_bpe, t.num_bpe + kNumSpecials - 1}, "id");
      const int64_t id = id_or.ok() ? *id_or : -1;
      if (!id_or.ok())
        return Status::Corruption(where + "expected a special id in [" + std::to_string(t.num_bpe) + ", " +
                                  std::to_string(t.num_bpe + kNumSpecials) + ")");
      auto content = entry.is_object() ? entry.find("content") : entry.end();
      if (content == entry.end() || !content->is_string() || content->get<std::string>().empty())
        return Status::Corruption(where + "expected an object with a non-empty string 'content'");
      names[id - t.num_bpe] = content->get<std::string>();
    }
  }
  for (int32_t i = 0; i < kNumSpecials; ++i) {
    int32_t id = t.num_bpe + i;
    std::string& name = names[i];
    if (name.empty()) name = "<|reserved_token_" + std::to_string(id) + "|>";
    if (!t.special_by_name.emplace(name, id).second)
      return Status::Corruption(path + ": special name '" + name + "' is given to two ids");
    t.bytes += name;
    t.offsets.push_back(static_cast<uint32_t>(t.bytes.size()));
    t.special_first_byte[static_cast<uint8_t>(name[0])] = true;
    if (std::find(t.special_lengths.begin(), t.special_lengths.end(), name.size()) == t.special_lengths.end())
      t.special_lengths.push_back(name.size());
  }
  std::sort(t.special_lengths.begin(), t.special_lengths.end(), std::greater<>());
  KL_ASSIGN_OR_RETURN(t.bos, special_field(cfg, "bos_token", path, t));
  KL_ASSIGN_OR_RETURN(t.eos, special_field(cfg, "eos_token", path, t));
  return Status();
}

// The pattern is a constant, so it is compiled (and JIT-compiled) once per process and shared by
// every Tables: loading a tokenizer again costs no compilation. A compiled pcre2_code is
// read-only during matching, so sharing it across threads is safe.
Status compile_pattern(Tables& t) {
  struct Compiled {
    pcre2_code* code = nullptr;
    Status status;
  };
  static const Compiled compiled = [] {
    Compiled c;
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    c.code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                           &err_offset, nullptr);
    if (!c.code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      c.status = Status::NotSupported("PCRE2 cannot compile the Kimi pattern at offset " + std::to_string(err_offset) +
                                      ": " + reinterpret_cast<const char*>(msg) +
                                      " (needs PCRE2 >= 10.40 with Unicode)");
      return c;
    }
    // Without JIT (an unsupported CPU) pcre2_match interprets the same pattern: slower, same result.
    pcre2_jit_compile(c.code, PCRE2_JIT_COMPLETE);
    return c;
  }();
  if (!compiled.code) return compiled.status;
  t.regex = compiled.code;
  return Status();
}

// ---- encoding ---------------------------------------------------------------------------------

// Per-thread PCRE2 match state. The JIT stack is large enough for the longest piece the 25,000
// run cut allows (a letter run backtracks one frame per character).
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

// Reused buffers of one encode() call.
struct BpeScratch {
  std::vector<std::pair<uint32_t, int32_t>> parts;  // linear merge: (start byte, rank of pair)
  std::vector<int32_t> next, prev;                  // heap merge: linked list by start byte
  struct Pair {
    int32_t rank;
    int32_t start;
    int32_t end;
    bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::vector<Pair> heap;
};

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// tiktoken's `_byte_pair_merge`: O(n * merges), the fastest for the short pieces of real text.
void bpe_linear(const Tables& t, std::string_view piece, std::vector<int32_t>& out, BpeScratch& s) {
  auto& parts = s.parts;
  const char* p = piece.data();
  auto pair_rank = [&](size_t i) -> int32_t {  // rank of parts i and i+1 merged
    if (i + 2 >= parts.size()) return kNoRank;
    int32_t r = t.ranks.find(p + parts[i].first, parts[i + 2].first - parts[i].first);
    return r < 0 ? kNoRank : r;
  };
  parts.clear();
  for (uint32_t i = 0; i <= piece.size(); ++i) parts.emplace_back(i, kNoRank);
  for (size_t i = 0; i + 2 < parts.size(); ++i) parts[i].second = pair_rank(i);
  while (parts.size() > 2) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < parts.size(); ++i)
      if (parts[i].second < parts[best].second) best = i;
    if (parts[best].second == kNoRank) break;
    parts.erase(parts.begin() + best + 1);
    parts[best].second = pair_rank(best);
    if (best > 0) parts[best - 1].second = pair_rank(best - 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    out.push_back(t.ranks.find(p + parts[i].first, parts[i + 1].first - parts[i].first));
}

// The same merge order (lowest rank, leftmost start on ties) with a min-heap of candidate pairs
// and a linked list of parts: O(n log n) for long pieces. Heap entries go stale when a neighbour
// merges; an entry is live iff its start is still a part and its pair still ends at `end`.
void bpe_heap(const Tables& t, std::string_view piece, std::vector<int32_t>& out, BpeScratch& s) {
  const int32_t n = static_cast<int32_t>(piece.size());
  const char* p = piece.data();
  auto& next = s.next;
  auto& prev = s.prev;
  next.resize(n);
  prev.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;
  }
  auto& heap = s.heap;
  heap.clear();
  auto end_of = [&](int32_t i) { return i < n ? next[i] : n; };  // end byte of the part at i
  auto push = [&](int32_t start) {  // the pair (part at start, its successor)
    int32_t mid = next[start];
    if (mid >= n) return;
    int32_t end = end_of(mid);
    int32_t r = t.ranks.find(p + start, end - start);
    if (r < 0) return;
    heap.push_back({r, start, end});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    BpeScratch::Pair top = heap.back();
    heap.pop_back();
    int32_t i = top.start;
    if (next[i] < 0 || next[i] >= n || end_of(next[i]) != top.end) continue;  // stale
    int32_t j = next[i];
    next[i] = next[j];
    next[j] = -1;  // j is no longer a part
    if (next[i] < n) prev[next[i]] = i;
    if (prev[i] >= 0) push(prev[i]);
    push(i);
  }
  for (int32_t i = 0; i < n; i = next[i]) out.push_back(t.ranks.find(p + i, next[i] - i));
}

void encode_ordinary(const Tables& t, std::string_view text, std::vector<int32_t>& out, BpeScratch& s) {
  if (text.empty()) return;
  MatchState& m = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    // The text was validated once; checking it again per match would make the loop quadratic.
    int rc = pcre2_match(t.regex, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, m.data, m.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    KL_CHECK(rc > 0, "PCRE2 match failed with code " + std::to_string(rc) + " at byte " + std::to_string(offset) +
                         " of a " + std::to_string(text.size()) + "-byte piece");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    std::string_view piece = text.substr(ov[0], ov[1] - ov[0]);
    KL_CHECK(!piece.empty(), "the Kimi pattern matched an empty piece");
    offset = ov[1];
    int32_t whole = t.ranks.find(piece.data(), piece.size());
    if (whole >= 0) {
      out.push_back(whole);
    } else if (piece.size() <= kLinearBpeMaxBytes) {
      bpe_linear(t, piece, out, s);
    } else {
      bpe_heap(t, piece, out, s);
    }
  }
}

// Next special name in `text` at or after `from`: leftmost, longest at that position.
std::optional<std::pair<size_t, int32_t>> find_special(const Tables& t, std::string_view text, size_t from) {
  for (size_t i = from; i < text.size(); ++i) {
    if (!t.special_first_byte[static_cast<uint8_t>(text[i])]) continue;
    for (size_t len : t.special_lengths) {
      if (i + len > text.size()) continue;
      auto it = t.special_by_name.find(text.substr(i, len));
      if (it != t.special_by_name.end()) return std::make_pair(i, it->second);
    }
  }
  return std::nullopt;
}

}  // namespace

// ---- Tokenizer --------------------------------------------------------------------------------

Result<Tokenizer> Tokenizer::load(const std::string& dir) {
  KL_ASSIGN_OR_RETURN(PathKind kind, path_kind(dir));
  if (kind != PathKind::kDirectory)
    return Status::NotFound("tokenizer directory '" + dir + "' does not exist or is not a directory");
  const std::string ranks_path = dir + "/tiktoken.model", config_path = dir + "/tokenizer_config.json";
  KL_ASSIGN_OR_RETURN(std::string ranks, read_regular_file(ranks_path, kMaxTokenizerFileBytes));
  KL_ASSIGN_OR_RETURN(std::string config, read_regular_file(config_path, kMaxJsonFileBytes));
  return parse(ranks, config, ranks_path, config_path);
}

Result<Tokenizer> Tokenizer::parse(std::string_view tiktoken, std::string_view config, const std::string& tiktoken_name,
                                   const std::string& config_name) {
  if (static_cast<int64_t>(tiktoken.size()) > kMaxTokenizerFileBytes)
    return Status::ResourceExhausted(tiktoken_name + ": " + std::to_string(tiktoken.size()) +
                                     " bytes, more than the limit of " + std::to_string(kMaxTokenizerFileBytes));
  auto t = std::make_shared<Tables>();
  KL_RETURN_IF_ERROR(load_ranks(tiktoken, tiktoken_name, *t));
  KL_RETURN_IF_ERROR(load_specials(config, config_name, *t));
  KL_RETURN_IF_ERROR(compile_pattern(*t));
  return Tokenizer(std::move(t));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, Specials specials) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    append_utf8_lossy(repaired, text);
    text = repaired;
  }
  std::vector<std::string_view> chunks;
  cut_text(text, chunks);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  BpeScratch scratch;
  for (std::string_view chunk : chunks) {
    if (specials == Specials::kAsText) {
      encode_ordinary(*t_, chunk, out, scratch);
      continue;
    }
    size_t pos = 0;
    while (auto hit = find_special(*t_, chunk, pos)) {
      encode_ordinary(*t_, chunk.substr(pos, hit->first - pos), out, scratch);
      out.push_back(hit->second);
      pos = hit->first + t_->token(hit->second).size();
    }
    encode_ordinary(*t_, chunk.substr(pos), out, scratch);
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id >= 0 && id < t_->vocab()) {
      bytes += t_->token(id);
    } else {
      bytes += kReplacement;
    }
  }
  if (is_valid_utf8(bytes)) return bytes;
  std::string out;
  append_utf8_lossy(out, bytes);
  return out;
}

Status Tokenizer::check_ids(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= t_->vocab())
      return Status::InvalidArgument("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                     " is outside the vocabulary [0, " + std::to_string(t_->vocab()) + ")");
  return Status();
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= t_->vocab()) return {};
  return std::string(t_->token(id));
}

std::optional<int32_t> Tokenizer::special_id(std::string_view name) const {
  auto it = t_->special_by_name.find(name);
  if (it == t_->special_by_name.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::vocab_size() const { return t_->vocab(); }
int32_t Tokenizer::num_bpe_tokens() const { return t_->num_bpe; }
std::optional<int32_t> Tokenizer::bos_id() const { return t_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return t_->eos; }

// ---- StreamDecoder ----------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, SpecialText specials) : t_(tokenizer.t_), specials_(specials) {}

std::string StreamDecoder::push(int32_t id) {
  if (specials_ == SpecialText::kSkip && id >= t_->num_bpe && id < t_->vocab()) return std::string();
  if (id >= 0 && id < t_->vocab()) {
    pending_ += t_->token(id);
  } else {
    pending_ += kReplacement;
  }
  size_t ready = pending_.size() - utf8_incomplete_tail(pending_);
  std::string out;
  append_utf8_lossy(out, std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  append_utf8_lossy(out, pending_);
  pending_.clear();
  return out;
}

bool is_python_blank(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size();)
    if (!py_isspace(next_code_point(p, i))) return false;
  return true;
}

}  // namespace klinear
