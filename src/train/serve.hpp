// Continuous batching over Generators (generate.hpp): requests arrive at decode steps; when a
// request's step comes it is prefilled and joins the next decode step beside the requests already
// running, and it leaves the step after it has its tokens. Every step is one Generator::decode of
// the requests running (one collective per layer for all of them), and every request has its own
// cache, so a request that joins mid-way changes nothing of the others: each request's tokens are
// those of generating it alone.
//
// A long prompt's prefill stalls every running request until it is done (here thousands of
// their steps). With a prefill chunk, as vLLM's and Sarathi-Serve's chunked prefill, a prompt
// is prefilled a piece at a time between the decode steps, so a running request waits for one
// piece between two of its tokens, and the joining request gets its first token later.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "train/generate.hpp"
#include "ulysses/comm/communicator.hpp"

namespace ulysses::train {

struct ServedRequest {
  std::vector<int> prompt;        // the same on every rank
  std::int64_t new_tokens = 1;    // tokens to generate, the prefill's first one included
  std::int64_t arrival_step = 0;  // arrives once this many decode steps have run (0: at the start)
};

// One decode step of the requests running.
struct ServedStep {
  std::int64_t step = 0;                     // its number: the steps run before it plus one, idle ones counted
  std::vector<std::size_t> running, joined;  // the requests it decoded; those whose first step it was
  double prefill_s = 0;                      // the prefill work since the previous step (before it)
  std::int64_t prefill_tokens = 0;           // the prompt tokens it prefilled
  double seconds = 0, comm_s = 0;            // the step itself, and its time in collectives
  // Its CPU seconds in this process: a clock the host's other load does not stretch.
  double cpu_s = 0;
  std::int64_t collectives = 0;
};

struct ServedRun {
  std::vector<std::vector<int>> tokens;           // each request's, in request order
  std::vector<double> arrival_s;                  // each request's arrival, seconds after the start
  std::vector<double> ttft_s;                     // its first token, seconds after its arrival (its wait included)
  std::vector<std::int64_t> prefill_collectives;  // over all its pieces
  std::vector<std::int64_t> prefill_pieces;       // how many pieces its prompt was prefilled in
  std::vector<ServedStep> steps;
  // This rank's most bytes held in KV caches at once (KvCache::bytes of the caches held, summed:
  // a request holds its cache from its first prefill piece to its last token), and whose they were.
  std::int64_t peak_kv_bytes = 0;
  std::vector<std::size_t> peak_kv_requests;
};

// The latest arrival step: the clock, which counts on past it, stays far from overflowing.
inline constexpr std::int64_t kMaxArrivalStep = std::int64_t(1) << 62;

// Not collective. "" when `requests` can be served, else the one problem: no request, or a
// request without a prompt, a new token or a valid arrival step, named by its index.
std::string serve_error(const std::vector<ServedRequest>& requests);

// Not collective. "" when prompts can be prefilled `chunk` tokens at a time at cp ranks (0: each
// whole), else why not: a piece needs a token a rank.
std::string prefill_chunk_error(std::int64_t chunk, int cp);

// Not collective. The requests whose caches serve holds at once, on every rank: a request's cache
// is allocated at its first prefill piece and returned after its last token, so after each
// allocation, the requests holding one then (in request order), one set an allocation. The
// schedule is serve's own, walked without the work (arrivals, prompt lengths and new tokens fix
// it). Throws Error for serve_error's and prefill_chunk_error's problems.
std::vector<std::vector<std::size_t>> held_together(const std::vector<ServedRequest>& requests,
                                                    std::int64_t prefill_chunk, int cp);

// Collective. gens[i] (one model, parameters and layout; its own cache) serves requests[i]. The
// clock is the decode step: after step s (s = 0: at the start), the requests arriving at s are
// prefilled in request order (each one's time to first token counts from s's end, so it includes
// the prefills before it), then step s + 1 decodes every request still short of its tokens. While
// nothing is running the clock moves to the next arrival at once: a step with nothing to decode
// is not run. With prefill_chunk C > 0 the arrived requests queue in arrival order and each step
// is preceded by one piece of the first one's prompt: C tokens (the first by prefill, the next by
// extend), the rest of it when fewer than C + cp are left, so no piece is shorter than cp; a
// request joins the step after its last piece; while nothing is running, pieces run back to back.
// Each request's cache is allocated at its first piece and returned (Generator::release) after
// its last token. Puts its phases on the communicator's timeline (arrivals, prefills, steps).
// Throws Error (the same on every rank) for serve_error's and prefill_chunk_error's problems or
// gens.size() != requests.size().
ServedRun serve(Communicator& comm, const std::vector<Generator*>& gens, const std::vector<ServedRequest>& requests,
                std::int64_t prefill_chunk = 0);

}  // namespace ulysses::train
