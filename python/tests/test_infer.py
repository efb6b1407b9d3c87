"""ulysses.torch.KvCache: prefill, a next turn (extend) and decode over a KV cache sharded over
the group, both layouts, both prefills. Alone (one process) on local groups of 1 to 4 rank
threads; under mpirun on the world. Every output against float64 attention over every token so
far (numpy), at every step, including decode from an empty cache (ranks with empty shards); a
tiny model's greedy tokens and logits against the same model on one rank; bad input as one
error on every rank."""

import numpy as np
import pytest
import torch
import ulysses
import ulysses.torch as ut
from mpi4py import MPI

WORLD = MPI.COMM_WORLD.size
SIZES = [1, 2, 3, 4] if WORLD == 1 else [WORLD]
CASES = [("heads", "ulysses"), ("heads", "ring"), ("interleaved", "ulysses"), ("interleaved", "ring")]
H, HKV, D = 4, 2, 8


@pytest.fixture(scope="module")
def world():
    return ulysses.Communicator(MPI.COMM_WORLD, threads=1)


def on_ranks(world, n, fn):
    """fn(comm) on n ranks, results in rank order: a local group alone, the world under mpirun."""
    if WORLD == 1:
        return ulysses.local_group(n, threads=1).run(fn)
    return MPI.COMM_WORLD.allgather(fn(world))


def attention64(q, k, v, first):
    """float64 causal attention of queries at positions first, first + 1, ... over keys 0..:
    q [T, h, d], k and v [S, h_kv, d] (numpy), GQA by repeating K/V heads."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    k, v = np.repeat(k, H // HKV, axis=1), np.repeat(v, H // HKV, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
    s[:, np.arange(q.shape[0])[:, None] + first < np.arange(k.shape[0])[None, :]] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), v)


def rel(x, ref):
    return float(np.linalg.norm(x.double().numpy() - ref) / np.linalg.norm(ref))


def prompt_calls(comm, cache, layer, q, k, v, first, how):
    """This rank's chunk of tokens [first, first + T) of q, k, v through prefill (or extend)."""
    b, n = ut.prompt_chunk(q.shape[1], comm.size, comm.rank)
    sl = slice(b, b + n)
    if first == 0:
        return cache.prefill(layer, q[:, sl], k[:, sl], v[:, sl], how), b
    return cache.extend(layer, q[:, sl], k[:, sl], v[:, sl]), b


def float64_run(comm, layout, how, prompt, turn, steps, seed=0):
    """Prefill `prompt` tokens (none: decode from an empty cache), decode `steps`, a second turn
    of `turn` tokens (extend), decode `steps` more; the largest relative error against float64 of
    every output, and what the cache holds against its formula, collectives of a decode step."""
    g = torch.Generator().manual_seed(seed)
    total = prompt + turn + 2 * steps
    q, k = torch.randn(1, total, H, D, generator=g), torch.randn(1, total, HKV, D, generator=g)
    v = torch.randn(1, total, HKV, D, generator=g)
    cache = ut.KvCache(comm, layout, 1, H, HKV, D, capacity=total)
    errors, at, step_collectives = [], 0, set()
    for kind, n in (("prompt", prompt), ("decode", steps), ("prompt", turn), ("decode", steps)):
        if kind == "prompt" and n:
            out, b = prompt_calls(comm, cache, 0, q[:, at : at + n], k[:, at : at + n], v[:, at : at + n], at, how)
            want = attention64(q[0, at : at + n], k[0, : at + n], v[0, : at + n], at)
            errors.append(rel(out[0], want[b : b + out.shape[1]]))
        for t in range(at, at + n) if kind == "decode" else ():
            before = cache.stats["collectives"]
            out = cache.decode(0, q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], agree=t % 2 == 0)
            step_collectives.add(cache.stats["collectives"] - before)
            errors.append(rel(out[0], attention64(q[0, t : t + 1], k[0, : t + 1], v[0, : t + 1], t)))
        at += n
    return max(errors), (cache.bytes, cache.bytes_formula, cache.tokens(0)), step_collectives


@pytest.mark.parametrize("layout,how", CASES)
@pytest.mark.parametrize("n", SIZES)
def test_every_output_matches_float64(world, n, layout, how):
    got = on_ranks(world, n, lambda comm: float64_run(comm, layout, how, prompt=9, turn=5, steps=3))
    for r, (err, (held, formula, tokens), per_step) in enumerate(got):
        assert err <= 1e-5, (n, layout, how, r, err)
        assert held == formula and tokens == 9 + 5 + 6, (r, held, formula, tokens)
        assert per_step == {1}, per_step  # one collective a decode step; agreement is not the library's


@pytest.mark.parametrize("layout", ["heads", "interleaved"])
@pytest.mark.parametrize("n", SIZES)
def test_decode_from_an_empty_cache(world, n, layout):
    # interleaved: token t on rank t mod n, so the first steps attend with empty shards
    got = on_ranks(world, n, lambda comm: float64_run(comm, layout, "ulysses", prompt=0, turn=0, steps=3))
    assert max(err for err, _, _ in got) <= 1e-5, got


class Tiny:
    """A 2-layer causal transformer (learned positions, GQA, no MLP) whose attention is the
    cache's: the model's result depends on the cache being exact."""

    def __init__(self, seed=3, vocab=32, width=24, layers=2, positions=64):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g) * s[0] ** -0.5  # noqa: E731
        self.emb, self.pos, self.layers = r(vocab, width), r(positions, width), layers
        self.w = [(r(width, H * D), r(width, HKV * D), r(width, HKV * D), r(H * D, width)) for _ in range(layers)]

    def logits(self, tokens, positions, attend):
        x = self.emb[tokens] + self.pos[positions]
        for layer, (wq, wk, wv, wo) in enumerate(self.w):
            n = len(tokens)
            q, k, v = (x @ wq).view(1, n, H, D), (x @ wk).view(1, n, HKV, D), (x @ wv).view(1, n, HKV, D)
            x = x + attend(layer, q, k, v).reshape(n, H * D) @ wo
        return x @ self.emb.T

    def greedy(self, comm, layout, how, prompt, new):
        """Prefill all but the prompt's last token, then decode from it (every rank has its
        logits): the tokens generated and every step's logits."""
        cache = ut.KvCache(comm, layout, self.layers, H, HKV, D, capacity=len(prompt) + new)
        b, n = ut.prompt_chunk(len(prompt) - 1, comm.size, comm.rank)
        self.logits(prompt[b : b + n], list(range(b, b + n)), lambda layer, *qkv: cache.prefill(layer, *qkv, how=how))
        token, out, steps = prompt[-1], [], []
        for p in range(len(prompt) - 1, len(prompt) - 1 + new):
            logits = self.logits([token], [p], cache.decode)[0]
            token = int(logits.argmax())
            out.append(token)
            steps.append(logits)
        return out, torch.stack(steps)


@pytest.mark.parametrize("layout,how", CASES)
@pytest.mark.parametrize("n", [s for s in SIZES if s > 1] or [1])
def test_greedy_tokens_equal_one_ranks(world, n, layout, how):
    model, prompt = Tiny(), [int(t) for t in torch.randint(0, 32, (13,), generator=torch.Generator().manual_seed(5))]
    one = ulysses.local_group(1).run(lambda comm: model.greedy(comm, "heads", "ulysses", prompt, 12))[0]
    got = on_ranks(world, n, lambda comm: model.greedy(comm, layout, how, prompt, 12))
    for r, (tokens, logits) in enumerate(got):
        assert tokens == one[0], (r, tokens, one[0])
        assert float((logits - one[1]).norm() / one[1].norm()) <= 1e-5, r


def errors_on_ranks(world, n, fn):
    """The ulysses.Error message every rank raised from fn(comm) (None where none)."""

    def guarded(comm):
        try:
            fn(comm)
        except ulysses.Error as e:
            return str(e)
        return None

    return on_ranks(world, n, guarded)


def one_error(messages, *parts):
    assert len(set(messages)) == 1 and messages[0] is not None, messages
    for p in parts:
        assert p in messages[0], (p, messages[0])


BAD_N = [s for s in SIZES if s > 1][-1:]  # the bad-input cases need two ranks or more


@pytest.mark.parametrize("n", BAD_N)
def test_a_prompt_longer_than_the_capacity(world, n):
    def fn(comm):
        cache = ut.KvCache(comm, "interleaved", 1, H, HKV, D, capacity=3 * n)
        q, kv = torch.zeros(1, 4, H, D), torch.zeros(1, 4, HKV, D)
        try:
            cache.prefill(0, q, kv, kv)
        finally:
            assert cache.tokens(0) == 0  # nothing cached

    one_error(errors_on_ranks(world, n, fn), f"{4 * n} tokens > capacity {3 * n}")


@pytest.mark.parametrize("n", BAD_N)
def test_a_layout_that_cannot_hold_the_heads(world, n):
    fn = lambda comm: ut.KvCache(comm, "heads", 1, n - 1, 1, D, capacity=8)  # noqa: E731
    one_error(errors_on_ranks(world, n, fn), f"cannot hold {n - 1} query heads at cp = {n}", "interleaved")


@pytest.mark.parametrize("n", BAD_N)
@pytest.mark.parametrize("differ", ["layer", "how", "heads", "dtype", "decode shape", "capacity"])
def test_a_request_that_differs_between_ranks(world, n, differ):
    def fn(comm):
        odd = comm.rank == n - 1
        cache = ut.KvCache(comm, "heads", 2, H, HKV, D, capacity=17 if odd and differ == "capacity" else 16)
        q, kv = torch.randn(1, 2, H, D), torch.randn(1, 2, HKV, D)
        if odd and differ == "heads":
            q = torch.randn(1, 2, H - 1, D)
        if odd and differ == "dtype":
            q = q.bfloat16()
        how = "ring" if odd and differ == "how" else "ulysses"
        cache.prefill(1 if odd and differ == "layer" else 0, q, kv, kv, how)
        rows = 2 if odd and differ == "decode shape" else 1
        cache.decode(0, torch.randn(1, rows, H, D), torch.randn(1, rows, HKV, D), torch.randn(1, rows, HKV, D))

    want = {"layer": "differ between ranks", "how": "differ between ranks", "heads": "q must be [1, n, 4, 8]",
            "dtype": "the KV cache holds torch.float32", "decode shape": "q must be [1, 1, 4, 8]",
            "capacity": "KvCache arguments differ between ranks"}  # fmt: skip
    one_error(errors_on_ranks(world, n, fn), want[differ])


@pytest.mark.skipif(WORLD > 1, reason="a rank that never calls would leave mpirun's ranks to the watchdog")
def test_a_request_on_one_rank_only_fails_the_group():
    def fn(comm):
        cache = ut.KvCache(comm, "interleaved", 1, H, HKV, D, capacity=8)
        if comm.rank == 0:
            cache.prefill(0, torch.zeros(1, 1, H, D), torch.zeros(1, 1, HKV, D), torch.zeros(1, 1, HKV, D))

    with pytest.raises(ulysses.Error):
        ulysses.local_group(3, threads=1).run(fn)
