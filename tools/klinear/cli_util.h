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

// Prints "klinear <cmd>: <status>" and returns the exit code: 2 for bad input, 1 otherwise.
inline int fail(const char* cmd, const Status& s) {
  std::fprintf(stderr, "klinear %s: %s\n", cmd, s.to_string().c_str());
  const bool input = s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound ||
                     s.code() == StatusCode::kCorruption || s.code() == StatusCode::kNotSupported;
  return input ? 2 : 1;
}

// "1,2,3" → {1, 2, 3}; InvalidArgument naming `flag` and the bad element otherwise.
inline Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0 || v > INT32_MAX)
      return Status::InvalidArgument(flag + ": '" + item + "' is not a non-negative token id (expected e.g. 1,2,3)");
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
