// Sampling (backend.h, SampleArgs) on the GPU: per row, greedy (the first id of the largest logit)
// at temperature ≤ 0, else a draw from softmax(logits / T) cut to the top k ids and the top-p mass,
// with the row's counter-based random stream (seed, counter); id −1 where a logit is not finite.
// Shapes and dtypes: logits [R, V] F32; temperature, top_p [R] F32; top_k, counter [R] I32; seed
// [R, 2] I32; ids [R] I32 out.
// One block of 1024 threads per row, whatever the data (a captured step replays the same launch).
// No sort of the vocabulary: the top-k and top-p cut-offs are found by radix selection over the
// 32-bit order key (four passes of 8-bit digits, a 256-bin histogram of counts or weights in shared
// memory, each pass over the ids still tied on the digits chosen so far), then one pass in id
// order (a block scan over contiguous chunks) walks the kept weights to the draw. Integer weights
// (backend/sampling.h) make every sum exact, so the pick is the CPU's.
// Ownership: reads the arguments, writes ids; shared memory only, no workspace.
// Cost and floor: greedy reads the row once; a draw reads it once for the maximum, up to four times
// for each radix selection (top-k, top-p) and twice for the walk, the later reads mostly from L2 (a
// 160k-entry vocabulary is 640 KB a row). The floor is one read of the logits at the copy rate,
// R·V·4 bytes (a decode batch of 64: 42 MB, ~10 µs at 4.2 TB/s).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>

#include "backend/cuda/common/device.cuh"
#include "backend/sampling.h"

namespace klinear::cuda {

namespace {

constexpr int kThreads = 1024;

struct RowArgs {
  const float* logits;
  int64_t v;
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const int32_t* seed;
  const int32_t* counter;
  int32_t* ids;
};

struct Best {
  float value;
  int32_t id;
};
struct BestOp {
  __device__ Best operator()(const Best& a, const Best& b) const {
    return (a.value > b.value || (a.value == b.value && a.id < b.id)) ? a : b;
  }
};

// A cut of the ids in logit order: every id with key > key, and the first `need` (lowest ids)
// of the `tied` ids with key == key.
struct Cut {
  uint32_t key;
  uint64_t need, tied;
  uint64_t above_n, above_w;  // count and weight of the ids with key > key
};

struct Shared {
  union {
    cub::BlockReduce<Best, kThreads>::TempStorage best;
    cub::BlockReduce<unsigned long long, kThreads>::TempStorage sum;
    cub::BlockScan<unsigned long long, kThreads>::TempStorage scan;
  } cub;
  unsigned int hist_n[256];
  unsigned long long hist_w[256];
  Cut cut;
  int32_t id;
};

// Radix selection: the key at which the ids taken in logit order reach `target` (a count, or a
// weight when by_weight), with what lies above it. Called by every thread; result in s.cut.
__device__ void select(const RowArgs& a, float mx, float inv_t, bool by_weight, uint64_t target, Shared& s) {
  const int tid = threadIdx.x, lane = tid % 32;
  const float* l = a.logits + blockIdx.x * a.v;
  __syncthreads();  // every thread has read the previous s.cut
  if (tid == 0) s.cut = Cut{0, target, 0, 0, 0};
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) s.hist_n[b] = 0, s.hist_w[b] = 0;
    __syncthreads();
    const uint32_t prefix = s.cut.key;
    for (int64_t base = 0; base < a.v; base += kThreads) {
      const int64_t i = base + tid;
      uint32_t key = 0;
      bool take = i < a.v;
      if (take) {
        key = sample_key(l[i]);
        take = shift == 24 || (key >> (shift + 8)) == (prefix >> (shift + 8));
      }
      const unsigned active = __ballot_sync(0xffffffffu, take);
      if (!take) continue;
      // Lanes on the same bin add once: their count, and their weights in two 32-bit halves.
      const uint32_t bin = (key >> shift) & 255u;
      const unsigned peers = __match_any_sync(active, bin);
      const uint64_t w = sample_weight(l[i], mx, inv_t);
      const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(w & 0xfffffu));
      const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(w >> 20));
      if (lane == __ffs(peers) - 1) {
        atomicAdd(&s.hist_n[bin], static_cast<unsigned>(__popc(peers)));
        atomicAdd(&s.hist_w[bin], (static_cast<unsigned long long>(hi) << 20) + lo);
      }
    }
    __syncthreads();
    if (tid == 0) {
      Cut c = s.cut;  // c.need: what is still to take
      int chosen = 0;
      for (int b = 255; b >= 0; --b) {
        const uint64_t have = by_weight ? s.hist_w[b] : s.hist_n[b];
        if (have >= c.need && have > 0) {
          chosen = b;
          break;
        }
        c.need -= have;
        c.above_n += s.hist_n[b];
        c.above_w += s.hist_w[b];
      }
      c.key = prefix | (static_cast<uint32_t>(chosen) << shift);
      c.tied = s.hist_n[chosen];
      s.cut = c;
    }
    __syncthreads();
  }
  // By weight, `need` is still a weight: the tied ids all weigh the same, so it becomes a count.
  if (tid == 0 && by_weight) {
    const uint64_t w = sample_weight(sample_key_value(s.cut.key), mx, inv_t);
    s.cut.need = (s.cut.need + w - 1) / w;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) sample_kernel(RowArgs a) {
  __shared__ Shared s;
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x, v = a.v;
  const float* l = a.logits + row * v;

  Best best{-INFINITY, INT_MAX};
  int bad = 0;
  for (int64_t i = tid; i < v; i += kThreads) {
    const float x = l[i];
    if (!isfinite(x)) bad = 1;
    else if (x > best.value) best = Best{x, static_cast<int32_t>(i)};
  }
  bad = __syncthreads_or(bad);
  best = cub::BlockReduce<Best, kThreads>(s.cub.best).Reduce(best, BestOp());
  if (tid == 0) s.id = best.id;
  __syncthreads();
  const float t = a.temperature[row];
  if (bad || !(t > 0.0f)) {
    if (tid == 0) a.ids[row] = bad ? -1 : s.id;
    return;
  }
  const float mx = l[s.id], inv_t = 1.0f / t;
  const int32_t k = a.top_k[row];
  const float p = a.top_p[row];

  // The cut: everything; then top-k by count; then top-p by weight inside it.
  Cut cut{0, 0, 0, 0, 0};
  if (k > 0 && k < v) {
    select(a, mx, inv_t, false, static_cast<uint64_t>(k), s);
    cut = s.cut;
  }
  if (p < 1.0f) {
    // Σ_K w: the ids above the top-k key plus the tied ids it keeps (the selection summed those),
    // or every id.
    uint64_t z = 0;
    if (cut.key != 0) {
      z = cut.above_w + cut.need * sample_weight(sample_key_value(cut.key), mx, inv_t);
    } else {
      unsigned long long mine = 0;
      for (int64_t i = tid; i < v; i += kThreads) mine += sample_weight(l[i], mx, inv_t);
      const unsigned long long all = cub::BlockReduce<unsigned long long, kThreads>(s.cub.sum).Sum(mine);
      if (tid == 0) s.cut.above_w = all;
      __syncthreads();
      z = s.cut.above_w;
      __syncthreads();
    }
    select(a, mx, inv_t, true, top_p_target(p, z), s);
    const Cut pc = s.cut;
    // The top-p prefix lies inside K, so its key is at least the top-k one.
    if (pc.key > cut.key) cut = pc;
    else cut.need = cut.need < pc.need ? cut.need : pc.need;
  }

  // Contiguous chunks in id order: chunk of thread t = [t·per, (t+1)·per).
  const int64_t per = (v + kThreads - 1) / kThreads, c0 = tid * per, c1 = c0 + per < v ? c0 + per : v;
  int64_t last_tied = v;  // ids ≤ last_tied among the tied ones are kept
  if (cut.key != 0 && cut.need < cut.tied) {
    unsigned long long n = 0, before = 0;
    for (int64_t i = c0; i < c1; ++i) n += sample_key(l[i]) == cut.key;
    cub::BlockScan<unsigned long long, kThreads>(s.cub.scan).ExclusiveSum(n, before);
    if (before < cut.need && cut.need <= before + n) {
      uint64_t seen = before;
      for (int64_t i = c0; i < c1; ++i)
        if (sample_key(l[i]) == cut.key && ++seen == cut.need) s.id = static_cast<int32_t>(i);
    }
    __syncthreads();
    last_tied = s.id;
    __syncthreads();
  }
  auto kept_weight = [&](int64_t i) -> uint64_t {
    const uint32_t key = sample_key(l[i]);
    return key > cut.key || (key == cut.key && i <= last_tied) ? sample_weight(l[i], mx, inv_t) : 0;
  };
  unsigned long long mine = 0, before = 0, total = 0;
  for (int64_t i = c0; i < c1; ++i) mine += kept_weight(i);
  cub::BlockScan<unsigned long long, kThreads>(s.cub.scan).ExclusiveSum(mine, before, total);
  const uint64_t x = sample_point(sample_bits(sample_seed(a.seed[2 * row], a.seed[2 * row + 1]),
                                              static_cast<uint32_t>(a.counter[row])),
                                  total);
  if (before <= x && x < before + mine) {
    uint64_t cum = before;
    for (int64_t i = c0; i < c1; ++i) {
      cum += kept_weight(i);
      if (x < cum) {
        a.ids[row] = static_cast<int32_t>(i);
        break;
      }
    }
  }
}

}  // namespace

void CudaBackend::sample(const SampleArgs& a) {
  const int64_t r = a.logits.dim(0), v = a.logits.dim(1);
  const std::string what = "sample logits " + shapes(a.logits);
  KL_CHECK(a.logits.rank() == 2 && a.logits.dtype() == DType::kF32 && a.temperature.numel() == r &&
               a.top_k.numel() == r && a.top_p.numel() == r && a.seed.numel() == 2 * r && a.counter.numel() == r &&
               a.ids.numel() == r && a.top_k.dtype() == DType::kI32 && a.seed.dtype() == DType::kI32 &&
               a.counter.dtype() == DType::kI32 && a.ids.dtype() == DType::kI32 && a.temperature.dtype() == DType::kF32 &&
               a.top_p.dtype() == DType::kF32 && v >= 1 && v < (int64_t{1} << 23),
           what + " ids " + shapes(a.ids));
  for (const Tensor* t : {&a.logits, &a.temperature, &a.top_k, &a.top_p, &a.seed, &a.counter, &a.ids})
    KL_CHECK(t->device() == Device::kCuda, what + ": a host tensor " + shapes(*t));
  if (r == 0) return;
  const RowArgs args{a.logits.data_as<const float>(), v, a.temperature.data_as<const float>(),
                     a.top_k.data_as<const int32_t>(), a.top_p.data_as<const float>(), a.seed.data_as<const int32_t>(),
                     a.counter.data_as<const int32_t>(), a.ids.data_as<int32_t>()};
  sample_kernel<<<static_cast<unsigned>(r), kThreads, 0, stream_>>>(args);
  KL_LAUNCHED(what);
}

}  // namespace klinear::cuda
