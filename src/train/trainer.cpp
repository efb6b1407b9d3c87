#include "train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "train/memory.hpp"
#include "ulysses/input_file.hpp"
#include "ulysses/output_file.hpp"
#include "ulysses/checked.hpp"
#include "ulysses/documents.hpp"
#include "ulysses/error.hpp"

namespace ulysses::train {

bool TrainConfig::same_run(const TrainConfig& o) const {
  return model == o.model && batch == o.batch && seq == o.seq && warmup == o.warmup && lr == o.lr &&
         beta1 == o.beta1 && beta2 == o.beta2 && eps == o.eps && weight_decay == o.weight_decay && clip == o.clip &&
         seed == o.seed && dtype == o.dtype;
}

namespace {

std::string config_error(const TrainConfig& c, int cp) {
  std::string e = c.model.error();
  if (!e.empty()) return e;
  if (c.batch <= 0 || c.seq <= 0) return fmt::format("batch ({}) and seq ({}) must be positive", c.batch, c.seq);
  if (c.memory.tile_rows <= 0) return fmt::format("tile rows must be positive, got {}", c.memory.tile_rows);
  if (c.steps < 0) return fmt::format("steps must not be negative, got {}", c.steps);
  if (!(c.lr > 0) || !(c.clip > 0) || !std::isfinite(c.lr) || !std::isfinite(c.clip))
    return fmt::format("lr ({}) and clip ({}) must be positive and finite", c.lr, c.clip);
  try {
    validate_cp_config(c.cp, cp, {c.batch, c.seq, c.model.heads, c.model.head_dim}, c.model.kv_heads);
  } catch (const Error& err) {
    return err.what();
  }
  const MemoryEstimate need = predict_memory(c, cp);
  if (c.max_memory > 0 && need.total() > c.max_memory)
    return fmt::format("the run needs a predicted {} per rank, more than --max-memory {}: turn on "
                       "--checkpoint-activations --tiled-mlp --tiled-loss, use more ranks, or a shorter --seq "
                       "(`ulysses plan --train` gives the longest that fits)",
                       need.describe(), format_bytes(c.max_memory));
  return "";
}

}  // namespace

Trainer::Trainer(Communicator& comm, TrainConfig config, DataSource data)
    : comm_(comm), cfg_(std::move(config)), data_(std::move(data)), model_(cfg_.model, cfg_.memory) {
  std::string err = config_error(cfg_, comm.size());
  if (err.empty()) err = data_.error_for(cfg_.seq);
  if (err.empty() && data_.packed() && cfg_.batch != 1)
    err = fmt::format("--pack puts the documents into one sequence per step: use --batch 1 (and a longer --seq), "
                      "got --batch {}", cfg_.batch);
  comm.agree(err);
  cfg_.cp.causal = true;
  chunks_ = rank_chunks(cfg_.cp, comm.size(), comm.rank(), cfg_.seq);
  positions_ = token_positions(chunks_);
  attention_ = std::make_unique<CpAttention>(comm, cfg_.cp, cfg_.model, cfg_.batch, std::int64_t(positions_.size()),
                                             cfg_.dtype);
  model_.init_params(cfg_.seed);
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

Trainer::Local Trainer::shard(const Batch& b) const {
  const std::int64_t n = std::int64_t(positions_.size());
  Local l{std::vector<int>(std::size_t(b.batch * n)), std::vector<int>(std::size_t(b.batch * n)),
          std::vector<std::uint8_t>(std::size_t(b.batch * n)), positions_, b.cu_seqlens, b.targets()};
  for (std::int64_t& p : l.positions) p -= document_of(b.cu_seqlens, p).begin;  // each document from 0
  for (std::int64_t i = 0; i < b.batch; ++i)
    for (std::int64_t t = 0; t < n; ++t) {
      const std::size_t src = std::size_t(i * b.seq + positions_[std::size_t(t)]), dst = std::size_t(i * n + t);
      l.tokens[dst] = b.tokens[src];
      l.labels[dst] = b.labels[src];
      l.scored[dst] = b.scored[src];
    }
  return l;
}

double Trainer::forward_backward(const Local& d, double* correct_and_count) {
  const std::int64_t n = std::int64_t(positions_.size());
  std::fill(model_.grads.begin(), model_.grads.end(), 0.0f);
  std::vector<int> argmax(d.tokens.size());
  const float scale = 1.0f / float(d.targets);
  attention_->set_documents(d.cu_seqlens);
  double sums[3] = {double(model_.forward(*attention_, d.tokens.data(), d.labels.data(), d.positions.data(), cfg_.batch,
                                          n, scale, argmax.data())),
                    0.0, 0.0};
  for (std::size_t i = 0; i < argmax.size(); ++i)
    if (d.scored[i]) {
      sums[1] += argmax[i] == d.labels[i];
      sums[2] += 1;
    }
  model_.backward(*attention_);
  comm_.allreduce_sum(model_.grads.data(), model_.grads.size(), "grad_allreduce");
  comm_.allreduce_sum(sums, 3, "loss_allreduce");
  if (correct_and_count) {
    correct_and_count[0] = sums[1];
    correct_and_count[1] = sums[2];
  }
  return sums[0] / double(d.targets);
}

double Trainer::compute_gradients(std::int64_t data_step) {
  return forward_backward(shard(data_.batch(cfg_.batch, cfg_.seq, cfg_.seed, data_step)), nullptr);
}

StepResult Trainer::step() {
  comm_.barrier();
  const double t0 = comm_.now();
  StepResult r;
  double cc[2];
  r.loss = forward_backward(shard(data_.batch(cfg_.batch, cfg_.seq, cfg_.seed, step_)), cc);
  r.accuracy = cc[1] > 0 ? cc[0] / cc[1] : -1.0;
  double norm2 = 0;
  for (float g : model_.grads) norm2 += double(g) * double(g);
  r.grad_norm = std::sqrt(norm2);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))  // the same on every rank: both are all-reduced
    throw Error(fmt::format("training diverged at step {}: loss {}, gradient norm {}; stopped before the update "
                            "(the last checkpoint is kept; try a smaller --lr)", step_ + 1, r.loss, r.grad_norm));
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
    throw Error(fmt::format("training diverged at step {}: the update made weights non-finite (the last checkpoint "
                            "is kept; try a smaller --lr)", t));
  step_ = t;
  r.step = t;
  r.attention = attention_->stats();
  comm_.trace(fmt::format("train step {}", t), t0, comm_.now(), "phase");
  double dt_rss[2] = {comm_.now() - t0, peak_rss_bytes()};
  comm_.allreduce_max(dt_rss, 2);
  r.seconds = dt_rss[0];
  r.peak_rss = dt_rss[1];
  return r;
}

double Evaluation::bits_per_byte() const { return loss < 0 ? -1.0 : loss / std::log(2.0); }

Evaluation Trainer::evaluate(std::int64_t batches) {
  if (batches <= 0 || (!data_.synthetic_task() && data_.held_out_bytes() == 0)) return {};
  double sums[4] = {0, 0, 0, 0};  // loss, labels, answers right, answers
  const std::int64_t n = std::int64_t(positions_.size());
  for (std::int64_t i = 0; i < batches; ++i) {
    const Batch b = data_.held_out_batch(cfg_.batch, cfg_.seq, cfg_.seed, i);
    const Local d = shard(b);
    std::vector<int> argmax(d.tokens.size());
    attention_->set_documents(d.cu_seqlens);
    sums[0] += double(model_.forward(*attention_, d.tokens.data(), d.labels.data(), d.positions.data(), cfg_.batch, n,
                                     1.0f, argmax.data()));
    sums[1] += comm_.rank() == 0 ? double(d.targets) : 0.0;  // a global count: once
    for (std::size_t j = 0; j < argmax.size(); ++j)
      if (d.scored[j]) {
        sums[2] += argmax[j] == d.labels[j];
        sums[3] += 1;
      }
  }
  for (int l = 0; l < cfg_.model.layers; ++l) attention_->release(l);  // no backward follows
  comm_.allreduce_sum(sums, 4, "eval_allreduce");
  return {sums[0] / sums[1], data_.synthetic_task() && sums[3] > 0 ? sums[2] / sums[3] : -1.0};
}

double Trainer::flops_per_step() const {
  const GptConfig& c = cfg_.model;
  const double tokens = double(cfg_.batch * cfg_.seq);
  const double matmul_params = double(model_.layout.total - c.vocab * c.width);  // the embedding is a lookup
  const double attention = double(c.layers) * 3.5 * 2.0 * double(cfg_.batch) * double(cfg_.seq) *
                           double(cfg_.seq) * double(c.heads * c.head_dim);  // causal: half of 4·b·s²·h·d
  return 6.0 * matmul_params * tokens + attention;
}

// ---- checkpoints --------------------------------------------------------------------------

namespace {

constexpr char kMagic[8] = {'U', 'L', 'Y', 'C', 'K', 'P', 'T', '1'};

std::uint64_t fnv1a(const char* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ std::uint8_t(p[i])) * 0x100000001b3ull;
  return h;
}

std::string header_of(const TrainConfig& c, std::int64_t step) {
  const GptConfig& m = c.model;
  return fmt::format(
      "vocab {}\nlayers {}\nwidth {}\nheads {}\nkv_heads {}\nhead_dim {}\nhidden {}\nbatch {}\nseq {}\nsteps {}\n"
      "warmup {}\nlr {:a}\nbeta1 {:a}\nbeta2 {:a}\neps {:a}\nweight_decay {:a}\nclip {:a}\nseed {}\nstep {}\n"
      "dtype {}\n",
      m.vocab, m.layers, m.width, m.heads, m.kv_heads, m.head_dim, m.hidden, c.batch, c.seq, c.steps, c.warmup, c.lr,
      c.beta1, c.beta2, c.eps, c.weight_decay, c.clip, c.seed, step, to_string(c.dtype));
}

struct Checkpoint {
  TrainConfig config;
  std::int64_t step = 0;
  std::vector<float> params, m, v;
};

void put_u64(std::string& s, std::uint64_t x) { s.append(reinterpret_cast<const char*>(&x), 8); }

std::uint64_t get_u64(const std::string& s, std::size_t at) {
  std::uint64_t x;
  std::memcpy(&x, s.data() + at, 8);
  return x;
}

// Each header field and the range a checkpoint may hold in it; anything else is corruption.
struct Field {
  const char* key;
  double lo, hi;
};
constexpr Field kFields[] = {
    {"vocab", 1, 256},        {"layers", 1, 4096},      {"width", 1, 1 << 20},   {"heads", 1, 1 << 16},
    {"kv_heads", 1, 1 << 16}, {"head_dim", 1, 1 << 16}, {"hidden", 1, 1 << 22},  {"batch", 1, 1 << 30},
    {"seq", 1, 1ll << 40},    {"steps", 0, 1ll << 62},  {"warmup", 0, 1ll << 62}, {"lr", 0, 1e6},
    {"beta1", 0, 1},          {"beta2", 0, 1},          {"eps", 0, 1},           {"weight_decay", 0, 1e6},
    {"clip", 0, 1e30},        {"seed", 0, 1.9e19},      {"step", 0, 1ll << 62}};

// The header's fields by name, each parsed and checked against kFields; `bad` makes the Error.
template <class Bad>
std::map<std::string, std::string> header_fields(const std::string& text, const Bad& bad) {
  std::map<std::string, std::string> fields;
  std::istringstream hdr(text);
  std::string key, val;
  while (hdr >> key >> val) {
    const bool optional = key == "dtype";  // older checkpoints have none: f32
    const auto f = std::find_if(std::begin(kFields), std::end(kFields), [&](const Field& x) { return key == x.key; });
    if (f == std::end(kFields) && !optional) throw bad(fmt::format("unknown header field '{}'", key.substr(0, 40)));
    if (!fields.emplace(key, val).second) throw bad(fmt::format("field {} appears twice", key));
  }
  for (const Field& f : kFields)
    if (!fields.count(f.key)) throw bad(fmt::format("field {} is missing", f.key));
  return fields;
}

// Field `key` as an integer in its range.
template <class T, class Bad>
T int_field(const std::map<std::string, std::string>& fields, const char* key, const Bad& bad) {
  const Field& f = *std::find_if(std::begin(kFields), std::end(kFields), [&](const Field& x) { return !std::strcmp(key, x.key); });
  const std::string& val = fields.at(key);
  T x{};
  const auto [end, ec] = std::from_chars(val.data(), val.data() + val.size(), x);
  if (ec != std::errc() || end != val.data() + val.size() || double(x) < f.lo || double(x) > f.hi)
    throw bad(fmt::format("field {} '{}' is not an integer in [{}, {}]", key, val.substr(0, 40), f.lo, f.hi));
  return x;
}

// Field `key` as a finite float in its range (the writer uses hex floats, "{:a}").
template <class Bad>
float float_field(const std::map<std::string, std::string>& fields, const char* key, const Bad& bad) {
  const Field& f = *std::find_if(std::begin(kFields), std::end(kFields), [&](const Field& x) { return !std::strcmp(key, x.key); });
  const std::string& val = fields.at(key);
  char* end = nullptr;
  const float x = std::strtof(val.c_str(), &end);
  if (end != val.c_str() + val.size() || !std::isfinite(x) || x < f.lo || x > f.hi)
    throw bad(fmt::format("field {} '{}' is not a number in [{}, {}]", key, val.substr(0, 40), f.lo, f.hi));
  return x;
}

// The configuration and step a checkpoint header declares, every field checked.
template <class Bad>
void parse_header(const std::string& text, Checkpoint& c, const Bad& bad) {
  const auto fields = header_fields(text, bad);
  auto i = [&](const char* key) { return int_field<std::int64_t>(fields, key, bad); };
  auto f = [&](const char* key) { return float_field(fields, key, bad); };
  GptConfig& m = c.config.model;
  m = {i("vocab"), i("layers"), i("width"), i("heads"), i("kv_heads"), i("head_dim"), i("hidden")};
  TrainConfig& t = c.config;
  t.batch = i("batch");
  t.seq = i("seq");
  t.steps = i("steps");
  t.warmup = i("warmup");
  t.lr = f("lr");
  t.beta1 = f("beta1");
  t.beta2 = f("beta2");
  t.eps = f("eps");
  t.weight_decay = f("weight_decay");
  t.clip = f("clip");
  t.seed = int_field<std::uint64_t>(fields, "seed", bad);
  c.step = i("step");
  if (const auto d = fields.find("dtype"); d != fields.end()) {
    if (d->second != "f32" && d->second != "bf16") throw bad(fmt::format("field dtype '{}' is not f32 or bf16", d->second.substr(0, 40)));
    t.dtype = parse_dtype(d->second);
  }
  if (const std::string e = m.error(); !e.empty()) throw bad(e);
}

// The parameter count of `m`, overflow-checked (ParamLayout would allocate per layer first).
std::int64_t param_count(const GptConfig& m) {
  const std::int64_t C = m.width, QD = checked_mul(m.heads, m.head_dim, "params"), F = m.hidden;
  const std::int64_t KD = checked_mul(m.kv_heads, m.head_dim, "params");
  const std::int64_t per_layer = checked_product({C, 2 * QD + 2 * KD + 3 * F}, "params") + 2 * C;
  return checked_mul(m.layers, per_layer, "params") + checked_product({2, m.vocab, C}, "params") + C;
}

Checkpoint read_checkpoint(const std::string& dir) {
  const std::string path = dir + "/checkpoint.bin";
  const std::string s = read_input_within_memory("--resume", path);
  auto bad = [&](const std::string& why) { return Error(fmt::format("corrupt checkpoint {}: {}", path, why)); };
  if (s.size() < 24 || std::memcmp(s.data(), kMagic, 8) != 0) throw bad("not a ulysses checkpoint (bad magic or too short)");
  const std::uint64_t hl = get_u64(s, 8);
  if (hl > 1 << 16 || 16 + hl + 8 > s.size()) throw bad(fmt::format("truncated ({} bytes)", s.size()));
  const std::uint64_t n = get_u64(s, 16 + hl);
  if (n > (std::uint64_t(1) << 36) || s.size() != 16 + hl + 8 + 12 * n + 8)
    throw bad(fmt::format("truncated or padded: {} bytes, expected {}", s.size(), 16 + hl + 8 + 12 * std::min<std::uint64_t>(n, 1ull << 36) + 8));
  if (fnv1a(s.data(), s.size() - 8) != get_u64(s, s.size() - 8)) throw bad("checksum mismatch: the file is corrupted");
  Checkpoint c;
  try {
    parse_header(s.substr(16, hl), c, bad);
    if (std::uint64_t(param_count(c.config.model)) != n) throw bad("parameter count does not match its model header");
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with("corrupt checkpoint")) throw;
    throw bad(e.what());
  }
  const char* data = s.data() + 16 + hl + 8;
  for (auto* vec : {&c.params, &c.m, &c.v}) {
    vec->resize(n);
    std::memcpy(vec->data(), data, n * 4);
    data += n * 4;
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(c.params[i]) || !std::isfinite(c.m[i]) || !(c.v[i] >= 0) || !std::isfinite(c.v[i]))
      throw bad(fmt::format("parameter {} or its optimizer state is not finite (param {}, m {}, v {})", i, c.params[i],
                            c.m[i], c.v[i]));
  return c;
}

}  // namespace

void Trainer::save(const std::string& dir) const {
  std::string err;
  if (comm_.rank() == 0) {
    try {
      std::filesystem::create_directories(dir);
      std::string s(kMagic, 8);
      const std::string hdr = header_of(cfg_, step_);
      put_u64(s, hdr.size());
      s += hdr;
      put_u64(s, model_.params.size());
      for (const auto* vec : {&model_.params, &m_, &v_}) s.append(reinterpret_cast<const char*>(vec->data()), vec->size() * 4);
      put_u64(s, fnv1a(s.data(), s.size()));
      write_file_atomic(dir + "/checkpoint.bin", s);
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
      throw Error(fmt::format("checkpoint {} was trained with --dtype {}; this run has --dtype {} (resume with --dtype {})",
                              dir, to_string(c.config.dtype), to_string(cfg_.dtype), to_string(c.config.dtype)));
    if (!c.config.same_run(cfg_))
      throw Error(fmt::format("checkpoint {} belongs to another run (model, batch, seq, optimizer or seed differ)", dir));
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
