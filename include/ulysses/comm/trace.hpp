// Tracer — a per-rank timeline of named intervals (communication, waits, compute), written as
// one Chrome trace (chrome://tracing, ui.perfetto.dev) with one track per rank.
//
// A Tracer attaches itself to a Communicator for its lifetime. While attached, every public
// communication method of that communicator (and of the sub-communicators a CpGroup splits
// off it, named "<group>.<op>") records its interval with the bytes and messages it counted;
// a Request::wait on a traced isend/irecv records how long it blocked ("wait <op>"); and
// strategies record their compute through Communicator::trace. Without a tracer nothing is
// recorded (one pointer test per operation). Not thread-safe: record from the thread that
// drives the communicator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"

namespace ulysses {

struct TraceEvent {
  std::string name;               // "seq_to_head", "fwd step 1/4", "wait p2p_kv"
  std::string category;           // "comm", "wait", "compute", "phase"
  double begin_s = 0, end_s = 0;  // seconds since the tracer's origin
  std::int64_t bytes = -1;        // comm: bytes this rank sent (-1: none recorded)
  std::int64_t messages = -1;     // comm: messages to other ranks (-1: none recorded)
};

class Tracer {
 public:
  // Collective over comm: a barrier, then this rank's clock becomes time zero (so the tracks
  // line up whatever the offsets between the ranks' clocks), and attaches to comm.
  explicit Tracer(Communicator& comm);
  ~Tracer();  // detaches
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // An interval [begin_s, end_s] on the communicator's clock (Communicator::now()).
  void record(std::string name, std::string category, double begin_s, double end_s, std::int64_t bytes = -1,
              std::int64_t messages = -1);
  const std::vector<TraceEvent>& events() const { return events_; }

 private:
  Communicator& comm_;
  double origin_s_ = 0;
  std::vector<TraceEvent> events_;
};

// This rank's events as Chrome trace events: complete ("X") events on track pid = rank,
// microseconds, integral nanoseconds (so intervals that nest in time nest exactly), args
// {bytes, messages} where recorded; a process_name "rank r" metadata event first.
std::string chrome_trace_events(const std::vector<TraceEvent>& events, int rank);

// Collective: every rank's events (a Tracer's, taken before or after it detached) as one
// Chrome trace JSON document {"traceEvents": [...], "displayTimeUnit": "ms"} on rank 0, "" on
// the others. The gathering counts under "trace" on comm.
std::string chrome_trace_json(Communicator& comm, const std::vector<TraceEvent>& events);

// Collective. Writes chrome_trace_json to `path` on rank 0 (atomically); throws Error on
// every rank when rank 0 cannot write it.
void write_chrome_trace(Communicator& comm, const std::vector<TraceEvent>& events, const std::string& path);

}  // namespace ulysses
