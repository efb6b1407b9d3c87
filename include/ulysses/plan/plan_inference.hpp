// The planner's inference mode: what a decode step over a sharded KV cache (kv_cache.hpp) costs
// per layout, where sharding the cache starts to pay, and which ring a prompt over a cache
// should pass (keys and values, or queries).
//
// Decode is bound by memory bandwidth: one query row per head against the cache is a
// matrix-vector product, so each step reads every cached byte a rank holds once (docs/inference.md
// measures the decode kernel at 0.6–1.0 of a plain read). Each layer adds one allgatherv of a
// few kilobytes (latency-bound): `heads` gathers every rank's heads of the output, `interleaved`
// every rank's partial (out, lse) for every head, merged by LSE. Sharding pays when the bytes a
// rank no longer reads take longer than the collective: at high concurrency or long contexts
// (vLLM / SGLang decode context parallelism report the crossover at 8–16 concurrent requests
// for 32K contexts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ulysses/cp/cost_model.hpp"

namespace ulysses {

// One decode step (one new token for each of in.batch requests, each over a cache of in.seq
// tokens), all layers, on the busiest rank of one layout.
struct DecodeRow {
  std::string layout;  // "heads", "interleaved", or "cp = 1" (the unsharded baseline)
  int cp = 1;
  bool valid = false;
  std::string reason;                            // why invalid, or ""
  std::int64_t replication = 1;                  // ranks holding each KV head (heads with kv_heads < cp)
  double kv_bytes = 0;                           // the cache a rank holds, all layers
  double read_s = 0, compute_s = 0, comm_s = 0;  // per step, all layers
  double row_s = 0;                              // per step: the rows' own work (DecodeModel), every rank alike
  double calls_s = 0;  // per step, all layers: fixed costs beyond the read (a call a layer, each request's own)
  std::int64_t collectives = 0;  // per step
  double step_s = 0;             // time per output token
  double tokens_per_s = 0;       // batch / step_s
  // The least concurrency (requests per step, at in.seq) and the least context (at in.batch)
  // at which this layout's step is faster than cp = 1's; 0: not below 2^30; 1: from the start.
  std::int64_t crossover_batch = 0, crossover_context = 0;
};

// The time to first token of a prompt of in.seq tokens (× in.batch) by one prefill path: its
// attention, forward only, as the strategies' table prices it (make_plan in PlanMode::prefill:
// cp = 1 and ulysses its a2a row, ring its p2p --no-zigzag row, the contiguous chunks generate's
// ring passes), and the prompt's rows on the busiest rank (its ceil(seq / cp) tokens), plus the
// LM head of the last token.
struct PrefillRow {
  std::string prefill;  // "cp = 1", "ulysses" or "ring"
  int cp = 1;
  bool valid = false;
  std::string reason;
  double attention_s = 0;  // all layers: the busiest rank's kernel time and the exposed communication
  double rows_s = 0;       // all layers and the LM head
  double ttft_s = 0;       // attention_s + rows_s
};
struct DecodePlan {
  std::vector<DecodeRow> rows;      // cp = 1, then heads and interleaved at in.cp
  std::vector<PrefillRow> prefill;  // cp = 1, then ulysses and ring at in.cp: the time to first token
  int best = -1;
  std::string recommendation;
};

// What a decode step costs beyond the attention's shape and the cluster.
//
// The model around the attention: every rank runs each new token's row whole (embedding, q/k/v
// and output projections, the SwiGLU MLP, the LM head; docs/inference.md "Decode"): only the
// attention is sharded, so the row's time is the same at every cp and moves no crossover, but
// it is part of every step. width 0: the attention alone.
//
// The last-level cache: steps re-read the same cache, so one whose bytes on a node (every rank's
// cache and the row's weights) fit in llc_bytes is read at llc_bandwidth, not from memory
// (plan --calibrate measures both; 0: every read from memory).
struct DecodeModel {
  std::int64_t width = 0, hidden = 0, vocab = 0;
  // FLOP/s of one row through these products (plan --calibrate times them); 0: peak × efficiency.
  double flops_per_s = 0;
  double llc_bytes = 0, llc_bandwidth = 0;  // per node
  // The read rates are the decode kernel's own, measured (plan --calibrate): its FLOPs are inside
  // them, so no compute term beside the read (else 4·d FLOPs a cached row and query head at
  // peak × efficiency, when slower than the read).
  bool kernel_measured = false;
  // Seconds of one decode collective at in.cp, measured (plan --calibrate); 0: the link model's
  // cp − 1 messages.
  double collective_s = 0;
  // The prefill (time to first token, PrefillRow). Its rows: seconds per prompt token of the
  // work around the attention on one rank, all layers (products, norms, rotary table, MLP,
  // residuals and their buffers; plan --calibrate times the model's own layers); 0: the
  // layers' row FLOPs at flops_per_s. Its attention: the forward kernel's rate as the cluster's
  // peak at efficiency 1 (plan --calibrate: queries streaming the prompt's whole key length, in
  // CPU seconds; 0: in.cluster's, which a calibration measures forward and backward on 2048-token
  // blocks).
  double prefill_token_s = 0;
  double prefill_flops = 0;
  // The decode step's rows at the batch asked: seconds per token of the work around the
  // attention on `batch_rows` rows at once, all layers, the LM head apart (plan --calibrate times
  // the model's own layers at in.batch rows: the products of b rows are one GEMM of b rows, whose
  // rate and whose norms', rotary table's and buffers' share per row depend on b); 0: the row's
  // FLOPs at flops_per_s. Priced at every batch the crossover search tries (the rows are the
  // same at every cp, so they move no crossover).
  double batch_token_s = 0;
  std::int64_t batch_rows = 0;
  // Seconds each request adds to a layer beyond its cache's read, per layout (plan --calibrate:
  // the decode step's own code, over caches of one row a rank, one request against many): this
  // CPU path appends each request's row, calls the kernel once per request and unpacks (heads)
  // or merges (interleaved) its block, so b requests pay b of them. 0: none beyond the layer's
  // one kernel call (a GPU's paged kernel takes every request's cache in one launch).
  struct RequestCost {
    double unsharded = 0, heads = 0, interleaved = 0;
  } request_s;
};

// The prompt's rows of one token on one rank, all layers (the LM head apart): seconds at
// DecodeModel::prefill_token_s, or 2 · layers · (the products of one layer) FLOPs at the row rate.
double prefill_token_seconds(const PlanInput& in, const DecodeModel& row);
// Per token: the products' multiply-adds × 2 over all layers and the LM head, and their weights'
// elements (every step reads them once, whatever the batch). The embedding is a lookup.
double row_flops(const PlanInput& in, const DecodeModel& row);
double row_weights(const PlanInput& in, const DecodeModel& row);
// The products [1, in]·[in, out] of one layer's row (q, k, v, out, MLP's three), then the LM head.
std::vector<std::pair<std::int64_t, std::int64_t>> row_products(const PlanInput& in, const DecodeModel& row);

// Every layout at in.cp against cp = 1. Memory bandwidth: in.cluster.kernel.memory_bandwidth
// (0: compute alone prices the read), or model.llc_bandwidth when the node's cache fits in
// model.llc_bytes. Per step the rows' own work adds
// max(batch · row_flops / rate, row_weights · bytes / memory bandwidth). Rows over
// in.max_memory_bytes are refused by memory. Throws Error for inputs make_plan refuses.
DecodePlan plan_decode(const PlanInput& in, const DecodeModel& row = {});

// A prompt of `turn` new tokens over `cached` tokens already in the cache, on a ring of in.cp:
// pass-KV moves every rank's keys and values of the whole context around the ring, pass-Q the
// new queries (and their partial outputs and LSE back). Meta (arXiv 2411.01783, section 3.3):
// pass-Q moves less when turn / (turn + cached) < 2 · kv_heads / heads.
struct TurnPlan {
  std::int64_t turn = 0, cached = 0;
  double pass_kv_bytes = 0, pass_q_bytes = 0;  // per rank, one layer
  double pass_kv_s = 0, pass_q_s = 0;          // all layers, compute + exposed communication
  bool rule_prefers_pass_q = false;
  std::string choice;  // "pass-Q" or "pass-KV", and why
};
TurnPlan plan_turn(const PlanInput& in, std::int64_t cached);

}  // namespace ulysses
