#include "runtime/rank_runner.h"

#include <bit>
#include <string>

namespace klinear {

namespace {

// A call as rank 0 sends it: {op, fields...}. open, open_prefix and reserve carry rank 0's answer
// (they run there first); run is sent before rank 0 runs it (the forward needs every rank).
enum Op : int64_t { kStop, kOpen, kOpenPrefix, kClose, kReserve, kRun };

// One message: its length, then its values (both broadcasts from rank 0).
Status broadcast_message(Comm& host, std::vector<int64_t>& message) {
  Tensor length = Tensor::empty(DType::kI64, {1});
  length.data_as<int64_t>()[0] = static_cast<int64_t>(message.size());
  KL_RETURN_IF_ERROR(host.broadcast(BroadcastArgs{length, 0}));
  message.resize(static_cast<size_t>(length.data_as<int64_t>()[0]));
  const Tensor values =
      Tensor::wrap(DType::kI64, {static_cast<int64_t>(message.size())}, message.data(), nullptr, Device::kCpu);
  return host.broadcast(BroadcastArgs{values, 0});
}

int64_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
float bits_float(int64_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b)); }

Status differs(const Comm& host, const std::string& call, int64_t here, int64_t leader) {
  return Status::Corruption("rank " + std::to_string(host.rank()) + ": " + call + " gave " + std::to_string(here) +
                          " here and " + std::to_string(leader) + " on rank 0: the ranks' caches differ");
}

}  // namespace

LeaderRunner::~LeaderRunner() { send({kStop}); }

void LeaderRunner::send(std::vector<int64_t> message) {
  if (!failed_.ok()) return;
  failed_ = broadcast_message(host_, message);
}

Result<RunnerSeq> LeaderRunner::open() {
  KL_RETURN_IF_ERROR(failed_);
  KL_ASSIGN_OR_RETURN(RunnerSeq seq, runner_.open());
  send({kOpen, seq});
  KL_RETURN_IF_ERROR(failed_);
  return seq;
}

Result<RunnerSeq> LeaderRunner::open_prefix(std::span<const int32_t> tokens, int64_t cached) {
  KL_RETURN_IF_ERROR(failed_);
  KL_ASSIGN_OR_RETURN(RunnerSeq seq, runner_.open_prefix(tokens, cached));
  std::vector<int64_t> m = {kOpenPrefix, seq, cached};
  m.insert(m.end(), tokens.begin(), tokens.end());
  send(std::move(m));
  KL_RETURN_IF_ERROR(failed_);
  return seq;
}

void LeaderRunner::close(RunnerSeq seq) {
  runner_.close(seq);
  send({kClose, seq});
}

bool LeaderRunner::reserve(RunnerSeq seq, int64_t tokens) {
  const bool fits = runner_.reserve(seq, tokens);
  send({kReserve, seq, tokens, fits ? 1 : 0});
  return fits;
}

Result<SampledStep> LeaderRunner::run(std::span<const RunnerStep> steps) {
  std::vector<int64_t> m = {kRun, static_cast<int64_t>(steps.size())};
  for (const RunnerStep& s : steps) {
    const SampleRow d = s.draw.value_or(SampleRow{});
    m.insert(m.end(), {s.seq, static_cast<int64_t>(s.logits), s.prompt, s.draw ? 1 : 0, float_bits(d.temperature), d.top_k,
                       float_bits(d.top_p), static_cast<int64_t>(d.seed), d.counter,
                       static_cast<int64_t>(s.ids.size())});
    m.insert(m.end(), s.ids.begin(), s.ids.end());
  }
  send(std::move(m));
  KL_RETURN_IF_ERROR(failed_);
  return runner_.run(steps);
}

Status follow_leader(ModelRunner& runner, Comm& host) {
  KL_CHECK(host.rank() != 0, "follow_leader on rank 0");
  std::vector<int64_t> m;
  std::vector<int32_t> ids;
  while (true) {
    KL_RETURN_IF_ERROR(broadcast_message(host, m));
    KL_CHECK(!m.empty(), "an empty message from rank 0");
    switch (m[0]) {
      case kStop: return Status();
      case kOpen: {
        KL_ASSIGN_OR_RETURN(RunnerSeq seq, runner.open());
        if (seq != m[1]) return differs(host, "open", seq, m[1]);
        break;
      }
      case kOpenPrefix: {
        ids.assign(m.begin() + 3, m.end());
        KL_ASSIGN_OR_RETURN(RunnerSeq seq, runner.open_prefix(ids, m[2]));
        if (seq != m[1]) return differs(host, "open_prefix", seq, m[1]);
        break;
      }
      case kClose: runner.close(m[1]); break;
      case kReserve: {
        const bool fits = runner.reserve(m[1], m[2]);
        if (fits != (m[3] != 0))
          return differs(host, "reserve(sequence " + std::to_string(m[1]) + ", " + std::to_string(m[2]) + " tokens)",
                         fits, m[3]);
        break;
      }
      case kRun: {
        // The steps' ids point into `ids`, filled first so that they stay put.
        const int64_t n = m[1];
        ids.clear();
        for (int64_t i = 0, at = 2; i < n; ++i) {
          ids.insert(ids.end(), m.begin() + at + 10, m.begin() + at + 10 + m[at + 9]);
          at += 10 + m[at + 9];
        }
        std::vector<RunnerStep> steps(static_cast<size_t>(n));
        size_t first = 0;
        for (int64_t i = 0, at = 2; i < n; ++i) {
          RunnerStep& s = steps[static_cast<size_t>(i)];
          const int64_t* f = m.data() + at;
          s.seq = f[0];
          s.logits = static_cast<StepLogits>(f[1]);
          s.prompt = f[2];
          if (f[3] != 0)
            s.draw = SampleRow{bits_float(f[4]), static_cast<int32_t>(f[5]), bits_float(f[6]), static_cast<uint64_t>(f[7]),
                               static_cast<int32_t>(f[8])};
          s.ids = std::span<const int32_t>(ids.data() + first, static_cast<size_t>(f[9]));
          first += static_cast<size_t>(f[9]);
          at += 10 + f[9];
        }
        KL_RETURN_IF_ERROR(runner.run(steps).status());
        break;
      }
      default: KL_CHECK(false, "message " + std::to_string(m[0]) + " from rank 0 is no call");
    }
  }
}

}  // namespace klinear
