// `klinear tokenize` and `klinear detokenize`: the Kimi tokenizer from the command line.
//
// Decision: output is exact, for scripts: tokenize prints one compact JSON array line, and
// detokenize prints the decoded text with no newline added, so the pair round-trips byte for byte
// (tools/tokenizer_crosscheck.py relies on it).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "io/json.h"
#include "io/tokenizer.h"

namespace klinear::cli {
namespace {

Status write_stdout(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0)
    return Status::IOError("stdout: write failed");
  return Status();
}

struct TokenizeArgs {
  std::string dir, text, file;
  bool allow_special = false;
  CLI::Option* text_option = nullptr;
  CLI::Option* file_option = nullptr;
};

Status run_tokenize(const TokenizeArgs& a) {
  const bool file = a.file_option->count() > 0;  // --text excludes --file (CLI11 refuses both)
  if (!file && a.text_option->count() == 0) return Status::InvalidArgument("--text or --file: expected one, got neither");
  KL_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.dir));
  std::string input = a.text;
  if (file) {
    auto bytes = read_text_file(a.file);
    if (!bytes.ok()) return bytes.status().with_context("--file");
    input = std::move(bytes).value();
  }
  std::vector<int32_t> ids =
      tok.encode(input, a.allow_special ? Tokenizer::Specials::kParse : Tokenizer::Specials::kAsText);
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
  KL_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_id_list(a.ids, "--ids"));
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
    exit_code = s.ok() ? 0 : fail("tokenize", s);
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
    exit_code = s.ok() ? 0 : fail("detokenize", s);
  });
}

}  // namespace klinear::cli
