"""Type stubs of the pybind11 extension (python/src/bindings.cpp): the C++ library's calls on
plain tuples. Tensors cross as views, (data pointer, dtype name "f32" | "bf16", shape [b, s, h, d],
strides of b, s and h in elements), made by ulysses._tensors.spec."""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__version__: str

View = Tuple[int, str, Tuple[int, int, int, int], Tuple[int, int, int]]
HeadRanges = Sequence[Tuple[int, int]]  # (first head, count) per rank

class Error(RuntimeError):
    """Every error of the library: the same message on every rank for a collective check."""

class Communicator:
    def __init__(self, fortran_handle: int) -> None:
        """Collective: a communicator over a duplicate of the MPI communicator with this Fortran
        handle (mpi4py's comm.py2f())."""
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    def counters(self) -> Dict[str, Dict[str, int]]:
        """Per operation: {"calls", "bytes_sent", "messages"}."""
    def reset_counters(self) -> None: ...
    @property
    def timeout(self) -> float:
        """Seconds any wait may last before the group fails with the watchdog's message (0: none);
        shared with the communicators split from it."""
    @timeout.setter
    def timeout(self, seconds: float) -> None: ...
    def default_threads(self) -> int:
        """Collective: cores on this node / ranks on this node."""
    def agree(self, local_error: str) -> None:
        """Collective: "" when this rank is fine, else its error; when any rank has one, every rank
        raises the lowest failing rank's."""
    def agree_identical(self, what: str, description: str) -> None:
        """Collective: every rank raises the same Error naming both texts when a rank's
        description differs from rank 0's."""
    def agree_all(self, local_error: str, what: str, description: str, values: List[int]) -> List[int]:
        """Collective: agree and agree_identical, and every rank's values (as many on each) in rank
        order, in one small all-gather."""
    @property
    def collectives(self) -> int:
        """How many collectives this rank has entered: transfers and agreements alike."""

class Context:
    """What one forward keeps for its backward."""
    @property
    def valid(self) -> bool: ...
    @property
    def stats(self) -> Dict[str, float]:
        """compute_s, comm_exposed_s, score_pairs."""

class ContextParallelAttention:
    def __init__(
        self,
        comm: Communicator,
        cp_comm_type: str,
        causal: bool,
        scale: float,
        cp_sizes: List[int],
        window: Tuple[int, int] = (-1, -1),
        overlap_chunks: int = 1,
        q_offset: Optional[int] = None,
        options: Dict[str, List[int]] = ...,
    ) -> None: ...
    def forward(self, out: View, q: View, k: View, v: View, cu_seqlens: List[int] = ...) -> Context:
        """Collective: writes out; returns the context for backward."""
    def refuse_forward(self, error: str) -> None:
        """Collective: this rank's part of a forward whose inputs failed the caller's checks;
        every rank raises the lowest failing rank's error."""
    def backward(self, ctx: Context, dq: View, dk: View, dv: View, dout: View) -> Dict[str, float]:
        """Collective: writes dq, dk, dv; returns the backward's stats."""

class HeadBuffer:
    """The head-sharded side of the fused all-to-all."""

def torch_communicator(transport: Any) -> Communicator:
    """Not collective: a communicator over a torch.distributed group (the transport of
    ulysses/_torch_comm.py: rank, size, me, name and one method per operation)."""

def run_local(size: int, fn: Callable[[Communicator], Any]) -> List[Any]:
    """fn(comm) on `size` threads, one per rank of a new local group; the results in rank order.
    An exception on a rank releases the others and is re-raised here once every rank has ended."""

def transpose_check(views: List[View], heads: List[HeadRanges], cp: int, op: str) -> Tuple[str, str]:
    """Not collective: why these shards cannot be transposed on this rank ("" when they can) and
    what every rank must agree on (dtype, b, h, d, the head lists), for the caller's one agreement."""

def seq_to_head(
    comm: Communicator, views: List[View], heads: List[HeadRanges], tokens: Optional[List[int]] = None
) -> Tuple[np.ndarray, List[int]]:
    """Collective: one all-to-all of every tensor [b, n_rank, h, d], rank j getting heads[t][j] of
    tensor t; returns the [s, b, H, d] head-sharded buffer (int16 bits for bf16) and every rank's
    n_r. Without ``tokens`` it agrees its inputs first (one small collective); with every rank's
    n_r it trusts them (the caller agreed them) and makes the all-to-all alone."""

def head_to_seq(
    comm: Communicator,
    head_views: List[View],
    out_views: List[View],
    heads: List[HeadRanges],
    tokens: Optional[List[int]] = None,
) -> None:
    """Collective: the adjoint of seq_to_head; writes every output [b, n_rank, h, d]. ``tokens``
    as for seq_to_head."""

def rank_chunks(
    cp_comm_type: str,
    causal: bool,
    cp_sizes: List[int],
    cp: int,
    rank: int,
    seq: int,
    q_offset: Optional[int] = None,
    cu_seqlens: List[int] = ...,
    options: Dict[str, List[int]] = ...,
) -> List[Tuple[int, int]]:
    """The (begin, length) chunks of the global sequence that `rank` of `cp` holds, in local order."""

def validate(cp_comm_type: str, causal: bool, cp_sizes: List[int], cp: int, q_global: List[int], kv_heads: int) -> None:
    """Raises Error if the configuration cannot run q_global [b, s, h, d] with kv_heads on cp ranks."""

def strategy_names() -> List[str]:
    """The registered cp_comm_type names."""

def strategy_options(cp_comm_type: str) -> List[Tuple[str, str, str]]:
    """The options a strategy declares (StrategyOption): (flag, metavar, help) each."""

def head_split(group: int, heads: int, kv_heads: int) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """Ulysses' head split over `group` ranks: (first, count) of query heads per rank, then of KV heads."""

def set_threads(threads: int) -> None:
    """OpenMP threads of the kernels (BLAS pinned to one)."""

def balance(
    lengths: List[int],
    world: int,
    dp: int,
    policy: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    layers: int,
    cp_comm_type: str,
    gemm_flops_per_token: float,
    max_tokens_per_rank: int,
    ranks_per_node: int,
    peak_flops: float,
    efficiency: float,
    dtype: str,
) -> Dict[str, Any]:
    """The balancer's plan (balancer.hpp) as a dict of BalancePlan's fields; ulysses.balance wraps it."""

class KvCache:
    """One rank's part of a KV cache sharded over a CP group (kv_cache.hpp): float32, every layer's
    capacity allocated at construction. Not collective; ulysses.torch.KvCache agrees its arguments."""
    def __init__(
        self, layout: str, layers: int, heads: int, kv_heads: int, head_dim: int, capacity: int, cp: int, rank: int
    ) -> None: ...
    @property
    def layout(self) -> str: ...
    @property
    def bytes(self) -> int:
        """The bytes the allocated tensors hold (equals kv_bytes_formula)."""
    @property
    def replication(self) -> int:
        """How many ranks hold each KV head (heads layout with kv_heads < cp), else 1."""
    @property
    def heads(self) -> Tuple[Tuple[int, int], Tuple[int, int]]:
        """((first, count) of this rank's query heads, the same of its KV heads)."""
    def tokens(self, layer: int) -> int: ...
    def rows(self, layer: int) -> int: ...
    def keys(self, layer: int) -> np.ndarray:
        """A float32 copy of this rank's cached keys: [rows, kv heads held, d]."""
    def values(self, layer: int) -> np.ndarray: ...
    def clear(self) -> None: ...

def kv_bytes_formula(
    layout: str, layers: int, heads: int, kv_heads: int, head_dim: int, capacity: int, cp: int, rank: int
) -> int:
    """layers * 2 * kv_rows(capacity) * kv heads held * head_dim * 4: the bytes rank `rank` of `cp` holds."""

def cache_prefill(
    comm: Communicator,
    cache: KvCache,
    how: str,
    layer: int,
    rank_tokens: List[int],
    q: View,
    k: View,
    v: View,
    out: View,
    over_cache: bool,
) -> Dict[str, Any]:
    """Collective, unchecked across ranks: prefill (or extend, over_cache) of one layer; returns
    {"collectives", "comm_s"}."""

def cache_decode(
    comm: Communicator, caches: List[KvCache], layer: int, q: View, k: View, v: View, out: View
) -> Dict[str, Any]:
    """Collective, unchecked across ranks: one decode step of len(caches) requests; returns its stats."""

def agree_all(comm: Communicator, local_error: str, what: str, description: str, values: List[int]) -> List[int]:
    """Collective: agree(local_error), agree_identical(what, description) and an all-gather of
    `values` in one small all-gather; every rank's values back to back."""
