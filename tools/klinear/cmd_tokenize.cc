// `klinear tokenize` and `klinear detokenize`: the Kimi tokenizer from the command line.
//
// Decision: output is exact, for scripts: tokenize prints one compact JSON array line, and
// detokenize prints the decoded text with no newline added, so the pair round-trips byte for byte
// (tools/tokenizer_crosscheck.py relies on it).
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "io/json.h"
#include "io/tokenizer.h"

namespace klinear::cli {
namespace {

// Input problems (a missing directory, a bad file, a malformed id list) exit 2; the rest exit 1.
int report(const char* command, const Status& status) {
  std::fprintf(stderr, "klinear %s: %s\n", command, status.to_string().c_str());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruption:
    case StatusCode::kIOError: return 2;
    default: return 1;
  }
}

Status write_stdout(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0)
    return Status::IOError("stdout: write failed");
  return Status();
}

// "1,2,3", "1, 2, 3" or "[1, 2, 3]" (tokenize's own output) -> ids. Empty list -> no ids.
Result<std::vector<int32_t>> parse_id_list(const std::string& text) {
  std::string s = text;
  auto trim = [](std::string& v) {
    size_t b = v.find_first_not_of(" \t\r\n"), e = v.find_last_not_of(" \t\r\n");
    v = b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
  };
  trim(s);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') {
    s = s.substr(1, s.size() - 2);
    trim(s);
  }
  std::vector<int32_t> ids;
  if (s.empty()) return ids;
  size_t pos = 0;
  for (size_t item = 0;; ++item) {
    size_t comma = s.find(',', pos);
    std::string field = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    trim(field);
    bool ok = !field.empty() && field.size() <= 11;
    for (size_t i = 0; ok && i < field.size(); ++i)
      ok = std::isdigit(static_cast<unsigned char>(field[i])) || (i == 0 && field[i] == '-' && field.size() > 1);
    long long v = ok ? std::stoll(field) : 0;
    if (!ok || v < INT32_MIN || v > INT32_MAX)
      return Status::InvalidArgument("--ids: item " + std::to_string(item) + " is '" + field +
                                     "', expected an integer token id (a list like 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

struct TokenizeArgs {
  std::string dir, text, file;
  bool allow_special = false;
  CLI::Option* text_option = nullptr;
  CLI::Option* file_option = nullptr;
};

Status run_tokenize(const TokenizeArgs& a) {
  if (a.text_option->count() == 0 && a.file_option->count() == 0)
    return Status::InvalidArgument("expected one of --text or --file");
  KL_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.dir));
  std::string text = a.text;
  if (a.file_option->count() > 0) {
    KL_ASSIGN_OR_RETURN(text, read_text_file(a.file));
  }
  std::vector<int32_t> ids =
      tok.encode(text, a.allow_special ? Tokenizer::Specials::kParse : Tokenizer::Specials::kAsText);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  return write_stdout(out);
}

struct DetokenizeArgs {
  std::string dir, ids;
};

Status run_detokenize(const DetokenizeArgs& a) {
  KL_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_id_list(a.ids));
  KL_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.dir));
  KL_RETURN_IF_ERROR(tok.check_ids(ids).with_context("--ids"));
  return write_stdout(tok.decode(ids));
}

}  // namespace

void add_tokenize_commands(CLI::App& app, int& exit_code) {
  auto targs = std::make_shared<TokenizeArgs>();
  CLI::App* tok = app.add_subcommand(
      "tokenize",
      "Encode text with a Kimi tokenizer and print the token ids as one JSON array line. Special-token "
      "names in the text are plain text unless --allow-special is given. No BOS/EOS is added.");
  tok->add_option("--tokenizer", targs->dir, "Directory with tiktoken.model and tokenizer_config.json")->required();
  tok->add_flag("--allow-special", targs->allow_special,
                "Encode special-token names in the text (e.g. <|im_end|>) as their special ids");
  targs->text_option = tok->add_option("--text", targs->text, "The text to encode");
  targs->file_option = tok->add_option("--file", targs->file, "Encode the bytes of this file instead of --text");
  targs->text_option->excludes(targs->file_option);
  tok->callback([targs, &exit_code] {
    Status s = run_tokenize(*targs);
    exit_code = s.ok() ? 0 : report("tokenize", s);
  });

  auto dargs = std::make_shared<DetokenizeArgs>();
  CLI::App* detok = app.add_subcommand(
      "detokenize",
      "Decode token ids and print the text exactly (UTF-8; invalid sequences become U+FFFD; no newline is "
      "added).");
  detok->add_option("--tokenizer", dargs->dir, "Directory with tiktoken.model and tokenizer_config.json")
      ->required();
  detok->add_option("--ids", dargs->ids, "Token ids: 1,2,3 or a JSON array such as [1, 2, 3]")->required();
  detok->callback([dargs, &exit_code] {
    Status s = run_detokenize(*dargs);
    exit_code = s.ok() ? 0 : report("detokenize", s);
  });
}

}  // namespace klinear::cli
