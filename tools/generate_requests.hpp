// `ulysses generate --requests SPEC`: concurrent requests decoding together over one sharded
// KV cache each, every step one collective per layer for all of them (train/generate.hpp).
#pragma once

#include "generate_command.hpp"
#include "ulysses/comm/communicator.hpp"

namespace ulysses::cli {

// Collective. Prefills each request of o.requests in turn, then decodes every request still
// running in one step until each has its new tokens; prints and writes (--json) per-request
// time to first token and tokens, and each step's tokens/s across the requests.
int run_generate_requests(Communicator& comm, const GenerateOptions& o);

}  // namespace ulysses::cli
