// The `ulysses` command line: subcommands over the library, run under mpirun or as ranks in threads.
// Started alone, the process starts MPI only for a command that makes an MPI communicator.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "agreement.hpp"
#include "commands.hpp"
#include "rank_errors.hpp"
#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/comm/local_communicator.hpp"
#include "ulysses/comm/mpi_communicator.hpp"
#include "ulysses/core/version.hpp"

namespace {

using namespace ulysses;

const cli::BackendOptions& chosen_backend(const CLI::App& app, const cli::Commands& c) {
  if (app.got_subcommand("attention")) return c.attention.backend;
  if (app.got_subcommand("train")) return c.train.backend;
  if (app.got_subcommand("generate")) return c.generate.backend;
  return c.plan.backend;
}

// Collective over the chosen backend's world (every rank thread of a local one).
int run_subcommand(const CLI::App& app, const cli::Commands& c) {
  if (app.got_subcommand("attention")) return cli::run_attention(c.attention);
  if (app.got_subcommand("train")) return cli::run_train(c.train);
  if (app.got_subcommand("generate")) return cli::run_generate(c.generate);
  return cli::run_plan(c.plan);
}

// A plan that measures nothing (no --calibrate) only agrees with the job's other processes.
// When the job is this process alone and MPI has not started (`world` is then "local"'s world
// of one), it plans on that world of one instead of starting MPI: the same plan, without Open
// MPI's singleton start (a daemon spawned, 0.3 s).
void plan_without_mpi_when_alone(const CLI::App& app, const Communicator& world, cli::Commands& c) {
  const bool alone = std::string_view(world.backend()) != "mpi";
  if (alone && app.got_subcommand("plan") && !c.plan.calibrate && c.plan.backend.comm == "mpi")
    c.plan.backend.comm = "local";
}

// Collective over the job's processes (make_job_communicator: MPI_COMM_WORLD under a launcher):
// the ranks agree on their command line, then run it, as processes or, with --comm local, as
// threads of this process. An Error every rank throws (agreed) comes out of run_local as the
// first failing rank's own. MPI starts, if it has not, when the command makes its communicator.
int run_agreed(CLI::App& app, cli::Commands& commands, const std::exception_ptr& parse_error) {
  const std::unique_ptr<Communicator> world = make_job_communicator();
  cli::agree_parse_outcome(*world, parse_error);
  if (parse_error) std::rethrow_exception(parse_error);  // every rank's, the same
  cli::agree_command_line(*world, *app.get_subcommands().front());
  const int threads = cli::local_ranks(chosen_backend(app, commands), world->size());
  if (threads == 0) {
    plan_without_mpi_when_alone(app, *world, commands);  // on this thread: its world of one
    return run_subcommand(app, commands);
  }
  int code = 0;
  run_local(threads, [&](Communicator& comm) {
    const int mine = run_subcommand(app, commands);
    if (comm.rank() == 0) code = mine;  // the commands agree on their exit code
  });
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const MpiSession mpi(argc, argv, MpiSession::Start::when_needed);
  const int rank = mpi.world_rank();
  CLI::App app{
      "ulysses: context-parallel attention (DeepSpeed-Ulysses and friends) over MPI.\n"
      "Run under mpirun, or with --comm local --ranks N as threads of one process; every rank holds "
      "s/cp tokens of every sequence."};
  app.set_version_flag("--version", std::string("ulysses ") + version());
  cli::Commands commands;
  cli::add_commands(app, commands);

  // ULYSSES_PRINT_OPTIONS=<subcommand>: its options, one a line (for the divergence test).
  if (const char* name = std::getenv("ULYSSES_PRINT_OPTIONS")) {
    try {
      if (rank == 0) cli::print_options(*app.get_subcommand(name));
      return 0;
    } catch (const CLI::OptionNotFound&) {
      if (rank == 0) std::fprintf(stderr, "ulysses: ULYSSES_PRINT_OPTIONS=%s: no such subcommand\n", name);
      return 2;
    }
  }

  int code = 0;
  std::exception_ptr parse_error;  // a rank's alone, maybe: agreed before anything else
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError&) {
    parse_error = std::current_exception();
  }
  try {
    code = run_agreed(app, commands, parse_error);
  } catch (const CLI::ParseError& e) {
    // Every rank's parse failed alike (agreed above), so every rank stops here; one prints.
    if (rank == 0)
      code = app.exit(e);
    else
      code = e.get_exit_code();
  } catch (const Error& e) {  // agreed: every rank throws it, rank 0 says it
    if (rank == 0) std::fprintf(stderr, "ulysses: error: %s\n", e.what());
    code = 2;
  } catch (const std::bad_alloc&) {  // this rank alone, maybe: end every rank, never hang
    cli::abort_job(rank, "out of memory");
  } catch (const std::exception& e) {
    cli::abort_job(rank, e.what());
  }
  return code;
}
