"""PyTorch modules over the library: ``ContextParallelAttention`` (every strategy, our
kernels, differentiable through our backward) and ``DistributedAttention`` (DeepSpeed's
signature, our fused all-to-all around any local attention)."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import torch

from . import _ulysses
from ._agree import INT64_MAX, agree_identical, agreed, agreed_all, attempt, integer
from ._infer import KvCache, prompt_chunk  # noqa: F401  (exported: inference over a sharded KV cache)
from ._tensors import check, from_buffer, readable, spec
from ._torch_comm import communicator as _communicator

MAX_OVERLAP_CHUNKS = 1024  # the CLI's --overlap-chunks limit

__all__ = ["ContextParallelAttention", "DistributedAttention", "all_to_all"]


class _CpAttention(torch.autograd.Function):
    """The library's forward; its context (what the backward needs) lives in autograd's ctx, so
    any number of forwards may be in flight and activation checkpointing recomputes freely."""

    @staticmethod
    def forward(ctx, comm, impl, q, k, v, cu_seqlens):
        q, k, v = readable(q, "q"), readable(k, "k"), readable(v, "v")  # checked and agreed by the caller
        out = torch.empty(q.shape, dtype=q.dtype)
        ctx.comm, ctx.impl = comm, impl
        ctx.context = impl.forward(spec(out), spec(q), spec(k), spec(v), cu_seqlens)
        ctx.kv_shape = k.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        # Autograd hands dout shaped, typed and placed as the forward's output: it cannot fail on
        # one rank alone, and the library's backward agrees it (one collective, not two).
        dout = readable(dout, "dout")
        dq = torch.empty(dout.shape, dtype=dout.dtype)
        dk = torch.empty(ctx.kv_shape, dtype=dout.dtype)
        dv = torch.empty(ctx.kv_shape, dtype=dout.dtype)
        ctx.impl.backward(ctx.context, spec(dq), spec(dk), spec(dv), spec(dout))
        return None, None, dq, dk, dv, None


class ContextParallelAttention(torch.nn.Module):
    """Attention over the whole sequence from this rank's shards.

    ``forward(q, k, v)``: q ``[b, s/cp, h, d]``, k and v ``[b, s/cp, h_kv, d]`` (float32 or
    bfloat16, any strides with ``d`` contiguous: no copy is made), holding the tokens
    ``ulysses.shard`` gives this rank; returns this rank's output ``[b, s/cp, h, d]``.
    ``strategy`` is Megatron's cp_comm_type (``ulysses.strategy_names()``); ``cp_sizes`` is
    ``[inner, outer]`` for ``a2a+p2p``; ``scale`` (finite, > 0) defaults to 1/sqrt(d) when None. Errors are raised
    as ``ulysses.Error`` with the same message on every rank.

    ``forward(q, k, v, cu_seqlens=...)``: packed documents, FlashAttention's varlen contract
    (batch 1): cumulative document lengths over the *global* sequence, the same on every
    rank (a list or an integer tensor); no token attends across a document boundary.

    ``window_size=(left, right)``: FlashAttention's sliding window over global positions, query
    i sees key j only if ``i - left <= j <= i + right`` (and ``j <= i`` when causal); -1 leaves
    that side unbounded; ``(-1, -1)`` (the default) is no window. Strategies without a window
    (``ulysses.Error`` names them) refuse it.

    ``overlap_chunks``: ``a2a`` only; cut each rank's heads into this many chunks and pipeline
    their all-to-alls with the attention of the others (same bytes, more messages); 1 is plain
    Ulysses, more than the KV heads a rank holds is clamped; below 1, or above 1 with another
    strategy, is an error.

    ``options``: the options a strategy declares for itself, by flag
    (``ulysses.strategy_options(strategy)``; ``{"toy-max-cp": [2]}``, ``{"per-document": [0]}``
    for p2p and a2a+p2p); the library refuses one its strategy does not declare, or a value it
    does not take. With ``cu_seqlens`` p2p and a2a+p2p lay every document out in zigzag on its
    own (per-document zigzag, unless ``per-document`` is 0): shard with the same ``cu_seqlens``
    and ``options`` (``ulysses.shard(x, comm, strategy, causal, cu_seqlens=..., options=...)``).

    Cross-attention: k and v may hold another global length ``s_k`` than q (each sharded over
    the ranks by its own length: ``ulysses.shard(k, comm, strategy, causal, q_offset=...)``);
    every built-in strategy supports it (a registered one that does not raises). ``q_offset`` is
    the key position of query 0: under ``causal`` query i sees keys ``j <= q_offset + i``,
    required when ``s_k != s``. With ``q_offset`` set every strategy keeps contiguous chunks.
    No window and no documents with cross-attention.

    ``comm`` is a ``ulysses.Communicator``, a ``torch.distributed`` ProcessGroup (None: the
    default group; gloo, e.g. under torchrun: ``Communicator.from_torch``) or an mpi4py
    communicator.

    Construction and every call are collective over ``comm``: a bad or differing argument on
    any rank (``overlap_chunks`` in [1, 1024], integers in int64) raises the same
    ``ulysses.Error`` on every rank, before any data moves; the library's own rules (window,
    cross-attention) are checked at the first call, the same way.
    """

    def __init__(
        self,
        comm: Any,
        strategy: str = "a2a",
        causal: bool = False,
        cp_sizes: Optional[Sequence[int]] = None,
        scale: Optional[float] = None,
        window_size: Tuple[int, int] = (-1, -1),
        overlap_chunks: int = 1,
        q_offset: Optional[int] = None,
        options: Optional[Mapping[str, Sequence[int]]] = None,
    ) -> None:
        super().__init__()
        comm = _communicator(comm, "comm")
        self.comm, self.strategy, self.causal = comm, strategy, causal

        def build():
            window = _window(window_size)
            chunks = integer("overlap_chunks", overlap_chunks, 1, MAX_OVERLAP_CHUNKS)
            offset = None if q_offset is None else integer("q_offset", q_offset, -INT64_MAX - 1, INT64_MAX)
            sizes = [integer("cp_sizes", n, 1, 2**31 - 1) for n in (cp_sizes or [])]
            own = {str(flag): [integer(str(flag), n, 0, INT64_MAX) for n in v] for flag, v in (options or {}).items()}
            impl = _ulysses.ContextParallelAttention(
                comm._impl,
                strategy,
                bool(causal),
                None if scale is None else float(scale),
                sizes,
                window,
                chunks,
                offset,
                own,
            )
            return dict(
                strategy=strategy,
                causal=bool(causal),
                cp_sizes=sizes,
                scale=None if scale is None else float(scale),
                window_size=window,
                overlap_chunks=chunks,
                q_offset=offset,
                options=own,
            ), impl

        args, self._impl = agreed(comm, build)
        agree_identical(comm, "ContextParallelAttention arguments", args)
        self.window_size, self.overlap_chunks = args["window_size"], args["overlap_chunks"]
        self.q_offset = args["q_offset"]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[Sequence[int]] = None
    ) -> torch.Tensor:
        """This rank's attention output ``[b, s/cp, h, d]`` from its shards of q, k, v (collective)."""

        def local():
            for t, name in ((q, "q"), (k, "k"), (v, "v")):
                check(t, name)
            if cu_seqlens is None:
                return []
            return [integer("cu_seqlens", x, -INT64_MAX - 1, INT64_MAX) for x in cu_seqlens]

        cu, error = attempt(local)
        if error:  # the library's forward agrees its own checks: this rank joins that one agreement
            self._impl.refuse_forward(error)
        return _CpAttention.apply(self.comm, self._impl, q, k, v, cu)

    def extra_repr(self) -> str:
        extra = "" if self.window_size == (-1, -1) else f", window_size={self.window_size}"
        extra += "" if self.overlap_chunks == 1 else f", overlap_chunks={self.overlap_chunks}"
        extra += "" if self.q_offset is None else f", q_offset={self.q_offset}"
        return f"strategy={self.strategy!r}, causal={self.causal}, cp={self.comm.size}{extra}"


def _window(window_size: Any) -> Tuple[int, int]:
    """FlashAttention's window_size as a pair of ints; the library checks the values."""
    try:
        left, right = window_size
        ok = int(left) == left and int(right) == right
    except (TypeError, ValueError):
        ok = False
    if ok:
        return tuple(
            integer(f"window_size[{i}]", int(x), -INT64_MAX - 1, INT64_MAX) for i, x in enumerate((left, right))
        )
    raise _ulysses.Error(f"window_size must be (left, right), two integers (-1: unbounded), got {window_size!r}")


def _head_parts(whole: Any, heads: List[int], dtype: torch.dtype) -> List[torch.Tensor]:
    """[b, s, h_t, d] views of the fused [s, b, H, d] head-sharded buffer, one per tensor."""
    t = from_buffer(whole, dtype)
    parts, start = [], 0
    for h in heads:
        parts.append(t[:, :, start : start + h].transpose(0, 1))
        start += h
    return parts


class _SeqToHead(torch.autograd.Function):
    """One all-to-all for all tensors: [b, s/p, h_t, d] → [b, s, heads_t[rank], d]. The caller
    agreed the inputs (``tokens``: every rank's n_r, from that agreement); the backward needs no
    agreement of its own: autograd hands gradients shaped, typed and placed as the outputs."""

    @staticmethod
    def forward(ctx, comm, heads, tokens, *xs):
        xs = [readable(x, "input") for x in xs]
        whole, _ = _ulysses.seq_to_head(comm._impl, [spec(x) for x in xs], heads, tokens)
        ctx.comm, ctx.heads, ctx.tokens, ctx.shapes, ctx.dtype = comm, heads, tokens, [x.shape for x in xs], xs[0].dtype
        parts = _head_parts(whole, [h[comm.rank][1] for h in heads], xs[0].dtype)
        ctx.part_shapes = [p.shape for p in parts]  # for gradients autograd omits (None)
        return tuple(parts)

    @staticmethod
    def backward(ctx, *grads):
        grads = [
            readable(torch.zeros(shape, dtype=ctx.dtype) if g is None else g, "grad")
            for g, shape in zip(grads, ctx.part_shapes)
        ]
        outs = [torch.empty(s, dtype=grads[0].dtype) for s in ctx.shapes]
        _ulysses.head_to_seq(ctx.comm._impl, [spec(g) for g in grads], [spec(o) for o in outs], ctx.heads, ctx.tokens)
        return (None, None, None) + tuple(outs)


class _HeadToSeq(torch.autograd.Function):
    """The output's all-to-all: [b, s, q_heads[rank], d] → [b, tokens[rank], h, d]; ``x`` agreed by
    the caller (``_head_side``), the backward trusting autograd's gradient as ``_SeqToHead``'s."""

    @staticmethod
    def forward(ctx, comm, q_heads, tokens, x):
        out = torch.empty((x.shape[0], tokens[comm.rank], sum(c for _, c in q_heads), x.shape[3]), dtype=x.dtype)
        _ulysses.head_to_seq(comm._impl, [spec(x)], [spec(out)], [q_heads], tokens)
        ctx.comm, ctx.q_heads, ctx.tokens = comm, q_heads, tokens
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = readable(grad, "grad")
        whole, _ = _ulysses.seq_to_head(ctx.comm._impl, [spec(grad)], [ctx.q_heads], ctx.tokens)
        return None, None, None, _head_parts(whole, [ctx.q_heads[ctx.comm.rank][1]], grad.dtype)[0]


def _head_side(comm, x, heads, tokens, name):
    """``x`` readable as the head-sharded side ``[b, s, heads[rank], d]`` of ``tokens`` (s their
    sum), agreed in one small collective: a bad local attention's output fails every rank."""

    def local():
        y = readable(x, name)
        want = (sum(tokens), heads[comm.rank][1])
        if tuple(y.shape[1:3]) != want:
            raise _ulysses.Error(
                f"{name} is {tuple(y.shape)}: [b, s, h, d] with the whole sequence s = {want[0]} and this rank's "
                f"heads h = {want[1]} expected"
            )
        return y, f"{y.dtype} [{y.shape[0]}, *, *, {y.shape[3]}]", []

    return agreed_all(comm, name, 0, local)[0]


class DistributedAttention(torch.nn.Module):
    """DeepSpeed's ``DistributedAttention`` (deepspeed.sequence.layer), same signature and
    semantics: ``local_attention`` runs on the full sequence for this rank's heads, between a
    seq→head and a head→seq all-to-all. Inputs are this rank's ``[s/p, b, h, d]`` (the default,
    ``gather_idx=0``, or ``batch_dim_idx=1``) or ``[b, s/p, h, d]`` (``gather_idx=1``, or
    ``batch_dim_idx=0``); the local attention gets and returns the same layout with the full
    sequence and this rank's heads (h/p; uneven h keeps GQA groups whole). Q, K and V travel in
    ONE all-to-all (DeepSpeed sends three); fewer KV heads than ranks are shared and their
    gradients summed. ``sequence_process_group`` is DeepSpeed's: a ``torch.distributed``
    ProcessGroup (None: the default group), or a ``ulysses.Communicator``, or an mpi4py
    communicator; by position or by name, as DeepSpeed's other arguments."""

    def __init__(
        self,
        local_attention: Callable[..., torch.Tensor],
        sequence_process_group: Any = None,
        scatter_idx: int = 2,
        gather_idx: int = 0,
        sp_stream: Any = None,
        num_kv_heads: Optional[int] = None,
    ) -> None:
        super().__init__()
        comm = _communicator(sequence_process_group)

        def validate():
            if scatter_idx != 2 or gather_idx not in (0, 1):
                raise _ulysses.Error(
                    f"DistributedAttention supports scatter_idx=2 with gather_idx 0 ([s, b, h, d]) or "
                    f"1 ([b, s, h, d]), got scatter_idx={scatter_idx}, gather_idx={gather_idx}"
                )
            if sp_stream is not None:
                raise _ulysses.Error("sp_stream (CUDA stream overlap) does not apply to CPU tensors")
            return None if num_kv_heads is None else integer("num_kv_heads", num_kv_heads, 1, INT64_MAX)

        num_kv_heads = agreed(comm, validate)  # collective: one rank's bad argument stops every rank
        agree_identical(comm, "DistributedAttention arguments", scatter_idx, gather_idx, num_kv_heads)
        self.local_attn, self.comm, self.scatter_idx, self.gather_idx = local_attention, comm, scatter_idx, gather_idx
        self.num_kv_heads = num_kv_heads

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        batch_dim_idx: Optional[int] = None,
        rotary_pos_emb: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``local_attention`` over the whole sequence for this rank's heads, between the two
        all-to-alls (collective); the output has the inputs' layout and this rank's tokens."""

        def local():  # every check before the first all-to-all, in its one agreement
            if rotary_pos_emb is not None:
                raise _ulysses.Error(
                    "rotary_pos_emb is not supported: apply RoPE before the call "
                    "(ulysses.positions gives each local token's global position)"
                )
            for t, name in ((query, "query"), (key, "key"), (value, "value")):
                check(t, name)
            seq_first = self.gather_idx == 0 if batch_dim_idx is None else batch_dim_idx == 1
            q, k, v = (
                readable(x.transpose(0, 1) if seq_first else x, n)
                for x, n in ((query, "query"), (key, "key"), (value, "value"))
            )
            if self.num_kv_heads is not None and self.num_kv_heads != k.shape[2]:
                raise _ulysses.Error(f"num_kv_heads={self.num_kv_heads} but key has {k.shape[2]} heads")
            q_heads, kv_heads = _ulysses.head_split(self.comm.size, q.shape[2], k.shape[2])
            heads = [q_heads, kv_heads, kv_heads]
            description = _transpose_description([q, k, v], heads, self.comm.size)
            return (seq_first, q, k, v, heads), f"{description}, sequence first: {seq_first}", [q.shape[1]]

        (seq_first, q, k, v, heads), tokens = agreed_all(self.comm, "DistributedAttention inputs", 1, local)
        qh, kh, vh = _SeqToHead.apply(self.comm, heads, tokens, q, k, v)
        if seq_first:
            qh, kh, vh = qh.transpose(0, 1), kh.transpose(0, 1), vh.transpose(0, 1)
        # Local kernels such as SDPA run far slower on strided views of the fused buffer (2.8x at
        # s = 2048, measured): one dense copy per tensor, as DeepSpeed's all-to-all unpack makes.
        qh, kh, vh = qh.contiguous(), kh.contiguous(), vh.contiguous()
        out = self.local_attn(qh, kh, vh, *args, **kwargs)
        out = _head_side(self.comm, out.transpose(0, 1) if seq_first else out, heads[0], tokens, "attention output")
        out = _HeadToSeq.apply(self.comm, heads[0], tokens, out)
        return out.transpose(0, 1) if seq_first else out


def _transpose_description(xs, heads, p):
    """What every rank must agree on before seq_to_head of ``xs`` (readable), else the Error why
    this rank cannot take part."""
    error, description = _ulysses.transpose_check([spec(x) for x in xs], heads, p, "seq_to_head")
    if error:
        raise _ulysses.Error(error)
    return description


def _a2a_layout(x: torch.Tensor, scatter_idx: int, gather_idx: int, batch_dim_idx: Optional[int], p: int):
    """DeepSpeed's all-to-all arguments checked (not collective): (to heads?, sequence first?)."""
    check(x, "input")
    pair = sorted((scatter_idx, gather_idx))
    if pair not in ([0, 2], [1, 2]):
        raise _ulysses.Error(
            f"all_to_all moves between the sequence (dim 0 or 1) and the heads (dim 2): scatter_idx and gather_idx "
            f"are 2 and the sequence's dim, got scatter_idx={scatter_idx}, gather_idx={gather_idx}"
        )
    if batch_dim_idx not in (None, 0, 1):
        raise _ulysses.Error(f"batch_dim_idx must be 0 ([b, s, h, d]) or 1 ([s, b, h, d]), got {batch_dim_idx!r}")
    seq_first = pair[0] == 0 if batch_dim_idx is None else batch_dim_idx == 1
    return scatter_idx == 2, seq_first


def all_to_all(
    input: torch.Tensor,
    scatter_idx: int,
    gather_idx: int,
    batch_dim_idx: Optional[int] = None,
    group: Any = None,
) -> torch.Tensor:
    """DeepSpeed's ``single_all_to_all`` (and ``_SeqAllToAll.apply(group, input, scatter_idx,
    gather_idx, batch_dim_idx)``): differentiable, its backward the same call with the indices
    swapped. ``scatter_idx=2`` scatters the heads and gathers the sequence: this rank's
    ``[b, s/p, h, d]`` (``batch_dim_idx=0``) or ``[s/p, b, h, d]`` (``1``) becomes the whole
    sequence for its heads ``[b, s, h/p, d]`` / ``[s, b, h/p, d]``; ``gather_idx=2`` is the way
    back. ``batch_dim_idx`` decides the layout, as in DeepSpeed; when None, the sequence's index
    among scatter_idx and gather_idx does. Uneven sizes are split as the library splits them
    (whole GQA groups of heads; tokens differing by one), not refused. ``group`` as in
    ``DistributedAttention``. Collective: bad input raises the same ``ulysses.Error`` everywhere."""
    comm = _communicator(group, "group")

    def local():  # every check before the all-to-all, in its one agreement: [tokens, heads] per rank
        to_heads, seq_first = _a2a_layout(input, scatter_idx, gather_idx, batch_dim_idx, comm.size)
        x = readable(input.transpose(0, 1) if seq_first else input, "input")  # [b, s, h, d]: the library reads strides
        layout = f"scatter_idx={scatter_idx}, gather_idx={gather_idx}, sequence first: {seq_first}"
        if to_heads:
            heads = [_ulysses.head_split(comm.size, x.shape[2], x.shape[2])[0]]
            return (x, seq_first, heads), f"{_transpose_description([x], heads, comm.size)}, {layout}", x.shape[1:3]
        return (x, seq_first, None), f"{x.dtype} [{x.shape[0]}, {x.shape[1]}, *, {x.shape[3]}], {layout}", x.shape[1:3]

    (x, seq_first, heads), values = agreed_all(comm, "all_to_all inputs", 2, local)
    if heads is not None:
        out = _SeqToHead.apply(comm, heads, values[0::2], x)[0]
    else:
        sizes = values[1::2]  # every rank's heads (uneven ones too) and the whole sequence
        starts = [sum(sizes[:r]) for r in range(comm.size)]
        s, p = x.shape[1], comm.size  # contiguous parts differing by one token, the first s % p larger
        tokens = [s // p + (r < s % p) for r in range(p)]
        out = _HeadToSeq.apply(comm, list(zip(starts, sizes)), tokens, x)
    return out.transpose(0, 1) if seq_first else out


class _SeqAllToAll:
    """DeepSpeed's ``_SeqAllToAll``: ``apply(group, input, scatter_idx, gather_idx,
    batch_dim_idx)`` is ``all_to_all`` (DeepSpeed's stream and overlap arguments do not apply
    to CPU tensors and must be left out)."""

    @staticmethod
    def apply(group: Any, input: torch.Tensor, scatter_idx: int, gather_idx: int, batch_dim_idx: Optional[int] = None):
        return all_to_all(input, scatter_idx, gather_idx, batch_dim_idx, group)
