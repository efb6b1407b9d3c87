// The `ulysses` command line: subcommands over the library, run under mpirun.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "agreement.hpp"
#include "commands.hpp"
#include "rank_errors.hpp"
#include "ulysses/communicator_factory.hpp"
#include "ulysses/error.hpp"
#include "ulysses/mpi_communicator.hpp"
#include "ulysses/version.hpp"

int main(int argc, char** argv) {
  const ulysses::MpiSession mpi(argc, argv);
  const int rank = mpi.world_rank();
  CLI::App app{
      "ulysses: context-parallel attention (DeepSpeed-Ulysses and friends) over MPI.\n"
      "Run under mpirun; every rank holds s/cp tokens of every sequence."};
  app.set_version_flag("--version", std::string("ulysses ") + ulysses::version());
  ulysses::cli::Commands commands;
  ulysses::cli::add_commands(app, commands);

  // ULYSSES_PRINT_OPTIONS=<subcommand>: its options, one a line (for the divergence test).
  if (const char* name = std::getenv("ULYSSES_PRINT_OPTIONS")) {
    try {
      if (rank == 0) ulysses::cli::print_options(*app.get_subcommand(name));
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
    const std::unique_ptr<ulysses::Communicator> world_owned = ulysses::make_communicator();
    ulysses::Communicator& world = *world_owned;
    ulysses::cli::agree_parse_outcome(world, parse_error);
    if (parse_error) std::rethrow_exception(parse_error);  // every rank's, the same
    ulysses::cli::agree_command_line(world, *app.get_subcommands().front());
    if (app.got_subcommand("attention")) code = ulysses::cli::run_attention(commands.attention);
    if (app.got_subcommand("train")) code = ulysses::cli::run_train(commands.train);
    if (app.got_subcommand("plan")) code = ulysses::cli::run_plan(commands.plan);
  } catch (const CLI::ParseError& e) {
    // Every rank's parse failed alike (agreed above), so every rank stops here; one prints.
    if (rank == 0)
      code = app.exit(e);
    else
      code = e.get_exit_code();
  } catch (const ulysses::Error& e) {  // agreed: every rank throws it, rank 0 says it
    if (rank == 0) std::fprintf(stderr, "ulysses: error: %s\n", e.what());
    code = 2;
  } catch (const std::bad_alloc&) {  // this rank alone, maybe: end every rank, never hang
    ulysses::cli::abort_job(rank, "out of memory");
  } catch (const std::exception& e) {
    ulysses::cli::abort_job(rank, e.what());
  }
  return code;
}
