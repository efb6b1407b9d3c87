"""A torch.distributed group where a Communicator goes: DeepSpeed's DistributedAttention
arguments by position and by name, ContextParallelAttention on every strategy, the byte counters
to the formula, the same results as MPI's communicator under mpirun, and bad input."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import ulysses
import ulysses.torch as ut
from conftest import agreed_ok, launcher, sdpa

RANK, P = dist.get_rank(), dist.get_world_size()


def reference(b, s, h, d, seed=3):
    """The global q, k, v, dout and single-process attention with its gradients (float32)."""
    torch.manual_seed(seed)
    q, k, v, dout = (torch.randn(b, s, h, d) for _ in range(4))
    rq, rk, rv = (x.clone().requires_grad_() for x in (q, k, v))
    out = sdpa(rq, rk, rv)
    out.backward(dout)
    return (q, k, v, dout), (out.detach(), rq.grad, rk.grad, rv.grad)


def mine(x, dim=1):
    """This rank's contiguous tokens (DeepSpeed's layout: equal parts)."""
    n = x.shape[dim] // P
    return x.narrow(dim, RANK * n, n).contiguous()


def test_the_group_is_a_communicator(world):
    comm = ulysses.Communicator.from_torch()
    assert (comm.backend, comm.rank, comm.size) == ("torch", RANK, P)
    assert ulysses.Communicator.from_torch(world) is comm  # one per group, shared by every layer
    assert comm.group is world


@pytest.mark.parametrize(
    "make",
    [
        lambda attn, g: ut.DistributedAttention(attn, g, 2, 1),
        lambda attn, g: ut.DistributedAttention(attn, sequence_process_group=g, scatter_idx=2, gather_idx=1),
        lambda attn, g: ut.DistributedAttention(local_attention=attn, sequence_process_group=None, gather_idx=1),
        lambda attn, g: ut.DistributedAttention(attn, ulysses.Communicator.from_torch(g), gather_idx=1),
    ],
    ids=["positional", "keywords", "default-group", "communicator"],
)
def test_distributed_attention_takes_their_group(world, make):
    (q, k, v, dout), (out, dq, dk, dv) = reference(2, 8 * P, 4, 16)
    layer = make(sdpa, world)
    lq, lk, lv = (mine(x).requires_grad_() for x in (q, k, v))
    got = layer(lq, lk, lv, 0)  # batch_dim_idx=0: [b, s/p, h, d], as DeepSpeed >= 0.15 passes it
    got.backward(mine(dout))
    pairs = [(got.detach(), out), (lq.grad, dq), (lk.grad, dk), (lv.grad, dv)]
    errs = [float((a - mine(b)).abs().max()) for a, b in pairs]
    assert agreed_ok(max(errs) < 1e-5), errs


def test_counters_are_the_formula(world):
    """seq_to_head sends (p-1)/p of q, k and v; head_to_seq (p-1)/p of the output: exact bytes."""
    b, n, h, d = 2, 8, 4 * P, 16
    layer = ut.DistributedAttention(sdpa, world, 2, 1)
    layer.comm.reset_counters()
    x = torch.randn(b, n, h, d)
    layer(x, x, x)
    c = layer.comm.counters()
    per_tensor = b * n * h * d * 4 * (P - 1) // P
    assert c["seq_to_head"]["bytes_sent"] == 3 * per_tensor
    assert c["head_to_seq"]["bytes_sent"] == per_tensor


def collectives_of(comm, fn, group_checks):
    """How many collectives ``fn()`` entered on this rank: ours on ``comm`` (transfers and
    agreements alike) and the default group's all-gathers that check a group where one is
    passed (``group_checks``: a list the patched check appends to)."""
    before, checks = comm.collectives, len(group_checks)
    out = fn()
    return out, (comm.collectives - before, len(group_checks) - checks)


def test_collectives_per_call(world, monkeypatch):
    """What the algorithm needs and no more (latency, not bytes, bounds small steps): the
    DistributedAttention forward agrees its inputs and every rank's tokens in one all-gather,
    makes the inputs' all-to-all, agrees the local attention's output, makes its all-to-all;
    the backward only its two all-to-alls (autograd's gradients are shaped as the agreed
    outputs). DeepSpeed's module makes 4 + 4 (Q, K and V travel apart). ``all_to_all`` takes its
    group at every call, so it also checks the group over the default group."""
    checks, check = [], ulysses._torch_comm._agree_on_groups
    monkeypatch.setattr(ulysses._torch_comm, "_agree_on_groups", lambda *a: checks.append(1) or check(*a))
    layer = ut.DistributedAttention(sdpa, world, 2, 1)
    comm = layer.comm
    q, k, v = (torch.randn(2, 8, 2 * P, 16, requires_grad=True) for _ in range(3))
    out, forward = collectives_of(comm, lambda: layer(q, k, v, 0), checks)
    _, backward = collectives_of(comm, lambda: out.sum().backward(), checks)
    heads, to_heads = collectives_of(comm, lambda: ut.all_to_all(q, 2, 1, 0, world), checks)
    _, to_seq = collectives_of(comm, lambda: ut.all_to_all(heads, 1, 2, 0, world), checks)
    _, a2a_backward = collectives_of(comm, lambda: heads.sum().backward(), checks)
    cp = ut.ContextParallelAttention(world)
    cp_out, cp_forward = collectives_of(comm, lambda: cp(q, k, v), checks)
    _, cp_backward = collectives_of(comm, lambda: cp_out.sum().backward(), checks)
    got = (forward, backward, to_heads, to_seq, a2a_backward, cp_forward, cp_backward)
    assert got == ((4, 0), (2, 0), (2, 1), (2, 1), (1, 0), (3, 0), (3, 0)), got


def test_a_local_attention_output_that_does_not_fit(world):
    """One rank's local attention returns another shape: the same error on every rank, before
    the output's all-to-all (which would otherwise move the wrong bytes or wait)."""
    last = lambda q, k, v: sdpa(q, k, v)[:, :-1] if RANK == P - 1 else sdpa(q, k, v)  # noqa: E731
    x = torch.randn(1, 4, 2 * P, 8)
    err = error_of(lambda: ut.DistributedAttention(last, world, 2, 1)(x, x, x, 0))
    prefix = f"rank {P - 1}: " if P > 1 else ""
    assert err is not None and err.startswith(prefix + "attention output is (1, "), err
    assert f"the whole sequence s = {4 * P}" in err, err


def test_layouts_that_differ_between_ranks(world):
    """batch_dim_idx differs between ranks: the same error on every rank, naming both layouts."""
    if P < 2:
        pytest.skip("needs two ranks")
    x = torch.randn(4, 4, 2 * P, 8)
    err = error_of(lambda: ut.DistributedAttention(sdpa, world, 2, 1)(x, x, x, RANK % 2))
    assert err is not None and err.startswith("DistributedAttention inputs differ between ranks: rank 0 has"), err
    assert "sequence first: False" in err and "sequence first: True" in err, err


def strategies():
    out = [(s, None) for s in ulysses.strategy_names() if s != "a2a+p2p"]
    return out + [("a2a+p2p", [i, P // i]) for i in range(1, P + 1) if P % i == 0]


@pytest.mark.parametrize("strategy,sizes", strategies())
def test_every_strategy_over_the_group(world, strategy, sizes):
    """Every strategy over torch.distributed equals single-process attention; under mpirun it is
    bit for bit what the same strategy gives over MPI (the same ranks, the same arithmetic)."""
    (q, k, v, _), (out, _, _, _) = reference(1, 6 * P, 4, 8, seed=5)
    comm = ulysses.Communicator.from_torch(world)
    attn = ut.ContextParallelAttention(None, strategy, causal=True, cp_sizes=sizes)  # None: the default group
    shards = [ulysses.shard(x, comm, strategy, True, cp_sizes=sizes) for x in (q, k, v)]
    got = attn(*shards)
    want = ulysses.shard(out, comm, strategy, True, cp_sizes=sizes)
    ok = float((got - want).abs().max()) < 1e-5
    if launcher() == "mpirun":
        from mpi4py import MPI

        mpi = ulysses.Communicator(MPI.COMM_WORLD)
        ok = ok and torch.equal(got, ut.ContextParallelAttention(mpi, strategy, causal=True, cp_sizes=sizes)(*shards))
    assert agreed_ok(ok)


def test_a_sub_group(world):
    """Groups of 2 inside the world (DeepSpeed's sp < world): each pair attends on its own."""
    if P % 2:
        pytest.skip("needs an even world")
    groups = [dist.new_group([r, r + 1]) for r in range(0, P, 2)]  # every rank makes every group
    group = groups[RANK // 2]
    torch.manual_seed(11 + RANK // 2)
    q, k, v = (torch.randn(1, 8, 4, 16) for _ in range(3))
    half = RANK % 2
    layer = ut.DistributedAttention(sdpa, group, 2, 1)
    got = layer(*(x[:, 4 * half : 4 * half + 4] for x in (q, k, v)))
    assert layer.comm.size == 2 and layer.comm.rank == half
    assert agreed_ok(float((got - sdpa(q, k, v)[:, 4 * half : 4 * half + 4]).abs().max()) < 1e-5)


def error_of(fn):
    try:
        fn()
    except ulysses.Error as e:
        return str(e)
    return None


def test_a_group_without_this_rank(world):
    """A rank passing a group that does not hold it: the same error on every rank, naming that
    rank, never its members left waiting for it."""
    if P < 2:
        pytest.skip("needs a rank outside the group")
    members = [0] if P == 2 else [0, 1]
    group = dist.new_group(members)
    err = error_of(lambda: ut.DistributedAttention(sdpa, group))
    outsider = members[-1] + 1
    assert err.startswith(f"global rank {outsider}: sequence_process_group does not hold this process"), err
    assert "pass the group this rank's tensors belong to" in err


def differing_groups():
    """(what rank r passes, what every rank must be told) for groups that differ between ranks."""
    if P == 2:  # rank 0 both ranks, rank 1 a group of its own (fresh groups: a used one is not agreed again)
        both, alone = dist.new_group([0, 1]), dist.new_group([1])
        return (
            both if RANK == 0 else alone
        ), "rank 0 passed the group of global ranks [0, 1], its member global rank 1 passed [1]"
    pairs = {r: dist.new_group([r, r + 1]) for r in range(P - 1)}
    last = dist.new_group([P - 1])
    mine = {0: pairs[0], 1: pairs[1], 2: pairs[1]}.get(RANK, last)  # rank 0 [0, 1], ranks 1 and 2 [1, 2]
    return mine, "rank 0 passed the group of global ranks [0, 1], its member global rank 1 passed [1, 2]"


def test_groups_that_differ_between_ranks(world):
    """Rank 0 passes [0, 1] where rank 1 passes [1, 2] (or, on 2 ranks, a group of its own):
    the group's first collective would wait for a peer busy in another group. The same error on
    every rank instead, naming both."""
    if P < 2:
        pytest.skip("needs two ranks")
    mine, says = differing_groups()
    err = error_of(lambda: ut.DistributedAttention(sdpa, mine))
    assert err.startswith("sequence_process_group differs between ranks: global ") and says in err, err
    assert "every member of a group must pass that same group" in err


def test_another_group_of_the_same_ranks(world):
    """Two new_group calls of the same ranks are two transports: passing one on rank 0 and the
    other elsewhere would hang as surely; the error says so."""
    twins = [dist.new_group(list(range(P))) for _ in range(2)]
    err = error_of(lambda: ulysses.Communicator.from_torch(twins[RANK == 0]))
    if P == 1:
        assert err is None
    else:
        assert "differs between ranks" in err and "another group of the same ranks (group names" in err, err


def test_a_cached_group_beside_a_new_one(world):
    """Rank 0 reuses a group every rank used before (its communicator cached) while the others
    pass a new group of the same ranks: rank 0 went straight to the old group's collectives and
    the others waited for it in the new group's first agreement. One error on every rank now."""
    if P < 2:
        pytest.skip("needs two ranks")
    used = dist.new_group(list(range(P)))
    ut.DistributedAttention(sdpa, used)  # every rank: this group is cached from now on
    fresh = dist.new_group(list(range(P)))
    err = error_of(lambda: ut.DistributedAttention(sdpa, used if RANK == 0 else fresh))
    assert err is not None and "differs between ranks" in err, err
    assert "another group of the same ranks (group names" in err, err
    assert ut.DistributedAttention(sdpa, used).comm is ulysses.Communicator.from_torch(used)  # still usable


def test_an_nccl_group(world, monkeypatch):
    """NCCL moves GPU tensors only: refused on every rank, saying to make a gloo group. An NCCL
    group cannot be made without a GPU (torch: "nccl2 requires at least one CUDA device"), so the
    last rank's gloo group says it is NCCL."""
    group = dist.new_group(list(range(P)))
    get_backend = dist.get_backend
    if RANK == P - 1:
        monkeypatch.setattr(dist, "get_backend", lambda g=None: "nccl" if g is group else get_backend(g))
    err = error_of(lambda: ut.DistributedAttention(sdpa, group))
    want = f"global rank {P - 1}: sequence_process_group uses the nccl backend, which does not move CPU tensors"
    assert err is not None and err.startswith(want), err
    assert f"torch.distributed.new_group({list(range(P))}, backend='gloo')" in err, err


@pytest.mark.parametrize(
    "bad,says",
    [
        (lambda x: x.to(torch.float16), ["dtype torch.float16", "convert with .float() or .bfloat16()"]),
        (lambda x: x.double(), ["dtype torch.float64", "convert with .float()"]),
        (lambda x: torch.empty(x.shape, device="meta"), ["is on meta", "move them with .cpu()"]),
    ],
    ids=["float16", "float64", "device"],
)
def test_tensors_we_cannot_take(world, bad, says):
    """One rank's bad tensor: the same error on every rank, saying what to do, no hang."""
    x = torch.randn(1, 4, 2 * P, 8)
    q = bad(x) if RANK == P - 1 else x
    errors = [
        error_of(lambda: ut.DistributedAttention(sdpa, world, 2, 1)(q, x, x)),
        error_of(lambda: ut.ContextParallelAttention(world)(q, x, x)),
        error_of(lambda: ut.all_to_all(q, 2, 1, 0, world)),
    ]
    for err in errors:
        prefix = f"rank {P - 1}: " if P > 1 else ""  # the failing rank, named on every rank
        assert err is not None and err.startswith(prefix) and all(s in err for s in says), err


def test_what_is_not_a_group(world):
    err = error_of(lambda: ut.DistributedAttention(sdpa, "world"))
    assert "must be a torch.distributed ProcessGroup" in err and "got str" in err


def test_before_init_process_group():
    """Without torch.distributed initialised: what to call first (a process of its own)."""
    if RANK != 0:
        return
    code = "import ulysses.torch as ut; ut.DistributedAttention(lambda q, k, v: q, None)"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE") and not k.startswith("OMPI_")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode != 0 and "call torch.distributed.init_process_group('gloo') first" in run.stderr, run.stderr


def test_all_to_all_uneven_tokens_and_heads(world):
    """Lengths and heads that do not divide by the group: the library's split (the first ranks
    one token larger, whole heads), there and back bit for bit."""
    s, h = 3 * P + 1, 2 * P + 1
    torch.manual_seed(RANK)
    x = torch.randn(2, s // P + (RANK < s % P), h, 8)
    heads = ut.all_to_all(x, 2, 1, 0, world)
    assert heads.shape[1] == s
    assert agreed_ok(torch.equal(ut.all_to_all(heads, 1, 2, 0, world), x))


def test_all_to_all_refuses_other_dims(world):
    err = error_of(lambda: ut.all_to_all(torch.zeros(1, 4, 2 * P, 8), 3, 1, 0, world))
    assert "scatter_idx and gather_idx are 2 and the sequence's dim" in err, err


HANG = """
import time, torch.distributed as dist, ulysses
dist.init_process_group("gloo")
comm = ulysses.Communicator.from_torch()
comm.timeout = 2
if dist.get_rank() == 0:
    comm._impl.agree("")  # rank 1 never joins this collective
time.sleep(60)
"""


def test_the_watchdog_ends_the_job(tmp_path):
    """A rank that skips a collective: the waiting rank names it and exits 75; torchrun ends the
    job (a torchrun of its own, started by rank 0)."""
    ok = True
    if RANK == 0:
        script = tmp_path / "hang.py"
        script.write_text(HANG)
        launch = ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "GROUP_", "ROLE_", "OMPI_", "PMIX")
        env = {k: v for k, v in os.environ.items() if not k.startswith(launch)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        out = run.stdout + run.stderr
        said = (
            "ulysses watchdog: rank 0 (torch global rank 0" in out and "the torch group of global ranks [0, 1]" in out
        )
        ok = run.returncode != 0 and said and "exitcode: 75" in out
        assert ok, out[-3000:]
    assert agreed_ok(ok)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shard_and_unshard_over_the_group(world, dtype):
    """shard, positions and unshard take the group too: zigzag tokens there and back exactly."""
    x = torch.arange(2 * (4 * P + 1) * 3, dtype=torch.float32).view(2, 4 * P + 1, 3, 1).to(dtype)
    mine = ulysses.shard(x, world, "p2p", causal=True)
    pos = ulysses.positions(x.shape[1], None, "p2p", causal=True)
    same = torch.equal(mine, x[:, pos])
    assert agreed_ok(same and torch.equal(ulysses.unshard(mine, world, "p2p", causal=True), x))
