// Generation over a sharded KV cache (train/generate.hpp) is exact at every group size: the
// greedy (and seeded sampled) tokens at cp = world equal one rank's, every step's logits within
// 1e-5 relative, under both cache layouts; bad requests are refused with the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "train/generate.hpp"
#include "ulysses/core/error.hpp"
#include "train/serve.hpp"
#include "worlds.hpp"

using namespace ulysses;
using namespace ulysses::train;

namespace {

GptConfig tiny_model() { return GptConfig{64, 2, 32, 4, 2, 8, 88}; }

struct Run {
  std::vector<int> tokens;
  std::vector<std::vector<float>> logits;  // the prefill's, then every decode step's
};

Run generate(Communicator& comm, const std::vector<float>& params, const GenerateConfig& config,
             const std::vector<int>& prompt, int steps) {
  Generator gen(comm, tiny_model(), params, config);
  Run run;
  run.logits.push_back(gen.prefill(prompt));
  // Per layer two transposes, or the ring's steps and one move into the layout (and the
  // interleaved scatter after the transposes); then the logits broadcast.
  const std::int64_t per_layer = config.prefill == Prefill::ring          ? (comm.size() - 1) + 1
                                 : config.layout == KvLayout::interleaved ? 3
                                                                          : 2;
  EXPECT_EQ(gen.stats().collectives, per_layer * tiny_model().layers + 1);
  for (int s = 0; s < steps; ++s) {
    run.tokens.push_back(gen.next_token(run.logits.back()));
    run.logits.push_back(gen.decode(run.tokens.back()));
    EXPECT_EQ(gen.stats().collectives, tiny_model().layers);  // one per layer, nothing else
  }
  EXPECT_EQ(gen.cache().bytes(), kv_bytes_formula(config.layout, gen.cache().shape(), comm.size(), comm.rank()));
  return run;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, double(std::abs(got[i] - want[i])));
    scale = std::max(scale, double(std::abs(want[i])));
  }
  return diff / scale;
}

COMM_TEST(Generate, EveryGroupSizeEqualsOneRank) {
  Gpt<float> model(tiny_model());
  model.init_params(7);
  std::vector<int> prompt;
  for (int i = 0; i < 13; ++i) prompt.push_back((i * 37 + 5) % 64);
  const std::unique_ptr<Communicator> alone = comm.split(comm.rank(), 0);
  for (float temperature : {0.0f, 1.0f})
    for (Prefill how : {Prefill::ulysses, Prefill::ring})
      for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved}) {
        const GenerateConfig config{layout, how, 24, temperature, 3};
        if (!generate_error(tiny_model(), config, comm.size(), 13, 8, 0).empty()) continue;
        const Run one = generate(*alone, model.params, config, prompt, 8);
        const Run all = generate(comm, model.params, config, prompt, 8);
        EXPECT_EQ(all.tokens, one.tokens)
            << to_string(layout) << " " << to_string(how) << " temperature " << temperature;
        for (std::size_t s = 0; s < one.logits.size(); ++s)
          EXPECT_LT(relative_error(all.logits[s], one.logits[s]), 1e-5) << to_string(layout) << " step " << s;
      }
}

// A second turn over the cache (extend: Ulysses over it for heads, pass-Q for interleaved)
// equals prefilling both turns at once, and its tokens at cp = world equal one rank's.
COMM_TEST(Generate, ASecondTurnEqualsOnePrompt) {
  Gpt<float> model(tiny_model());
  model.init_params(11);
  std::vector<int> first, second, both;
  for (int i = 0; i < 10; ++i) first.push_back((i * 29 + 3) % 64);
  for (int i = 0; i < 6; ++i) second.push_back((i * 13 + 7) % 64);
  both = first;
  both.insert(both.end(), second.begin(), second.end());
  const std::unique_ptr<Communicator> alone = comm.split(comm.rank(), 0);
  for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved}) {
    const GenerateConfig config{layout, Prefill::ulysses, 24, 0, 0};
    if (!generate_error(tiny_model(), config, comm.size(), 10, 8, 0).empty()) continue;
    Generator whole(*alone, tiny_model(), model.params, config), turns(comm, tiny_model(), model.params, config);
    std::vector<float> want = whole.prefill(both);
    turns.prefill(first);
    std::vector<float> got = turns.extend(second);
    for (int s = 0; s < 4; ++s) {  // the turn's logits, then three decode steps'
      EXPECT_LT(relative_error(got, want), 1e-5) << to_string(layout) << " step " << s;
      const int token = whole.next_token(want);
      EXPECT_EQ(turns.next_token(got), token) << to_string(layout) << " step " << s;
      want = whole.decode(token);
      got = turns.decode(token);
    }
  }
}

// Concurrent requests of different prompt lengths, finishing at different steps, decoded in one
// step each (one collective per layer for all of them) at cp = world: each request's tokens and
// logits equal running it alone on one rank.
COMM_TEST(Generate, ConcurrentRequestsEqualEachAlone) {
  Gpt<float> model(tiny_model());
  model.init_params(5);
  const std::vector<std::int64_t> prompt_len{9, 17, 12}, new_tokens{3, 8, 5};
  const std::unique_ptr<Communicator> alone = comm.split(comm.rank(), 0);
  for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved}) {
    const GenerateConfig config{layout, Prefill::ulysses, 32, 0, 0};
    if (!generate_error(tiny_model(), config, comm.size(), 9, 8, 0).empty()) continue;
    std::vector<std::unique_ptr<Generator>> gens;
    std::vector<std::vector<float>> last;
    std::vector<std::vector<int>> got(3), prompts(3);
    for (std::size_t i = 0; i < 3; ++i) {
      for (std::int64_t t = 0; t < prompt_len[i]; ++t) prompts[i].push_back(int((t * 31 + 7 * i + 1) % 64));
      gens.push_back(std::make_unique<Generator>(comm, tiny_model(), model.params, config));
      last.push_back(gens[i]->prefill(prompts[i]));
      got[i].push_back(gens[i]->next_token(last[i]));
    }
    for (int step = 1; step < 8; ++step) {  // the requests still running decode together
      std::vector<Generator*> running;
      std::vector<int> tokens;
      std::vector<std::size_t> which;
      for (std::size_t i = 0; i < 3; ++i)
        if (std::int64_t(got[i].size()) < new_tokens[i]) {
          running.push_back(gens[i].get());
          tokens.push_back(got[i].back());
          which.push_back(i);
        }
      const std::vector<std::vector<float>> logits = Generator::decode(running, tokens);
      EXPECT_EQ(running[0]->stats().collectives, tiny_model().layers) << "step " << step;
      for (std::size_t j = 0; j < which.size(); ++j) got[which[j]].push_back(gens[which[j]]->next_token(logits[j]));
    }
    for (std::size_t i = 0; i < 3; ++i) {
      Generator one(*alone, tiny_model(), model.params, config);
      std::vector<int> want{one.next_token(one.prefill(prompts[i]))};
      while (std::int64_t(want.size()) < new_tokens[i]) want.push_back(one.next_token(one.decode(want.back())));
      EXPECT_EQ(got[i], want) << to_string(layout) << " request " << i;
    }
  }
}

// Requests arriving at decode steps (out of index order, two at once, one done at its prefill,
// one after the others finished): each is prefilled when its step comes and joins the next
// step. The steps run and who joined them are the schedule worked out by hand, and each
// request's tokens (greedy and sampled) equal it generated alone on one rank.
COMM_TEST(Generate, RequestsJoiningMidwayEqualEachAlone) {
  Gpt<float> model(tiny_model());
  model.init_params(6);
  const std::vector<std::int64_t> prompt_len{9, 17, 12, 10, 11, 8}, new_tokens{3, 6, 4, 1, 2, 3},
      arrival{0, 0, 2, 2, 9, 1};
  std::vector<ServedRequest> requests;
  for (std::size_t i = 0; i < prompt_len.size(); ++i) {
    requests.push_back({{}, new_tokens[i], arrival[i]});
    for (std::int64_t t = 0; t < prompt_len[i]; ++t) requests[i].prompt.push_back(int((t * 29 + 5 * i + 3) % 64));
  }
  using Ids = std::vector<std::size_t>;
  const std::vector<std::int64_t> want_steps{1, 2, 3, 4, 5, 10};  // idle from 6 to 9: not run
  const std::vector<Ids> want_running{{0, 1}, {0, 1, 5}, {1, 2, 5}, {1, 2}, {1, 2}, {4}},
      want_joined{{0, 1}, {5}, {2}, {}, {}, {4}};
  const std::unique_ptr<Communicator> alone = comm.split(comm.rank(), 0);
  for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved})
    for (float temperature : {0.0f, 0.8f}) {
      const std::string what = std::string(to_string(layout)) + (temperature > 0 ? " sampled" : " greedy");
      std::vector<std::unique_ptr<Generator>> gens;
      std::vector<Generator*> served;
      for (std::size_t i = 0; i < requests.size(); ++i) {
        const GenerateConfig config{layout, Prefill::ulysses, 32, temperature, 40 + i};
        if (!generate_error(tiny_model(), config, comm.size(), 8, 6, 0).empty()) break;
        gens.push_back(std::make_unique<Generator>(comm, tiny_model(), model.params, config));
        served.push_back(gens.back().get());
      }
      if (served.size() != requests.size()) continue;  // a layout that cannot hold the heads here
      const ServedRun run = serve(comm, served, requests);
      ASSERT_EQ(run.steps.size(), want_steps.size()) << what;
      for (std::size_t s = 0; s < run.steps.size(); ++s) {
        EXPECT_EQ(run.steps[s].step, want_steps[s]) << what;
        EXPECT_EQ(run.steps[s].running, want_running[s]) << what << " step " << want_steps[s];
        EXPECT_EQ(run.steps[s].joined, want_joined[s]) << what << " step " << want_steps[s];
        EXPECT_EQ(run.steps[s].collectives, tiny_model().layers) << what;  // one per layer, whoever runs
      }
      EXPECT_EQ(run.arrival_s[2], run.arrival_s[3]);  // they arrive together, after step 2
      // Every cache is returned after its request's last token; at the busiest moment requests 1,
      // 2, 3 and 5 held theirs (3 is done at its prefill, after 2's and its own were allocated).
      for (const Generator* g : served) EXPECT_FALSE(g->holds_cache()) << what;
      EXPECT_EQ(run.peak_kv_requests, (Ids{1, 2, 3, 5})) << what;
      const KvCacheShape shape{tiny_model().layers, tiny_model().heads, tiny_model().kv_heads, tiny_model().head_dim,
                               32};
      EXPECT_EQ(run.peak_kv_bytes, 4 * kv_bytes_formula(layout, shape, comm.size(), comm.rank())) << what;
      for (std::size_t i = 0; i < requests.size(); ++i) {
        Generator one(*alone, tiny_model(), model.params, {layout, Prefill::ulysses, 32, temperature, 40 + i});
        std::vector<int> want{one.next_token(one.prefill(requests[i].prompt))};
        while (std::int64_t(want.size()) < new_tokens[i]) want.push_back(one.next_token(one.decode(want.back())));
        EXPECT_EQ(run.tokens[i], want) << what << " request " << i;
      }
    }
}

// Chunked prefill: prompts of multiples of the chunk (4 tokens, so the pieces are the same at
// every cp up to 4) are prefilled a piece before each step; a request joins the step after its
// last piece, and while nothing runs the pieces run back to back. The schedule is worked out by
// hand, and each request's tokens equal it generated alone, its prompt whole, on one rank.
COMM_TEST(Generate, ChunkedPrefillInterleavesPiecesWithSteps) {
  Gpt<float> model(tiny_model());
  model.init_params(7);
  const std::vector<std::int64_t> prompt_len{8, 16, 12, 8}, new_tokens{6, 3, 4, 2}, arrival{0, 1, 1, 6};
  std::vector<ServedRequest> requests;
  for (std::size_t i = 0; i < prompt_len.size(); ++i) {
    requests.push_back({{}, new_tokens[i], arrival[i]});
    for (std::int64_t t = 0; t < prompt_len[i]; ++t) requests[i].prompt.push_back(int((t * 31 + 7 * i + 1) % 64));
  }
  using Ids = std::vector<std::size_t>;
  const std::vector<Ids> want_running{{0}, {0}, {0}, {0}, {0, 1}, {1}, {2}, {2}, {2, 3}},
      want_joined{{0}, {}, {}, {}, {1}, {}, {2}, {}, {3}};
  const std::vector<std::int64_t> want_tokens{8, 4, 4, 4, 4, 4, 8, 4, 4}, want_pieces{2, 4, 3, 2};
  const std::unique_ptr<Communicator> alone = comm.split(comm.rank(), 0);
  for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved}) {
    const std::string what = to_string(layout);
    std::vector<std::unique_ptr<Generator>> gens;
    std::vector<Generator*> served;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const GenerateConfig config{layout, Prefill::ulysses, 32, 0, 50 + i};
      if (!generate_error(tiny_model(), config, comm.size(), 8, 6, 0).empty()) break;
      gens.push_back(std::make_unique<Generator>(comm, tiny_model(), model.params, config));
      served.push_back(gens.back().get());
    }
    if (served.size() != requests.size()) continue;  // a layout that cannot hold the heads here
    const ServedRun run = serve(comm, served, requests, 4);
    ASSERT_EQ(run.steps.size(), want_running.size()) << what;
    for (std::size_t s = 0; s < run.steps.size(); ++s) {
      EXPECT_EQ(run.steps[s].step, std::int64_t(s + 1)) << what;
      EXPECT_EQ(run.steps[s].running, want_running[s]) << what << " step " << s + 1;
      EXPECT_EQ(run.steps[s].joined, want_joined[s]) << what << " step " << s + 1;
      EXPECT_EQ(run.steps[s].prefill_tokens, want_tokens[s]) << what << " step " << s + 1;
    }
    EXPECT_EQ(run.prefill_pieces, want_pieces) << what;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      Generator one(*alone, tiny_model(), model.params, {layout, Prefill::ulysses, 32, 0, 50 + i});
      std::vector<int> want{one.next_token(one.prefill(requests[i].prompt))};
      while (std::int64_t(want.size()) < new_tokens[i]) want.push_back(one.next_token(one.decode(want.back())));
      EXPECT_EQ(run.tokens[i], want) << what << " request " << i;
    }
  }
}

// A piece needs a token a rank; 0 is each prompt whole.
TEST(Generate, PrefillChunkRefusedBelowOneTokenARank) {
  EXPECT_EQ(prefill_chunk_error(0, 4), "");
  EXPECT_EQ(prefill_chunk_error(4, 4), "");
  EXPECT_EQ(prefill_chunk_error(3, 4),
            "a prefill chunk of 3 tokens is shorter than the 4 ranks: a piece needs a token a rank");
  EXPECT_EQ(prefill_chunk_error(-1, 1), "a prefill chunk of -1 tokens is negative (0: each prompt whole)");
}

// The planner's prefill row probe runs the model's own layers: a time a token, refused without rows.
TEST(Generate, PrefillRowProbeNeedsRowsAndTimesTheLayers) {
  GptConfig model;  // the default tiny model: 2 layers, width 64
  EXPECT_THROW(prefill_row_seconds(model, 0), Error);
  EXPECT_THROW(prefill_row_seconds(model, -5), Error);
  const double s = prefill_row_seconds(model, 64);
  EXPECT_TRUE(std::isfinite(s));
  EXPECT_GT(s, 0);
}

// What serve refuses, before anything runs: named by the request's index.
TEST(Generate, ServeRefusesBadRequests) {
  const std::vector<int> prompt{1, 2, 3};
  EXPECT_EQ(serve_error({{prompt, 2, 0}, {prompt, 1, 7}}), "");
  EXPECT_EQ(serve_error({{prompt, 2, 0}, {prompt, 1, -1}}),
            "request 1 of 2: arrival step -1 is negative (0 is the start, s after s decode steps)");
  EXPECT_EQ(serve_error({{prompt, 0, 0}}), "request 0 of 1: 0 new tokens (at least 1)");
  EXPECT_EQ(serve_error({{prompt, 1, kMaxArrivalStep + 1}}),
            "request 0 of 1: arrival step 4611686018427387905 is past 4611686018427387904");
  EXPECT_EQ(serve_error({{{}, 1, 0}}), "request 0 of 1: the prompt is empty");
  EXPECT_EQ(serve_error({}), "no request to serve");
}

// The memory model counts the caches held together by their formula, a longer prompt's prefill (more
// rows a rank) as more activations, and the bandwidth probe's buffer only where it is larger.
TEST(Generate, MemoryModelCountsTheCachesByTheirFormula) {
  const GptConfig m = tiny_model();
  const std::vector<GenerateConfig> two{{KvLayout::interleaved, Prefill::ulysses, 1000, 0, 0},
                                        {KvLayout::interleaved, Prefill::ulysses, 333, 0, 0}};
  for (int rank = 0; rank < 3; ++rank) {
    const MemoryEstimate e = predict_generate_memory(m, two, {{0, 1}}, 3, rank, 64, 0);
    const KvCacheShape s{m.layers, m.heads, m.kv_heads, m.head_dim, 0};
    EXPECT_EQ(e.attention,
              double(
                  kv_bytes_formula(KvLayout::interleaved, {s.layers, s.heads, s.kv_heads, s.head_dim, 1000}, 3, rank) +
                  kv_bytes_formula(KvLayout::interleaved, {s.layers, s.heads, s.kv_heads, s.head_dim, 333}, 3, rank)));
  }
  EXPECT_GT(predict_generate_memory(m, two, {{0, 1}}, 2, 0, 1 << 16, 0).activations,
            predict_generate_memory(m, two, {{0, 1}}, 2, 0, 1 << 10, 0).activations);
  // The probe's buffer comes after the prefill's is returned: the larger of the two, not the sum.
  const double prefill = predict_generate_memory(m, two, {{0, 1}}, 2, 0, 1 << 16, 0).activations;
  EXPECT_EQ(predict_generate_memory(m, two, {{0, 1}}, 2, 0, 1 << 16, 1e9).activations, std::max(prefill, 1e9));
  EXPECT_EQ(predict_generate_memory(m, two, {{0, 1}}, 2, 0, 1 << 16, prefill / 2).activations, prefill);
  // Under heads no K or V row moves after the transposes; under interleaved the rank's rows go to
  // their owners: a send and a receive buffer and the received K and V, 4 of its 2^15 rows of
  // kv_heads · head_dim = 16 floats.
  const std::vector<GenerateConfig> heads{{KvLayout::heads, Prefill::ulysses, 1000, 0, 0}};
  EXPECT_EQ(prefill - predict_generate_memory(m, heads, {{0}}, 2, 0, 1 << 16, 0).activations,
            4.0 * (1 << 15) * 16 * sizeof(float));
}

// A released request holds no cache (and cannot decode); a next prefill allocates it again and
// gives the same logits as the first.
COMM_TEST(Generate, ReleaseReturnsTheCacheAndAPrefillTakesItAgain) {
  Gpt<float> model(tiny_model());
  model.init_params(8);
  const GenerateConfig config{KvLayout::interleaved, Prefill::ulysses, 24, 0, 0};
  Generator gen(comm, tiny_model(), model.params, config);
  EXPECT_FALSE(gen.holds_cache());
  EXPECT_THROW(gen.cache(), Error);
  std::vector<int> prompt;
  for (int t = 0; t < 12; ++t) prompt.push_back((t * 13 + 2) % 64);
  const std::vector<float> first = gen.prefill(prompt);
  const std::vector<float> step = gen.decode(gen.next_token(first));
  EXPECT_EQ(gen.cache().bytes(), kv_bytes_formula(config.layout, gen.cache().shape(), comm.size(), comm.rank()));
  gen.release();
  EXPECT_FALSE(gen.holds_cache());
  EXPECT_THROW(gen.cache(), Error);
  EXPECT_THROW(gen.decode(1), Error);  // not collective: refused before any data moves
  EXPECT_EQ(gen.prefill(prompt), first);
  EXPECT_EQ(gen.decode(gen.next_token(first)), step);
  EXPECT_EQ(gen.cache().tokens(0), 13);
}

// The caches held at once follow serve's schedule: requests that never overlap hold one cache at
// a time, so the peak is the largest one, not the sum; overlapping ones add up. The schedules are
// RequestsJoiningMidwayEqualEachAlone's and ChunkedPrefillInterleavesPiecesWithSteps' (worked
// out by hand there), and the bytes are counted by hand: tiny_model's 2 layers, K and V, 2 KV
// heads of 8 floats are 256 bytes a token at cp 1 under heads.
TEST(Generate, PeakCachesFollowTheSchedule) {
  using Ids = std::vector<std::size_t>;
  const GptConfig m = tiny_model();
  auto request = [](std::int64_t prompt, std::int64_t new_tokens, std::int64_t arrival) {
    return ServedRequest{std::vector<int>(std::size_t(prompt), 1), new_tokens, arrival};
  };
  auto configs = [](const std::vector<std::int64_t>& capacity) {
    std::vector<GenerateConfig> c;
    for (const std::int64_t n : capacity) c.push_back({KvLayout::heads, Prefill::ulysses, n, 0, 0});
    return c;
  };
  // One after another: 3 tokens each (prefill and 2 steps), the next arriving 10 steps on.
  const std::vector<ServedRequest> apart{request(90, 3, 0), request(290, 3, 10), request(190, 3, 20)};
  const std::vector<std::vector<std::size_t>> one_at_a_time = held_together(apart, 0, 1);
  EXPECT_EQ(one_at_a_time, (std::vector<Ids>{{0}, {1}, {2}}));
  const KvPeak alone = peak_kv(m, configs({100, 300, 200}), one_at_a_time, 1, 0);
  EXPECT_EQ(alone.bytes, 300 * 256);  // the largest, where all at once would be 600 · 256
  EXPECT_EQ(alone.requests, Ids{1});
  EXPECT_EQ(predict_generate_memory(m, configs({100, 300, 200}), one_at_a_time, 1, 0, 90, 0).attention, 300 * 256);
  // Arriving while others run: the capacities are each prompt plus its new tokens.
  const std::vector<std::int64_t> prompt{9, 17, 12, 10, 11, 8}, new_tokens{3, 6, 4, 1, 2, 3}, arrival{0, 0, 2, 2, 9, 1};
  std::vector<ServedRequest> joining;
  std::vector<std::int64_t> capacity;
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    joining.push_back(request(prompt[i], new_tokens[i], arrival[i]));
    capacity.push_back(prompt[i] + new_tokens[i]);
  }
  const std::vector<std::vector<std::size_t>> together = held_together(joining, 0, 1);
  EXPECT_EQ(together, (std::vector<Ids>{{0}, {0, 1}, {0, 1, 5}, {1, 2, 5}, {1, 2, 3, 5}, {4}}));
  const KvPeak peak = peak_kv(m, configs(capacity), together, 1, 0);
  EXPECT_EQ(peak.bytes, (23 + 16 + 11 + 11) * 256);  // of all six: 86 · 256
  EXPECT_EQ(peak.requests, (Ids{1, 2, 3, 5}));
  // Chunked prefill: a cache is held from a prompt's first piece, while it still queues; the
  // pieces are the same at cp 1 and 4.
  const std::vector<ServedRequest> chunked{request(8, 6, 0), request(16, 3, 1), request(12, 4, 1), request(8, 2, 6)};
  for (int cp : {1, 4}) EXPECT_EQ(held_together(chunked, 4, cp), (std::vector<Ids>{{0}, {0, 1}, {1, 2}, {2, 3}}));
  // Bad schedules: serve's own errors.
  EXPECT_THROW(held_together({}, 0, 1), Error);
  EXPECT_THROW(held_together(apart, 1, 2), Error);
}

// Progress on a prompt: the hook hears the start and every layer of a prefill and of a next
// turn, in order.
COMM_TEST(Generate, PromptProgressHearsEveryLayer) {
  Gpt<float> model(tiny_model());
  model.init_params(3);
  Generator gen(comm, tiny_model(), model.params, {KvLayout::interleaved, Prefill::ulysses, 40, 0, 0});
  std::vector<std::int64_t> heard;
  gen.on_prompt_layer([&](std::int64_t done, std::int64_t layers) {
    EXPECT_EQ(layers, tiny_model().layers);
    heard.push_back(done);
  });
  gen.prefill(std::vector<int>(12, 5));
  gen.extend(std::vector<int>(8, 7));
  EXPECT_EQ(heard, (std::vector<std::int64_t>{0, 1, 2, 0, 1, 2}));
}

TEST(Generate, RefusesBadRequestsWithTheNumbers) {
  const GptConfig m = tiny_model();
  const GenerateConfig heads{KvLayout::heads, Prefill::ulysses, 100, 0, 0};
  EXPECT_NE(generate_error(m, heads, 2, 0, 5, 0).find("empty"), std::string::npos);
  EXPECT_NE(generate_error(m, heads, 2, 10, 0, 0).find("--max-new-tokens must be positive, got 0"), std::string::npos);
  EXPECT_NE(generate_error(m, heads, 2, 99, 5, 0).find("capacity of 100"), std::string::npos);
  EXPECT_NE(generate_error(m, heads, 2, 80, 5, 64).find("80 tokens, longer than the model's 64"), std::string::npos);
  EXPECT_NE(generate_error(m, heads, 8, 80, 5, 0).find("--kv-layout interleaved"), std::string::npos);
  EXPECT_EQ(generate_error(m, {KvLayout::interleaved, Prefill::ring, 100, 0, 0}, 8, 80, 5, 0), "");
}

}  // namespace
