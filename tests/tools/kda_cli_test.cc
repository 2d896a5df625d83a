// `klinear kda` end to end: random .npy inputs (T = 70, not a multiple of 64), the command run
// forward and backward, its outputs equal to the CPU ops run here on the same inputs (q and k as
// given), context parallelism under mpirun equal to one rank, and missing files, wrong
// shapes and CUDA answered with a clear error.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "backend/backend.h"
#include "io/npy.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::CliRun;

struct KdaFiles {
  Tensor q, k, v, g, beta, h0, d_out, d_ht;
};

// Random inputs with unit-norm keys (the caller normalises) and decays in (−0.5, 0).
KdaFiles random_files(int64_t t_len, int64_t heads, int64_t dk, int64_t dv) {
  std::mt19937_64 rng(testing::fresh_seed());
  KdaFiles f{testing::random_tensor(rng, {t_len, heads, dk}),
             testing::random_tensor(rng, {t_len, heads, dk}),
             testing::random_tensor(rng, {t_len, heads, dv}),
             testing::random_tensor(rng, {t_len, heads, dk}, -0.5f, -0.001f),
             testing::random_tensor(rng, {t_len, heads}, 0.05f, 0.95f),
             testing::random_tensor(rng, {heads, dk, dv}),
             testing::random_tensor(rng, {t_len, heads, dv}),
             testing::random_tensor(rng, {heads, dk, dv})};
  for (int64_t r = 0; r < t_len * heads; ++r) {
    float ss = 0;
    for (int64_t j = 0; j < dk; ++j) ss += f.k.f32()[r * dk + j] * f.k.f32()[r * dk + j];
    for (int64_t j = 0; j < dk; ++j) f.k.f32()[r * dk + j] /= std::sqrt(ss);
  }
  return f;
}

void write(const testing::ScratchDir& dir, const std::string& name, const Tensor& t) {
  ASSERT_TRUE(write_npy(dir.file(name + ".npy"), t).ok()) << name;
}

Tensor read(const testing::ScratchDir& dir, const std::string& name) {
  auto t = read_npy(dir.file(name + ".npy"));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : Tensor();
}

TEST(KdaCli, ForwardAndBackwardEqualTheOps) {
  const int64_t T = 70, H = 2, dk = 8, dv = 4;
  const KdaFiles f = random_files(T, H, dk, dv);
  const testing::ScratchDir in, out;
  for (auto [name, t] : {std::pair{"q", &f.q}, {"k", &f.k}, {"v", &f.v}, {"g", &f.g}, {"beta", &f.beta},
                         {"h0", &f.h0}, {"do", &f.d_out}, {"dht", &f.d_ht}})
    write(in, name, *t);
  const CliRun r = testing::run_cli("kda --inputs " + in.str() + " --out " + out.str() + " --backward");
  ASSERT_EQ(r.exit_code, 0) << r.all();

  auto be = std::move(make_backend(BackendOptions{}).value());
  SeqLayout layout;
  layout.cu_seqlens = {0, static_cast<int32_t>(T)};
  layout.cached = {0};
  layout.slots = {0};
  const Tensor states = Tensor::empty(DType::kF32, {1, H, dk, dv}), o = Tensor::empty(DType::kF32, {T, H, dv});
  std::copy(f.h0.f32(), f.h0.f32() + f.h0.numel(), states.f32());
  be->kda_chunked({f.q, f.k, f.v, f.g, f.beta, states, o, KdaQkNorm::kGiven}, layout);
  KdaBackwardArgs b{f.q, f.k, f.v, f.g, f.beta, f.h0.view({1, H, dk, dv}), f.d_out, f.d_ht.view({1, H, dk, dv}),
                    KdaQkNorm::kGiven, Tensor::empty(DType::kF32, {T, H, dk}), Tensor::empty(DType::kF32, {T, H, dk}),
                    Tensor::empty(DType::kF32, {T, H, dv}), Tensor::empty(DType::kF32, {T, H, dk}),
                    Tensor::empty(DType::kF32, {T, H}), Tensor::empty(DType::kF32, {1, H, dk, dv})};
  be->kda_chunked_backward(b, layout);
  // The same ops on the same values: bit for bit.
  for (auto [name, t] : {std::pair{"o", o}, {"ht", states.view({H, dk, dv})}, {"dq", b.dq}, {"dk", b.dk},
                         {"dv", b.dv}, {"dg", b.dg}, {"dbeta", b.dbeta}, {"dh0", b.dh0.view({H, dk, dv})}}) {
    const Tensor got = read(out, name);
    ASSERT_TRUE(got.defined()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_TRUE(testing::all_close(got, t, 0.0)) << name;
  }

  // Forward only, without h0: o and ht alone, from a zero state.
  std::filesystem::remove(in.file("h0.npy"));
  const testing::ScratchDir out2;
  const CliRun fwd = testing::run_cli("kda --inputs " + in.str() + " --out " + out2.str());
  ASSERT_EQ(fwd.exit_code, 0) << fwd.all();
  std::fill(states.f32(), states.f32() + states.numel(), 0.0f);
  be->kda_chunked({f.q, f.k, f.v, f.g, f.beta, states, o, KdaQkNorm::kGiven}, layout);
  EXPECT_TRUE(testing::all_close(read(out2, "o"), o, 0.0)) << "o";
  EXPECT_TRUE(testing::all_close(read(out2, "ht"), states.view({H, dk, dv}), 0.0)) << "ht";
  EXPECT_FALSE(std::filesystem::exists(out2.file("dq.npy")));
}

// Context parallelism on 2 and 4 CPU ranks (mpirun), every strategy, forward and backward: every
// output file equals the one-rank command's, o and ht within 1e-5, the gradients' rows within
// testing::kGradients (the segments move the chunk boundaries) for lengths a rank count does not divide
// (1: ranks without rows), with and without h0 and dht; what cannot run is refused naming it.
TEST(KdaCli, ContextParallelEqualsOneRank) {
  const std::string mpirun = KLINEAR_MPIRUN;
  if (mpirun.empty()) GTEST_SKIP() << "no mpirun (openmpi-bin) in this build";
  const std::string launch = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                             "OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 " + mpirun +
                             " --oversubscribe -np ";
  const int64_t H = 4, dk = 8, dv = 4;
  const char* const modes[] = {"p2p", "allgather", "grouped --allgather-group-size 2", "ulysses",
                               "hybrid --ulysses-degree 2"};
  for (int64_t T : {1, 65, 200}) {
    const KdaFiles f = random_files(T, H, dk, dv);
    const testing::ScratchDir in, one;
    for (auto [name, t] : {std::pair{"q", &f.q}, {"k", &f.k}, {"v", &f.v}, {"g", &f.g}, {"beta", &f.beta},
                           {"do", &f.d_out}})
      write(in, name, *t);
    if (T != 65) {
      write(in, "h0", f.h0);
      write(in, "dht", f.d_ht);
    }
    const CliRun single = testing::run_cli("kda --backward --inputs " + in.str() + " --out " + one.str());
    ASSERT_EQ(single.exit_code, 0) << single.all();
    for (int ranks : {2, 4})
      for (const char* mode : modes) {
        if (T == 1 && ranks == 2) continue;  // 4 ranks show ranks without rows
        SCOPED_TRACE("T " + std::to_string(T) + ", " + std::to_string(ranks) + " ranks, " + mode);
        const testing::ScratchDir out;
        const CliRun r = testing::run_cli_prefixed(launch + std::to_string(ranks) + " ",
                                                   "kda --backward --inputs " + in.str() + " --out " + out.str() +
                                                       " --context-parallel-size " + std::to_string(ranks) +
                                                       " --cp-mode " + mode);
        ASSERT_EQ(r.exit_code, 0) << r.all();
        for (const char* name : {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"})
          EXPECT_TRUE(testing::all_close(read(out, name), read(one, name),
                                         name[0] == 'd' ? testing::kGradients.rel(DType::kF32) : 1e-5))
              << name;
      }
  }
  const testing::ScratchDir in, out;
  const KdaFiles f = random_files(9, 2, dk, dv);  // 2 heads: Ulysses over 4 ranks cannot split them
  for (auto [name, t] : {std::pair{"q", &f.q}, {"k", &f.k}, {"v", &f.v}, {"g", &f.g}, {"beta", &f.beta}, {"do", &f.d_out}})
    write(in, name, *t);
  const std::string base = "kda --inputs " + in.str() + " --out " + out.str();
  struct Refusal {
    std::string prefix, flags, says;
  };
  const Refusal refusals[] = {
      {launch + "4 ", " --context-parallel-size 4 --cp-mode ulysses", "ulysses degree 4 does not divide the 2 heads"},
      {launch + "2 ", " --context-parallel-size 2 --cp-mode hybrid", "--cp-mode hybrid needs --ulysses-degree"},
      {launch + "2 ", " --context-parallel-size 2 --cp-mode grouped --allgather-group-size 3",
       "--allgather-group-size 3: must divide the 2 ranks"},
      {"", " --ulysses-degree 2", "--allgather-group-size and --ulysses-degree need --context-parallel-size > 1"},
      {launch + "2 ", " --context-parallel-size 4", "--context-parallel-size 4, but 2 rank(s) run"},
      {"", " --context-parallel-size 2", "--context-parallel-size 2, but 1 rank(s) run"},
      {"", " --cp-mode ring", "--cp-mode ring: expected one of p2p, allgather, grouped, ulysses, hybrid"},
  };
  for (const Refusal& x : refusals) {
    const CliRun r = testing::run_cli_prefixed(x.prefix, base + x.flags);
    EXPECT_NE(r.exit_code, 0) << x.flags << "\n" << r.all();
    EXPECT_NE(r.err.find(x.says), std::string::npos) << x.flags << "\n" << r.err;
  }
}

TEST(KdaCli, BadInputIsAClearError) {
  const int64_t T = 5, H = 2, dk = 4, dv = 3;
  const KdaFiles f = random_files(T, H, dk, dv);
  const testing::ScratchDir in, out;
  for (auto [name, t] : {std::pair{"q", &f.q}, {"k", &f.k}, {"v", &f.v}, {"g", &f.g}, {"beta", &f.beta}})
    write(in, name, *t);
  auto run = [&](const std::string& extra) {
    return testing::run_cli("kda --inputs " + in.str() + " --out " + out.str() + extra);
  };
  // --backward without do.npy: the file, and the shape it should have.
  CliRun r = run(" --backward");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("do.npy: missing (expected float32 [5, 2, 3])"), std::string::npos) << r.err;
  // A beta of the wrong shape: the file, the expected and the actual shape.
  write(in, "beta", Tensor::zeros(DType::kF32, {T, H + 1}));
  r = run("");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("beta.npy: expected shape [5, 2], got [5, 3]"), std::string::npos) << r.err;
  write(in, "beta", f.beta);
  write(in, "h0", Tensor::zeros(DType::kF32, {H, dv, dk}));
  r = run("");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("h0.npy: expected shape [2, 4, 3], got [2, 3, 4]"), std::string::npos) << r.err;
  std::filesystem::remove(in.file("h0.npy"));
  std::filesystem::remove(in.file("k.npy"));
  r = run("");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("k.npy: missing"), std::string::npos) << r.err;
  write(in, "k", f.k);
  // CUDA: not yet, said before anything runs.
  r = run(" --device cuda --backward");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("not implemented on CUDA yet (issue 37)"), std::string::npos) << r.err;
  // And the inputs as they are now run.
  r = run("");
  EXPECT_EQ(r.exit_code, 0) << r.all();
}

}  // namespace
}  // namespace klinear
