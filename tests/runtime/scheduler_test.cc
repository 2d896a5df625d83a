// Scheduler as a unit, over a fake runner's slots and pages (tests/runtime/fake_runner.h): decodes
// go first, prefill chunks fill the token budget and have their pages reserved as they are
// scheduled, admission waits behind the queue head, a sequence short of pages preempts (itself
// when no other running sequence is left to give way) and its pages are back at once, and with a
// snapshot grid a chunk ends where the step could not snapshot; a long prompt's chunks stay within
// the step's attention bound and leave room for the sequences waiting behind it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fake_runner.h"
#include "runtime/scheduler.h"

namespace klinear {
namespace {

using testing::FakeRunner;

TEST(Scheduler, DecodesFirstThenChunksUnderTheBudget) {
  Scheduler s(SchedulerOptions{10, 8});
  Sequence a, b, c;
  a.id = 1, b.id = 2, c.id = 3;
  a.tokens.assign(5, 1);
  b.tokens.assign(30, 1);
  c.tokens.assign(3, 1);
  s.add(&a);
  FakeRunner runner(4, 6, 4);  // 4 slots, 6 pages of 4 positions
  StepPlan p = s.schedule(runner);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_TRUE(p.seqs[0].admit);
  EXPECT_EQ(p.seqs[0].tokens, 5);
  ASSERT_TRUE(a.slot.has_value()) << "admitted without an admitter: opened in the runner";
  EXPECT_EQ(runner.usage().pages_free, 4) << "a's 5 positions hold 2 pages";
  a.computed = 5;
  a.tokens.push_back(7);  // sampled: a decodes next
  s.add(&b);
  s.add(&c);
  p = s.schedule(runner);
  ASSERT_EQ(p.seqs.size(), 2u);  // a's decode, then b's first chunk takes the rest; c waits
  EXPECT_EQ(p.seqs[0].seq, &a);
  EXPECT_EQ(p.seqs[0].tokens, 1);
  EXPECT_EQ(p.seqs[1].seq, &b);
  EXPECT_EQ(p.seqs[1].tokens, 9);
  EXPECT_EQ(s.num_waiting(), 1u);
  EXPECT_EQ(runner.usage().pages_free, 1) << "b's chunk of 9 reserved 3 pages";
  // b's next chunk needs 2 more pages and 1 is free; the only other running sequence (a) already
  // has its decode in this step, so b preempts itself back to the front of the queue, closed in
  // the runner at once. (c leaves first: while it waits, b's chunk would take half the budget.)
  s.remove(&c);
  a.computed = 6;
  a.tokens.push_back(8);
  b.computed = 9;
  p = s.schedule(runner);
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], &b);
  EXPECT_EQ(b.computed, 0);
  EXPECT_FALSE(b.slot.has_value());
  EXPECT_EQ(runner.usage().pages_free, 4) << "b's pages are back";
  EXPECT_EQ(runner.usage().slots_free, 3);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq, &a);
  EXPECT_EQ(s.num_waiting(), 1u);
  EXPECT_EQ(s.num_preemptions(), 1);
}

// A long prompt's chunks: at most max_step_attention query-key pairs a step (a chunk of n tokens
// from position p attends over n·p + n(n+1)/2), one token whatever the context when it is the
// step's only prefill, and half the step's tokens and pairs while a sequence waits for a slot, the
// rest going to that sequence's admission. Before, the long prompt took the whole budget step after
// step and a short request waited for all of its prefill (a 1M-token prompt froze the server).
TEST(Scheduler, LongPrefillsStayWithinTheAttentionBoundAndLeaveRoomForAdmission) {
  struct Case {
    const char* what;
    int64_t attention, computed;
    bool waiting;
    int64_t want_long, want_short;  // tokens of the long prompt's chunk and the waiting one's admission
  };
  const std::vector<Case> cases{
      {"no bound, alone", 0, 44, false, 64, 0},
      {"from 0: 44 tokens (990 pairs)", 1000, 0, false, 44, 0},
      {"from 44: 18 tokens (963 pairs)", 1000, 44, false, 18, 0},
      {"one token's 5,001 pairs over the bound still runs", 1000, 5000, false, 1, 0},
      {"half the pairs while one waits: 10 tokens (495), its 5 (15)", 1000, 44, true, 10, 5},
      {"no bound: half the tokens while one waits", 0, 44, true, 32, 5},
      {"the pairs left are too few for the waiting one's chunk", 1000, 5000, true, 1, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Scheduler s(SchedulerOptions{64, 8, 0, c.attention});
    Sequence lng, shrt;
    lng.id = 1, shrt.id = 2;
    lng.tokens.assign(10000, 1);
    lng.prompt = 10000;
    shrt.tokens.assign(5, 1);
    shrt.prompt = 5;
    FakeRunner runner(4, 0, 1);  // no pages
    s.add(&lng);
    ASSERT_EQ(s.schedule(runner).seqs.size(), 1u);  // admitted
    lng.computed = c.computed;
    if (c.waiting) s.add(&shrt);
    const StepPlan p = s.schedule(runner);
    ASSERT_EQ(p.seqs.size(), c.want_short > 0 ? 2u : 1u);
    EXPECT_EQ(p.seqs[0].seq, &lng);
    EXPECT_EQ(p.seqs[0].tokens, c.want_long);
    if (c.want_short > 0) {
      EXPECT_EQ(p.seqs[1].seq, &shrt);
      EXPECT_TRUE(p.seqs[1].admit);
      EXPECT_EQ(p.seqs[1].tokens, c.want_short);
    }
  }
}

// With a snapshot grid, a prefill chunk ends where the step could not snapshot: at a grid point or
// the prompt's end that is not a multiple of 64 tokens from the chunk's start; points at such a
// multiple (or at the chunk's end) do not shorten it.
TEST(Scheduler, ChunksEndAtSnapshotPointsTheyCannotSnapshot) {
  struct Case {
    int64_t budget, prompt, total, computed, want;
  };
  const std::vector<Case> cases{
      {100, 150, 150, 0, 100},   // grid 64 at offset 64: allowed
      {100, 150, 150, 100, 28},  // grid 128 at offset 28: cut there
      {100, 150, 150, 128, 22},  // the prompt's end is the chunk's end
      {100, 150, 160, 128, 22},  // a recomputed sequence: the prompt's end at offset 22 cuts
      {7, 150, 150, 126, 2},     // grid 128 inside a small chunk
      {7, 150, 150, 128, 7},
      {200, 300, 300, 10, 54},   // grid 64 at offset 54
      {200, 300, 300, 64, 200},  // 128, 192, 256 all at multiples of 64
      {200, 40, 300, 0, 40},     // nothing beyond the prompt is on the grid
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("budget " + std::to_string(c.budget) + " computed " + std::to_string(c.computed));
    Scheduler s(SchedulerOptions{c.budget, 8, 64});
    Sequence q;
    q.id = 1;
    q.tokens.assign(static_cast<size_t>(c.total), 1);
    q.prompt = c.prompt;
    s.add(&q);
    FakeRunner runner(4, 0, 1);  // no pages
    const StepPlan p = s.schedule(runner);
    ASSERT_EQ(p.seqs.size(), 1u);
    q.computed = c.computed;  // admitted from zero; now ask for the chunk from `computed`
    const StepPlan next = s.schedule(runner);
    ASSERT_EQ(next.seqs.size(), 1u);
    EXPECT_EQ(next.seqs[0].tokens, c.want);
  }
}

}  // namespace
}  // namespace klinear
