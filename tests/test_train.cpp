// The training demo: the whole model's gradient against finite differences (float64), the
// loss of every step and the gradients at cp > 1 for every strategy equal to cp = 1, and
// bit-for-bit resume from checkpoints that refuse corruption.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "mpi_helpers.hpp"
#include "kernels/isa.hpp"
#include "kernels/onednn_gemm.hpp"
#include "train_test_util.hpp"
#include "train/attention_ops.hpp"
#include "train/gemm.hpp"
#include "train/gpt.hpp"
#include "train/memory.hpp"
#include "train/trainer.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/cp/strategy.hpp"

using namespace ulysses;
using namespace ulysses::train;
using train_test::relative_distance;
using train_test::small_config;

namespace {

TEST(Gpt, GradientMatchesFiniteDifferencesInFloat64) {
  const GptConfig c{16, 2, 8, 2, 1, 4, 12};
  const i64 B = 2, S = 6, N = B * S;
  Gpt<double> model(c);
  model.init_params(7);
  ReferenceAttention att(c, B, S);
  std::vector<int> tokens(N), labels(N);
  for (i64 i = 0; i < N; ++i) {
    tokens[std::size_t(i)] = int((i * 7 + 3) % 16);
    labels[std::size_t(i)] = int((i * 5 + 1) % 16);
  }
  std::vector<i64> pos(S);
  for (i64 i = 0; i < S; ++i) pos[std::size_t(i)] = i;
  const double scale = 1.0 / double(N);
  auto loss = [&] { return model.forward(att, tokens.data(), labels.data(), pos.data(), B, S, scale) * scale; };
  loss();
  std::fill(model.grads.begin(), model.grads.end(), 0.0);
  model.backward(att);
  const std::vector<double> analytic = model.grads;
  double num = 0, den = 0, worst = 0;
  const double eps = 1e-5;
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const double keep = model.params[i];
    model.params[i] = keep + eps;
    const double up = loss();
    model.params[i] = keep - eps;
    const double down = loss();
    model.params[i] = keep;
    const double fd = (up - down) / (2 * eps);
    num += (fd - analytic[i]) * (fd - analytic[i]);
    den += fd * fd;
    worst = std::max(worst, std::abs(fd - analytic[i]));
  }
  EXPECT_LT(std::sqrt(num / den), 1e-7) << "over " << model.params.size() << " parameters";
  EXPECT_LT(worst, 1e-8);
}

std::vector<CpConfig> strategies(int cp) {
  std::vector<CpConfig> out{{"a2a", {}, true, std::nullopt},
                            {"p2p", {}, true, std::nullopt},
                            {"all_gather", {}, true, std::nullopt}};
  for (int inner = 1; inner <= cp; ++inner)
    if (cp % inner == 0) out.push_back({"a2a+p2p", {inner, cp / inner}, true, std::nullopt});
  std::vector<CpConfig> valid;
  for (const CpConfig& c : out) {
    try {
      validate_cp_config(c, cp, {2, 96, 4, 8}, 2);
      valid.push_back(c);
    } catch (const Error&) {  // e.g. a2a with 4 heads on 8 ranks
    }
  }
  return valid;
}

// Weight gradients of the first step at cp ranks against one rank, relative L2 distance.
double gradient_distance(Communicator& world, const TrainConfig& config, const std::vector<float>& one_rank) {
  Trainer t(world, config, DataSource::synthetic());
  t.compute_gradients(0);  // the gradient of step 1, before any update
  double num = 0, den = 0;
  for (std::size_t i = 0; i < one_rank.size(); ++i) {
    num += std::pow(double(t.gradients()[i]) - one_rank[i], 2);
    den += double(one_rank[i]) * one_rank[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> one_rank_gradients(const TrainConfig& config) {
  MpiCommunicator self(MPI_COMM_SELF);
  Trainer one(self, config, DataSource::synthetic());
  one.compute_gradients(0);
  return one.gradients();
}

// The losses of 20 steps of one rank training `config` on `data` alone.
std::vector<double> one_rank_losses(const TrainConfig& config, DataSource data) {
  MpiCommunicator self(MPI_COMM_SELF);
  Trainer one(self, config, std::move(data));
  std::vector<double> out;
  for (int i = 0; i < 20; ++i) out.push_back(one.step().loss);
  return out;
}

// The largest relative difference of the next ref.size() losses of `run` from `ref`.
double worst_loss_difference(Trainer& run, const std::vector<double>& ref) {
  double worst = 0;
  for (double want : ref) worst = std::max(worst, std::abs(run.step().loss - want) / want);
  return worst;
}

TEST(Training, EveryStrategyMatchesOneRankStepByStep) {
  MpiCommunicator world;
  const std::vector<double> ref = one_rank_losses(small_config({}), DataSource::synthetic());
  const std::vector<float> g1 = one_rank_gradients(small_config({}));
  for (const CpConfig& cp : strategies(world.size())) {
    SCOPED_TRACE(cp.cp_comm_type + " on " + std::to_string(world.size()) + " ranks");
    EXPECT_LT(gradient_distance(world, small_config(cp), g1), 1e-5) << "weight gradients differ from cp = 1";
    Trainer run(world, small_config(cp), DataSource::synthetic());
    const double worst = worst_loss_difference(run, ref);
    EXPECT_LT(worst, 1e-5) << "loss differs from cp = 1";
  }
}

TEST(Training, SequencesThatDoNotDivideTrainLikeOneRank) {
  // 97 tokens: ranks hold different counts under every layout; RoPE positions and the loss
  // follow each rank's own tokens.
  MpiCommunicator world;
  TrainConfig c = small_config({});
  c.seq = 97;
  const std::vector<float> g1 = one_rank_gradients(c);
  for (const CpConfig& cp : strategies(world.size())) {
    SCOPED_TRACE(cp.cp_comm_type + " on " + std::to_string(world.size()) + " ranks");
    c.cp = cp;
    EXPECT_LT(gradient_distance(world, c, g1), 1e-5) << "weight gradients differ from cp = 1";
  }
}

// Each memory technique, and all of them together, gives the loss and weight
// gradients of keeping everything, at this job's cp (tiles of 40 rows: several, the last partial).
TEST(Training, MemoryTechniquesGiveTheSameLossAndGradients) {
  MpiCommunicator world;
  TrainConfig c = small_config({"a2a", {}, true, std::nullopt});
  if (world.size() > 2) c.cp = {"p2p", {}, true, std::nullopt};  // a2a needs heads >= cp
  auto run = [&](MemoryOptions m) {
    c.memory = m;
    Trainer t(world, c, DataSource::synthetic());
    const double loss = t.compute_gradients(0);
    return std::pair{loss, t.gradients()};
  };
  const auto [loss0, g0] = run({});
  for (const MemoryOptions m : {MemoryOptions{true, false, false, 40}, MemoryOptions{false, true, false, 40},
                                MemoryOptions{false, false, true, 40}, MemoryOptions{true, true, true, 40}}) {
    SCOPED_TRACE(fmt::format("checkpoint {} tiled_mlp {} tiled_loss {} on {} ranks", m.checkpoint_activations,
                             m.tiled_mlp, m.tiled_loss, world.size()));
    const auto [loss, g] = run(m);
    EXPECT_LT(std::abs(loss - loss0) / loss0, 1e-6);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < g0.size(); ++i) {
      num += std::pow(double(g[i]) - g0[i], 2);
      den += double(g0[i]) * g0[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-6) << "weight gradients differ";
  }
}

TEST(Training, MaxMemoryRefusesWhatThePredictionSaysWillNotFit) {
  MpiCommunicator world;
  TrainConfig c = small_config({"p2p", {}, true, std::nullopt});
  const double need = predict_memory(c, world.size()).total();
  c.max_memory = need * 1.01;
  EXPECT_NO_THROW(Trainer(world, c, DataSource::synthetic()));
  c.max_memory = need * 0.99;
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer t(world, c, DataSource::synthetic()); },
      "needs a predicted " + format_bytes(need) + " (weights");
}

// Documents of 1 to 40 bytes, one per line, written once per job (rank 0) and read by all.
std::string documents_file(Communicator& comm) {
  std::int64_t pid = getpid();
  comm.broadcast(&pid, sizeof(pid), 0);
  const std::string path = "/tmp/ulysses_test_docs_" + std::to_string(pid) + ".txt";
  if (comm.rank() == 0) {
    std::ofstream f(path);
    for (int i = 0; i < 60; ++i) f << std::string(std::size_t(1 + (i * 7) % 40), char('a' + i % 26)) << "bcd\n";
  }
  comm.barrier();
  return path;
}

TEST(Training, PackedDocumentsMaskEveryBoundary) {
  MpiCommunicator self(MPI_COMM_SELF);
  const DataSource d = DataSource::packed_documents(documents_file(self), "\n");
  for (std::int64_t step = 0; step < 5; ++step) {
    const Batch b = d.batch(1, 200, 1, step);
    ASSERT_EQ(cu_seqlens_error(b.cu_seqlens, 200), "");
    ASSERT_GT(b.cu_seqlens.size(), 3u);  // several documents in each sequence
    for (std::int64_t i = 0; i < 200; ++i) {
      const Document doc = document_of(b.cu_seqlens, i);
      // The last token of a document predicts nothing (the sequence's last one continues its document).
      const bool ends = i + 1 == doc.end && doc.end < 200;
      if (i < 199)
        EXPECT_EQ(b.labels[std::size_t(i)] == kNoLabel, ends) << "token " << i;  // 199: whether a
                                                                                 // document starts at 200 is not in cu
      if (i > doc.begin) EXPECT_EQ(b.labels[std::size_t(i - 1)], b.tokens[std::size_t(i)]);
    }
    EXPECT_EQ(b.targets(), 200 - std::int64_t(b.cu_seqlens.size()) + 2 - (b.labels[199] == kNoLabel));
  }
}

TEST(Training, PackedDocumentsTrainLikeOneRank) {
  // Per-document masks and RoPE positions: every strategy at cp ranks gives the losses of one
  // rank, step by step, on 20 steps of packed documents (other documents every step).
  MpiCommunicator world;
  const std::string path = documents_file(world);
  TrainConfig c = small_config({});
  c.batch = 1;
  c.seq = 160;
  const std::vector<double> ref = one_rank_losses(c, DataSource::packed_documents(path, "\n"));
  for (const CpConfig& cp : strategies(world.size())) {
    SCOPED_TRACE(cp.cp_comm_type + " on " + std::to_string(world.size()) + " ranks");
    c.cp = cp;
    Trainer run(world, c, DataSource::packed_documents(path, "\n"));
    const double worst = worst_loss_difference(run, ref);
    EXPECT_LT(worst, 1e-5) << "loss differs from cp = 1";
  }
  c.batch = 2;
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer t(world, c, DataSource::packed_documents(path, "\n")); }, "use --batch 1");
}

std::string scratch_dir(Communicator& comm, const std::string& name) {
  std::int64_t pid = getpid();
  comm.broadcast(&pid, sizeof(pid), 0);  // one directory for the whole job
  return "/tmp/ulysses_test_" + std::to_string(pid) + "_" + name;
}

// Trains `total` steps straight and, beside it, `saved_at` steps saved into dir then resumed
// from there: the resumed run's losses and final weights must equal the straight run's bit for
// bit. Leaves the checkpoint in dir.
void expect_resume_bit_for_bit(Communicator& world, const TrainConfig& config, const std::string& dir, int saved_at,
                               int total) {
  Trainer straight(world, config, DataSource::synthetic());
  std::vector<double> losses;
  for (int i = 0; i < total; ++i) losses.push_back(straight.step().loss);
  {
    Trainer first(world, config, DataSource::synthetic());
    for (int i = 0; i < saved_at; ++i) first.step();
    first.save(dir);
  }
  Trainer resumed(world, config, DataSource::synthetic());
  resumed.load(dir);
  EXPECT_EQ(resumed.current_step(), saved_at);
  for (int i = saved_at; i < total; ++i) EXPECT_EQ(resumed.step().loss, losses[std::size_t(i)]) << "step " << i + 1;
  EXPECT_EQ(std::memcmp(resumed.parameters().data(), straight.parameters().data(), straight.parameters().size() * 4),
            0);
}

TEST(Training, ResumeIsBitForBit) {
  MpiCommunicator world;
  const std::string dir = scratch_dir(world, "resume");
  expect_resume_bit_for_bit(world, small_config({"p2p", {}, true, std::nullopt}), dir, 5, 10);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

// One training step, saved into dir; rank 0 gets the checkpoint file's bytes ("" elsewhere).
std::string step_and_save(Communicator& world, Trainer& t, const std::string& dir) {
  t.step();
  t.save(dir);
  std::string bytes;
  if (world.rank() == 0) {
    std::ifstream in(dir + "/checkpoint.bin", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return bytes;
}

TEST(Training, DamagedCheckpointsAreRefusedEverywhere) {
  MpiCommunicator world;
  const std::string dir = scratch_dir(world, "damaged");
  const CpConfig ring{"p2p", {}, true, std::nullopt};  // valid at every rank count
  Trainer t(world, small_config(ring), DataSource::synthetic());
  const std::string path = dir + "/checkpoint.bin", good = step_and_save(world, t, dir);
  if (world.rank() == 0) {
    std::string bad = good;
    bad[bad.size() / 2] ^= 0x10;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
  }
  world.barrier();
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { t.load(dir); }, "checksum mismatch");
  world.barrier();
  if (world.rank() == 0) std::ofstream(path, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 100);
  world.barrier();
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { t.load(dir); }, "truncated");
  world.barrier();
  // A crashed save leaves only a temp file: the last good checkpoint still loads.
  if (world.rank() == 0) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
    std::ofstream(path + ".tmp.999", std::ios::binary) << good.substr(0, 50);
  }
  world.barrier();
  EXPECT_NO_THROW(t.load(dir));
  EXPECT_EQ(t.current_step(), 1);
  // A checkpoint of another run (different seed) is refused.
  TrainConfig other = small_config(ring);
  other.seed = 99;
  Trainer u(world, other, DataSource::synthetic());
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { u.load(dir); }, "belongs to another run");
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

// The checkpoint at `path` with its header passed through `edit_header` and its floats through
// `edit_floats`, re-signed (FNV-1a is no protection against a crafted file).
void resign(const std::string& path, const std::function<std::string(std::string)>& edit_header,
            const std::function<void(std::vector<float>&)>& edit_floats) {
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t hl = 0, n = 0;
  std::memcpy(&hl, s.data() + 8, 8);
  std::memcpy(&n, s.data() + 16 + hl, 8);
  std::vector<float> floats(3 * n);
  std::memcpy(floats.data(), s.data() + 24 + hl, 12 * n);
  edit_floats(floats);
  const std::string header = edit_header(s.substr(16, hl));
  std::string out = s.substr(0, 8);
  const std::uint64_t new_hl = header.size();
  out.append(reinterpret_cast<const char*>(&new_hl), 8);
  out += header;
  out.append(reinterpret_cast<const char*>(&n), 8);
  out.append(reinterpret_cast<const char*>(floats.data()), 12 * n);
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : out) h = (h ^ std::uint8_t(c)) * 0x100000001b3ull;
  out.append(reinterpret_cast<const char*>(&h), 8);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
}

// `header` with the value of `key` replaced by `value`.
std::string with_field(std::string header, const std::string& key, const std::string& value) {
  const std::size_t at = header.find("\n" + key + " ") + key.size() + 2;
  return header.replace(at, header.find('\n', at) - at, value);
}

TEST(Training, CraftedCheckpointHeadersAreCorruptNotCrashes) {
  MpiCommunicator world;
  const std::string dir = scratch_dir(world, "crafted");
  const CpConfig ring{"p2p", {}, true, std::nullopt};
  Trainer t(world, small_config(ring), DataSource::synthetic());
  const std::string path = dir + "/checkpoint.bin", good = step_and_save(world, t, dir);
  auto keep = [](std::vector<float>&) {};
  auto header_case = [&](const std::string& key, const std::string& value, const std::string& needle) {
    if (world.rank() == 0) {
      std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
      resign(
          path, [&](std::string h) { return with_field(h, key, value); }, keep);
    }
    world.barrier();
    ulysses::testing::expect_same_error_everywhere(
        world, [&] { t.load(dir); }, "corrupt checkpoint " + path + ": " + needle);
    EXPECT_THROW(Trainer::checkpoint_config(dir), Error);
    world.barrier();
  };
  header_case("width", "abc", "field width 'abc' is not an integer in [1, 1048576]");
  header_case("step", "99999999999999999999", "field step '99999999999999999999' is not an integer");
  header_case("layers", "1000000000000", "field layers '1000000000000' is not an integer in [1, 4096]");
  header_case("step", "-5", "field step '-5' is not an integer");
  header_case("lr", "nan", "field lr 'nan' is not a number");
  header_case("layers", "3", "parameter count does not match its model header");
  header_case("kv_heads", "3", "heads (4) must be divisible by kv_heads (3)");
  if (world.rank() == 0) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
    resign(
        path, [](std::string h) { return h; }, [](std::vector<float>& f) { f[5] = std::nanf(""); });
  }
  world.barrier();
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { t.load(dir); }, "parameter 5 or its optimizer state is not finite");
  if (world.rank() == 0) std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
  world.barrier();
  EXPECT_NO_THROW(t.load(dir));
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Training, DivergenceStopsBeforeTheUpdateOnEveryRank) {
  MpiCommunicator world;
  TrainConfig c = small_config({"p2p", {}, true, std::nullopt});
  c.lr = 1e30f;
  c.warmup = 0;
  Trainer t(world, c, DataSource::synthetic());
  ulysses::testing::expect_same_error_everywhere(
      world,
      [&] {
        for (int i = 0; i < 6; ++i) t.step();
      },
      "training diverged at step");
  EXPECT_LT(t.current_step(), 6);
  c.lr = std::numeric_limits<float>::infinity();
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer u(world, c, DataSource::synthetic()); }, "must be positive and finite");
}

TEST(Training, BadConfigurationIsRefusedBeforeAnyWork) {
  MpiCommunicator world;
  const CpConfig ring{"p2p", {}, true, std::nullopt};
  TrainConfig c = small_config(ring);
  c.model.heads = 3;  // not divisible by kv_heads 2
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer t(world, c, DataSource::synthetic()); }, "heads (3) must be divisible by kv_heads (2)");
  c = small_config(ring);
  c.seq = 2 * world.size() - 1;  // zigzag: fewer than two tokens per rank
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer t(world, c, DataSource::synthetic()); },
      "sequence length (" + std::to_string(c.seq) + ") must be at least 2*cp");
  c = small_config({});  // a2a: one head on more ranks
  c.model.heads = c.model.kv_heads = 1;
  if (world.size() > 1)
    ulysses::testing::expect_same_error_everywhere(
        world, [&] { Trainer t(world, c, DataSource::synthetic()); }, "num_heads (1) must be at least cp");
  c = small_config(ring);
  c.seq = 48;  // divisible by 2·cp for cp in 1..4 and 8, too short for the task
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer t(world, c, DataSource::synthetic()); }, "needs --seq >= 64");
}

// --dtype bf16: the attention, the projections and the MLP in bfloat16 (float32 accumulation),
// master weights, gradients, optimizer and the LM head in float32.
TrainConfig bf16_config(const CpConfig& cp) {
  TrainConfig t = small_config(cp);
  t.dtype = DType::bf16;
  return t;
}

TEST(TrainingBf16, EveryStrategyFollowsOneRankBf16) {
  MpiCommunicator world;
  const std::vector<double> ref = one_rank_losses(bf16_config({}), DataSource::synthetic());
  for (const CpConfig& cp : strategies(world.size())) {
    SCOPED_TRACE(cp.cp_comm_type + " on " + std::to_string(world.size()) + " ranks");
    Trainer run(world, bf16_config(cp), DataSource::synthetic());
    const double worst = worst_loss_difference(run, ref);
    // Measured: 1e-4 to 2.4e-4 at cp = 2 and 3 (the merges and reductions round in another order).
    EXPECT_LT(worst, 2e-3) << "bf16 loss differs from bf16 at cp = 1 by more than bf16 rounding";
  }
}

TEST(TrainingBf16, LossCurveFollowsFloat32) {
  MpiCommunicator world;
  const CpConfig ring{"p2p", {}, true, std::nullopt};
  Trainer f32(world, small_config(ring), DataSource::synthetic());
  Trainer bf16(world, bf16_config(ring), DataSource::synthetic());
  double first = 0, last32 = 0, last16 = 0, worst = 0;
  for (int i = 0; i < 20; ++i) {
    const double a = f32.step().loss, b = bf16.step().loss;
    worst = std::max(worst, std::abs(b - a) / a);
    if (i == 0) first = a;
    if (i >= 15) last32 += a / 5, last16 += b / 5;
  }
  EXPECT_LT(last32, 0.9 * first) << "float32 training did not learn; the comparison would say nothing";
  EXPECT_NE(last16, last32) << "the attention did not run in bf16";
  // Measured: 3e-5 to 6e-5 apart.
  EXPECT_NEAR(last16 / last32, 1.0, 0.01) << "the mean loss of steps 16-20: f32 " << last32 << ", bf16 " << last16;
  // Step by step: bf16 keeps 8 significant bits (a relative rounding of at most 2^-9 = 2e-3 per
  // GEMM input), but the loss is a mean over the step's 192 tokens of sums whose roundings have
  // random signs, so it moves far less. Measured: at most 8.5e-4 relative over the 20 steps
  // (1 and 2 ranks); the bound, 2^-7, is four bf16 roundings of the loss itself.
  EXPECT_LT(worst, 1.0 / 128) << "bf16 loss curve left float32's by more than bf16 rounding";
}

// The same model in float32 and with bf16 GEMMs (a float32 attention stand-in: out = q, so the
// GEMMs are the only difference): the loss and every weight gradient of one step agree within
// bf16's rounding, and differ (the GEMMs did run in bf16).
class QAsOutput : public AttentionOp<float> {
 public:
  explicit QAsOutput(i64 n) : n_(n) {}
  void forward(int, float* out, const float* q, const float*, const float*) override { std::copy_n(q, n_, out); }
  void backward(int, float* dq, float*, float*, const float* dout) override {
    for (i64 i = 0; i < n_; ++i) dq[i] += dout[i];
  }

 private:
  i64 n_;
};

// One step of a small model with the QAsOutput attention: the loss (through *loss) and the
// weight gradients, with bf16 GEMMs or float32 ones.
std::vector<float> one_step_gradients(bool bf16, double* loss) {
  const GptConfig c{256, 2, 64, 4, 4, 16, 172};
  const i64 N = 256;
  std::vector<int> tokens(N), labels(N);
  for (i64 i = 0; i < N; ++i)
    tokens[std::size_t(i)] = int((i * 37 + 11) % 256), labels[std::size_t(i)] = int((i * 53 + 5) % 256);
  std::vector<i64> pos(N);
  for (i64 i = 0; i < N; ++i) pos[std::size_t(i)] = i;
  Gpt<float> m(c, {}, bf16);
  m.init_params(5);
  QAsOutput att(N * c.heads * c.head_dim);
  *loss = double(m.forward(att, tokens.data(), labels.data(), pos.data(), 1, N, 1.0f / float(N))) / double(N);
  std::fill(m.grads.begin(), m.grads.end(), 0.0f);
  m.backward(att);
  return m.grads;
}

TEST(TrainingBf16, Bf16GemmsGiveFloat32GradientsWithinBf16Rounding) {
  double l32 = 0, l16 = 0;
  const std::vector<float> g32 = one_step_gradients(false, &l32), g16 = one_step_gradients(true, &l16);
  const double rel = relative_distance(g16, g32);
  EXPECT_NE(l16, l32) << "the GEMMs did not run in bf16";
  EXPECT_LT(std::abs(l16 - l32) / l32, 1.0 / 512) << "f32 " << l32 << ", bf16 " << l16;
  // A gradient is a chain of GEMMs whose inputs are each rounded by up to 2^-9 relative: a few
  // such roundings, in quadrature over the elements. Measured: 5.3e-3 relative L2 (the loss
  // 4.6e-5 apart); bound 2^-5, eight roundings of 2^-8 (the relative spacing of bf16).
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 1.0 / 32) << "relative L2 distance of the weight gradients, bf16 GEMMs against float32";
}

// The bf16 GEMMs run on one of two units (gemm.hpp): oneDNN's dot product where the kernel
// level has a bf16 engine, the float32 GEMMs over the rounded inputs where it has none. Both
// multiply the same bf16 values and add in float32, in other orders; a sum one float32 ulp
// apart can round to another bf16 as the next GEMM's input, so they are not bit-equal, but one
// step's gradients stay well inside one bf16 rounding of each other (2^-9), where bf16 against
// float32 GEMMs is 5e-3 apart (above). Each route is checked on any CPU.
TEST(TrainingBf16, BothGemmUnitsGiveTheSameStep) {
  // Only whether the level has a bf16 engine steers the GEMMs; QAsOutput runs no kernel.
  kernels::KernelLevel dot = kernels::active_level(), fma = dot;
  dot.bf16 = dot.f32;
  fma.bf16 = nullptr;
  double l_dot = 0, l_fma = 0;
  kernels::use_level_for_testing(&dot);
  const std::vector<float> g_dot = one_step_gradients(true, &l_dot);
  kernels::use_level_for_testing(&fma);
  const std::vector<float> g_fma = one_step_gradients(true, &l_fma);
  kernels::use_level_for_testing(nullptr);
  // The loss, a mean over every token, moves by whole bf16 roundings of the activations where
  // the two orders of adding round apart. Measured: 1.8e-6 relative on a Sapphire Rapids (oneDNN
  // on AMX tiles against OpenBLAS), under that on an Emerald Rapids; bound 1e-5.
  EXPECT_NEAR(l_dot / l_fma, 1.0, 1e-5);
  // Measured: 2.0e-4 relative L2 on an Emerald Rapids (oneDNN on vdpbf16ps against OpenBLAS).
  EXPECT_LT(relative_distance(g_dot, g_fma), 1.0 / 512) << "the two units' weight gradients";
}

// oneDNN's bf16 GEMM on inputs that bfloat16 holds exactly (small integers over a power of two,
// so every product and sum is exact in float32): the same bits as a float64 reference, for
// each transpose, leading dimensions wider than the matrix, and accumulation.
TEST(Bf16Gemm, ExactOnBf16ExactInputsForEveryTransposeAndAccumulation) {
  const i64 m = 37, n = 45, k = 70, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool acc : {false, true}) {
        SCOPED_TRACE(fmt::format("ta {} tb {} accumulate {}", ta, tb, acc));
        const i64 lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
        std::vector<float> a(std::size_t((ta ? k : m) * lda)), b(std::size_t((tb ? n : k) * ldb));
        std::vector<float> c(std::size_t(m * ldc));
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 17) - 8) / 16;
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 13) - 6) / 8;
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = float(int(i % 9) - 4);
        std::vector<std::uint16_t> a16, b16;
        round_to_bf16(a16, a.data(), i64(a.size()));
        round_to_bf16(b16, b.data(), i64(b.size()));
        std::vector<float> want = c;
        for (i64 i = 0; i < m; ++i)
          for (i64 j = 0; j < n; ++j) {
            double sum = acc ? c[std::size_t(i * ldc + j)] : 0.0;
            for (i64 p = 0; p < k; ++p)
              sum += double(ta ? a[std::size_t(p * lda + i)] : a[std::size_t(i * lda + p)]) *
                     double(tb ? b[std::size_t(j * ldb + p)] : b[std::size_t(p * ldb + j)]);
            want[std::size_t(i * ldc + j)] = float(sum);
          }
        std::vector<float> got16 = c, got32 = c;
        kernels::onednn_gemm_bf16(ta, tb, m, n, k, a16.data(), lda, b16.data(), ldb, got16.data(), ldc, acc);
        kernels::onednn_gemm_f32(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, got32.data(), ldc, acc);
        EXPECT_EQ(got16, want) << "bf16";
        EXPECT_EQ(got32, want) << "f32";
      }
}

TEST(TrainingBf16, AttentionContextsShrinkInTheMemoryModel) {
  // The contexts kept per layer are bf16 (a2a's head-sharded out stays float32); the backward's
  // transients follow the CPU (float32 copies where it has no bf16 engine), so the layers'
  // share is what shrinks on every CPU.
  for (const char* type : {"p2p", "a2a"})
    for (int cp : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} at cp {}", type, cp));
      const TrainConfig f32 = small_config({type, {}, true, std::nullopt}),
                        bf16 = bf16_config({type, {}, true, std::nullopt});
      auto kept = [&](TrainConfig c) {  // the attention bytes two more layers add
        const double two = predict_memory(c, cp).attention;
        c.model.layers = 4;
        return predict_memory(c, cp).attention - two;
      };
      EXPECT_LT(kept(bf16), 0.75 * kept(f32));
      const MemoryEstimate a = predict_memory(f32, cp), b = predict_memory(bf16, cp);
      const double P = double(f32.model.num_params());
      EXPECT_EQ(b.weights, a.weights + 2 * P) << "master weights and AdamW stay float32, beside a bf16 copy";
      EXPECT_GE(b.activations, a.activations) << "the bf16 GEMMs' input copies";
      EXPECT_LT(b.activations, 1.1 * a.activations) << "the model's own activations stay float32";
    }
}

TEST(TrainingMemory, EveryStrategysOneMemoryModelIsWhatTrainingCounts) {
  // Training reads each strategy's one declaration (Strategy::memory): its kept bytes per layer
  // and its backward once, for the built-ins and tests/toy_strategy.cpp's alike, without a line
  // about any of them anywhere else.
  for (const Strategy* strategy : ulysses::strategies())
    for (const int cp : {2, 4}) {
      TrainConfig c = small_config(strategy->plan_configs(cp, true).front());
      SCOPED_TRACE(fmt::format("{} at cp {}", strategy->config_name(c.cp), cp));
      const StrategyMemory m = strategy->memory(c.cp, cp, {c.batch, c.seq, c.model.heads, c.model.head_dim}, c.seq,
                                                c.model.kv_heads, DType::f32);
      ASSERT_GT(m.kept, 0);
      EXPECT_GE(m.forward, m.kept) << "the forward allocates what it keeps";
      TrainConfig deeper = c;
      deeper.model.layers += 2;
      EXPECT_DOUBLE_EQ(predict_memory(deeper, cp).attention - predict_memory(c, cp).attention, 2 * m.kept);
      EXPECT_DOUBLE_EQ(predict_memory(c, cp).attention, c.model.layers * m.kept + m.backward);
    }
}

TEST(TrainingBf16, ResumesBitForBitAndRefusesAnotherDtype) {
  MpiCommunicator world;
  const CpConfig cp{"a2a", {}, true, std::nullopt};
  const std::string dir = scratch_dir(world, "resume_bf16");
  expect_resume_bit_for_bit(world, bf16_config(cp), dir, 2, 4);
  EXPECT_EQ(Trainer::checkpoint_config(dir).dtype, DType::bf16);
  Trainer other(world, small_config(cp), DataSource::synthetic());
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { other.load(dir); },
      "was trained with --dtype bf16; this run has --dtype f32 (resume with --dtype bf16)");
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- --data with a held-out tail ----------------------------------------------------------

// A file every rank can read: rank 0 writes `text` under a name the whole job shares.
std::string shared_file(Communicator& comm, const std::string& name, const std::string& text) {
  const std::string path = scratch_dir(comm, name);
  if (comm.rank() == 0) std::ofstream(path, std::ios::binary) << text;
  comm.barrier();
  return path;
}

// 4096 bytes in lines of 32: the first 3840 bytes lower case, the last 256 upper case.
std::string two_case_text() {
  std::string s;
  for (int line = 0; line < 128; ++line)
    for (int i = 0; i < 32; ++i) s += i == 31 ? '\n' : char((line < 120 ? 'a' : 'A') + (line * 7 + i) % 26);
  return s;
}

TEST(TrainingText, HeldOutBytesNeverReachTraining) {
  MpiCommunicator self(MPI_COMM_SELF);
  const std::string path = shared_file(self, "two_case.txt", two_case_text());
  auto check = [](const DataSource& d, std::int64_t B, std::int64_t S) {
    ASSERT_EQ(d.error_for(S), "");
    EXPECT_EQ(d.held_out_bytes(), 256);
    for (std::int64_t step = 0; step < 200; ++step) {  // training: the lower-case head only
      const Batch b = d.batch(B, S, 7, step);
      for (std::size_t i = 0; i < b.tokens.size(); ++i) {
        ASSERT_FALSE(std::isupper(b.tokens[i])) << "step " << step << " token " << i;
        ASSERT_TRUE(b.labels[i] == kNoLabel || !std::isupper(b.labels[i])) << "step " << step << " label " << i;
      }
    }
    for (std::int64_t index = 0; index < 8; ++index) {  // evaluation: the upper-case tail only
      const Batch b = d.held_out_batch(B, S, 7, index);
      for (std::size_t i = 0; i < b.tokens.size(); ++i) {
        ASSERT_FALSE(std::islower(b.tokens[i])) << "held-out batch " << index << " token " << i;
        ASSERT_TRUE(b.labels[i] == kNoLabel || !std::islower(b.labels[i])) << "held-out batch " << index;
      }
    }
  };
  {
    SCOPED_TRACE("plain text, --holdout 1/16: the cut falls on the first upper-case byte");
    check(DataSource::text_file(path, 0.0625), 2, 48);
  }
  {
    SCOPED_TRACE("packed lines, --holdout 0.066: the cut falls inside the last lower-case line, trained on whole");
    check(DataSource::packed_documents(path, "\n", 0.066), 1, 100);
  }
  EXPECT_NE(DataSource::text_file(path, 0.0625).error_for(300).find("holds out 256 bytes"), std::string::npos);
  EXPECT_EQ(DataSource::text_file(path, 0).held_out_bytes(), 0);
  try {
    DataSource::text_file(path, 1.0);
    ADD_FAILURE() << "--holdout 1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--holdout must be in [0, 1), got 1"), std::string::npos);
  }
}

// ~24 KB of sentences from a small grammar: learnable in a few steps, the tail like the head.
std::string sentences() {
  const char* subjects[] = {"the cat", "a dog", "my friend", "the old man", "our teacher"};
  const char* verbs[] = {"sees", "likes", "finds", "paints", "follows"};
  const char* objects[] = {"the river", "a red ball", "the moon", "an apple", "the garden"};
  std::string s;
  std::uint64_t x = 12345;
  auto pick = [&](int n) { return int((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 60) % n; };
  while (s.size() < 24000) s += fmt::format("{} {} {}.\n", subjects[pick(5)], verbs[pick(5)], objects[pick(5)]);
  return s;
}

TEST(TrainingText, HeldOutLossFallsTheSameOnEveryRankCount) {
  // The held-out loss is measured collectively: cp ranks report the loss of one rank.
  MpiCommunicator world;
  MpiCommunicator self(MPI_COMM_SELF);
  const std::string path = shared_file(world, "sentences.txt", sentences());
  TrainConfig c = small_config({});
  Trainer one(self, c, DataSource::text_file(path, 0.05));
  const Evaluation before = one.evaluate(4);
  for (int i = 0; i < 30; ++i) one.step();
  const Evaluation after = one.evaluate(4);
  ASSERT_TRUE(std::isfinite(before.loss) && std::isfinite(after.loss));
  EXPECT_GT(before.loss, 4.0) << "an untrained byte model is near uniform (ln 256 = 5.5)";
  EXPECT_LT(after.loss, 0.6 * before.loss) << "held-out loss did not fall";
  EXPECT_NEAR(after.bits_per_byte(), after.loss / std::log(2.0), 1e-12);
  EXPECT_EQ(after.accuracy, -1.0) << "accuracy is the synthetic task's";
  c.cp = {"a2a", {}, true, std::nullopt};
  Trainer run(world, c, DataSource::text_file(path, 0.05));
  EXPECT_NEAR(run.evaluate(4).loss, before.loss, 1e-5 * before.loss);
  for (int i = 0; i < 30; ++i) run.step();
  EXPECT_NEAR(run.evaluate(4).loss, after.loss, 1e-4 * after.loss) << "cp = " << world.size();
  EXPECT_EQ(Trainer(self, c, DataSource::text_file(path, 0)).evaluate(4).loss, -1.0) << "nothing held out";
}

}  // namespace
