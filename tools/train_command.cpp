#include "train_command.hpp"

#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "agreement.hpp"
#include "kernels/onednn_gemm.hpp"
#include "kernels/peak.hpp"
#include "guard.hpp"
#include "options.hpp"
#include "plan_command.hpp"
#include "rank_errors.hpp"
#include "report.hpp"
#include "svg.hpp"
#include "train/log.hpp"
#include "train/memory.hpp"
#include "train/trainer.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/input_file.hpp"
#include "ulysses/core/lengths.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/core/threads.hpp"
#include "ulysses/comm/trace.hpp"

namespace ulysses::cli {

namespace {

// What a step holds and which ranks compute each sequence.
void add_step_options(CLI::App* c, TrainOptions& o) {
  c->add_option("--steps", o.steps, "optimizer steps (the total, when resuming)")
      ->capture_default_str()
      ->check(non_negative_number());
  c->add_option("--seq", o.seq, "sequence length (global, per sequence)")
      ->capture_default_str()
      ->check(positive_number());
  c->add_option("--batch", o.batch, "sequences per step")->capture_default_str()->check(positive_number());
  c->add_option("--dp", o.dp,
                "data-parallel replicas: cp = world / dp ranks each (dp must divide the world); one "
                "gradient all-reduce over all ranks")
      ->capture_default_str();
  c->add_option("--lengths", o.lengths,
                "variable-length steps: sequences of these lengths every step instead of "
                "--batch x --seq, e.g. 1x16384,32x512 or pareto:N:MIN:MAX:ALPHA[:SEED] (each one the synthetic task "
                "at its length, or a window of --data, or packed documents with --pack); nothing is padded");
  c->add_option("--tokens-per-step", o.tokens_per_step,
                "with --data (no --pack): each step takes whole documents "
                "(one per line, or split on --doc-separator), each one sequence of its own length, consecutive from "
                "a random one while they fit in N tokens")
      ->check(positive_number());
  c->add_option("--balance", o.balance,
                "which ranks compute each sequence: static (dp groups of world/dp ranks, "
                "round-robin), pow2 (Megatron's hybrid CP) or dynamic (the balancer's solver)")
      ->capture_default_str();
}

// The model and its optimizer.
void add_model_options(CLI::App* c, TrainOptions& o) {
  c->add_option("--layers", o.layers, "transformer blocks")->capture_default_str()->check(positive_number());
  c->add_option("--width", o.width, "model width (d_model)")->capture_default_str()->check(positive_number());
  c->add_option("--heads", o.heads, "query heads")->capture_default_str()->check(positive_number());
  c->add_option("--kv-heads", o.kv_heads, "key/value heads (GQA)")->capture_default_str()->check(positive_number());
  c->add_option("--head-dim", o.head_dim, "head dim")->capture_default_str()->check(positive_number());
  c->add_option("--hidden", o.hidden,
                "SwiGLU hidden size (default: 8/3 x width rounded up to a multiple of 4, "
                "LLaMA's sizing: 172 at width 64)")
      ->check(positive_number());
  c->add_option("--lr", o.lr, "AdamW learning rate (linear warm-up)")->capture_default_str();
  c->add_option("--warmup", o.warmup, "warm-up steps")->capture_default_str();
  c->add_option("--seed", o.seed, "seed of the weights and the data")->capture_default_str();
}

// Text to train on instead of the synthetic task, and its held-out tail.
void add_data_options(CLI::App* c, TrainOptions& o) {
  input_path(c->add_option("--data", o.data, "train byte-level on this text file instead of the synthetic task"),
             "file");
  c->add_option("--holdout", o.holdout,
                "with --data: the fraction of its bytes, from the end, that training never "
                "sees; its loss is reported (0: none)")
      ->capture_default_str();
  c->add_option("--eval-every", o.eval_every,
                "with --data: the held-out loss and bits per byte every K steps and at "
                "the end (default: a tenth of --steps; 0: at the end only)")
      ->check(CLI::NonNegativeNumber);
  c->add_flag("--pack", o.pack,
              "with --data: pack its documents (one per line, or split on --doc-separator) into each sequence, "
              "with document masking (cu_seqlens), per-document RoPE positions and no loss across a boundary; "
              "needs --batch 1");
  c->add_option("--doc-separator", o.doc_separator, "with --pack: the text between documents (default: a newline)");
}

// What the run writes: logs, checkpoints, plots, traces.
void add_output_options(CLI::App* c, TrainOptions& o) {
  c->add_option("--log", o.log, "JSON lines, one per step (rank 0)");
  c->add_option("--save", o.save, "checkpoint directory (written atomically, with a checksum)");
  c->add_option("--save-every", o.save_every, "checkpoint every K steps (default: only at the end)");
  input_path(c->add_option("--resume", o.resume,
                           "continue from this checkpoint directory (model and optimizer settings "
                           "come from it)"),
             "dir");
  c->add_option("--svg", o.svg, "draw the loss curve here (rank 0)");
  c->add_option("--trace", o.trace,
                "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of the training steps "
                "here (rank 0): one track per rank, steps, attention compute, every communication with its bytes");
}

// What bounds a rank's memory, and the compute dtype.
void add_memory_options(CLI::App* c, TrainOptions& o) {
  c->add_flag("--checkpoint-activations", o.checkpoint_activations,
              "keep only each layer's input; recompute the layer (its attention too) in the backward");
  c->add_flag("--tiled-mlp", o.tiled_mlp,
              "run the SwiGLU MLP a tile of --tile-rows at a time (ALST's TiledMLP): "
              "the [s/cp, hidden] intermediates never exist whole");
  c->add_flag("--tiled-loss", o.tiled_loss,
              "compute the logits and the loss a tile of --tile-rows at a time: the "
              "[s/cp, vocab] logits never exist whole");
  c->add_option("--tile-rows", o.tile_rows, "rows of a tile")->capture_default_str()->check(positive_number());
  c->add_option("--max-memory", o.max_memory,
                "refuse at start-up a run predicted to need more than this per rank "
                "(e.g. 2GiB, 512MiB)");
  c->add_option("--dtype", o.dtype,
                "compute dtype: f32 (default) or bf16 (mixed precision: the attention on the bf16 "
                "kernels, the projections and the MLP as bf16 GEMMs with float32 accumulation; master "
                "weights, gradients, AdamW and the LM head float32)")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

}  // namespace

void add_train_command(CLI::App& app, TrainOptions& o) {
  CLI::App* c = add_command(
      app, "train",
      "Train a small GPT on long sequences with data x context parallelism: --dp replicas of cp = world / dp "
      "ranks (or the CP groups --balance gives each sequence), every rank holding its groups' shards of "
      "their sequences and the full weights. Default data: a synthetic long-range retrieval task.");
  c->add_option("--strategy", o.strategy, "cp_comm_type: " + strategy_names(" | "))->capture_default_str();
  add_strategy_options(c, o.strategy_options);
  add_step_options(c, o);
  add_model_options(c, o);
  add_data_options(c, o);
  add_output_options(c, o);
  add_memory_options(c, o);
  add_timeout_option(c, o.timeout);
  add_backend_options(c, o.backend);
  c->add_option("--eval-batches", o.eval_batches,
                "held-out batches of each evaluation (the final accuracy; "
                "with --data, the held-out loss)")
      ->capture_default_str();
  c->add_option("--threads", o.threads, "threads per rank (default: cores / ranks on the node)")
      ->check(CLI::Range(0, 1024));
  c->final_callback([c, &o] {
    for (const CLI::Option* opt : c->get_options())
      if (opt->count() > 0) o.given.push_back(opt->get_name());
  });
}

namespace {

constexpr const char* kMemoryRemedy =
    "turn on --checkpoint-activations --tiled-mlp --tiled-loss, use more ranks, or shorter sequences "
    "(`ulysses plan --train` gives the longest that fits)";

std::int64_t sum(const std::vector<std::int64_t>& v) {
  std::int64_t t = 0;
  for (std::int64_t x : v) t += x;
  return t;
}

// What the memory model predicts for one rank: the static batch on its replica; for --lengths,
// the largest batch the trainer runs at once (same-length sequences run as one batch, a
// replica's share of them, split where a cap stops it); for whole documents, a step's budget
// as one sequence (same-length documents batched hold no more tokens).
// A calibrating run (calibrate in trainer.hpp) first times its layers on one forward and backward
// of 1024 tokens (Trainer::layers_rate's probe) on every rank alone, and its links with 16 MB
// messages: a rank's peak is theirs when a step holds less per rank (1x1031 on 2 ranks: 44 MiB
// a step, 58 MiB measured).
train::MemoryEstimate with_calibration(const train::TrainConfig& cfg, const train::MemoryEstimate& step) {
  if (!cfg.calibrate) return step;
  train::TrainConfig probe = cfg;
  probe.lengths.clear();
  probe.tokens_per_step = 0;
  probe.batch = 1;
  probe.seq = 1024;
  train::MemoryEstimate p = train::predict_memory(probe, 1);
  // The link fit's 16 MB messages (calibrate.cpp): on a small model they are the peak, 13-17 MiB
  // over the baseline and weights (MPI's copies; the buffers themselves are unmapped after).
  train::MemoryEstimate link = p;
  link.activations = 16 << 20;
  link.attention = 0;
  if (link.total() > p.total()) p = link;
  return p.total() > step.total() ? p : step;
}

train::MemoryEstimate predicted_memory(train::TrainConfig cfg, int cp) {
  if (!cfg.lengths.empty()) {
    std::map<std::int64_t, std::int64_t> count;
    for (std::int64_t len : cfg.lengths) ++count[len];
    train::MemoryEstimate worst;
    for (const auto& [len, k] : count) {
      cfg.seq = len;
      const std::int64_t share = (k + cfg.dp - 1) / cfg.dp;
      cfg.batch = share;
      if (cfg.max_memory > 0) {  // the trainer grows a batch while it fits: the largest that does
        std::int64_t lo = 1, hi = cfg.batch;
        while (lo < hi) {
          cfg.batch = lo + (hi - lo + 1) / 2;
          if (train::predict_memory(cfg, cp).total() <= cfg.max_memory)
            lo = cfg.batch;
          else
            hi = cfg.batch - 1;
        }
        const std::int64_t pieces = (share + lo - 1) / lo;  // split in equal pieces (runs_of)
        cfg.batch = (share + pieces - 1) / pieces;
      }
      const train::MemoryEstimate e = train::predict_memory(cfg, cp);
      if (e.total() > worst.total()) worst = e;
    }
    return with_calibration(cfg, worst);
  }
  if (cfg.tokens_per_step > 0) {
    cfg.seq = cfg.tokens_per_step;
    cfg.batch = 1;
  } else {
    cfg.batch = (cfg.batch + cfg.dp - 1) / cfg.dp;
  }
  return with_calibration(cfg, train::predict_memory(cfg, cp));
}

std::string svg_curve(const std::vector<double>& loss, const std::string& title) {
  const double W = 640, H = 360, L = 60, R = 20, T = 40, B = 40;
  const double hi = *std::max_element(loss.begin(), loss.end()),
               lo = std::min(0.0, *std::min_element(loss.begin(), loss.end()));
  const svg::Axis Y{lo, hi + 1e-12, H - B, T, false};
  std::string pts;
  for (std::size_t i = 0; i < loss.size(); ++i) {
    const double x = L + (W - L - R) * (loss.size() > 1 ? double(i) / double(loss.size() - 1) : 0.0);
    pts += fmt::format("{:.1f},{:.1f} ", x, Y(loss[i]));
  }
  std::string s =
      svg::open(W, H, title, L) + fmt::format(
                                      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n"
                                      "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"black\"/>\n",
                                      L, T, H - B, W - R);
  for (int k = 0; k <= 4; ++k) {
    const double v = lo + (hi - lo) * k / 4.0, y = T + (H - T - B) * (1.0 - k / 4.0);
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.2f}</text>\n", L - 6, y + 4, v);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step (1 … {})</text>\n", (W + L) / 2, H - 10,
                   loss.size());
  s += fmt::format("<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">loss</text>\n",
                   H / 2, H / 2);
  return s + svg::polyline(pts, svg::color(0), 1.5) + "</svg>\n";
}

std::string clock(double seconds) {
  const long s = long(seconds + 0.5);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

// The peak of the unit the run's GEMMs use (kernels/peak.hpp), over all the job's threads:
// every rank probes at once, one probe per thread, so ranks sharing cores see their share.
// Collective; a tenth of a second.
struct Peak {
  std::string unit;   // what was measured
  double gflops = 0;  // all ranks and threads together
  int threads = 0;    // over all ranks
};

Peak measure_peak(Communicator& comm, DType dtype, int threads) {
  using kernels::PeakUnit;
  const PeakUnit unit = kernels::compute_unit(dtype);
  double total[2] = {0, double(threads)};
#pragma omp parallel num_threads(threads) reduction(+ : total[0])
  total[0] += kernels::peak_gflops(unit, 0.1);
  comm.allreduce_sum(total, 2);
  return {kernels::peak_unit_name(unit), total[0], int(total[1])};
}

// Model FLOPs utilisation: the step's model FLOPs over what the peak does in its time.
double mfu(double model_flops, double seconds, const Peak& peak) {
  return peak.gflops > 0 ? model_flops / seconds / (peak.gflops * 1e9) : 0.0;
}

// Where a run stands, for rank 0's progress lines.
struct Progress {
  std::int64_t first = 0, steps = 0;  // steps taken when the run started, and the total to reach
  std::chrono::steady_clock::time_point start;
  double predicted_bytes = 0;  // memory.hpp's prediction per rank
  std::string dtype;           // the attention's
  Peak peak;                   // of the dtype's unit, measured at the start
};

// Rank 0, after step `s` (and the held-out evaluation after it, if one ran): its JSON line in
// the log, and a progress line about 20 times a run and at every evaluation.
void report_step(AppendFile* log, const Progress& p, std::int64_t s, const train::StepResult& r, double acc_recent,
                 const train::Evaluation* held_out) {
  const double tps = double(r.tokens) / r.seconds;
  std::string idle;  // each rank's, milliseconds
  for (double t : r.idle_s) idle += fmt::format("{}{:.2f}", idle.empty() ? "" : ", ", t * 1e3);
  const std::string held = held_out ? fmt::format(", \"held_out_loss\": {:.6f}, \"held_out_bpb\": {:.6f}",
                                                  held_out->loss, held_out->bits_per_byte())
                                    : "";
  if (log)  // written as it goes: a killed run keeps its steps' lines, so log and checkpoint agree
    log->append(
        fmt::format("{{\"step\": {}, \"loss\": {:.6f}, \"accuracy\": {:.4f}, \"grad_norm\": {:.4f}, "
                    "\"tokens_per_s\": {:.1f}, \"attention_compute_s\": {:.5f}, \"attention_comm_exposed_s\": "
                    "{:.5f}, \"peak_rss_bytes\": {:.0f}, \"predicted_bytes\": {:.0f}, \"dtype\": \"{}\", "
                    "\"sequences\": {}, \"tokens\": {}, \"step_s\": {:.6f}, \"predicted_step_s\": {:.6f}, "
                    "\"idle_ms\": [{}], \"model_flops\": {:.6g}, \"mfu\": {:.4f}{}}}\n",
                    r.step, r.loss, r.accuracy, r.grad_norm, tps, r.attention.compute_s, r.attention.comm_exposed_s,
                    r.peak_rss, p.predicted_bytes, p.dtype, r.sequences, r.tokens, r.seconds, r.predicted_s, idle,
                    r.model_flops, mfu(r.model_flops, r.seconds, p.peak), held));
  const double done = double(s + 1 - p.first), total = double(p.steps - p.first);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.start).count();
  const int width = 30, filled = int(width * done / total);
  std::string line =
      fmt::format("[{}{}] step {}/{}  loss {:.4f}  acc {:.2f}  {:.0f} tok/s  MFU {:.0f}%  idle ms [{}]  ETA {}",
                  std::string(std::size_t(filled), '#'), std::string(std::size_t(width - filled), '.'), r.step, p.steps,
                  r.loss, acc_recent, tps, 100 * mfu(r.model_flops, r.seconds, p.peak), idle,
                  clock(elapsed / done * (total - done)));
  if (held_out) line += fmt::format("  held-out {:.4f} ({:.3f} bits/byte)", held_out->loss, held_out->bits_per_byte());
  const std::int64_t every = std::max<std::int64_t>(1, (p.steps - p.first) / 20);
  if ((s + 1 - p.first) % every == 0 || s + 1 == p.steps || s == p.first || held_out) fmt::print("{}\n", line);
  std::fflush(stdout);
}

// Each step's numbers, for the summary.
struct Steps {
  std::vector<double> losses, seconds, tps, flops, idle, predicted;
  std::vector<std::pair<std::int64_t, train::Evaluation>> evals;  // (step, held-out)
  double peak_rss = 0;                                            // after the last step, the largest over ranks
};

// Rank 0's summary of a run that took at least one step.
void print_summary(const Steps& steps, const train::Evaluation& final_eval,
                   const std::vector<std::pair<std::int64_t, train::Evaluation>>& evals, const train::DataSource& data,
                   const Peak& peak, const train::TrainConfig& cfg, double peak_rss, int cp) {
  const std::vector<double>& losses = steps.losses;
  const double med = median(steps.seconds);
  std::vector<double> rates;  // model FLOP/s of each step
  for (std::size_t i = 0; i < steps.seconds.size(); ++i) rates.push_back(steps.flops[i] / steps.seconds[i]);
  const double tps = median(steps.tps), flops = median(rates);
  const std::size_t tail = std::min<std::size_t>(10, losses.size());
  double last = 0;
  for (std::size_t i = losses.size() - tail; i < losses.size(); ++i) last += losses[i] / double(tail);
  fmt::print("done: {} steps, attention dtype {}; loss {:.4f} -> {:.4f} (mean of the last {})\n", losses.size(),
             to_string(cfg.dtype), losses.front(), last, tail);
  if (final_eval.accuracy >= 0)
    fmt::print(
        "retrieval accuracy on held-out sequences: {:.1f}% (chance: 10%) — the answers sit up to {} tokens "
        "away, on other ranks' shards\n",
        final_eval.accuracy * 100,
        cfg.lengths.empty() ? cfg.seq : *std::max_element(cfg.lengths.begin(), cfg.lengths.end()));
  if (!data.synthetic_task() && final_eval.loss >= 0)
    fmt::print("held-out loss {:.4f} ({:.3f} bits per byte) on the last {} bytes of the data, never trained on{}\n",
               final_eval.loss, final_eval.bits_per_byte(), data.held_out_bytes(),
               evals.size() > 1 ? fmt::format(" (step {}: {:.4f}, {:.3f} bits per byte)", evals.front().first,
                                              evals.front().second.loss, evals.front().second.bits_per_byte())
                                : std::string());
  fmt::print(
      "throughput: {:.0f} tokens/s (median step {:.1f} ms); model FLOPs {:.2f} GFLOP/s = MFU {:.1f}% of the peak "
      "({:.1f} GFLOP/s: {} threads × {} measured at the start)\n",
      tps, med * 1e3, flops * 1e-9, 100 * mfu(flops, 1.0, peak), peak.gflops, peak.threads, peak.unit);
  fmt::print(
      "idle: the busiest-idle rank waits {:.1f} ms a step (median), for its groups and the gradient all-reduce\n",
      median(steps.idle) * 1e3);
  const double predicted = median(steps.predicted);
  if (cfg.calibrate)
    fmt::print("step time: measured {:.3f} s, the balancer predicted {:.3f} s (medians; measured/predicted {:.2f})\n",
               med, predicted, med / predicted);
  const train::MemoryEstimate need = predicted_memory(cfg, cp);
  fmt::print("memory per rank: predicted {}; measured peak RSS {} (largest over ranks; measured/predicted {:.3f})\n",
             need.describe(), train::format_bytes(peak_rss), peak_rss / need.total());
}

// Not collective. Throws Error for a model or optimizer flag given with --resume that differs
// from the checkpoint's setting (which would otherwise win silently), naming both values.
void check_resume_flags(const TrainOptions& o, const train::TrainConfig& ck) {
  const train::GptConfig& m = ck.model;
  auto str = [](auto x) { return fmt::format("{}", x); };  // each in its own type: equal means equal
  const std::vector<std::tuple<const char*, std::string, std::string>> fixed{
      {"--layers", str(o.layers), str(m.layers)},
      {"--width", str(o.width), str(m.width)},
      {"--heads", str(o.heads), str(m.heads)},
      {"--kv-heads", str(o.kv_heads), str(m.kv_heads)},
      {"--head-dim", str(o.head_dim), str(m.head_dim)},
      {"--hidden", str(o.hidden), str(m.hidden)},
      {"--batch", str(o.batch), str(ck.batch)},
      {"--seq", str(o.seq), str(ck.seq)},
      {"--lr", str(o.lr), str(ck.lr)},
      {"--warmup", str(o.warmup), str(ck.warmup)},
      {"--seed", str(o.seed), str(ck.seed)}};
  for (const auto& [flag, given, saved] : fixed)
    if (std::find(o.given.begin(), o.given.end(), flag) != o.given.end() && given != saved)
      throw Error(
          fmt::format("{} {} conflicts with the checkpoint {} ({} {}): a resumed run keeps its model and "
                      "optimizer settings; drop {} or start a new run",
                      flag, given, o.resume, flag, saved, flag));
}

// Collective. The run's settings: a checkpoint's, or the options'; errors agreed.
train::TrainConfig train_config(Communicator& comm, const TrainOptions& o, train::DataSource& data) {
  train::TrainConfig cfg;
  on_every_rank(comm, [&] {
    if (!o.resume.empty()) {
      cfg = train::Trainer::checkpoint_config(o.resume);
      check_resume_flags(o, cfg);
    } else {
      cfg.model = {256,
                   o.layers,
                   o.width,
                   o.heads,
                   o.kv_heads,
                   o.head_dim,
                   o.hidden > 0 ? o.hidden : train::GptConfig::swiglu_hidden(o.width)};
      cfg.batch = o.batch;
      cfg.seq = o.seq;
      cfg.lr = o.lr;
      cfg.warmup = o.warmup;
      cfg.seed = o.seed;
    }
    cfg.steps = o.steps;
    if (!o.dtype.empty()) cfg.dtype = parse_dtype(o.dtype);  // a mismatch with a checkpoint is refused by load()
    cfg.memory = {o.checkpoint_activations, o.tiled_mlp, o.tiled_loss, o.tile_rows};
    if (!o.max_memory.empty() || std::find(o.given.begin(), o.given.end(), "--max-memory") != o.given.end())
      cfg.max_memory = train::parse_bytes(o.max_memory);  // an empty one given is an error, not "no cap"
    if (o.dp < 1 || comm.size() % o.dp != 0)
      throw Error(
          fmt::format("--dp {} must divide the world size {} (cp = world / dp ranks per replica)", o.dp, comm.size()));
    cfg.dp = o.dp;
    cfg.balance = parse_policy(o.balance);
    if (o.lengths) cfg.lengths = parse_lengths(*o.lengths);
    cfg.tokens_per_step = o.tokens_per_step;
    // A step the balancer decides on is predicted for this machine (a fixed batch on one replica
    // has nothing to decide: no calibration, whose seconds would lengthen every small run).
    cfg.calibrate =
        !cfg.lengths.empty() || cfg.tokens_per_step > 0 || cfg.dp > 1 || cfg.balance != BalancePolicy::static_;
    cfg.cp = parse_strategy(o.strategy, o.strategy_options, comm.size() / o.dp);
    if (o.pack && o.data.empty()) throw Error("--pack needs --data FILE (the documents to pack)");
    if (o.tokens_per_step > 0 && o.data.empty())
      throw Error(fmt::format("--tokens-per-step {} samples whole documents: it needs --data FILE", o.tokens_per_step));
    if (!o.data.empty())
      data = o.pack                  ? train::DataSource::packed_documents(o.data, o.doc_separator, o.holdout)
             : o.tokens_per_step > 0 ? train::DataSource::documents(o.data, o.doc_separator, o.holdout)
                                     : train::DataSource::text_file(o.data, o.holdout);
  });
  return cfg;
}

bool given(const TrainOptions& o, const char* flag) {
  return std::find(o.given.begin(), o.given.end(), flag) != o.given.end();
}

// Not collective. Options that the rest of the command line would leave without effect: an
// error, never silently ignored.
void check_option_effects(const TrainOptions& o) {
  if (given(o, "--doc-separator") && !o.pack && o.tokens_per_step == 0)
    throw Error(
        "--doc-separator splits --data into documents for --pack or --tokens-per-step: without either it has no "
        "effect");
  for (const char* flag : {"--holdout", "--eval-every"})
    if (given(o, flag) && o.data.empty())
      throw Error(fmt::format("{} is about --data FILE's held-out text: without --data it has no effect", flag));
  if (given(o, "--save-every") && o.save.empty())
    throw Error("--save-every needs --save DIR (where to write the checkpoints)");
  if (given(o, "--tile-rows") && !o.tiled_mlp && !o.tiled_loss)
    throw Error("--tile-rows sizes the tiles of --tiled-mlp and --tiled-loss: without either it has no effect");
  // A variable-length step is its own sequences: --seq and --batch would size nothing.
  const char* variable = o.lengths ? "--lengths" : o.tokens_per_step > 0 ? "--tokens-per-step" : nullptr;
  for (const char* flag : {"--seq", "--batch"})
    if (variable != nullptr && given(o, flag))
      throw Error(
          fmt::format("{} has no effect with {}, whose steps are their own sequences: drop it", flag, variable));
}

// Collective. Whole documents, each its own sequence: every one (held-out ones too) that the
// static groups could not run is named before step 1, not at the step that draws it.
void check_documents(const train::TrainConfig& cfg, const train::DataSource& data, int cp) {
  std::string err = data.error_for(cfg.shape());
  if (err.empty() && data.whole_documents() && cfg.balance == BalancePolicy::static_) {
    CpConfig c = cfg.cp;
    c.causal = true;
    err = data.first_document_error([&](std::int64_t len) -> std::string {
      try {
        validate_cp_config(c, cp, Shape{1, len, cfg.model.heads, cfg.model.head_dim}, cfg.model.kv_heads);
      } catch (const Error& e) {
        return fmt::format("on the groups of {} ranks: {}", cp, e.what());
      }
      return "";
    });
  }
  if (!err.empty()) throw Error(err);
}

// Collective. Refuses, before anything is allocated or calibrated, a run predicted to need more
// per rank than --max-memory or than 90 % of what this machine has for each of its ranks
// (MemAvailable, or what the cgroup's limit still allows, shared by the node's ranks; the least
// over the nodes): the model errs by up to about 10 %, and MemAvailable moves while a run goes
// on. Sets the cap the trainer splits batches of same-length sequences under: --max-memory,
// else that 90 %.
void admit_memory(Communicator& comm, train::TrainConfig& cfg, int cp) {
  const MemoryRoom room = memory_room(comm);
  on_every_rank(comm, [&] {
    train::TrainConfig one = cfg;
    one.max_memory = 0;  // the largest batch alone: a longer run is split under the cap
    if (!one.lengths.empty()) one.lengths = {*std::max_element(one.lengths.begin(), one.lengths.end())};
    // pow2 and dynamic may give a long sequence every rank of the world (static: its replica's)
    const train::MemoryEstimate need = predicted_memory(one, cfg.balance == BalancePolicy::static_ ? cp : comm.size());
    if (cfg.max_memory > 0 && need.total() > cfg.max_memory)
      throw Error(fmt::format("the run needs a predicted {} per rank, more than --max-memory {}: {}", need.describe(),
                              train::format_bytes(cfg.max_memory), kMemoryRemedy));
    if (const std::string refusal = room.refusal("the run", need.total(), need.describe(), kMemoryRemedy);
        !refusal.empty())
      throw Error(refusal);
    if (cfg.max_memory <= 0 && room.known) cfg.max_memory = room.per_rank;
  });
}

// " (zigzag)" or " (per-document zigzag)" when `packed` documents change the layout, "" when contiguous.
std::string layout_note(const CpConfig& config, bool packed) {
  CpConfig probe = config;
  if (packed) probe.cu_seqlens = {0, 1};  // any documents: the layout packed steps get
  return uses_zigzag(probe) ? fmt::format(" ({})", layout_name(token_layout(probe))) : "";
}

void print_header(const train::TrainConfig& cfg, const train::DataSource& data, int cp, int threads,
                  const TrainOptions& o, std::int64_t resumed_at, const std::optional<Calibration>& calibration) {
  const auto& m = cfg.model;
  fmt::print("ulysses train: {} parameters ({} layers, width {}, {} heads / {} KV heads of {}, SwiGLU {})\n",
             m.num_params(), m.layers, m.width, m.heads, m.kv_heads, m.head_dim, m.hidden);
  fmt::print("  data: {}\n", data.describe());
  if (!cfg.lengths.empty())
    fmt::print("  every step: --lengths {} ({} sequences, {} tokens, each its own length)\n",
               describe_lengths(cfg.lengths), cfg.lengths.size(), sum(cfg.lengths));
  else if (cfg.tokens_per_step > 0)
    fmt::print("  every step: whole documents, each one sequence of its own length, up to {} tokens\n",
               cfg.tokens_per_step);
  else
    fmt::print("  every step: {} sequences x {} tokens\n", cfg.batch, cfg.seq);
  fmt::print("  dp {} x cp {} (--balance {}: {}); cp_comm_type {} x {} thread(s){}\n", cfg.dp, cp,
             policy_name(cfg.balance),
             cfg.balance == BalancePolicy::static_ ? "every sequence on one replica's ranks, dealt round-robin"
                                                   : "a CP group of its own size for every sequence",
             cfg.cp.cp_comm_type, threads, layout_note(cfg.cp, o.pack));
  const train::MemoryOptions& mo = cfg.memory;
  fmt::print("  attention dtype {} on {}{}\n", to_string(cfg.dtype), kernel_engine(cfg.dtype),
             cfg.dtype == DType::bf16 ? " (mixed precision: master weights, gradients, AdamW and the LM head float32)"
                                      : "");
  if (cfg.dtype == DType::bf16)
    fmt::print("  GEMMs: projections and MLP bf16 on oneDNN ({}), LM head float32 on OpenBLAS, core {}\n",
               kernels::onednn_bf16_implementation(cfg.seq, cfg.model.width, cfg.model.width), blas_core());
  else
    fmt::print("  GEMMs on OpenBLAS, core {}\n", blas_core());
  fmt::print("  memory per rank (predicted{}): {}{}{}{}\n",
             !cfg.lengths.empty()      ? ", the largest batch of same-length sequences on cp ranks or calibration"
             : cfg.tokens_per_step > 0 ? ", a step's documents on cp ranks or calibration"
                                       : "",
             predicted_memory(cfg, cp).describe(), mo.checkpoint_activations ? "; activation checkpointing" : "",
             mo.tiled_mlp ? "; tiled MLP" : "", mo.tiled_loss ? "; tiled loss" : "");
  if (const auto& c = calibration)
    fmt::print(
        "  calibrated: attention {:.1f} GFLOP/s (forward), layers {:.1f} GFLOP/s per rank; send/recv {:.2f} GB/s, "
        "{:.1f} us\n",
        c->cluster.peak_flops / 1e9, c->gemm_flops / 1e9, c->cluster.intra.bandwidth / 1e9,
        c->cluster.intra.latency * 1e6);
  if (o.timeout > 0)
    fmt::print("  watchdog: a wait over {:g} s ends the job, naming the operation (--timeout)\n", o.timeout);
  else
    fmt::print("  watchdog: off (--timeout 0: waits have no deadline)\n");
  if (!o.resume.empty()) fmt::print("  resumed from {} at step {}\n", o.resume, resumed_at);
  std::fflush(stdout);
}

// Not collective. Every file the run writes, against each other and the files it reads, before
// any work (ulysses/io/output_file.hpp's rules). A checkpoint may be saved over the one it resumed.
void check_files(const TrainOptions& o) {
  const std::string saved = o.save.empty() ? "" : o.save + "/checkpoint.bin";
  const std::string resumed = o.resume.empty() ? "" : o.resume + "/checkpoint.bin";
  check_outputs({{"--log", o.log}, {"--svg", o.svg}, {"--trace", o.trace}, {"--save", saved, false, true, "--resume"}},
                {{"--data", o.data}, {"--resume", resumed}});
}

// The trainer frees each phase's buffers as soon as it is done with them (the memory model's
// peak depends on it) and allocates them again next step. By default glibc hands blocks of its
// dynamic threshold and up back to the kernel (munmap, or trimming the heap's top), so every step
// faulted its buffers in again, page by zeroed page: 4 % of a step's cycles at s = 8192. Keep
// freed memory in the process instead; the peak RSS is unchanged (measured, docs/perf.md v23).
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: blocks above it are mapped anyway
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace

// Collective: the run's steps from the trainer's current one to the last, each reported (rank
// 0) and logged, the held-out loss of text every eval_every steps and after the last, and
// checkpoints every --save-every steps.
// `log`: rank 0's --log, else null.
Steps run_steps(Communicator& comm, train::Trainer& trainer, const TrainOptions& o, const Progress& progress,
                const train::DataSource& data, AppendFile* log) {
  const train::TrainConfig& cfg = trainer.config();
  const int rank = comm.rank();
  Steps steps;
  double acc_recent = -1;
  const bool held_out = !data.synthetic_task() && data.held_out_bytes() > 0 && o.eval_batches > 0;
  const std::int64_t eval_every = o.eval_every >= 0 ? o.eval_every : std::max<std::int64_t>(1, cfg.steps / 10);
  for (std::int64_t s = progress.first; s < cfg.steps; ++s) {
    const WatchdogStep named(comm, fmt::format("train step {}", s + 1));
    const train::StepResult r = trainer.step();
    steps.losses.push_back(r.loss);
    steps.seconds.push_back(r.seconds);
    steps.tps.push_back(double(r.tokens) / r.seconds);
    steps.flops.push_back(r.model_flops);
    steps.idle.push_back(*std::max_element(r.idle_s.begin(), r.idle_s.end()));
    steps.predicted.push_back(r.predicted_s);
    steps.peak_rss = r.peak_rss;
    if (r.accuracy >= 0) acc_recent = r.accuracy;
    const bool eval = held_out && ((eval_every > 0 && r.step % eval_every == 0) || r.step == cfg.steps);
    if (eval) steps.evals.emplace_back(r.step, trainer.evaluate(o.eval_batches));
    const auto report = [&] {
      report_step(log, progress, s, r, acc_recent, eval ? &steps.evals.back().second : nullptr);
    };
    if (o.log.empty() && rank == 0) report();
    if (!o.log.empty()) on_root(comm, report);  // a log that cannot be written stops every rank
    if (!o.save.empty() && o.save_every > 0 && r.step % o.save_every == 0) trainer.save(o.save);
  }
  return steps;
}

// Collective: the final evaluation (unless the last step had one), then rank 0's summary and
// loss curve.
void summarize(Communicator& comm, train::Trainer& trainer, const TrainOptions& o, const Steps& steps,
               const train::DataSource& data, const Peak& peak, int cp) {
  const train::TrainConfig& cfg = trainer.config();
  const train::Evaluation final_eval = !steps.evals.empty() && steps.evals.back().first == trainer.current_step()
                                           ? steps.evals.back().second
                                           : trainer.evaluate(o.eval_batches);
  on_root(comm, [&] {
    if (steps.losses.empty())
      fmt::print("nothing to do: the run is already at step {} of {}\n", trainer.current_step(), cfg.steps);
    else
      print_summary(steps, final_eval, steps.evals, data, peak, cfg, steps.peak_rss, cp);
    if (!o.svg.empty() && !steps.losses.empty())
      write_file_atomic(o.svg, svg_curve(steps.losses, fmt::format("ulysses train: loss, cp_comm_type {} on {} ranks",
                                                                   cfg.cp.cp_comm_type, cp)));
  });
}

int run_train(const TrainOptions& o) {
  keep_freed_memory();
  const std::unique_ptr<Communicator> world = make_communicator(o.backend.comm);
  Communicator& comm = *world;
  comm.set_timeout(o.timeout);
  const int rank = comm.rank();
  const int fallback = default_threads(comm);  // collective: on every rank, --threads given or not
  const int threads = o.threads > 0 ? o.threads : fallback;
  set_threads(threads);
  on_root(comm, [&] { check_files(o); });
  train::DataSource data = train::DataSource::synthetic();
  on_every_rank(comm, [&] { check_option_effects(o); });
  train::TrainConfig config = train_config(comm, o, data);
  const int cp = comm.size() / config.dp;
  on_every_rank(comm, [&] { check_documents(config, data, cp); });
  admit_memory(comm, config, cp);
  const train::TrainConfig& cfg = config;
  train::Trainer trainer(comm, cfg, data);  // validates everything, on every rank, before any work
  if (!o.resume.empty()) trainer.load(o.resume);
  if (rank == 0) print_header(cfg, data, cp, threads, o, trainer.current_step(), trainer.calibration());

  std::optional<AppendFile> log;  // rank 0's; a resumed run's keeps the lines through its checkpoint
  on_root(comm, [&] {
    if (!o.log.empty())
      log.emplace("--log", o.log, train::log_bytes_to_keep(o.log, o.resume.empty() ? -1 : trainer.current_step()));
  });
  std::optional<Tracer> tracer;
  if (!o.trace.empty()) tracer.emplace(comm);
  const Peak peak = measure_peak(comm, cfg.dtype, threads);
  if (rank == 0)
    fmt::print(
        "  peak for MFU: {} {:.1f} GFLOP/s per thread, {:.1f} over the job's {} threads (register-resident, "
        "measured now)\n",
        peak.unit, peak.gflops / peak.threads, peak.gflops, peak.threads);
  const Progress progress{
      trainer.current_step(), cfg.steps, std::chrono::steady_clock::now(), predicted_memory(cfg, cp).total(),
      to_string(cfg.dtype),   peak};
  const Steps steps = run_steps(comm, trainer, o, progress, data, log ? &*log : nullptr);
  on_root(comm, [&] {
    if (log) log->close();
  });
  if (tracer) {
    const std::vector<TraceEvent> events = tracer->events();
    tracer.reset();  // the steps only
    write_chrome_trace(comm, events, o.trace);
  }
  if (!o.save.empty()) trainer.save(o.save);

  summarize(comm, trainer, o, steps, data, peak, cp);
  return 0;
}

// ---- ulysses plan --train --------------------------------------------------------------------

namespace {

// The first registered strategy that runs `cfg`'s model on cp ranks with none of its options
// set (a2a while there are heads for every rank, then the ring): the one plan --train sizes.
std::string first_runnable(const train::TrainConfig& cfg, int cp) {
  for (const Strategy* strategy : strategies()) {
    CpConfig c = cfg.cp;
    c.cp_comm_type = strategy->name();
    try {
      validate_cp_config(c, cp, Shape{cfg.batch, 2 * cp, cfg.model.heads, cfg.model.head_dim}, cfg.model.kv_heads);
      return c.cp_comm_type;
    } catch (const Error&) {
      // not this one: the next
    }
  }
  throw Error(fmt::format("no strategy runs {} heads on {} ranks", cfg.model.heads, cp));
}

}  // namespace

int run_plan_train(const PlanOptions& o) {
  const std::unique_ptr<Communicator> world = make_communicator(o.backend.comm);
  Communicator& comm = *world;
  comm.set_timeout(o.timeout);
  on_root(comm, [&] {
    check_plan_option_effects(o, comm.size());
    train::TrainConfig cfg;
    const std::int64_t width = o.width > 0 ? o.width : o.heads * o.head_dim;
    const std::int64_t hidden = o.hidden > 0 ? o.hidden : train::GptConfig::swiglu_hidden(width);
    cfg.model = {256, o.layers, width, o.heads, o.kv_heads > 0 ? o.kv_heads : o.heads, o.head_dim, hidden};
    if (const std::string e = cfg.model.error(); !e.empty()) throw Error(e);
    cfg.batch = o.batch;
    cfg.dtype = parse_dtype(o.dtype);
    const double cap = train::parse_bytes(o.max_memory);
    fmt::print(
        "ulysses plan --train: {} parameters ({} layers, width {}, {} heads / {} KV heads of {}, SwiGLU {}), "
        "batch {}, {}, at most {} per rank\n",
        cfg.model.num_params(), cfg.model.layers, width, cfg.model.heads, cfg.model.kv_heads, o.head_dim, hidden,
        o.batch, to_string(cfg.dtype), train::format_bytes(cap));
    fmt::print("{:>5} {:>12} {:>18} {:>28} {:>10}\n", "cp", "strategy", "longest s (plain)", "longest s (ckpt+tiled)",
               "gain");
    for (int cp = 1; cp <= std::min(o.cp, 65536); cp *= 2) {
      cfg.cp.cp_comm_type = first_runnable(cfg, cp);
      cfg.memory = {};
      const std::int64_t plain = train::longest_sequence(cfg, cp, cap);
      cfg.memory = {true, true, true, o.tile_rows};
      const std::int64_t saved = train::longest_sequence(cfg, cp, cap);
      // 0: not one token fits under the cap; no gain over it to print.
      fmt::print("{:>5} {:>12} {:>18} {:>28} {:>10}\n", cp, cfg.cp.cp_comm_type, plain, saved,
                 plain > 0 ? fmt::format("{:.2f}x", double(saved) / double(plain)) : "-");
    }
  });
  return 0;
}

}  // namespace ulysses::cli
