// The harness of klinear_dist_tests: one process per rank, every test run by every rank.
//
// Run directly for a world of one (SelfComm), or under a launcher for Open MPI's:
//   mpirun -np 4 --oversubscribe build/klinear_dist_tests     (CTest: Dist.Self, Dist.Mpi2, Dist.Mpi4)
// Every rank runs every test in the same order and makes the same collective calls whatever it
// found (EXPECT, never an early return, so a failure cannot leave the other ranks waiting). Only
// rank 0 prints gtest's report; the others print their failures prefixed with their rank, each
// test's TearDown fails it on rank 0 when any rank failed it, and the exit status is every rank's
// (tests/dist/main.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "dist/comm.h"

namespace klinear::testing {

// The launch's host world, opened by main() before any test runs.
Comm& host_world();

class RanksTest : public ::testing::Test {
 protected:
  // Draws a fresh seed on rank 0 (printed) and shares it with every rank.
  void SetUp() override;
  // Fails the test on rank 0 when any rank failed it.
  void TearDown() override;

  static Comm& world() { return host_world(); }
  static int rank() { return world().rank(); }
  static int size() { return world().size(); }
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_ = 0;
};

}  // namespace klinear::testing
