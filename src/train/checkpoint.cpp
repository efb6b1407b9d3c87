// The checkpoint file: magic, a text header (every field range-checked on reading), the
// parameters and AdamW's moments as float32, an FNV-1a checksum of everything before it.
#include "train/checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "ulysses/core/checked.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/input_file.hpp"
#include "ulysses/io/output_file.hpp"

namespace ulysses::train {

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
constexpr Field kFields[] = {{"vocab", 1, 256},        {"layers", 1, 4096},      {"width", 1, 1 << 20},
                             {"heads", 1, 1 << 16},    {"kv_heads", 1, 1 << 16}, {"head_dim", 1, 1 << 16},
                             {"hidden", 1, 1 << 22},   {"batch", 1, 1 << 30},    {"seq", 1, 1ll << 40},
                             {"steps", 0, 1ll << 62},  {"warmup", 0, 1ll << 62}, {"lr", 0, 1e6},
                             {"beta1", 0, 1},          {"beta2", 0, 1},          {"eps", 0, 1},
                             {"weight_decay", 0, 1e6}, {"clip", 0, 1e30},        {"seed", 0, 1.9e19},
                             {"step", 0, 1ll << 62}};

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
  const Field& f =
      *std::find_if(std::begin(kFields), std::end(kFields), [&](const Field& x) { return !std::strcmp(key, x.key); });
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
  const Field& f =
      *std::find_if(std::begin(kFields), std::end(kFields), [&](const Field& x) { return !std::strcmp(key, x.key); });
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
    if (d->second != "f32" && d->second != "bf16")
      throw bad(fmt::format("field dtype '{}' is not f32 or bf16", d->second.substr(0, 40)));
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

}  // namespace

Checkpoint read_checkpoint(const std::string& dir) {
  const std::string path = dir + "/checkpoint.bin";
  const std::string s = read_input_within_memory("--resume", path);
  auto bad = [&](const std::string& why) { return Error(fmt::format("corrupt checkpoint {}: {}", path, why)); };
  if (s.size() < 24 || std::memcmp(s.data(), kMagic, 8) != 0)
    throw bad("not a ulysses checkpoint (bad magic or too short)");
  const std::uint64_t hl = get_u64(s, 8);
  if (hl > 1 << 16 || 16 + hl + 8 > s.size()) throw bad(fmt::format("truncated ({} bytes)", s.size()));
  const std::uint64_t n = get_u64(s, 16 + hl);
  if (n > (std::uint64_t(1) << 36) || s.size() != 16 + hl + 8 + 12 * n + 8)
    throw bad(fmt::format("truncated or padded: {} bytes, expected {}", s.size(),
                          16 + hl + 8 + 12 * std::min<std::uint64_t>(n, 1ull << 36) + 8));
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

void write_checkpoint(const std::string& dir, const TrainConfig& config, std::int64_t step,
                      const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v) {
  std::filesystem::create_directories(dir);
  std::string s(kMagic, 8);
  const std::string hdr = header_of(config, step);
  put_u64(s, hdr.size());
  s += hdr;
  put_u64(s, params.size());
  for (const auto* vec : {&params, &m, &v}) s.append(reinterpret_cast<const char*>(vec->data()), vec->size() * 4);
  put_u64(s, fnv1a(s.data(), s.size()));
  write_file_atomic(dir + "/checkpoint.bin", s);
}

}  // namespace ulysses::train
