// ulysses_bench: the performance picture in one MPI job, every figure beside its ceiling.
//
//   mpirun -n 2 --bind-to none build/ulysses_bench [--quick] [--json FILE] [--only SECTION]
//
//   1. kernels     local flash forward/backward, f32 and bf16, on the active kernel level
//                  and on every level the CPU supports, vs this CPU's ceilings (OpenBLAS
//                  sgemm; AMX tile GEMMs where present), vs a naive attention that materialises
//                  the scores, and vs PyTorch SDPA when a Python with torch >= 2 is found
//   2. alltoall    seq_to_head of Q, K, V vs a raw MPI_Alltoall and a memcpy of the same bytes
//   3. strategies  attention fwd+bwd: 1 rank × all cores vs every strategy on all ranks, with
//                  compute, communication and exposed communication, bytes vs formula, and
//                  peak memory per rank vs each strategy's memory model
//   4. seed        the seed's ring-vs-Ulysses claims, each measured (docs/seed_claims.md):
//                  mpirun -n 8 --oversubscribe ... --only seed --plots DIR
//   5. gemm        the trainer's GEMMs (width 512) on OpenBLAS, BLIS and oneDNN, f32 and bf16,
//                  against the register-resident f32 FMA and bf16 dot peaks measured in the run
//   6. decode      the decode kernel over a float32 cache at 32k and 128k rows, MHA and GQA
//                  shapes, 1 thread, against the plain and the prefetching read probes
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/core/threads.hpp"

using namespace ulysses;

namespace {

// Collective. Rank 0 checks the outputs before any work (ulysses/io/output_file.hpp's rules; the
// plots' directory is created when missing); false, with the message printed, on every rank.
bool agree_outputs(Communicator& world, const std::string& json, const std::string& plots) {
  std::string error;
  if (world.rank() == 0) try {
      check_outputs(
          {{"--json", json, true}, {"--plots", plots.empty() ? "" : plots + "/claim2_bytes.svg", false, true}});
    } catch (const Error& e) {
      error = e.what();
    }
  try {
    world.agree(error);
  } catch (const Error& e) {
    if (world.rank() == 0) fmt::print(stderr, "ulysses_bench: {}\n", e.what());
    return false;
  }
  return true;
}

// Collective. Every section asked for, the report written to `json` (rank 0). Returns the exit
// code: 1 when the report cannot be written.
int run_sections(Communicator& world, Communicator& self, bench::Options& o, const std::string& only,
                 const std::string& json) {
  o.cores = default_threads(self);
  o.threads_per_rank = default_threads(world);
  nlohmann::json report{{"ranks", world.size()},
                        {"cores", o.cores},
                        {"threads_per_rank", o.threads_per_rank},
                        {"quick", o.quick}};
  if (world.rank() == 0)
    fmt::print("ulysses_bench: {} ranks, {} threads per rank, {} threads for one rank alone{}\n", world.size(),
               o.threads_per_rank, o.cores, o.quick ? " (--quick: smoke run, numbers not meaningful)" : "");
  if (only.empty() || only == "kernels") report["kernels"] = bench::kernels_section(world, o);
  if (only.empty() || only == "alltoall") report["alltoall"] = bench::alltoall_section(world, o);
  if (only.empty() || only == "strategies") report["strategies"] = bench::strategies_section(world, o);
  if (only.empty() || only == "seed") report["seed"] = bench::seed_section(world, o);
  if (only.empty() || only == "gemm") report["gemm"] = bench::gemm_section(world, o);
  if (only.empty() || only == "decode") report["decode"] = bench::decode_section(world, o);
  if (world.rank() != 0 || json.empty()) return 0;
  try {
    write_file_atomic(json, report.dump(2) + "\n");
  } catch (const Error& e) {
    fmt::print(stderr, "ulysses_bench: --json {}\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"ulysses benchmarks: kernels, all-to-all, strategies (run under mpirun, 2+ ranks)"};
  bench::Options o;
  std::string json, only;
  app.add_flag("--quick", o.quick, "small shapes, one repetition: seconds (CI smoke run; no timing claims)");
  app.add_option("--reps", o.reps, "timed repetitions per measurement (median)")->capture_default_str();
  app.add_option("--seq", o.seq, "sequence length of the end-to-end sections")->capture_default_str();
  app.add_option("--json", json, "write every section's results here (rank 0; - for standard output)");
  app.add_option("--timeout", o.timeout, "seconds any rank may wait for another before the job ends (0 = forever)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--only", only, "run one section: kernels | alltoall | strategies | seed | gemm | decode")
      ->check(CLI::IsMember({"kernels", "alltoall", "strategies", "seed", "gemm", "decode"}));
  app.add_option("--plots", o.plots, "seed section: write its SVG plots and Chrome trace into this directory (rank 0)");
  CLI11_PARSE(app, argc, argv);
  if (o.quick) {
    o.reps = 1;
    o.seq = std::min<std::int64_t>(o.seq, 2048);
  }
  int rc = 2;
  {
    const std::unique_ptr<Communicator> world_owned = make_communicator(),
                                        self_owned = make_self_communicator(*world_owned);
    Communicator& world = *world_owned;
    Communicator& self = *self_owned;
    world.set_timeout(o.timeout);
    if (agree_outputs(world, json, o.plots)) rc = run_sections(world, self, o, only, json);
  }
  MPI_Finalize();
  return rc;
}
