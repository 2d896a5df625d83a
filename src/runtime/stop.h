// When a sequence stops, and which of its text may be shown yet.
//
// Token rules: a stop id (the config's eos ids and the request's stop ids, unless ignore_eos; the
// request's stop ids count even with ignore_eos, as in vLLM) ends the sequence with kStop and adds
// no text; reaching max_tokens ends it with kLength. The first min_tokens generated tokens stop
// nothing (no stop id, no stop string; the sampler does not draw stop ids meanwhile), as vLLM's
// min_tokens.
//
// Stop strings can span tokens, so released text holds back its longest tail that is still the
// beginning of some stop string; a match ends the sequence with kStop and drops everything after
// the stop string, and the stop string too unless include_stop_str_in_output. Each generated token's log-probability entry is released with the last
// byte of its text, so the released entries' texts concatenate to the released text (up to a stop
// string: the token holding the start of a match is dropped with it).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace klinear {

struct StopOptions {
  int64_t max_tokens = 16;           // >= 1
  std::vector<std::string> stop;     // stop strings, each non-empty
  std::vector<int32_t> stop_ids;     // stop ids besides eos
  bool ignore_eos = false;
  int64_t min_tokens = 0;            // >= 0: tokens generated before a stop id or string may end the sequence
  bool include_stop_str_in_output = false;  // a matched stop string stays in the text
};

// The ids that stop a sequence of `o` whose model's end ids are `eos_ids` (the sampler's min_tokens
// suppression covers these).
std::vector<int32_t> stop_ids_of(const StopOptions& o, const std::vector<int32_t>& eos_ids);

// InvalidArgument naming the field: max_tokens < 1, an empty stop string.
Status validate_stop(const StopOptions& o);

// One generated token as the caller reports it to the client.
struct TokenOutput {
  int32_t id = 0;
  std::string text;   // the text this token added (may be empty: a partial UTF-8 character)
  Sampled logprobs;   // meaningful when the request asked for log-probabilities
};

struct Released {
  std::string text;                 // newly final text
  std::vector<TokenOutput> tokens;  // tokens whose text is now wholly released, in order
  std::optional<FinishReason> finish;
};

// Not thread-safe: one per sequence (one per choice of an n > 1 request).
class StopFilter {
 public:
  StopFilter(StopOptions options, std::vector<int32_t> eos_ids);

  // Adds the next generated token with its decoded text piece. After a result with `finish`
  // set, push() must not be called again.
  Released push(TokenOutput token);
  // Releases what is held back when the sequence ends for another reason (e.g. the context is
  // full: the caller passes the finish reason it decided).
  Released flush(FinishReason reason);
  int64_t generated() const { return generated_; }

 private:
  bool is_stop_id(int32_t id) const;
  // Whether a stop id or string may end the sequence yet (past min_tokens).
  bool may_stop() const;
  // Ends `out` with kLength (releasing what is held) when max_tokens are generated.
  Released finish_at_max(Released& out);
  // Releases pending_[0, n) and the tokens whose text ends inside it.
  void release(size_t n, Released& out);

  StopOptions options_;
  std::vector<int32_t> eos_ids_;
  int64_t generated_ = 0;
  std::string pending_;              // text not yet released
  std::vector<TokenOutput> waiting_;  // tokens whose text is not wholly released
  std::vector<size_t> waiting_end_;   // end offset of each waiting token's text in pending_
};

}  // namespace klinear
