// The watchdog's deadline loop and message; the backends call it around every blocking wait.
#include "ulysses/comm/watchdog.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {

namespace {
using Clock = std::chrono::steady_clock;
// Polls spin this long (a transfer about to finish costs no extra latency), then yield the
// core until kYieldFor, then sleep kNap between polls: after 5 ms a 50 µs nap is noise, and a
// rank waiting for a slow peer stops taking a core from ranks that compute.
constexpr auto kSpinFor = std::chrono::microseconds(50);
constexpr auto kYieldFor = std::chrono::milliseconds(5);
constexpr auto kNap = std::chrono::microseconds(50);
}  // namespace

Watchdog::Watchdog(double timeout_s) : timeout_s_(0) { set_timeout(timeout_s); }

void Watchdog::set_timeout(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    throw Error(fmt::format("timeout must be a finite number of seconds >= 0 (0 = none), got {}", seconds));
  timeout_s_ = seconds;
}

bool Watchdog::wait(const std::function<bool()>& done) const {
  if (done()) return true;
  const Clock::time_point start = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout_s_);
  for (;;) {
    if (done()) return true;
    const auto waited = Clock::now() - start;
    if (timeout_s_ > 0 && waited > limit) return false;
    if (waited > kYieldFor)
      std::this_thread::sleep_for(kNap);
    else if (waited > kSpinFor)
      sched_yield();
  }
}

std::string Watchdog::steps() const {
  std::string s;
  for (const std::string& step : steps_) {
    if (!s.empty()) s += " / ";
    s += step;
  }
  return s;
}

std::string Watchdog::message(const std::string& rank, const std::string& what) const {
  const std::string step = steps();
  return fmt::format("ulysses watchdog: {} waited {:g} s (the timeout) for {}{}; ending the job", rank, timeout_s_,
                     what, step.empty() ? "" : fmt::format(", during {}", step));
}

WatchdogStep::WatchdogStep(Communicator& comm, std::string label) : dog_(comm.watchdog()) {
  dog_.steps_.push_back(std::move(label));
}

WatchdogStep::~WatchdogStep() { dog_.steps_.pop_back(); }

}  // namespace ulysses
