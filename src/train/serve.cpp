#include "train/serve.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "ulysses/core/error.hpp"

namespace ulysses::train {

std::string serve_error(const std::vector<ServedRequest>& requests) {
  if (requests.empty()) return "no request to serve";
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const ServedRequest& r = requests[i];
    const std::string which = fmt::format("request {} of {}", i, requests.size());
    if (r.prompt.empty()) return which + ": the prompt is empty";
    if (r.new_tokens <= 0) return fmt::format("{}: {} new tokens (at least 1)", which, r.new_tokens);
    if (r.arrival_step < 0)
      return fmt::format("{}: arrival step {} is negative (0 is the start, s after s decode steps)", which,
                         r.arrival_step);
    if (r.arrival_step > kMaxArrivalStep)  // the clock counts on past it: it must not overflow
      return fmt::format("{}: arrival step {} is past {}", which, r.arrival_step, kMaxArrivalStep);
  }
  return "";
}

namespace {

// The run in progress: who has arrived (order[0, next) by arrival step, then request index).
struct Server {
  Communicator& comm;
  const std::vector<Generator*>& gens;
  const std::vector<ServedRequest>& requests;
  std::vector<std::size_t> order;
  std::size_t next = 0;
  double t0 = 0;
  ServedRun run;

  // Prefills, one after another, the requests that have arrived by decode step `step`; returns
  // the seconds they took (the running requests wait for them).
  double admit(std::int64_t step) {
    const double a0 = comm.now();
    std::vector<std::size_t> arrived;
    for (; next < order.size() && requests[order[next]].arrival_step <= step; ++next) {
      const std::size_t i = order[next];
      const double p0 = comm.now();
      run.arrival_s[i] = a0 - t0;
      run.tokens[i] = {gens[i]->next_token(gens[i]->prefill(requests[i].prompt))};
      run.ttft_s[i] = comm.now() - a0;
      run.prefill_collectives[i] = gens[i]->stats().collectives;
      comm.trace(fmt::format("prefill request {}", i), p0, comm.now(), "phase");
      arrived.push_back(i);
    }
    if (arrived.empty()) return 0;
    comm.trace(fmt::format("arrivals after step {}: request {}", step, fmt::join(arrived, ", ")), a0, comm.now(),
               "phase");
    return comm.now() - a0;
  }

  // The requests that have arrived and are short of their tokens, in request order.
  std::vector<std::size_t> running() const {
    std::vector<std::size_t> out;
    for (std::size_t k = 0; k < next; ++k)
      if (std::int64_t(run.tokens[order[k]].size()) < requests[order[k]].new_tokens) out.push_back(order[k]);
    std::sort(out.begin(), out.end());
    return out;
  }

  // Decode step `step` of `ids`: one Generator::decode for all of them.
  ServedStep decode(std::int64_t step, const std::vector<std::size_t>& ids, double prefill_s) {
    ServedStep s{step, ids, {}, prefill_s};
    std::vector<Generator*> batch;
    std::vector<int> last;
    for (const std::size_t i : ids) {
      batch.push_back(gens[i]);
      last.push_back(run.tokens[i].back());
      if (run.tokens[i].size() == 1) s.joined.push_back(i);  // only its prefill's token so far
    }
    const double s0 = comm.now();
    const std::vector<std::vector<float>> logits = Generator::decode(batch, last);
    for (std::size_t j = 0; j < ids.size(); ++j) run.tokens[ids[j]].push_back(batch[j]->next_token(logits[j]));
    s.seconds = comm.now() - s0;
    s.collectives = batch[0]->stats().collectives;
    s.comm_s = batch[0]->stats().comm_s;
    comm.trace(fmt::format("decode step {} ({} requests{})", step, ids.size(),
                           s.joined.empty() ? "" : fmt::format("; request {} joined", fmt::join(s.joined, ", "))),
               s0, comm.now(), "phase");
    return s;
  }
};

}  // namespace

ServedRun serve(Communicator& comm, const std::vector<Generator*>& gens, const std::vector<ServedRequest>& requests) {
  const std::string e = serve_error(requests);
  if (!e.empty()) throw Error(e);
  if (gens.size() != requests.size())
    throw Error(fmt::format("{} generators for {} requests", gens.size(), requests.size()));
  const std::size_t n = requests.size();
  Server s{comm, gens, requests, std::vector<std::size_t>(n), 0, 0, {}};
  std::iota(s.order.begin(), s.order.end(), std::size_t(0));
  std::stable_sort(s.order.begin(), s.order.end(),
                   [&](std::size_t a, std::size_t b) { return requests[a].arrival_step < requests[b].arrival_step; });
  s.run.tokens.resize(n);
  s.run.arrival_s.assign(n, 0);
  s.run.ttft_s.assign(n, 0);
  s.run.prefill_collectives.assign(n, 0);
  comm.barrier();
  s.t0 = comm.now();
  std::int64_t step = 0;
  double prefill_s = 0;  // since the last step
  for (;;) {
    prefill_s += s.admit(step);
    const std::vector<std::size_t> ids = s.running();
    if (ids.empty() && s.next == n) return std::move(s.run);
    if (ids.empty()) {  // nothing to decode: the clock moves to the next arrival
      step = requests[s.order[s.next]].arrival_step;
      continue;
    }
    s.run.steps.push_back(s.decode(++step, ids, prefill_s));
    prefill_s = 0;
  }
}

}  // namespace ulysses::train
