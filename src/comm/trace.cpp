// The per-rank timeline and its Chrome trace JSON.
#include "ulysses/comm/trace.hpp"

#include <fmt/format.h>

#include <cmath>

#include "ulysses/io/output_file.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {

Tracer::Tracer(Communicator& comm) : comm_(comm) {
  comm.barrier();
  origin_s_ = comm.now();
  comm.attach_tracer(this);
}

Tracer::~Tracer() { comm_.attach_tracer(nullptr); }

void Tracer::record(std::string name, std::string category, double begin_s, double end_s, std::int64_t bytes,
                    std::int64_t messages) {
  events_.push_back({std::move(name), std::move(category), begin_s - origin_s_, end_s - origin_s_, bytes, messages});
}

namespace {

// Names are ours (operation and step names), but escape them anyway: the output must parse.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\u{:04x}", int(c));
    else
      out += c;
  }
  return out + "\"";
}

std::int64_t nanoseconds(double s) { return std::llround(s * 1e9); }

std::string event_json(const TraceEvent& e, int rank) {
  const std::int64_t b = nanoseconds(e.begin_s), end = nanoseconds(e.end_s);
  std::string args;
  if (e.bytes >= 0) args += fmt::format("\"bytes\": {}", e.bytes);
  if (e.messages >= 0) args += fmt::format("{}\"messages\": {}", args.empty() ? "" : ", ", e.messages);
  return fmt::format(
      "{{\"name\": {}, \"cat\": {}, \"ph\": \"X\", \"pid\": {}, \"tid\": 0, \"ts\": {}.{:03}, "
      "\"dur\": {}.{:03}, \"args\": {{{}}}}}",
      json_string(e.name), json_string(e.category), rank, b / 1000, b % 1000, (end - b) / 1000, (end - b) % 1000, args);
}

}  // namespace

std::string chrome_trace_events(const std::vector<TraceEvent>& events, int rank) {
  std::string out = fmt::format(
      "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {0}, \"tid\": 0, "
      "\"args\": {{\"name\": \"rank {0}\"}}}}",
      rank);
  for (const TraceEvent& e : events) out += ",\n" + event_json(e, rank);
  return out;
}

std::string chrome_trace_json(Communicator& comm, const std::vector<TraceEvent>& events) {
  const std::string mine = chrome_trace_events(events, comm.rank());  // before the gather adds its own
  const std::vector<std::int64_t> lengths = comm.allgather_value(std::int64_t(mine.size()), "trace");
  constexpr int kTag = 0x7ace;
  if (comm.rank() != 0) {
    comm.isend({mine.data(), mine.size()}, 0, kTag, "trace").wait();
    return "";
  }
  std::string all = "{\"traceEvents\": [\n" + mine;
  for (int r = 1; r < comm.size(); ++r) {
    std::string theirs(std::size_t(lengths[std::size_t(r)]), '\0');
    comm.irecv({theirs.data(), theirs.size()}, r, kTag, "trace").wait();
    all += ",\n" + theirs;
  }
  return all + "\n],\n\"displayTimeUnit\": \"ms\"}\n";
}

void write_chrome_trace(Communicator& comm, const std::vector<TraceEvent>& events, const std::string& path) {
  const std::string json = chrome_trace_json(comm, events);
  std::string error;
  if (comm.rank() == 0) try {
      write_file_atomic(path, json);
    } catch (const std::exception& e) {
      error = fmt::format("--trace {}: {}", path, e.what());
    }
  comm.agree(error);
}

}  // namespace ulysses
