"""Inference over a KV cache sharded across a context-parallel group: a prompt prefilled into
the cache, then one token a step decoded against it (the library's kv_cache.hpp and
cached_attention.hpp on torch tensors)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import _ulysses
from ._agree import INT64_MAX, agree_identical, agreed, integer
from ._tensors import check, spec

if TYPE_CHECKING:
    from ._comm import Communicator

LAYOUTS = ("heads", "interleaved")
PREFILLS = ("ulysses", "ring")


def prompt_chunk(tokens: int, cp: int, rank: int) -> Tuple[int, int]:
    """(begin, length) of the prompt tokens rank ``rank`` of ``cp`` passes to ``prefill``: the
    prompt cut into contiguous parts in rank order, as ``ulysses generate`` cuts it.

    >>> [prompt_chunk(10, 3, r) for r in range(3)]
    [(0, 3), (3, 3), (6, 4)]
    """
    return tokens * rank // cp, tokens * (rank + 1) // cp - tokens * rank // cp


class KvCache:
    """This rank's part of a KV cache sharded over ``comm`` (collective to build), for
    ``layers`` layers of a model with ``heads`` query and ``kv_heads`` KV heads of ``head_dim``,
    ``capacity`` tokens (prompt and generated), float32, all allocated at construction.

    ``layout``: ``"heads"`` (Ulysses: every token, this rank's KV heads; needs ``heads >= cp``;
    with ``kv_heads < cp`` each KV head is held by ``replication`` ranks) or ``"interleaved"``
    (token i on rank i mod cp, every head: any cp; a rank may hold no token).

    Per layer, every call collective over ``comm``:

    - ``prefill(layer, q, k, v, how="ulysses")``: the prompt into an empty layer. This rank
      passes its contiguous part (``prompt_chunk``, at least one token): q ``[1, n, heads, d]``,
      k and v ``[1, n, kv_heads, d]``, positions applied; returns its causal attention
      ``[1, n, heads, d]``. ``how``: ``"ulysses"`` (the a2a strategy's all-to-alls) or
      ``"ring"`` (pass-KV, the p2p strategy's ring), then K and V go where the layout keeps them.
    - ``extend(layer, q, k, v)``: the same for a prompt over a layer that holds tokens (the
      next turn of a conversation, the next chunk of a chunked prefill): Ulysses over the cache
      (``heads``), pass-Q (``interleaved``: the cache never moves).
    - ``decode(layer, q, k, v)``: one new token, q ``[1, 1, heads, d]``, k and v
      ``[1, 1, kv_heads, d]``, the same on every rank; appends it and returns its attention
      over every cached token ``[1, 1, heads, d]``, the same bits on every rank.
      ``KvCache.decode_many(caches, ...)`` steps several requests (row b of q is request b's,
      at any lengths) in the same one collective.

    Every call checks its arguments and agrees them across ranks before any data moves
    (shapes, layer, the tokens the layer holds, the prompt's total against ``capacity``): a bad
    or differing argument on any rank raises the same ``ulysses.Error`` on every rank. A
    decode step then makes one collective, plus this agreement (one small all-gather);
    ``agree=False`` skips the agreement for a caller whose steps were agreed already (a step's
    local checks still run; a rank whose check fails alone leaves the others to the watchdog).

    ``bytes`` (what this rank holds) equals ``bytes_formula``:
    ``layers * 2 * rows(capacity) * kv heads held * head_dim * 4``. ``stats`` counts the
    collectives of every call so far and their seconds.
    """

    def __init__(
        self,
        comm: Communicator,
        layout: str,
        layers: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
    ) -> None:
        def build():
            if layout not in LAYOUTS:
                raise _ulysses.Error(f"unknown KV cache layout {layout!r} (heads | interleaved)")
            sizes = [integer(n, x, 1, INT64_MAX) for n, x in zip(_SHAPE, (layers, heads, kv_heads, head_dim, capacity))]
            return sizes, _ulysses.KvCache(layout, *sizes, comm.size, comm.rank)

        sizes, self._impl = agreed(comm, build)
        agree_identical(comm, "KvCache arguments", layout, sizes)
        self.comm, self.layout = comm, layout
        self.layers, self.heads, self.kv_heads, self.head_dim, self.capacity = sizes
        self.stats: Dict[str, Any] = {"collectives": 0, "comm_s": 0.0}

    @property
    def bytes(self) -> int:
        """The bytes this rank's tensors hold."""
        return self._impl.bytes

    @property
    def bytes_formula(self) -> int:
        """The closed form ``bytes`` equals (``ulysses generate`` prints both)."""
        shape = (self.layers, self.heads, self.kv_heads, self.head_dim, self.capacity)
        return _ulysses.kv_bytes_formula(self.layout, *shape, self.comm.size, self.comm.rank)

    @property
    def replication(self) -> int:
        """How many ranks hold each KV head (``heads`` layout with ``kv_heads < cp``), else 1."""
        return self._impl.replication

    def tokens(self, layer: int = 0) -> int:
        """Tokens of the group cached in ``layer``."""
        return self._impl.tokens(self._layer(layer))

    def rows(self, layer: int = 0) -> int:
        """This rank's rows of them."""
        return self._impl.rows(self._layer(layer))

    def keys(self, layer: int = 0) -> torch.Tensor:
        """A copy of this rank's cached keys of ``layer``: ``[rows, kv heads held, d]``."""
        return torch.from_numpy(self._impl.keys(self._layer(layer)))

    def values(self, layer: int = 0) -> torch.Tensor:
        """A copy of this rank's cached values of ``layer``: ``[rows, kv heads held, d]``."""
        return torch.from_numpy(self._impl.values(self._layer(layer)))

    def clear(self) -> None:
        """Forgets every token (the memory stays). Not collective: every rank clears."""
        self._impl.clear()

    def prefill(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, how: str = "ulysses"
    ) -> torch.Tensor:
        """The prompt's attention for this rank's tokens, the layer filled (see the class)."""
        return self._prompt("prefill", layer, q, k, v, how)

    def extend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """A prompt over the tokens ``layer`` holds (see the class)."""
        return self._prompt("extend", layer, q, k, v, None)

    def decode(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, agree: bool = True) -> torch.Tensor:
        """The new token's attention over the whole cache, the token appended (see the class)."""
        return KvCache.decode_many([self], layer, q, k, v, agree)

    @staticmethod
    def decode_many(
        caches: Sequence["KvCache"],
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        agree: bool = True,
    ) -> torch.Tensor:
        """One decode step of ``len(caches)`` requests (caches of one group, shape and layout,
        any lengths): row b of q ``[1, B, heads, d]``, k and v ``[1, B, kv_heads, d]`` is request
        b's token; returns ``[1, B, heads, d]``, row b equal to decoding request b alone."""
        first = caches[0]

        def local():
            first._same_caches(caches)
            tensors = first._tensors(layer, q, k, v, len(caches))
            for c in caches:
                if c.tokens(layer) + 1 > c.capacity:
                    raise _ulysses.Error(
                        f"KV cache full: {c.tokens(layer)} tokens cached in a capacity of {c.capacity}"
                    )
            return tensors

        if agree:
            describe = (layer, _shapes(q, k, v), [_held(c, layer) for c in caches])
            qd, kd, vd = first._agreed(local, "KvCache.decode arguments", describe, [])[0]
        else:
            qd, kd, vd = local()
        out = torch.empty(qd.shape, dtype=torch.float32)
        stats = _ulysses.cache_decode(first.comm._impl, [c._impl for c in caches], layer, *map(spec, (qd, kd, vd, out)))
        first._count(stats)
        return out

    def _prompt(self, call: str, layer: Any, q: Any, k: Any, v: Any, how: Optional[str]) -> torch.Tensor:
        def local():
            if how is not None and how not in PREFILLS:
                raise _ulysses.Error(f"unknown prefill {how!r} (ulysses | ring)")
            tensors = self._tensors(layer, q, k, v, None)
            held = self.tokens(layer)
            if call == "prefill" and held != 0:
                raise _ulysses.Error(f"prefill fills an empty layer; layer {layer} holds {held} tokens (use extend)")
            if call == "extend" and held == 0:
                raise _ulysses.Error(f"extend continues a filled layer; layer {layer} is empty (use prefill)")
            return tensors

        held = _held(self, layer)
        n = q.shape[1] if isinstance(q, torch.Tensor) and q.dim() == 4 else 0
        describe = (layer, how, _shapes(q, k, v, per_rank=True), held)
        (qd, kd, vd), counts = self._agreed(local, f"KvCache.{call} arguments", describe, [n])
        total = held + sum(counts)
        if total > self.capacity:
            raise _ulysses.Error(
                f"prompt of {sum(counts)} tokens over {held} cached does not fit the KV cache: "
                f"{total} tokens > capacity {self.capacity}"
            )
        out = torch.empty(qd.shape, dtype=torch.float32)
        args = (layer, counts, *map(spec, (qd, kd, vd, out)), call == "extend")
        self._count(_ulysses.cache_prefill(self.comm._impl, self._impl, how or "ulysses", *args))
        return out

    def _agreed(self, local, what, describe, values) -> Tuple[Any, List[int]]:
        """local() on this rank; its error, the description and ``values`` agreed in one collective."""
        try:
            result, error = local(), ""
        except _ulysses.Error as e:
            result, error = None, str(e)
        except Exception as e:  # noqa: BLE001  (a TypeError on one rank must stop every rank too)
            result, error = None, f"{type(e).__name__}: {e}"
        counts = [integer("tokens", n, 0, INT64_MAX) for n in values] if not error else [0] * len(values)
        return result, _ulysses.agree_all(self.comm._impl, error, what, repr(describe), counts)

    def _tensors(self, layer: Any, q: Any, k: Any, v: Any, rows: Optional[int]) -> Tuple[torch.Tensor, ...]:
        """q, k, v checked against the cache (dense float32 copies where needed); Error if not."""
        self._layer(layer)
        n = q.shape[1] if isinstance(q, torch.Tensor) and q.dim() == 4 else None
        if rows is None and n == 0:
            raise _ulysses.Error("every rank needs at least one prompt token (prompt_chunk splits a prompt)")
        want = [(q, "q", self.heads), (k, "k", self.kv_heads), (v, "v", self.kv_heads)]
        for t, name, h in want:
            check(t, name)
            if t.dtype != torch.float32:
                raise _ulysses.Error(f"{name} has dtype {t.dtype}; the KV cache holds torch.float32")
            shape = (1, n if rows is None else rows, h, self.head_dim)
            if tuple(t.shape) != shape:
                raise _ulysses.Error(
                    f"{name} must be [1, {'n' if rows is None else rows}, {h}, {self.head_dim}] = "
                    f"{list(shape)}, got {list(t.shape)}"
                )
        return tuple(_dense(t) for t, _, _ in want)

    def _layer(self, layer: Any) -> int:
        return integer("layer", layer, 0, self.layers - 1)

    def _same_caches(self, caches: Sequence["KvCache"]) -> None:
        for c in caches:
            if not isinstance(c, KvCache) or (c.comm._impl, c.layout, c._shape()) != (
                self.comm._impl,
                self.layout,
                self._shape(),
            ):
                raise _ulysses.Error("decode_many takes caches of one group, layout and shape")

    def _shape(self) -> Tuple[int, int, int, int]:
        return self.layers, self.heads, self.kv_heads, self.head_dim

    def _count(self, stats: Dict[str, Any]) -> None:
        self.stats["collectives"] += stats["collectives"]
        self.stats["comm_s"] += stats["comm_s"]


_SHAPE = ("layers", "heads", "kv_heads", "head_dim", "capacity")


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the strides of a dense [b, s, h, d] block (the library's collectives send the
    block as it lies; torch keeps any stride on a dimension of size 1)."""
    dense = [1]
    for n in reversed(t.shape[1:]):
        dense.insert(0, dense[0] * n)
    return t if list(t.stride()) == dense else torch.empty(t.shape, dtype=t.dtype).copy_(t)


def _held(cache: Any, layer: Any) -> Optional[int]:
    """The tokens ``layer`` of ``cache`` holds; None for what is not a cache's layer (refused by
    the call's agreed checks, so describing it must not raise first)."""
    ok = isinstance(cache, KvCache) and isinstance(layer, int) and not isinstance(layer, bool)
    return cache._impl.tokens(layer) if ok and 0 <= layer < cache.layers else None


def _shapes(q: Any, k: Any, v: Any, per_rank: bool = False) -> List[Any]:
    """What must match across ranks: every shape (but a prompt's token count, per_rank) and dtype."""
    out = []
    for t in (q, k, v):
        if not isinstance(t, torch.Tensor):
            out.append(type(t).__name__)
            continue
        shape = list(t.shape)
        if per_rank and len(shape) > 1:
            shape[1] = "n"
        out.append((shape, str(t.dtype)))
    return out
