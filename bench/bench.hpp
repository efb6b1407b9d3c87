// The benchmark's shared pieces. Every figure is measured in the same run as its ceiling or
// baseline; medians only; no assertions on time anywhere.
#pragma once

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ulysses/comm/communicator_factory.hpp"

namespace ulysses::bench {

struct Options {
  double timeout = 300;  // seconds any wait may take (Communicator::set_timeout)
  bool quick = false;
  int reps = 3;
  std::int64_t seq = 16384;  // end-to-end sections
  int cores = 1;             // threads one rank may use alone
  int threads_per_rank = 1;  // threads when every rank runs
  std::string plots;         // seed section: write its SVG plots and trace into this directory
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `reps` calls after one untimed warm-up.
template <class Fn>
double time_median(int reps, Fn&& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

// Seconds per call of fn, after one untimed call, calling it until min_seconds have passed.
template <class Fn>
double time_per_call(double min_seconds, Fn&& fn) {
  fn();
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_seconds);
  return elapsed / calls;
}

inline double slowest(Communicator& comm, double x) {
  comm.allreduce_max(&x, 1);
  return x;
}

// Sleep (not spin) until every rank arrives, so idle ranks leave their core to rank 0.
inline void idle_barrier(MPI_Comm comm) {
  MPI_Request r;
  MPI_Ibarrier(comm, &r);
  int done = 0;
  while (!done) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) {
      struct timespec ts {
        0, 1000000
      };
      nanosleep(&ts, nullptr);
    }
  }
}

// Sections. Each prints its table on rank 0 and returns its JSON (rank 0; null elsewhere).
nlohmann::json kernels_section(Communicator& world, const Options& o);     // rank 0 alone, all cores
nlohmann::json alltoall_section(Communicator& world, const Options& o);    // all ranks
nlohmann::json strategies_section(Communicator& world, const Options& o);  // all ranks (+ rank 0 alone)
nlohmann::json seed_section(Communicator& world, const Options& o);        // all ranks (+ rank 0 alone)
nlohmann::json gemm_section(Communicator& world, const Options& o);        // rank 0 alone, one thread
nlohmann::json decode_section(Communicator& world, const Options& o);      // rank 0 alone, one thread

}  // namespace ulysses::bench
