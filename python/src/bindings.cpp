// ulysses._ulysses: the C++ library for Python (pybind11). Thin: tensors cross as (data
// pointer, dtype, shape, strides) tuples built by python/ulysses/_tensors.py from torch
// tensors, so nothing is copied; the GIL is released while the library computes or
// communicates; ulysses::Error becomes ulysses.Error with the same (agreed) message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/numpy.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ulysses/comm/all_to_all.hpp"
#include "ulysses/plan/balancer.hpp"
#include "ulysses/infer/cached_attention.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/infer/kv_cache.hpp"
#include "ulysses/comm/local_communicator.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/core/threads.hpp"
#include "ulysses/core/version.hpp"
#include "torch_communicator.hpp"

namespace py = pybind11;
using namespace ulysses;

namespace {

// (data_ptr, "f32" | "bf16", (b, s, h, d), (stride_b, stride_s, stride_h)) → a view; d is
// contiguous (the Python side guarantees it).
TensorView view_of(const py::tuple& t) {
  if (t.size() != 4) throw Error("internal: a tensor spec is (ptr, dtype, shape, strides)");
  TensorView v;
  v.data = reinterpret_cast<void*>(t[0].cast<std::uintptr_t>());
  v.dtype = parse_dtype(t[1].cast<std::string>());
  const auto shape = t[2].cast<std::vector<std::int64_t>>();
  const auto strides = t[3].cast<std::vector<std::int64_t>>();
  if (shape.size() != 4 || strides.size() != 3) throw Error("internal: shape must have 4 sizes and 3 strides");
  v.shape = {shape[0], shape[1], shape[2], shape[3]};
  v.stride_b = strides[0];
  v.stride_s = strides[1];
  v.stride_h = strides[2];
  return v;
}

std::vector<TensorView> views_of(const py::list& l) {
  std::vector<TensorView> out;
  for (const auto& t : l) out.push_back(view_of(t.cast<py::tuple>()));
  return out;
}

py::dict stats_dict(const CpStats& s) {
  py::dict d;
  d["compute_s"] = s.compute_s;
  d["comm_exposed_s"] = s.comm_exposed_s;
  d["score_pairs"] = s.score_pairs;
  return d;
}

// Python's float (a double) as the config's float32 scale: past float32's range it becomes ±inf
// (a plain cast would be undefined), so the library's collective check refuses it by value.
std::optional<float> scale_of(std::optional<double> scale) {
  if (!scale || !(std::abs(*scale) > double(std::numeric_limits<float>::max()))) return scale;
  return std::copysign(std::numeric_limits<float>::infinity(), float(*scale));
}

// window (left, right): FlashAttention's window_size, -1 unbounded; q_offset: cross-attention;
// scale: None for 1/sqrt(d), else finite and > 0 (refused at the first forward, on every rank).
CpConfig make_config(const std::string& type, bool causal, std::optional<double> scale,
                     const std::vector<int>& cp_sizes, std::pair<std::int64_t, std::int64_t> window = {-1, -1},
                     int overlap_chunks = 1, std::optional<std::int64_t> q_offset = std::nullopt,
                     std::map<std::string, std::vector<std::int64_t>> options = {}) {
  CpConfig c{std::string(find_strategy(type).name()), cp_sizes, causal, scale_of(scale)};
  std::tie(c.window_left, c.window_right) = window;
  c.overlap_chunks = overlap_chunks;
  c.q_offset = q_offset;
  std::vector<StrategyOption> declared;
  for (const Strategy* s : strategies())
    for (const StrategyOption& o : s->options()) declared.push_back(o);
  for (const auto& entry : options) {  // declared ones through their setters; the library refuses misplaced ones
    const std::string& flag = entry.first;
    const auto it =
        std::find_if(declared.begin(), declared.end(), [&](const StrategyOption& o) { return o.flag == flag; });
    if (it != declared.end())
      set_option(*it, c, entry.second);
    else
      c.options[flag] = entry.second;
  }
  return c;
}

// The head-sharded side of the fused all-to-all, kept alive by the numpy array viewing it.
struct HeadBuffer {
  FusedHeads heads;
};

// A numpy array over the whole [s, b, H, d] buffer (int16 bits for bf16), owned by `owner`.
py::array whole_array(const FusedHeads& f, py::handle owner) {
  const std::vector<py::ssize_t> shape{f.seq(), f.batch(), f.total_heads(), f.head_dim()};
  // Strides spelled out: pybind11 < 2.12 reads the element size from numpy's dtype struct,
  // whose layout numpy 2 changed (it would give 0 and all-zero strides).
  const py::ssize_t es = py::ssize_t(dtype_size(f.dtype()));
  const std::vector<py::ssize_t> strides{shape[1] * shape[2] * shape[3] * es, shape[2] * shape[3] * es, shape[3] * es,
                                         es};
  const py::dtype dt = f.dtype() == DType::f32 ? py::dtype::of<float>() : py::dtype::of<std::int16_t>();
  return py::array(dt, shape, strides, f.whole().data, owner);
}

// One (first, count) head range per rank for each tensor: which heads every rank gets.
using HeadLists = std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>;

std::vector<SeqShard> shards_of(const py::list& views, const HeadLists& heads) {
  const std::vector<TensorView> v = views_of(views);
  if (heads.size() != v.size()) throw Error("internal: one head list per tensor");
  std::vector<SeqShard> s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    SeqShard shard{v[i], {}};
    for (const auto& [first, count] : heads[i]) shard.heads.push_back({first, count});
    s.push_back(std::move(shard));
  }
  return s;
}

}  // namespace

// ---- the balancer (ulysses.balance): a plan for a variable-length step, as plain Python values ----
namespace {

py::dict balance_plan(const std::vector<std::int64_t>& lengths, int world, int dp, const std::string& policy,
                      std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t layers,
                      const std::string& cp_comm_type, double gemm_flops_per_token, std::int64_t max_tokens_per_rank,
                      int ranks_per_node, double peak_flops, double efficiency, const std::string& dtype) {
  BalanceInput in;
  in.lengths = lengths;
  in.world = world;
  in.dp = dp;
  in.cp_comm_type = cp_comm_type;
  in.gemm_flops_per_token = gemm_flops_per_token;
  in.max_tokens_per_rank = max_tokens_per_rank;
  in.model.heads = heads;
  in.model.kv_heads = kv_heads;
  in.model.head_dim = head_dim;
  in.model.layers = layers;
  in.model.dtype = parse_dtype(dtype);
  in.model.cluster.ranks_per_node = ranks_per_node;
  in.model.cluster.peak_flops = peak_flops;
  in.model.cluster.efficiency = efficiency;
  BalancePlan p;
  {
    py::gil_scoped_release unlocked;
    p = balance(in, parse_policy(policy));
  }
  std::vector<std::pair<int, int>> groups;
  for (const BalanceGroup& g : p.groups) groups.emplace_back(g.first_rank, g.size);
  std::vector<std::vector<int>> per_rank;
  for (int r = 0; r < world; ++r) per_rank.push_back(p.sequences_of(r));
  py::dict d;
  d["policy"] = policy_name(p.policy);
  d["groups"] = groups;
  d["sequences_of_rank"] = per_rank;
  d["step_seconds"] = p.step_seconds;
  d["rank_seconds"] = p.rank_seconds;
  d["rank_busy_seconds"] = p.rank_busy_seconds;
  d["rank_bytes"] = p.rank_bytes;
  d["sequence_seconds"] = p.sequence_seconds;
  return d;
}

void add_balance_bindings(py::module_& m) {
  m.def("balance", &balance_plan, py::arg("lengths"), py::arg("world"), py::arg("dp"), py::arg("policy"),
        py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("layers"), py::arg("cp_comm_type"),
        py::arg("gemm_flops_per_token"), py::arg("max_tokens_per_rank"), py::arg("ranks_per_node"),
        py::arg("peak_flops"), py::arg("efficiency"), py::arg("dtype"),
        "Not collective. balancer.hpp's balance(): a contiguous group (first_rank, size) per sequence and the "
        "predictions, as a dict.");
}

}  // namespace

// run_local for Python: each rank thread takes the GIL to call fn, which every collective of
// the binding releases again, so the ranks' C++ work runs in parallel; the caller waits without
// it. Python shares ownership of each rank's communicator: one that fn saved (or a module built
// on it) outlives the run without dangling, and raises Error on use once the group has ended.
py::list run_local_py(int size, const py::function& fn) {
  std::vector<py::object> results(static_cast<std::size_t>(std::max(size, 0)));
  {
    py::gil_scoped_release nogil;
    run_local_shared(size, [&](const std::shared_ptr<Communicator>& comm) {
      py::gil_scoped_acquire gil;
      results[std::size_t(comm->rank())] = fn(py::cast(comm));
    });
  }
  py::list out;
  for (py::object& r : results) out.append(std::move(r));
  return out;
}

namespace {

// Communicator (over mpi4py's handle, or a rank of run_local) and run_local.
void add_communicator_bindings(py::module_& m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def(py::init([](std::intptr_t fortran_handle) -> std::shared_ptr<Communicator> {
             return make_mpi_communicator(fortran_handle);
           }),
           py::arg("fortran_handle"), py::call_guard<py::gil_scoped_release>(),
           "Collective: a communicator over a duplicate of the MPI communicator with this Fortran handle "
           "(mpi4py's comm.py2f()).")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("backend", &Communicator::backend)
      .def("counters",
           [](const Communicator& c) {
             py::dict d;
             for (const auto& [op, k] : c.counters())
               d[py::str(op)] = py::dict(py::arg("calls") = k.calls, py::arg("bytes_sent") = k.bytes_sent,
                                         py::arg("messages") = k.messages);
             return d;
           })
      .def("reset_counters", &Communicator::reset_counters)
      .def_property_readonly("collectives", &Communicator::collectives,
                             "How many collectives this rank has entered: transfers and agreements alike.")
      .def_property("timeout", &Communicator::timeout, &Communicator::set_timeout,
                    "Seconds any wait may last before the group fails with the watchdog's message (0: none); "
                    "shared with the communicators split from it.")
      .def("agree", &Communicator::agree, py::arg("local_error"), py::call_guard<py::gil_scoped_release>(),
           "Collective: \"\" when this rank is fine, else its error; when any rank has one, every rank raises the "
           "lowest failing rank's, prefixed with that rank.")
      .def("agree_identical", &Communicator::agree_identical, py::arg("what"), py::arg("description"),
           py::call_guard<py::gil_scoped_release>(),
           "Collective: every rank raises the same Error naming both texts when a rank's description differs from "
           "rank 0's.")
      .def(
          "agree_all",
          [](Communicator& c, const std::string& local_error, const std::string& what, const std::string& description,
             const std::vector<std::int64_t>& values) { return c.agree_all(local_error, what, description, values); },
          py::arg("local_error"), py::arg("what"), py::arg("description"), py::arg("values"),
          py::call_guard<py::gil_scoped_release>(),
          "Collective: agree and agree_identical, and every rank's values (as many on each) in rank order, in one "
          "small all-gather.")
      .def(
          "default_threads", [](Communicator& c) { return default_threads(c); },
          py::call_guard<py::gil_scoped_release>(), "Collective: cores on this node / ranks on this node.");

  m.def("torch_communicator", &make_torch_communicator, py::arg("transport"),
        "Not collective: a communicator over a torch.distributed group (python/ulysses/_torch_comm.py's transport).");
  m.def("run_local", &run_local_py, py::arg("size"), py::arg("fn"),
        "fn(comm) on `size` threads, one per rank of a new local group; returns the results in rank order. An "
        "exception on a rank releases the others and is re-raised here once every rank has ended.");
}

// ContextParallelAttention and what its forward keeps for the backward.
void add_attention_bindings(py::module_& m) {
  py::class_<CpContext>(m, "Context", "What one forward keeps for its backward.")
      .def_property_readonly("valid", &CpContext::valid)
      .def_property_readonly("stats", [](const CpContext& c) { return stats_dict(c.stats()); });

  py::class_<ContextParallelAttention>(m, "ContextParallelAttention")
      .def(py::init([](Communicator& comm, const std::string& type, bool causal, std::optional<double> scale,
                       const std::vector<int>& cp_sizes, std::pair<std::int64_t, std::int64_t> window,
                       int overlap_chunks, std::optional<std::int64_t> q_offset,
                       std::map<std::string, std::vector<std::int64_t>> options) {
             return std::make_unique<ContextParallelAttention>(comm, make_config(type, causal, scale, cp_sizes, window,
                                                                                 overlap_chunks, q_offset,
                                                                                 std::move(options)));
           }),
           py::arg("comm"), py::arg("cp_comm_type"), py::arg("causal"), py::arg("scale"), py::arg("cp_sizes"),
           py::arg("window") = std::pair<std::int64_t, std::int64_t>{-1, -1}, py::arg("overlap_chunks") = 1,
           py::arg("q_offset") = std::nullopt, py::arg("options") = std::map<std::string, std::vector<std::int64_t>>{},
           py::keep_alive<1, 2>())
      .def(
          "forward",
          [](ContextParallelAttention& a, const py::tuple& out, const py::tuple& q, const py::tuple& k,
             const py::tuple& v, std::vector<std::int64_t> cu_seqlens) {
            const TensorView o = view_of(out), qv = view_of(q), kv = view_of(k), vv = view_of(v);
            py::gil_scoped_release nogil;
            return cu_seqlens.empty() ? a.forward(o, qv, kv, vv) : a.forward(o, qv, kv, vv, std::move(cu_seqlens));
          },
          py::arg("out"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens") = std::vector<std::int64_t>{})
      .def("refuse_forward", &ContextParallelAttention::refuse_forward, py::arg("error"),
           py::call_guard<py::gil_scoped_release>(),
           "Collective: this rank's part of a forward whose inputs failed the caller's checks; every rank raises "
           "the lowest failing rank's error.")
      .def("backward", [](ContextParallelAttention& a, const CpContext& ctx, const py::tuple& dq, const py::tuple& dk,
                          const py::tuple& dv, const py::tuple& dout) {
        const TensorView a1 = view_of(dq), a2 = view_of(dk), a3 = view_of(dv), g = view_of(dout);
        CpStats s;
        {
          py::gil_scoped_release nogil;
          s = a.backward(ctx, a1, a2, a3, g);
        }
        return stats_dict(s);
      });
}

// Ulysses' fused all-to-all and its adjoint, over tensors Python owns. Without `tokens` each
// agrees its inputs and learns every rank's n_r in one small collective; with them (every rank's
// n_r, from an agreement the caller already made, e.g. over the same inputs' forward) it trusts
// its inputs and makes the all-to-all alone.
void add_transpose_bindings(py::module_& m) {
  py::class_<HeadBuffer>(m, "HeadBuffer", "The head-sharded side of the fused all-to-all.");
  using Tokens = std::optional<std::vector<std::int64_t>>;
  m.def(
      "transpose_check",
      [](const py::list& views, const HeadLists& heads, int cp, const std::string& op) {
        const TransposeCheck c = local_transpose_check(shards_of(views, heads), cp, op.c_str());
        return py::make_tuple(c.error, c.description);
      },
      py::arg("views"), py::arg("heads"), py::arg("cp"), py::arg("op"),
      "Not collective: (why these shards cannot be transposed here or \"\", what every rank must agree on).");
  m.def(
      "seq_to_head",
      [](Communicator& comm, const py::list& views, const HeadLists& heads, const Tokens& tokens) {
        const std::vector<SeqShard> shards = shards_of(views, heads);
        auto buffer = std::make_unique<HeadBuffer>();
        {
          py::gil_scoped_release nogil;
          if (tokens)
            post_seq_to_head(comm, shards, *tokens, buffer->heads).wait();
          else
            buffer->heads = seq_to_head(comm, shards);
        }
        py::object owner = py::cast(std::move(buffer));
        const FusedHeads& f = owner.cast<HeadBuffer&>().heads;
        return py::make_tuple(whole_array(f, owner), f.rank_tokens());
      },
      py::arg("comm"), py::arg("views"), py::arg("heads"), py::arg("tokens") = Tokens{},
      "Collective: one all-to-all of every tensor [b, n_rank, h, d], rank j getting heads[t][j] of tensor t; "
      "returns the [s, b, H, d] head-sharded buffer, tensors' heads back to back, and every rank's n_r.");
  m.def(
      "head_to_seq",
      [](Communicator& comm, const py::list& head_views, const py::list& out_views, const HeadLists& heads,
         const Tokens& tokens) {
        const std::vector<TensorView> in = views_of(head_views);
        const std::vector<SeqShard> out = shards_of(out_views, heads);
        if (in.empty() || in.size() != out.size()) throw Error("head_to_seq: one head-sharded input per output");
        std::vector<std::int64_t> local_heads;
        for (const TensorView& v : in) local_heads.push_back(v.shape.h);
        py::gil_scoped_release nogil;
        const std::vector<std::int64_t> rank_tokens =
            tokens ? *tokens : comm.allgather_value(out[0].view.shape.s, "validate");
        FusedHeads f(in[0].dtype, in[0].shape.b, rank_tokens, in[0].shape.d, local_heads);
        for (std::size_t t = 0; t < in.size(); ++t) copy(in[t], f.part(int(t)));
        if (tokens)
          post_head_to_seq(comm, f, out).wait();
        else
          head_to_seq(comm, f, out);
      },
      py::arg("comm"), py::arg("head_views"), py::arg("out_views"), py::arg("heads"), py::arg("tokens") = Tokens{},
      "Collective: the adjoint of seq_to_head; writes every output [b, n_rank, h, d] (shared heads summed).");
}

// The layouts and the registry: which tokens and heads every rank holds, the strategies and their options.
void add_layout_bindings(py::module_& m) {
  m.def(
      "rank_chunks",
      [](const std::string& type, bool causal, const std::vector<int>& cp_sizes, int cp, int rank, std::int64_t seq,
         std::optional<std::int64_t> q_offset, std::vector<std::int64_t> cu_seqlens,
         std::map<std::string, std::vector<std::int64_t>> options) {
        std::vector<std::pair<std::int64_t, std::int64_t>> out;
        CpConfig config = make_config(type, causal, 0.0f, cp_sizes, {-1, -1}, 1, q_offset, std::move(options));
        config.cu_seqlens = std::move(cu_seqlens);
        for (const SeqChunk& c : rank_chunks(config, cp, rank, seq)) out.emplace_back(c.begin, c.length);
        return out;
      },
      py::arg("cp_comm_type"), py::arg("causal"), py::arg("cp_sizes"), py::arg("cp"), py::arg("rank"), py::arg("seq"),
      py::arg("q_offset") = std::nullopt, py::arg("cu_seqlens") = std::vector<std::int64_t>{},
      py::arg("options") = std::map<std::string, std::vector<std::int64_t>>{},
      "The (begin, length) chunks of the global sequence that `rank` of `cp` holds, in local order (contiguous "
      "under cross-attention: q_offset set; per-document zigzag on a ring with cu_seqlens).");
  m.def("validate", [](const std::string& type, bool causal, const std::vector<int>& cp_sizes, int cp,
                       const std::vector<std::int64_t>& q_global, std::int64_t kv_heads) {
    if (q_global.size() != 4) throw Error("validate: q_global is [b, s, h, d]");
    validate_cp_config(make_config(type, causal, 0.0f, cp_sizes), cp,
                       {q_global[0], q_global[1], q_global[2], q_global[3]}, kv_heads);
  });
  m.def(
      "strategy_options",
      [](const std::string& type) {
        std::vector<std::tuple<std::string, std::string, std::string>> out;
        for (const StrategyOption& o : find_strategy(type).options()) out.emplace_back(o.flag, o.metavar, o.help);
        return out;
      },
      py::arg("cp_comm_type"), "The options a strategy declares: (flag, metavar, help) each.");
  m.def("strategy_names", [] {
    std::vector<std::string> n;
    for (const Strategy* s : strategies()) n.emplace_back(s->name());
    return n;
  });
  m.def(
      "head_split",
      [](int group, std::int64_t heads, std::int64_t kv_heads) {
        const HeadSplit split = ulysses_head_split(group, heads, kv_heads);
        auto pairs = [](const std::vector<HeadRange>& r) {
          std::vector<std::pair<std::int64_t, std::int64_t>> out;
          for (const HeadRange& h : r) out.emplace_back(h.first, h.count);
          return out;
        };
        return py::make_tuple(pairs(split.q), pairs(split.kv));
      },
      "Ulysses' head split over `group` ranks: ((first, count) of query heads per rank, the same for KV heads); "
      "GQA groups kept whole, KV heads shared when fewer than ranks.");
}

}  // namespace

// ---- inference (ulysses.torch.KvCache): the sharded KV cache and attention over it ----
namespace {

py::dict cache_stats(const CachedAttentionStats& s) {
  py::dict d;
  d["collectives"] = s.collectives;
  d["comm_s"] = s.comm_s;
  return d;
}

// [rows, kv heads held, d] float32 copy of one layer's cached keys or values.
py::array_t<float> cached_rows(const TensorView& x) {
  py::array_t<float> a({x.shape.s, x.shape.h, x.shape.d});
  copy(x, TensorView::dense(a.mutable_data(), DType::f32, {1, x.shape.s, x.shape.h, x.shape.d}, Layout::bshd));
  return a;
}

void add_cache_class(py::module_& m) {
  py::class_<KvCache>(m, "KvCache", "One rank's part of a KV cache sharded over a CP group (kv_cache.hpp).")
      .def(py::init([](const std::string& layout, std::int64_t layers, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim, std::int64_t capacity, int cp, int rank) {
             return std::make_unique<KvCache>(parse_kv_layout(layout),
                                              KvCacheShape{layers, heads, kv_heads, head_dim, capacity}, cp, rank);
           }),
           py::arg("layout"), py::arg("layers"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("capacity"), py::arg("cp"), py::arg("rank"))
      .def_property_readonly("layout", [](const KvCache& c) { return std::string(to_string(c.layout())); })
      .def_property_readonly("bytes", &KvCache::bytes)
      .def_property_readonly("replication", &KvCache::replication)
      .def_property_readonly("heads",
                             [](const KvCache& c) {
                               const RankHeads& h = c.heads();
                               return py::make_tuple(py::make_tuple(h.q.first, h.q.count),
                                                     py::make_tuple(h.kv.first, h.kv.count));
                             })
      .def("tokens", &KvCache::tokens, py::arg("layer"))
      .def("rows", &KvCache::rows, py::arg("layer"))
      .def(
          "keys", [](const KvCache& c, std::int64_t layer) { return cached_rows(c.keys(layer)); }, py::arg("layer"))
      .def(
          "values", [](const KvCache& c, std::int64_t layer) { return cached_rows(c.values(layer)); }, py::arg("layer"))
      .def("clear", &KvCache::clear);
  m.def(
      "kv_bytes_formula",
      [](const std::string& layout, std::int64_t layers, std::int64_t heads, std::int64_t kv_heads,
         std::int64_t head_dim, std::int64_t capacity, int cp, int rank) {
        return kv_bytes_formula(parse_kv_layout(layout), KvCacheShape{layers, heads, kv_heads, head_dim, capacity}, cp,
                                rank);
      },
      "layers * 2 * kv_rows(capacity) * kv heads held * head_dim * 4: the bytes rank `rank` of `cp` holds.");
}

void add_cache_bindings(py::module_& m) {
  add_cache_class(m);
  m.def(
      "cache_prefill",
      [](Communicator& comm, KvCache& cache, const std::string& how, std::int64_t layer,
         const std::vector<std::int64_t>& rank_tokens, const py::tuple& q, const py::tuple& k, const py::tuple& v,
         const py::tuple& out, bool over_cache) {
        const TensorView qv = view_of(q), kv = view_of(k), vv = view_of(v), o = view_of(out);
        const Prefill path = parse_prefill(how);
        CachedAttentionStats s;
        {
          py::gil_scoped_release nogil;
          if (over_cache)
            extend(comm, cache, layer, rank_tokens, qv, kv, vv, o, &s);
          else
            prefill(comm, cache, path, layer, rank_tokens, qv, kv, vv, o, &s);
        }
        return cache_stats(s);
      },
      py::arg("comm"), py::arg("cache"), py::arg("how"), py::arg("layer"), py::arg("rank_tokens"), py::arg("q"),
      py::arg("k"), py::arg("v"), py::arg("out"), py::arg("over_cache"),
      "Collective, unchecked across ranks: prefill (or extend, over_cache) of one layer; returns its stats.");
  m.def(
      "cache_decode",
      [](Communicator& comm, const std::vector<KvCache*>& caches, std::int64_t layer, const py::tuple& q,
         const py::tuple& k, const py::tuple& v, const py::tuple& out) {
        const TensorView qv = view_of(q), kv = view_of(k), vv = view_of(v), o = view_of(out);
        CachedAttentionStats s;
        {
          py::gil_scoped_release nogil;
          decode_attention(comm, caches, layer, qv, kv, vv, o, &s);
        }
        return cache_stats(s);
      },
      "Collective, unchecked across ranks: one decode step of len(caches) requests; returns its stats.");
  m.def(
      "agree_all",
      [](Communicator& comm, const std::string& local_error, const std::string& what, const std::string& description,
         const std::vector<std::int64_t>& values) {
        py::gil_scoped_release nogil;
        return comm.agree_all(local_error, what, description, values);
      },
      "Collective: agree(local_error), agree_identical(what, description) and an all-gather of `values` in one "
      "small all-gather; returns every rank's values back to back.");
}

}  // namespace

PYBIND11_MODULE(_ulysses, m) {
  m.doc() = "ulysses: context-parallel attention over MPI (the C++ library)";
  m.attr("__version__") = ulysses::version();
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  add_communicator_bindings(m);
  add_attention_bindings(m);
  add_transpose_bindings(m);
  add_layout_bindings(m);
  m.def("set_threads", &set_threads, "OpenMP threads of the kernels (BLAS pinned to one).");
  add_balance_bindings(m);
  add_cache_bindings(m);
}
