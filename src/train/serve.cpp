#include "train/serve.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <utility>
#include <numeric>

#include "ulysses/core/cpu_clock.hpp"
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

std::string prefill_chunk_error(std::int64_t chunk, int cp) {
  if (chunk < 0) return fmt::format("a prefill chunk of {} tokens is negative (0: each prompt whole)", chunk);
  if (chunk > 0 && chunk < cp)
    return fmt::format("a prefill chunk of {} tokens is shorter than the {} ranks: a piece needs a token a rank", chunk,
                       cp);
  return "";
}

namespace {

// A request that has arrived and is not yet prefilled: how many of its prompt's tokens are.
struct Pending {
  std::size_t request = 0;
  std::int64_t done = 0;
};

// The run in progress: who has arrived (order[0, next) by arrival step, then request index).
struct Server {
  Communicator& comm;
  const std::vector<Generator*>& gens;
  const std::vector<ServedRequest>& requests;
  std::int64_t chunk = 0;  // 0: each prompt whole
  std::vector<std::size_t> order;
  std::size_t next = 0;
  std::deque<Pending> queue;  // arrived, prefilling, in arrival order
  double t0 = 0;
  ServedRun run;

  // The requests arriving by decode step `step` join the prefill queue.
  std::vector<std::size_t> arrive(std::int64_t step) {
    std::vector<std::size_t> arrived;
    const double now = comm.now() - t0;
    for (; next < order.size() && requests[order[next]].arrival_step <= step; ++next) {
      run.arrival_s[order[next]] = now;
      queue.push_back({order[next]});
      arrived.push_back(order[next]);
    }
    return arrived;
  }

  // The next piece of the first request in the queue: the whole prompt, or `chunk` tokens (all
  // that is left when fewer than chunk + cp are, so that no piece is shorter than cp). Its last
  // piece gives the request's first token; returns the tokens prefilled.
  std::int64_t piece() {
    Pending& p = queue.front();
    const std::size_t i = p.request;
    const std::vector<int>& prompt = requests[i].prompt;
    const std::int64_t left = std::int64_t(prompt.size()) - p.done;
    const std::int64_t take = chunk == 0 || left < chunk + comm.size() ? left : chunk;
    const std::vector<int> tokens(prompt.begin() + p.done, prompt.begin() + p.done + take);
    const double p0 = comm.now();
    const std::vector<float> logits = p.done == 0 ? gens[i]->prefill(tokens) : gens[i]->extend(tokens);
    run.prefill_collectives[i] += gens[i]->stats().collectives;
    ++run.prefill_pieces[i];
    comm.trace(chunk == 0 ? fmt::format("prefill request {}", i)
                          : fmt::format("prefill request {}, tokens {}-{}", i, p.done, p.done + take - 1),
               p0, comm.now(), "phase");
    if ((p.done += take) == std::int64_t(prompt.size())) {
      run.tokens[i] = {gens[i]->next_token(logits)};
      run.ttft_s[i] = comm.now() - t0 - run.arrival_s[i];
      queue.pop_front();
    }
    return take;
  }

  // The prefill work before the next decode step, after the arrivals of step `step`: every
  // queued prompt whole, or one piece (while nothing runs, pieces until a request can run).
  // Returns its seconds and tokens (the running requests wait for it).
  std::pair<double, std::int64_t> prefill(std::int64_t step) {
    const double a0 = comm.now();
    const std::vector<std::size_t> arrived = arrive(step);
    std::int64_t tokens = 0;
    if (chunk == 0)
      while (!queue.empty()) tokens += piece();
    else if (!queue.empty())
      do tokens += piece();
      while (!queue.empty() && running().empty());
    if (!arrived.empty())
      comm.trace(fmt::format("arrivals after step {}: request {}", step, fmt::join(arrived, ", ")), a0, comm.now(),
                 "phase");
    return {comm.now() - a0, tokens};
  }

  // The requests that have arrived and are short of their tokens, in request order.
  std::vector<std::size_t> running() const {
    std::vector<std::size_t> out;
    for (std::size_t k = 0; k < next; ++k)
      if (const std::size_t n = run.tokens[order[k]].size(); n > 0 && std::int64_t(n) < requests[order[k]].new_tokens)
        out.push_back(order[k]);  // n = 0: still prefilling
    std::sort(out.begin(), out.end());
    return out;
  }

  // Decode step `step` of `ids`: one Generator::decode for all of them.
  ServedStep decode(std::int64_t step, const std::vector<std::size_t>& ids, std::pair<double, std::int64_t> prefill) {
    ServedStep s{step, ids, {}, prefill.first, prefill.second};
    std::vector<Generator*> batch;
    std::vector<int> last;
    for (const std::size_t i : ids) {
      batch.push_back(gens[i]);
      last.push_back(run.tokens[i].back());
      if (run.tokens[i].size() == 1) s.joined.push_back(i);  // only its prefill's token so far
    }
    const double s0 = comm.now(), c0 = process_cpu_seconds();
    const std::vector<std::vector<float>> logits = Generator::decode(batch, last);
    for (std::size_t j = 0; j < ids.size(); ++j) run.tokens[ids[j]].push_back(batch[j]->next_token(logits[j]));
    s.seconds = comm.now() - s0;
    s.cpu_s = process_cpu_seconds() - c0;
    s.collectives = batch[0]->stats().collectives;
    s.comm_s = batch[0]->stats().comm_s;
    comm.trace(fmt::format("decode step {} ({} requests{})", step, ids.size(),
                           s.joined.empty() ? "" : fmt::format("; request {} joined", fmt::join(s.joined, ", "))),
               s0, comm.now(), "phase");
    return s;
  }
};

}  // namespace

ServedRun serve(Communicator& comm, const std::vector<Generator*>& gens, const std::vector<ServedRequest>& requests,
                std::int64_t prefill_chunk) {
  for (const std::string& e : {serve_error(requests), prefill_chunk_error(prefill_chunk, comm.size())})
    if (!e.empty()) throw Error(e);
  if (gens.size() != requests.size())
    throw Error(fmt::format("{} generators for {} requests", gens.size(), requests.size()));
  const std::size_t n = requests.size();
  Server s{comm, gens, requests, prefill_chunk, std::vector<std::size_t>(n), 0, {}, 0, {}};
  std::iota(s.order.begin(), s.order.end(), std::size_t(0));
  std::stable_sort(s.order.begin(), s.order.end(),
                   [&](std::size_t a, std::size_t b) { return requests[a].arrival_step < requests[b].arrival_step; });
  s.run.tokens.resize(n);
  s.run.arrival_s.assign(n, 0);
  s.run.ttft_s.assign(n, 0);
  s.run.prefill_collectives.assign(n, 0);
  s.run.prefill_pieces.assign(n, 0);
  comm.barrier();
  s.t0 = comm.now();
  std::int64_t step = 0;
  std::pair<double, std::int64_t> prefill{0, 0};  // since the last step
  for (;;) {
    const auto [seconds, tokens] = s.prefill(step);
    prefill = {prefill.first + seconds, prefill.second + tokens};
    const std::vector<std::size_t> ids = s.running();
    if (ids.empty() && s.queue.empty() && s.next == n) return std::move(s.run);
    if (ids.empty()) {  // nothing to decode: the clock moves to the next arrival
      if (s.queue.empty()) step = requests[s.order[s.next]].arrival_step;
      continue;
    }
    s.run.steps.push_back(s.decode(++step, ids, prefill));
    prefill = {0, 0};
  }
}

}  // namespace ulysses::train
