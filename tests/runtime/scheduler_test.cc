// Scheduler as a unit, over a fake runner's slots and pages (tests/runtime/fake_runner.h): decodes
// go first, prefill chunks fill the token budget and have their pages reserved as they are
// scheduled, admission waits behind the queue head, a sequence short of pages preempts (itself
// when no other running sequence is left to give way) and its pages are back at once, and with a
// snapshot grid a chunk ends where the step could not snapshot.
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
  // the runner at once.
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
  EXPECT_EQ(s.num_waiting(), 2u);
  EXPECT_EQ(s.num_preemptions(), 1);
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
