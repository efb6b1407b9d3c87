// `ulysses generate --requests SPEC`: concurrent requests decoding together over one sharded
// KV cache each, every step one collective per layer for all of them; requests arrive at decode
// steps (--requests-arrive), join the next step and leave when they have their tokens
// (train/serve.hpp).
#pragma once

#include "generate_command.hpp"
#include "ulysses/comm/communicator.hpp"

namespace ulysses::cli {

// Collective. Serves the requests of o.requests: each prefilled when its arrival step comes,
// then decoded in every step until it has its new tokens; prints and writes (--json) each
// request's arrival, time to first token (from its arrival) and tokens, and each step's requests,
// joins and tokens/s across them.
int run_generate_requests(Communicator& comm, const GenerateOptions& o);

}  // namespace ulysses::cli
