#include "train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <tuple>

#include "train/checkpoint.hpp"
#include "train/memory.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/core/lengths.hpp"

namespace ulysses::train {

namespace {

// The configured strategy at a group of `size` ranks, resized by the strategy (its options
// that depend on the ranks), under the causal mask of a language model.
CpConfig config_at(const CpConfig& base, int size) {
  CpConfig c = find_strategy(base.cp_comm_type).config_for_size(base, size);
  c.causal = true;
  return c;
}

// Every member's tokens of `sequence` on `group`, the strategy resized to the group (`at`): its
// documents choose the layout (per-document zigzag on a ring), as they do inside the attention.
Placement placement(CpConfig at, const BalanceGroup& group, const SequenceLayout& sequence) {
  at.cu_seqlens = sequence.cu_seqlens;
  Placement p{group, {}};
  for (int j = 0; j < group.size; ++j) p.chunks.push_back(rank_chunks(at, group.size, j, sequence.length));
  return p;
}

// What one rank of a group of `cp` needs for `batch` sequences of `seq` tokens at once, the
// strategy resized to the group (`at`).
double memory_need(TrainConfig c, const CpConfig& at, std::int64_t batch, std::int64_t seq, int cp) {
  c.batch = batch;
  c.seq = seq;
  c.cp = at;
  return predict_memory(c, cp).total();
}

std::string config_error(const TrainConfig& c, int world) {
  std::string e = c.model.error();
  if (!e.empty()) return e;
  if (c.dp < 1 || world % c.dp != 0)
    return fmt::format("--dp {} must divide the world size {} (cp = world / dp ranks per replica)", c.dp, world);
  if (c.batch <= 0 || c.seq <= 0) return fmt::format("batch ({}) and seq ({}) must be positive", c.batch, c.seq);
  if (!c.lengths.empty() && c.tokens_per_step > 0)
    return fmt::format("--lengths and --tokens-per-step {} both say what a step holds: give one", c.tokens_per_step);
  if (c.memory.tile_rows <= 0) return fmt::format("tile rows must be positive, got {}", c.memory.tile_rows);
  if (c.steps < 0) return fmt::format("steps must not be negative, got {}", c.steps);
  if (!(c.lr > 0) || !(c.clip > 0) || !std::isfinite(c.lr) || !std::isfinite(c.clip))
    return fmt::format("lr ({}) and clip ({}) must be positive and finite", c.lr, c.clip);
  const int cp = world / c.dp;
  const bool fixed = c.lengths.empty() && c.tokens_per_step == 0;
  // static: the strategy at its groups' size, on the longest sequence a step may hold. Every
  // policy's steps are checked again, each sequence at its group's size, when they are planned.
  const std::int64_t longest = fixed               ? c.seq
                               : c.lengths.empty() ? c.tokens_per_step
                                                   : *std::max_element(c.lengths.begin(), c.lengths.end());
  try {
    if (c.balance == BalancePolicy::static_)
      validate_cp_config(config_at(c.cp, cp), cp, {fixed ? c.batch : 1, longest, c.model.heads, c.model.head_dim},
                         c.model.kv_heads);
  } catch (const Error& err) {
    return err.what();
  }
  // batch × seq under static: each replica runs its ceil(batch / dp) sequences as one batch.
  TrainConfig one = c;
  one.batch = (c.batch + c.dp - 1) / c.dp;
  const MemoryEstimate need = predict_memory(one, cp);
  if (fixed && c.balance == BalancePolicy::static_ && c.max_memory > 0 && need.total() > c.max_memory)
    return fmt::format(
        "the run needs a predicted {} per rank, more than --max-memory {}: turn on "
        "--checkpoint-activations --tiled-mlp --tiled-loss, use more ranks, or a shorter --seq "
        "(`ulysses plan --train` gives the longest that fits)",
        need.describe(), format_bytes(c.max_memory));
  return "";
}

// Same-length sequences that the cap split into several runs share them out evenly: the greedy
// fill leaves full runs and a short last one (a full batch then a remainder measured 1.2x the
// model's prediction of the full one); equal pieces, none larger than the greedy one (so each
// fits), are the shape the model prices.
void equalize(std::vector<Trainer::Run>& runs, const std::vector<SequenceLayout>& seqs) {
  std::map<std::tuple<int, int, std::int64_t>, std::vector<std::size_t>> split;  // key -> its runs, in order
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const SequenceLayout& first = seqs[std::size_t(runs[r].sequences.front())];
    if (first.cu_seqlens.empty()) split[{runs[r].group.first_rank, runs[r].group.size, first.length}].push_back(r);
  }
  for (const auto& [key, rs] : split) {
    if (rs.size() < 2) continue;
    std::vector<int> all;
    for (std::size_t r : rs) all.insert(all.end(), runs[r].sequences.begin(), runs[r].sequences.end());
    const std::size_t base = all.size() / rs.size(), extra = all.size() % rs.size();
    auto at = all.begin();
    for (std::size_t j = 0; j < rs.size(); ++j) {
      const auto take = std::ptrdiff_t(base + (j < extra ? 1 : 0));
      runs[rs[j]].sequences.assign(at, at + take);
      at += take;
    }
  }
}

// Sequences of one group and one length (and no packed documents) run as one batch: bigger
// GEMMs, the same numbers. Runs execute in order of their first sequence; every member of a
// group sees the same runs in the same order, so the lowest unfinished run always has all its
// ranks at it (balancer.hpp's argument, with runs for sequences). Under a memory cap a run
// grows only while its batch fits.
std::vector<Trainer::Run> runs_of(const std::vector<SequenceLayout>& seqs, const BalancePlan& plan,
                                  const std::function<bool(std::size_t, std::int64_t, int)>& fits) {
  std::vector<Trainer::Run> runs;
  std::map<std::tuple<int, int, std::int64_t>, std::size_t> open;  // (first, size, length) -> run
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const BalanceGroup g = plan.groups[i];
    const auto key = std::make_tuple(g.first_rank, g.size, seqs[i].length);
    const auto it = open.find(key);
    if (seqs[i].cu_seqlens.empty() && it != open.end() &&
        fits(runs[it->second].sequences.size() + 1, seqs[i].length, g.size)) {
      runs[it->second].sequences.push_back(int(i));
      continue;
    }
    runs.push_back({g, {int(i)}});
    if (seqs[i].cu_seqlens.empty()) open[key] = runs.size() - 1;
  }
  equalize(runs, seqs);
  return runs;
}

}  // namespace

Trainer::Trainer(Communicator& comm, TrainConfig config, DataSource data)
    : comm_(comm), cfg_(std::move(config)), data_(std::move(data)),
      model_(cfg_.model, cfg_.memory, cfg_.dtype == DType::bf16), groups_(comm) {
  std::string err = config_error(cfg_, comm.size());
  if (err.empty()) err = data_.error_for(cfg_.shape());
  if (err.empty() && data_.packed() && cfg_.batch != 1 && cfg_.lengths.empty())
    err = fmt::format(
        "--pack puts the documents into one sequence per step: use --batch 1 (and a longer --seq), "
        "got --batch {}",
        cfg_.batch);
  comm.agree(err);
  cfg_.cp.causal = true;
  model_.init_params(cfg_.seed);
  if (cfg_.calibrate) {
    calibration_ = calibrate(comm, cfg_.model.head_dim, cfg_.dtype);
    calibration_->gemm_flops = layers_rate();
  }
  m_.assign(model_.params.size(), 0.0f);
  v_.assign(model_.params.size(), 0.0f);
  decay_.assign(model_.params.size(), 1);  // no weight decay on the norms' gains
  auto no_decay = [&](std::int64_t off) { std::fill_n(decay_.begin() + off, cfg_.model.width, 0); };
  for (const auto& L : model_.layout.layer) {
    no_decay(L.rms1);
    no_decay(L.rms2);
  }
  no_decay(model_.layout.rmsf);
}

double Trainer::gemm_flops_per_token() const {
  return 6.0 * double(model_.layout.total - cfg_.model.vocab * cfg_.model.width);  // the embedding is a lookup
}

// A BLAS GEMM of one shape (what calibrate() times) ran 1.2-1.4x faster per FLOP than the
// trainer's layers do on the same rows (bench/train_balance.sh's traces, 2 ranks busy at once):
// the layers also run the norms, RoPE, SwiGLU, the loss and GEMMs of other shapes, all per
// token. So the rate the balancer prices a token's non-attention work at is timed on the
// model itself: one forward + backward of kProbeTokens tokens on each rank's own 1-rank
// group, every rank at once as in a step, less the attention kernels' time; the slowest rank's.
double Trainer::layers_rate() {
  constexpr std::int64_t kProbeTokens = 1024;
  std::vector<BalanceGroup> alone;
  for (int r = 0; r < comm_.size(); ++r) alone.push_back({r, 1});
  groups_.ensure(alone);
  CpAttention& att = attention_for(alone[std::size_t(comm_.rank())], config_at(cfg_.cp, 1));
  att.reshape(1, kProbeTokens);
  att.set_documents({});
  std::vector<int> tokens(kProbeTokens), argmax(kProbeTokens);
  std::vector<std::int64_t> pos(kProbeTokens);
  for (std::int64_t t = 0; t < kProbeTokens; ++t) {
    tokens[std::size_t(t)] = int(t % cfg_.model.vocab);
    pos[std::size_t(t)] = t;
  }
  std::vector<double> attention_s;
  double seconds = local_median_seconds(comm_, [&] {
    model_.forward(att, tokens.data(), tokens.data(), pos.data(), 1, kProbeTokens, 1.0f / kProbeTokens, argmax.data());
    model_.backward(att);
    attention_s.push_back(att.stats().compute_s);
  });
  std::sort(attention_s.begin(), attention_s.end());
  seconds = std::max(1e-9, seconds - attention_s[attention_s.size() / 2]);  // medians of the same runs
  comm_.allreduce_max(&seconds, 1);
  std::fill(model_.grads.begin(), model_.grads.end(), 0.0f);
  return gemm_flops_per_token() * double(kProbeTokens) / seconds;
}

BalanceInput Trainer::balance_input(const std::vector<SequenceLayout>& seqs) const {
  BalanceInput in;
  for (const SequenceLayout& l : seqs) in.lengths.push_back(l.length);
  in.world = comm_.size();
  in.dp = cfg_.dp;
  const GptConfig& m = cfg_.model;
  in.model.heads = m.heads;
  in.model.kv_heads = m.kv_heads;
  in.model.head_dim = m.head_dim;
  in.model.layers = m.layers;
  in.model.causal = true;
  in.model.dtype = cfg_.dtype;
  in.cp_comm_type = cfg_.cp.cp_comm_type;
  if (calibration_) {
    in.model.cluster = calibration_->cluster;
    in.gemm_flops_rate = calibration_->gemm_flops;
  }
  in.gemm_flops_per_token = gemm_flops_per_token();
  const TrainConfig c = cfg_;
  in.memory_per_rank = [c](std::int64_t len, int cp) { return memory_need(c, config_at(c.cp, cp), 1, len, cp); };
  in.max_memory = cfg_.max_memory;
  return in;
}

Trainer::StepPlan Trainer::plan_step(std::int64_t data_step, bool held_out) {
  StepPlan p;
  std::string err;
  try {
    p.sequences = data_.step_layout(cfg_.shape(), cfg_.seed, data_step, held_out);
    if (p.sequences.empty())
      throw Error(fmt::format("step {} has no sequences (an empty batch): the data gives none", data_step + 1));
    for (const SequenceLayout& l : p.sequences) p.targets += l.targets;
    if (p.targets == 0)
      throw Error(fmt::format("step {} has no labels to train on ({} sequences of {} tokens)", data_step + 1,
                              p.sequences.size(), describe_lengths(balance_input(p.sequences).lengths)));
    p.plan = balance(balance_input(p.sequences), cfg_.balance);
    place_sequences(p);
    const TrainConfig c = cfg_;
    p.runs = runs_of(p.sequences, p.plan, [&c, &p](std::size_t batch, std::int64_t len, int cp) {
      return c.max_memory <= 0 || memory_need(c, p.configs.at(cp), std::int64_t(batch), len, cp) <= c.max_memory;
    });
  } catch (const Error& e) {
    err = e.what();
  }
  comm_.agree(err);
  return p;
}

void Trainer::place_sequences(StepPlan& p) const {
  for (std::size_t i = 0; i < p.sequences.size(); ++i) {
    const BalanceGroup& g = p.plan.groups[i];
    const std::int64_t len = p.sequences[i].length;
    auto it = p.configs.find(g.size);  // resized once per group size
    if (it == p.configs.end()) it = p.configs.emplace(g.size, config_at(cfg_.cp, g.size)).first;
    const CpConfig& at = it->second;
    validate_cp_config(at, g.size, {1, len, cfg_.model.heads, cfg_.model.head_dim}, cfg_.model.kv_heads);
    const double need = memory_need(cfg_, at, 1, len, g.size);
    if (cfg_.max_memory > 0 && need > cfg_.max_memory)
      throw Error(
          fmt::format("sequence {} ({} tokens) needs a predicted {} per rank on its group of {} ranks "
                      "({} policy), more than --max-memory {}",
                      i, len, format_bytes(need), g.size, policy_name(cfg_.balance), format_bytes(cfg_.max_memory)));
    p.placements.push_back(placement(at, g, p.sequences[i]));
  }
}

CpAttention& Trainer::attention_for(const BalanceGroup& g, const CpConfig& config) {
  std::unique_ptr<CpAttention>& a = attention_[{g.first_rank, g.size}];
  if (!a) a = std::make_unique<CpAttention>(groups_.get(g), config, cfg_.model, 1, 1, cfg_.dtype);
  return *a;
}

void Trainer::run_sequences(const Run& run, const StepPlan& p, const std::map<int, Shard>& shards, float scale,
                            bool train, Sums& sums) {
  const BalanceGroup g = run.group;
  const SequenceLayout& first = p.sequences[std::size_t(run.sequences.front())];
  std::vector<std::int64_t> pos = token_positions(p.placements[std::size_t(run.sequences.front())].of(comm_.rank()));
  for (std::int64_t& q : pos) q -= document_of(first.cu_seqlens, q).begin;  // RoPE: each document from 0
  const std::int64_t n = std::int64_t(pos.size()), B = std::int64_t(run.sequences.size());
  std::vector<int> tokens(std::size_t(B * n)), labels(tokens.size()), argmax(tokens.size());
  std::vector<std::uint8_t> scored(tokens.size());
  for (std::int64_t b = 0; b < B; ++b) {
    const Shard& s = shards.at(run.sequences[std::size_t(b)]);
    for (std::int64_t t = 0; t < n; ++t) {
      const std::size_t dst = std::size_t(b * n + t), src = std::size_t(3 * t);
      tokens[dst] = s[src];
      labels[dst] = s[src + 1];
      scored[dst] = std::uint8_t(s[src + 2]);
    }
  }
  CpAttention& att = attention_for(g, p.configs.at(g.size));
  att.reshape(B, n);
  att.set_documents(first.cu_seqlens);
  const double t0 = comm_.now();
  sums.loss += double(model_.forward(att, tokens.data(), labels.data(), pos.data(), B, n, scale, argmax.data()));
  if (train) {
    model_.backward(att);
  } else {
    for (int l = 0; l < cfg_.model.layers; ++l) att.release(l);  // no backward follows
  }
  const CpStats st = att.stats();
  sums.attention += st;
  sums.busy_s += comm_.now() - t0 - st.comm_exposed_s;
  for (std::size_t i = 0; i < argmax.size(); ++i)
    if (scored[i]) {
      sums.correct += argmax[i] == labels[i];
      sums.answers += 1;
    }
  comm_.trace(fmt::format("{} x {} tokens on ranks {}-{}", B, first.length, g.first_rank, g.first_rank + g.size - 1),
              t0, comm_.now(), "compute");
}

Trainer::Sums Trainer::run_step(const StepPlan& p, std::int64_t data_step, bool held_out, bool train) {
  groups_.ensure(p.plan.groups);
  std::map<int, Batch> loaded;
  for (int i = 0; i < int(p.sequences.size()); ++i)
    if (loader_of(i, comm_.size()) == comm_.rank())
      loaded.emplace(i, data_.sequence(p.sequences[std::size_t(i)], cfg_.seed, data_step, held_out));
  const std::map<int, Shard> shards = deal_sequences(comm_, p.placements, loaded);
  if (train) std::fill(model_.grads.begin(), model_.grads.end(), 0.0f);
  const float scale = train ? 1.0f / float(p.targets) : 1.0f;
  Sums sums;
  for (const Run& r : p.runs)
    if (r.group.contains(comm_.rank())) run_sequences(r, p, shards, scale, train, sums);
  const double t_idle = comm_.now();
  if (train) comm_.allreduce_sum(model_.grads.data(), model_.grads.size(), "grad_allreduce");
  double s[3] = {sums.loss, sums.correct, sums.answers};
  comm_.allreduce_sum(s, 3, "loss_allreduce");
  comm_.trace("idle: the other ranks' sequences and the all-reduce", t_idle, comm_.now(), "wait");
  sums.loss = s[0];
  sums.correct = s[1];
  sums.answers = s[2];
  return sums;
}

double Trainer::compute_gradients(std::int64_t data_step) {
  const StepPlan p = plan_step(data_step, false);
  return run_step(p, data_step, false, true).loss / double(p.targets);
}

StepResult Trainer::step() {
  comm_.barrier();
  const double t0 = comm_.now();
  StepResult r;
  const StepPlan p = plan_step(step_, false);
  const Sums sums = run_step(p, step_, false, true);
  r.loss = sums.loss / double(p.targets);
  r.accuracy = sums.answers > 0 ? sums.correct / sums.answers : -1.0;
  double norm2 = 0;
  for (float g : model_.grads) norm2 += double(g) * double(g);
  r.grad_norm = std::sqrt(norm2);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))  // the same on every rank: both are all-reduced
    throw Error(
        fmt::format("training diverged at step {}: loss {}, gradient norm {}; stopped before the update "
                    "(the last checkpoint is kept; try a smaller --lr)",
                    step_ + 1, r.loss, r.grad_norm));
  const float clip = r.grad_norm > cfg_.clip ? float(cfg_.clip / r.grad_norm) : 1.0f;
  const std::int64_t t = step_ + 1;
  const float lr = cfg_.lr * std::min(1.0f, float(t) / float(std::max<std::int64_t>(1, cfg_.warmup)));
  const float bc1 = 1.0f - std::pow(cfg_.beta1, float(t)), bc2 = 1.0f - std::pow(cfg_.beta2, float(t));
  for (std::size_t i = 0; i < model_.params.size(); ++i) {  // AdamW, decoupled weight decay
    const float g = model_.grads[i] * clip;
    m_[i] = cfg_.beta1 * m_[i] + (1.0f - cfg_.beta1) * g;
    v_[i] = cfg_.beta2 * v_[i] + (1.0f - cfg_.beta2) * g * g;
    const float update = (m_[i] / bc1) / (std::sqrt(v_[i] / bc2) + cfg_.eps);
    model_.params[i] -= lr * (update + (decay_[i] ? cfg_.weight_decay * model_.params[i] : 0.0f));
  }
  if (!std::all_of(model_.params.begin(), model_.params.end(), [](float p) { return std::isfinite(p); }))
    throw Error(
        fmt::format("training diverged at step {}: the update made weights non-finite (the last checkpoint "
                    "is kept; try a smaller --lr)",
                    t));
  step_ = t;
  r.step = t;
  r.attention = sums.attention;
  r.sequences = std::int64_t(p.sequences.size());
  for (const SequenceLayout& l : p.sequences) {
    r.tokens += l.length;
    r.model_flops += cfg_.model.train_flops(l.length);
  }
  r.predicted_s = p.plan.step_seconds;
  const double wall = comm_.now() - t0;
  comm_.trace(fmt::format("train step {}", t), t0, comm_.now(), "phase");
  const double idle = wall - sums.busy_s;
  r.idle_s.resize(std::size_t(comm_.size()));
  comm_.allgather(&idle, r.idle_s.data(), sizeof(double), "idle_allgather");
  double dt_rss[2] = {wall, peak_rss_bytes()};
  comm_.allreduce_max(dt_rss, 2);
  r.seconds = dt_rss[0];
  r.peak_rss = dt_rss[1];
  return r;
}

double Evaluation::bits_per_byte() const { return loss < 0 ? -1.0 : loss / std::log(2.0); }

Evaluation Trainer::evaluate(std::int64_t batches) {
  if (batches <= 0 || (!data_.synthetic_task() && data_.held_out_bytes() == 0)) return {};
  double loss = 0, targets = 0, correct = 0, answers = 0;
  for (std::int64_t i = 0; i < batches; ++i) {
    const StepPlan p = plan_step(i, true);
    const Sums s = run_step(p, i, true, false);
    loss += s.loss;
    targets += double(p.targets);
    correct += s.correct;
    answers += s.answers;
  }
  return {loss / targets, data_.synthetic_task() && answers > 0 ? correct / answers : -1.0};
}

void Trainer::save(const std::string& dir) const {
  std::string err;
  if (comm_.rank() == 0) {
    try {
      write_checkpoint(dir, cfg_, step_, model_.params, m_, v_);
    } catch (const std::exception& e) {
      err = fmt::format("--save {}: {}", dir, e.what());
    }
  }
  comm_.agree(err);
}

TrainConfig Trainer::checkpoint_config(const std::string& dir) { return read_checkpoint(dir).config; }

void Trainer::load(const std::string& dir) {
  std::string err;
  Checkpoint c;
  try {
    c = read_checkpoint(dir);
    if (c.config.dtype != cfg_.dtype)
      throw Error(
          fmt::format("checkpoint {} was trained with --dtype {}; this run has --dtype {} (resume with --dtype {})",
                      dir, to_string(c.config.dtype), to_string(cfg_.dtype), to_string(c.config.dtype)));
    if (!c.config.same_run(cfg_))
      throw Error(
          fmt::format("checkpoint {} belongs to another run (model, batch, seq, optimizer or seed differ)", dir));
  } catch (const Error& e) {
    err = e.what();
  }
  comm_.agree(err);
  model_.params = std::move(c.params);
  m_ = std::move(c.m);
  v_ = std::move(c.v);
  step_ = c.step;
}

}  // namespace ulysses::train
