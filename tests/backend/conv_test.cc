// Short conv (MODEL.md 4.2) over a step of several sequences, on every backend row: each sequence's
// causal depthwise conv + SiLU against its formula from its own state slot, the slot updated to
// the last Kc−1 inputs, untouched slots left alone, and a sequence run in pieces through its
// state equal to the whole sequence at once. The table covers widths that are and are not a
// multiple of 8 (CUDA's 16-byte chunks), steps whose runs of 16 rows (CUDA: a thread's rows) cross
// several sequences including empty ones, and Kc from 1 (no history) to 6 (past CUDA's register
// window of 4 taps).
#include <gtest/gtest.h>

#include <cstring>

#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

struct ConvCase {
  const char* name;
  int64_t c;                      // channels
  std::vector<int32_t> lens;      // new rows per sequence (the first ≥ 10: it is rerun in pieces)
  std::vector<int32_t> cached;    // positions before them
  std::vector<int32_t> slot_of;   // state slot per sequence
  int64_t slots;                  // slots in the pool (some unused)
};

const ConvCase kConvCases[] = {
    {"odd_width", 12, {23, 1, 9, 2}, {0, 5, 0, 70}, {3, 0, 4, 1}, 5},
    {"chunked_width_empty_sequences", 24, {23, 0, 3, 0, 0, 2, 1, 0, 40, 0}, {0, 4, 9, 0, 1, 0, 3, 0, 20, 2},
     {7, 0, 11, 2, 9, 4, 10, 1, 5, 3}, 12},
};

class ShortConv : public testing::BackendTest {};

TEST_P(ShortConv, BatchAgainstFormulaAndPieces) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const ConvCase& cc : kConvCases) {
    for (int64_t kc : {1, 2, 3, 4, 6}) {
      SCOPED_TRACE(std::string(cc.name) + " kc " + std::to_string(kc));
      const int64_t c = cc.c, slots = cc.slots;
      const std::vector<int32_t>& lens = cc.lens;
      const std::vector<int32_t>& slot_of = cc.slot_of;
      SeqLayout layout = testing::make_layout(lens, cc.cached, slot_of, 16, 64, rng);
      be().upload_layout(layout);
      const int64_t n = layout.num_rows();
      Tensor x = testing::random_tensor(rng, {n, c}), w = testing::random_tensor(rng, {c, kc});
      Tensor s0 = testing::random_tensor(rng, {slots, kc - 1, c});  // non-empty histories
      Tensor states = persistent(s0, act());
      Tensor out = poisoned({n, c});
      be().short_conv(ConvArgs{dev(x), persistent(w, act()), states, out}, layout);

      Tensor expect = Tensor::empty(DType::kF32, {n, c}), expect_state = Tensor::empty(DType::kF32, s0.shape());
      std::memcpy(expect_state.data(), s0.data(), s0.nbytes());
      for (size_t b = 0; b < lens.size(); ++b) {
        const int64_t r0 = layout.cu_seqlens[b], t = lens[b];
        const float* hist = s0.f32() + slot_of[b] * (kc - 1) * c;
        // in[i] for i in [−(kc−1), t): the slot's history, then this sequence's rows.
        auto in = [&](int64_t i, int64_t ch) { return i < 0 ? hist[(i + kc - 1) * c + ch] : x.f32()[(r0 + i) * c + ch]; };
        for (int64_t i = 0; i < t; ++i)
          for (int64_t ch = 0; ch < c; ++ch) {
            double acc = 0;
            for (int64_t j = 0; j < kc; ++j) acc += double(w.f32()[ch * kc + j]) * in(i - (kc - 1) + j, ch);
            expect.f32()[(r0 + i) * c + ch] = float(acc / (1 + std::exp(-acc)));
          }
        for (int64_t r = 0; r < kc - 1; ++r)
          for (int64_t ch = 0; ch < c; ++ch)
            expect_state.f32()[(slot_of[b] * (kc - 1) + r) * c + ch] = in(t - (kc - 1) + r, ch);
      }
      EXPECT_TRUE(testing::all_close(host(out), expect, tol()));
      if (kc > 1) {  // Kc = 1 keeps no state
        EXPECT_TRUE(testing::close_rel(host(states), expect_state, tol())) << "states";
      }

      // The first sequence alone in pieces 1 + 9 + 13 through its slot equals the batch result.
      Tensor piece_states = persistent(s0, act());
      Tensor pieces = Tensor::empty(DType::kF32, {lens[0], c});
      for (auto [b, e] : {std::pair<int32_t, int32_t>{0, 1}, {1, 10}, {10, lens[0]}}) {
        SeqLayout one = testing::make_layout({e - b}, {b}, {slot_of[0]}, 16, 64, rng);
        be().upload_layout(one);
        Tensor o = poisoned({e - b, c});
        be().short_conv(ConvArgs{dev(x.rows(b, e)), persistent(w, act()), piece_states, o}, one);
        const Tensor oh = host(o);
        std::memcpy(pieces.f32() + b * c, oh.f32(), oh.nbytes());
      }
      EXPECT_TRUE(testing::all_close(pieces, host(out).rows(0, lens[0]), tol())) << "pieces";

    }
  }
}

KL_BACKEND_SUITE(ShortConv);

}  // namespace
}  // namespace klinear
