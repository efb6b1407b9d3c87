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

// What the schedule runs: each request's Generator over the communicator, or nothing (the memory
// model's walk of the same schedule, for the caches held at once). The schedule itself (who is
// prefilled and decoded when) is Server's alone, the same for both.
class Work {
 public:
  virtual ~Work() = default;
  virtual int cp() const = 0;
  virtual double now() const { return 0; }
  virtual void trace(const std::string& /*name*/, double /*t0*/) {}
  // Prefills tokens [from, from + take) of request i's prompt (from = 0: into an empty cache,
  // which it allocates) and adds its collectives to `collectives`; after the last piece returns
  // the first token (the sampler advances only then).
  virtual int piece(std::size_t i, std::int64_t from, std::int64_t take, bool last, std::int64_t& collectives) = 0;
  // One decode step of `ids` after their `last` tokens: their next tokens, s's CPU time and collectives.
  virtual std::vector<int> step(const std::vector<std::size_t>& ids, const std::vector<int>& last, ServedStep& s) = 0;
  // Just after a request's cache was allocated: the requests whose caches are held now, it included.
  virtual void allocated(const std::vector<std::size_t>& held) = 0;
  // Request i has its tokens: its cache goes.
  virtual void finished(std::size_t i) = 0;
};

class GeneratorWork final : public Work {
 public:
  GeneratorWork(Communicator& comm, const std::vector<Generator*>& gens, const std::vector<ServedRequest>& requests)
      : comm_(comm), gens_(gens), requests_(requests) {}
  int cp() const override { return comm_.size(); }
  double now() const override { return comm_.now(); }
  void trace(const std::string& name, double t0) override { comm_.trace(name, t0, comm_.now(), "phase"); }
  int piece(std::size_t i, std::int64_t from, std::int64_t take, bool last, std::int64_t& collectives) override {
    const std::vector<int>& prompt = requests_[i].prompt;
    const std::vector<int> tokens(prompt.begin() + from, prompt.begin() + from + take);
    const std::vector<float> logits = from == 0 ? gens_[i]->prefill(tokens) : gens_[i]->extend(tokens);
    collectives += gens_[i]->stats().collectives;
    return last ? gens_[i]->next_token(logits) : -1;
  }
  std::vector<int> step(const std::vector<std::size_t>& ids, const std::vector<int>& last, ServedStep& s) override {
    std::vector<Generator*> batch;
    for (const std::size_t i : ids) batch.push_back(gens_[i]);
    const double c0 = process_cpu_seconds();
    const std::vector<std::vector<float>> logits = Generator::decode(batch, last);
    std::vector<int> next;
    for (std::size_t j = 0; j < ids.size(); ++j) next.push_back(batch[j]->next_token(logits[j]));
    s.cpu_s = process_cpu_seconds() - c0;
    s.collectives = batch[0]->stats().collectives;
    s.comm_s = batch[0]->stats().comm_s;
    return next;
  }
  void allocated(const std::vector<std::size_t>& held) override {
    std::int64_t bytes = 0;
    for (const std::size_t i : held) bytes += gens_[i]->cache().bytes();
    if (bytes > peak_bytes || peak_requests.empty()) {
      peak_bytes = bytes;
      peak_requests = held;
      std::sort(peak_requests.begin(), peak_requests.end());
    }
  }
  void finished(std::size_t i) override { gens_[i]->release(); }
  // This rank's most bytes held in caches at once (KvCache::bytes), and whose caches they were.
  std::int64_t peak_bytes = 0;
  std::vector<std::size_t> peak_requests;

 private:
  Communicator& comm_;
  const std::vector<Generator*>& gens_;
  const std::vector<ServedRequest>& requests_;
};

// The schedule without the work: each moment a cache is allocated, the caches held then.
class HeldWalk final : public Work {
 public:
  explicit HeldWalk(int cp) : cp_(cp) {}
  int cp() const override { return cp_; }
  int piece(std::size_t, std::int64_t, std::int64_t, bool, std::int64_t&) override { return 0; }
  std::vector<int> step(const std::vector<std::size_t>& ids, const std::vector<int>&, ServedStep&) override {
    return std::vector<int>(ids.size(), 0);
  }
  void allocated(const std::vector<std::size_t>& held) override {
    sets.push_back(held);
    std::sort(sets.back().begin(), sets.back().end());
  }
  void finished(std::size_t) override {}
  std::vector<std::vector<std::size_t>> sets;

 private:
  int cp_;
};

// The run in progress: who has arrived (order[0, next) by arrival step, then request index).
struct Server {
  Work& work;
  const std::vector<ServedRequest>& requests;
  std::int64_t chunk = 0;  // 0: each prompt whole
  std::vector<std::size_t> order;
  std::size_t next = 0;
  std::deque<Pending> queue;      // arrived, prefilling, in arrival order
  std::vector<std::size_t> held;  // the requests holding a cache: from their first piece to their last token
  double t0 = 0;
  ServedRun run;

  // The requests arriving by decode step `step` join the prefill queue.
  std::vector<std::size_t> arrive(std::int64_t step) {
    std::vector<std::size_t> arrived;
    const double now = work.now() - t0;
    for (; next < order.size() && requests[order[next]].arrival_step <= step; ++next) {
      run.arrival_s[order[next]] = now;
      queue.push_back({order[next]});
      arrived.push_back(order[next]);
    }
    return arrived;
  }

  // Request i has its tokens: its cache is returned at once, on every rank.
  void finish(std::size_t i) {
    held.erase(std::find(held.begin(), held.end(), i));
    work.finished(i);
  }

  // The next piece of the first request in the queue: the whole prompt, or `chunk` tokens (all
  // that is left when fewer than chunk + cp are, so that no piece is shorter than cp). Its first
  // piece allocates its cache; its last gives the request's first token. Returns the tokens
  // prefilled.
  std::int64_t piece() {
    Pending& p = queue.front();
    const std::size_t i = p.request;
    const std::int64_t size = std::int64_t(requests[i].prompt.size()), left = size - p.done;
    const std::int64_t take = chunk == 0 || left < chunk + work.cp() ? left : chunk;
    const double p0 = work.now();
    const int token = work.piece(i, p.done, take, p.done + take == size, run.prefill_collectives[i]);
    if (p.done == 0) {
      held.push_back(i);
      work.allocated(held);
    }
    ++run.prefill_pieces[i];
    work.trace(chunk == 0 ? fmt::format("prefill request {}", i)
                          : fmt::format("prefill request {}, tokens {}-{}", i, p.done, p.done + take - 1),
               p0);
    if ((p.done += take) == size) {
      run.tokens[i] = {token};
      run.ttft_s[i] = work.now() - t0 - run.arrival_s[i];
      queue.pop_front();
      if (requests[i].new_tokens == 1) finish(i);
    }
    return take;
  }

  // The prefill work before the next decode step, after the arrivals of step `step`: every
  // queued prompt whole, or one piece (while nothing runs, pieces until a request can run).
  // Returns its seconds and tokens (the running requests wait for it).
  std::pair<double, std::int64_t> prefill(std::int64_t step) {
    const double a0 = work.now();
    const std::vector<std::size_t> arrived = arrive(step);
    std::int64_t tokens = 0;
    if (chunk == 0)
      while (!queue.empty()) tokens += piece();
    else if (!queue.empty())
      do tokens += piece();
      while (!queue.empty() && running().empty());
    if (!arrived.empty())
      work.trace(fmt::format("arrivals after step {}: request {}", step, fmt::join(arrived, ", ")), a0);
    return {work.now() - a0, tokens};
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

  // Decode step `step` of `ids`: one Generator::decode for all of them; a request that has its
  // tokens after it returns its cache.
  ServedStep decode(std::int64_t step, const std::vector<std::size_t>& ids, std::pair<double, std::int64_t> prefill) {
    ServedStep s{step, ids, {}, prefill.first, prefill.second};
    std::vector<int> last;
    for (const std::size_t i : ids) {
      last.push_back(run.tokens[i].back());
      if (run.tokens[i].size() == 1) s.joined.push_back(i);  // only its prefill's token so far
    }
    const double s0 = work.now();
    const std::vector<int> next_tokens = work.step(ids, last, s);
    for (std::size_t j = 0; j < ids.size(); ++j) run.tokens[ids[j]].push_back(next_tokens[j]);
    s.seconds = work.now() - s0;
    work.trace(fmt::format("decode step {} ({} requests{})", step, ids.size(),
                           s.joined.empty() ? "" : fmt::format("; request {} joined", fmt::join(s.joined, ", "))),
               s0);
    for (const std::size_t i : ids)
      if (std::int64_t(run.tokens[i].size()) == requests[i].new_tokens) finish(i);
    return s;
  }

  // The schedule, from the start to the last request's last token.
  void serve_all() {
    std::int64_t step = 0;
    std::pair<double, std::int64_t> prefill_since{0, 0};  // since the last step
    for (;;) {
      const auto [seconds, tokens] = prefill(step);
      prefill_since = {prefill_since.first + seconds, prefill_since.second + tokens};
      const std::vector<std::size_t> ids = running();
      if (ids.empty() && queue.empty() && next == requests.size()) return;
      if (ids.empty()) {  // nothing to decode: the clock moves to the next arrival
        if (queue.empty()) step = requests[order[next]].arrival_step;
        continue;
      }
      run.steps.push_back(decode(++step, ids, prefill_since));
      prefill_since = {0, 0};
    }
  }
};

// A server of `requests` over `work`, checked as serve documents, before it starts.
Server make_server(Work& work, const std::vector<ServedRequest>& requests, std::int64_t chunk) {
  for (const std::string& e : {serve_error(requests), prefill_chunk_error(chunk, work.cp())})
    if (!e.empty()) throw Error(e);
  const std::size_t n = requests.size();
  Server s{work, requests, chunk, std::vector<std::size_t>(n), 0, {}, {}, 0, {}};
  std::iota(s.order.begin(), s.order.end(), std::size_t(0));
  std::stable_sort(s.order.begin(), s.order.end(),
                   [&](std::size_t a, std::size_t b) { return requests[a].arrival_step < requests[b].arrival_step; });
  s.run.tokens.resize(n);
  s.run.arrival_s.assign(n, 0);
  s.run.ttft_s.assign(n, 0);
  s.run.prefill_collectives.assign(n, 0);
  s.run.prefill_pieces.assign(n, 0);
  return s;
}

}  // namespace

std::vector<std::vector<std::size_t>> held_together(const std::vector<ServedRequest>& requests,
                                                    std::int64_t prefill_chunk, int cp) {
  HeldWalk walk(cp);
  Server s = make_server(walk, requests, prefill_chunk);
  s.serve_all();
  return std::move(walk.sets);
}

ServedRun serve(Communicator& comm, const std::vector<Generator*>& gens, const std::vector<ServedRequest>& requests,
                std::int64_t prefill_chunk) {
  GeneratorWork work(comm, gens, requests);
  Server s = make_server(work, requests, prefill_chunk);
  if (gens.size() != requests.size())
    throw Error(fmt::format("{} generators for {} requests", gens.size(), requests.size()));
  comm.barrier();
  s.t0 = comm.now();
  s.serve_all();
  s.run.peak_kv_bytes = work.peak_bytes;
  s.run.peak_kv_requests = std::move(work.peak_requests);
  return std::move(s.run);
}

}  // namespace ulysses::train
