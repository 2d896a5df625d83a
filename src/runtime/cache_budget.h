// Cache budget from a fraction of the device memory, as vLLM's --gpu-memory-utilization: the
// caches get `fraction` of the memory free at start-up minus what the weights and the step arena
// at its peak took since. The arena's peak is reached up front by profile_step(), so serving
// never grows it past what the budget left. Used by `klinear serve` / `run` on CUDA when
// --cache-memory is not given (tools/klinear/cmd_serve.cc).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "model/model.h"

namespace klinear {

struct MemoryFraction {
  double fraction = 0.9;         // of free_at_start, in (0, 1]
  uint64_t free_at_start = 0;    // backend available_bytes() before the weights were loaded
  uint64_t free_after_load = 0;  // ... after the weights and profile_step()
};

// fraction * free_at_start - (free_at_start - free_after_load). InvalidArgument for a fraction
// outside (0, 1]; ResourceExhausted naming the numbers when nothing is left for the caches.
Result<uint64_t> cache_budget(const MemoryFraction& m);

// Runs, on a throwaway cache, one step as large as the engine's largest: max_num_tokens tokens
// spread over min(max_num_seqs, max_num_tokens) sequences, each asking for logits. The backend's
// step arena keeps its peak size afterwards.
Status profile_step(Model& model, int64_t max_num_tokens, int64_t max_num_seqs, int64_t page_size);

}  // namespace klinear
