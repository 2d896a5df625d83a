// The CUDA KDA decode's tilings, named for the benchmark and the test (bench/cuda/ops_bench.cc
// times each; tests/backend/kda_decode_test.cc runs every case under each).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace klinear::cuda {

class CudaBackend;

// How kda_decode's (head, sequence) items map onto blocks: one block per item (every item's chain
// in parallel; the better shape while the items fill the SMs about once), or persistent blocks
// that prefetch their next item's state tile into shared memory while they compute the current
// one (the DRAM stays busy when each block has several items). kda_decode.cu has the numbers.
enum class KdaDecodeTiling { kBlockPerHead, kPipelined };

// The op's choice for `items` = heads × sequences on `num_sms` SMs.
KdaDecodeTiling default_kda_decode_tiling(int64_t items, int num_sms);

// kda_decode with a chosen tiling (both compute the same values).
void kda_decode_tiled(CudaBackend& be, const KdaDecodeArgs& a, const SeqLayout& decode, KdaDecodeTiling tiling);

}  // namespace klinear::cuda
