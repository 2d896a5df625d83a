// Small helpers shared by the CLI subcommands: error printing, id-list parsing, and the sampling
// options common to generate and chat.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "io/json.h"
#include "runtime/generate.h"

namespace klinear::cli {

// Prints "klinear <cmd>: <status>" and returns the exit code: 2 for bad input (a missing or
// malformed file, directory, flag or id), 1 for anything else.
inline int fail(const char* cmd, const Status& s) {
  std::fprintf(stderr, "klinear %s: %s\n", cmd, s.to_string().c_str());
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruption:
    case StatusCode::kNotSupported:
    case StatusCode::kIOError: return 2;
    default: return 1;
  }
}

// "1,2,3", "1, 2, 3" or "[1, 2, 3]" (tokenize's own output) → ids; "" or "[]" → no ids.
// InvalidArgument naming `flag`, the item and its position otherwise.
inline Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& flag) {
  auto trim = [](std::string v) {
    const size_t b = v.find_first_not_of(" \t\r\n"), e = v.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
  };
  std::string s = trim(text);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = trim(s.substr(1, s.size() - 2));
  std::vector<int32_t> ids;
  if (s.empty()) return ids;
  size_t pos = 0;
  for (size_t item = 0;; ++item) {
    const size_t comma = s.find(',', pos);
    const std::string field = trim(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    bool ok = !field.empty() && field.size() <= 10;
    for (char ch : field) ok = ok && ch >= '0' && ch <= '9';
    const long long v = ok ? std::stoll(field) : -1;
    if (!ok || v > INT32_MAX)
      return Status::InvalidArgument(flag + ": item " + std::to_string(item) + " is '" + field +
                                     "', expected a non-negative token id (a list like 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

inline void add_generate_options(CLI::App* sub, GenerateOptions& o) {
  sub->add_option("--max-tokens", o.max_tokens, "maximum number of tokens to generate")->capture_default_str();
  sub->add_option("--temperature", o.sampling.temperature, "sampling temperature; 0 is greedy")->capture_default_str();
  sub->add_option("--top-k", o.sampling.top_k, "sample from the k most likely tokens (0: all)")->capture_default_str();
  sub->add_option("--top-p", o.sampling.top_p, "nucleus sampling probability mass")->capture_default_str();
  sub->add_option("--seed", o.sampling.seed, "random seed for sampling")->capture_default_str();
  sub->add_flag("--ignore-eos", o.ignore_eos, "do not stop at the end-of-sequence id");
}

// Prints the generated ids: one JSON object with --json, else the ids on one line. `text` is the
// decoded text when a tokenizer is available.
inline void print_generation(const GenerateResult& r, bool json, const std::string* text) {
  if (json) {
    Json out{{"ids", r.ids},
             {"finish_reason", r.finish == FinishReason::kStop ? "stop" : "length"},
             {"context_full", r.finish == FinishReason::kContext},
             {"prompt_tokens", r.prompt_tokens},
             {"prefill_seconds", r.prefill_seconds},
             {"decode_seconds", r.decode_seconds}};
    if (text) out["text"] = *text;
    std::printf("%s\n", out.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
    return;
  }
  std::string line;
  for (size_t i = 0; i < r.ids.size(); ++i) line += (i ? "," : "") + std::to_string(r.ids[i]);
  std::printf("%s\n", line.c_str());
}

}  // namespace klinear::cli
