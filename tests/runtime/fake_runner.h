// A fake StepRunner for the scheduler and engine tests: its "model" is a hash of everything a
// sequence has been fed (so any state mix-up, lost chunk or stale slot changes the tokens), its
// cache counts slots and reserved pages, and every step checks that the positions it writes were
// reserved and that the pools were not overfilled.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <new>
#include <set>
#include <vector>

#include "runtime/step_runner.h"

namespace klinear::testing {

constexpr int64_t kVocab = 64;
constexpr int32_t kPoison = 63;       // the fake runner fails a step that feeds this id,
constexpr int32_t kOutOfMemory = 62;  // throws std::bad_alloc from one that feeds this (ids below are fine)

inline uint64_t mix(uint64_t h, int32_t id) { return (h ^ (static_cast<uint64_t>(id) + 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull; }

// Logits of a state: pseudo-random per (state, id), in [-4, 4); the two failing ids are never generated.
inline void fake_logits(uint64_t h, float* row) {
  for (int64_t j = 0; j < kVocab; ++j) row[j] = static_cast<float>((mix(h, static_cast<int32_t>(j)) >> 40) % 8192) / 1024.0f - 4.0f;
  row[kPoison] = row[kOutOfMemory] = -1e30f;
}

struct StepRecord {
  int64_t tokens = 0, decodes = 0, prefills = 0;
  int64_t widest_all = 0;  // the most rows a StepLogits::kAll step returned
};

class FakeRunner final : public StepRunner {
 public:
  FakeRunner(int64_t slots, int64_t pages, int64_t page_size) : slots_(slots), pages_(pages), page_size_(page_size) {}
  int64_t vocab_size() const override { return kVocab; }
  int64_t max_model_len() const override { return 4096; }
  CacheUsage usage() const override {
    CacheUsage u{slots_, slots_ - static_cast<int64_t>(seqs_.size()), pages_, pages_, page_size_};
    for (const auto& [id, s] : seqs_) u.pages_free -= s.pages;
    return u;
  }
  bool reserve(RunnerSeq seq, int64_t tokens) override {
    State& s = seqs_.at(seq);
    const int64_t more = pages_ > 0 ? std::max<int64_t>(0, pages_for(tokens, page_size_) - s.pages) : 0;
    if (more > usage().pages_free) return false;
    s.pages += more;
    return true;
  }
  Result<RunnerSeq> open() override {
    if (static_cast<int64_t>(seqs_.size()) >= slots_) return Status::ResourceExhausted("no slot");
    seqs_[next_] = State{};  // zero state, whatever was there before
    return next_++;
  }
  void close(RunnerSeq seq) override { KL_CHECK(seqs_.erase(seq) == 1, "close of an unknown sequence"); }
  Result<SampledStep> run(std::span<const RunnerStep> steps) override {
    StepRecord rec;
    std::set<RunnerSeq> seen;
    int64_t rows = 0;
    for (const RunnerStep& s : steps) {
      EXPECT_TRUE(seqs_.count(s.seq)) << "step on a closed sequence";
      EXPECT_TRUE(seen.insert(s.seq).second) << "sequence twice in one step";
      EXPECT_GE(s.ids.size(), 1u);
      if (pages_ > 0) {
        EXPECT_GE(seqs_[s.seq].pages * page_size_, seqs_[s.seq].tokens + static_cast<int64_t>(s.ids.size()))
            << "a step writes positions the scheduler did not reserve";
      }
      rows += s.host_rows();
      if (s.logits == StepLogits::kAll) rec.widest_all = std::max(rec.widest_all, static_cast<int64_t>(s.ids.size()));
      rec.tokens += static_cast<int64_t>(s.ids.size());
      (seqs_[s.seq].tokens > 0 && s.ids.size() == 1 ? rec.decodes : rec.prefills) += 1;
      for (int32_t id : s.ids) {
        if (id == kPoison) return Status::InvalidArgument("poisoned token");
        if (id == kOutOfMemory) throw std::bad_alloc();
      }
    }
    Tensor out = Tensor::empty(DType::kF32, {rows, kVocab});
    int64_t row = 0;
    for (const RunnerStep& s : steps) {
      State& st = seqs_[s.seq];
      for (int32_t id : s.ids) {
        st.hash = mix(st.hash, id);
        // kAll: the distribution after each new token, in order.
        if (s.logits == StepLogits::kAll) fake_logits(st.hash, out.f32() + row++ * kVocab);
      }
      st.tokens += static_cast<int64_t>(s.ids.size());
      if (s.logits == StepLogits::kLast) fake_logits(st.hash, out.f32() + row++ * kVocab);
    }
    EXPECT_GE(usage().pages_free, 0) << "the scheduler overfilled the pages";
    record.push_back(rec);
    return SampledStep{out, {}};
  }
  std::vector<StepRecord> record;

 private:
  struct State {
    uint64_t hash = 0;
    int64_t tokens = 0;
    int64_t pages = 0;  // reserved
  };
  int64_t slots_, pages_, page_size_;
  std::map<RunnerSeq, State> seqs_;
  RunnerSeq next_ = 1;
};

}  // namespace klinear::testing
