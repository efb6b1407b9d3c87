// Watchdog — a deadline on every blocking wait of a communicator (c10d's Work.wait(timeout),
// NCCL's watchdog). A rank that skipped a collective, died, or sits behind a dead link would
// otherwise leave its peers waiting for hours; with a watchdog the waiting rank names what it
// waited for and ends the whole job.
//
// A communicator owns one (shared with the communicators split from it, so a strategy's
// sub-groups obey the user's setting and name the user's step). The backend polls its
// pending operation through wait(); when that returns false the backend prints message() and
// aborts the job (MpiCommunicator: MPI_Abort, so every rank ends, not only this one).
//
// Not thread-safe: one thread drives a communicator, as with MPI_THREAD_FUNNELED.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace ulysses {

class Communicator;

class Watchdog {
 public:
  // Seconds a wait may take before the watchdog fires (0 = forever). The library's default is
  // c10d's (default_pg_timeout, 30 min): a program may keep one rank busy alone for minutes
  // (evaluation, I/O) while the others wait. The CLI, which knows its phases, uses 300 s.
  static constexpr double kDefaultTimeout = 1800;
  // The exit code a watchdog abort hands to the launcher: sysexits' EX_TEMPFAIL, as a rerun
  // (from the last checkpoint) may well succeed; not 124, which timeout(1) uses.
  static constexpr int kExitCode = 75;

  explicit Watchdog(double timeout_s = kDefaultTimeout);
  double timeout() const { return timeout_s_; }
  void set_timeout(double seconds);  // throws Error unless finite and >= 0

  // Polls done() until it returns true (then returns true) or the timeout passes (then false).
  // Spins for the first microseconds (a transfer that is nearly there costs no extra latency),
  // then yields the core, then sleeps briefly between polls: a rank waiting long for a slow
  // peer leaves its core to the ranks that compute.
  bool wait(const std::function<bool()>& done) const;

  // The watchdog's one line: who waited how long for what, during which step.
  // `rank` names the waiting rank ("rank 1 (world rank 3, host h2)"); `what` the operation and
  // its peer or group.
  std::string message(const std::string& rank, const std::string& what) const;

  // The steps in progress, outermost first, joined by " / " ("" when none).
  std::string steps() const;

 private:
  friend class WatchdogStep;
  double timeout_s_;
  std::vector<std::string> steps_;
};

// Names what this process is doing while it is in scope ("train step 12", "ring forward step 2
// of 4"), for the watchdog's message. Scopes nest. Not collective; cheap (one string).
class WatchdogStep {
 public:
  WatchdogStep(Communicator& comm, std::string label);
  ~WatchdogStep();
  WatchdogStep(const WatchdogStep&) = delete;
  WatchdogStep& operator=(const WatchdogStep&) = delete;

 private:
  Watchdog& dog_;
};

}  // namespace ulysses
