"""Hugging Face ``transformers`` models with Ulysses attention: importing this module registers
``attn_implementation="ulysses"`` (an ``AttentionInterface`` function and its
``AttentionMaskInterface`` mask function, so causal, sliding-window and padding masks hold).

    import ulysses, ulysses.hf
    sp = ulysses.hf.SequenceParallel(comm)             # the context-parallel group
    model = sp.attach(LlamaForCausalLM(config))         # heads checked, attention set to "ulysses"
    batch = sp.shard_batch(input_ids, attention_mask=mask, labels=labels)  # this rank's tokens
    loss = sp.loss(model(**batch.inputs).logits, batch)  # over the valid tokens of every rank
    loss.backward()
    sp.reduce_gradients(model)                          # the sum over the group, as at cp = 1
    tokens = sp.generate(model, prompt, max_new_tokens=8)  # prefill sharded, decoding on every rank

Each rank holds the whole model and s/cp tokens of every sequence. Around every attention, one
all-to-all (``ulysses.torch.DistributedAttention``) turns this rank's tokens of all heads into
all tokens of this rank's heads; the attention runs over the whole sequence (torch's
``scaled_dot_product_attention`` under the model's mask, built at the global length), and a
second all-to-all brings the output back to this rank's tokens.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from . import _ulysses
from ._agree import agreed
from .torch import DistributedAttention

try:
    from transformers import AttentionInterface, DynamicCache
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as e:  # an unhelpful ModuleNotFoundError deep in a user's import otherwise
    raise ImportError(f"ulysses.hf needs Hugging Face transformers (pip install transformers): {e}") from None

__all__ = ["IGNORE_INDEX", "NAME", "SequenceParallel", "ShardedBatch"]

NAME = "ulysses"  # the attn_implementation
IGNORE_INDEX = -100  # the label of a token without a target (transformers' and torch's default)

# Keywords transformers may pass an attention function that change the scores; a function that
# does not apply them must refuse them (transformers' sdpa refuses softcap the same way).
_UNSUPPORTED = ("softcap", "s_aux")


def _communicator(group: Any) -> Any:
    """The ``ulysses.Communicator`` of ``group``: a Communicator, an mpi4py communicator or a
    torch.distributed ProcessGroup (None: the default group), resolved as every module resolves
    one (``ulysses.torch``'s ``sequence_process_group``)."""
    from ._torch_comm import communicator

    return communicator(group, "SequenceParallel's group")


@dataclass
class ShardedBatch:
    """This rank's part of a batch (``SequenceParallel.shard_batch``).

    ``inputs``: the model's keywords: ``input_ids`` and ``position_ids`` of this rank's tokens
    ``[b, s/cp]``, ``use_cache=False`` (a cache would hold this rank's keys only), and, when one
    was given, ``attention_mask``: the *global* ``[b, s]`` padding mask (the attention needs
    every key's). ``shift_labels``: this rank's ``[b, s/cp]`` next-token targets
    (``IGNORE_INDEX`` where there is none), or None without labels. ``num_items``: the valid
    targets of the whole batch, over all ranks."""

    inputs: Dict[str, torch.Tensor]
    shift_labels: Optional[torch.Tensor]
    num_items: int


class _WholeValue(torch.autograd.Function):
    """``whole`` (the same bits on every rank) as the value, ``mine`` (this rank's part) for the
    gradient: each rank's backward then reaches the parameters through its own tokens once."""

    @staticmethod
    def forward(ctx, mine, whole):
        return whole.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _LazyMask:
    """What transformers' mask builder asked for, at this rank's length; the attention builds the
    mask at the global length once per forward (every layer of a forward shares this object)."""

    def __init__(self, request: Dict[str, Any]) -> None:
        self.request, self.built = request, None

    def build(self, seq: int) -> Optional[torch.Tensor]:
        """The ``[b, 1, s, s]`` boolean mask over the whole sequence, or None: plain causal."""
        r = self.request
        padding = r.get("attention_mask")
        if r.get("q_offset") or r.get("kv_offset"):
            raise _ulysses.Error("the ulysses attention keeps no KV cache: generate with SequenceParallel.generate")
        if padding is not None and tuple(padding.shape) != (r["batch_size"], seq):
            raise _ulysses.Error(
                f"attention_mask must be the global padding mask [b, s] = [{r['batch_size']}, {seq}] of the whole "
                f"sequence (SequenceParallel.shard_batch gives it), got {list(padding.shape)}"
            )
        args = {k: v for k, v in r.items() if k not in ("q_length", "kv_length", "q_offset", "kv_offset")}
        mask = sdpa_mask(q_length=seq, kv_length=seq, **args)
        if mask is not None:  # a query that sees no key (a left pad under a causal mask) sees all,
            mask = mask | ~mask.any(-1, keepdim=True)  # as transformers' sdpa did: finite, unused
        return mask


def _mask_interface(**request: Any) -> _LazyMask:
    """The ``AttentionMaskInterface`` function of ``"ulysses"`` (called by the model's mask builder)."""
    return _LazyMask(request)


def _attention_interface(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    """The ``AttentionInterface`` function of ``"ulysses"``: query ``[b, h, s/cp, d]``, key and
    value ``[b, h_kv, s/cp, d]`` of this rank's tokens; returns ``([b, s/cp, h, d], None)``."""
    sp = getattr(module, "_ulysses_sp", None)
    if sp is None:
        raise _ulysses.Error(
            f'attn_implementation="{NAME}" on a model that no SequenceParallel attached: call sp.attach(model)'
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return sp._attend(query, key, value, attention_mask, dropout, scaling, bool(causal), kw), None


AttentionInterface.register(NAME, _attention_interface)
AttentionMaskInterface.register(NAME, _mask_interface)


def _agree_text(comm: Any, what: str, text: str) -> None:
    """Collective: every rank raises "<what> differ between ranks: rank 0 has <text>, rank r has
    <its text>" unless all ranks' texts are equal."""
    comm._impl.agree_identical(what, text)


def _digest(*tensors: Optional[torch.Tensor]) -> str:
    """A short hash of the tensors' shapes, dtypes and bytes (to compare ranks' copies)."""
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().contiguous().reshape(-1)
        h.update(f"{t.dtype}{list(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    if config is None:
        raise _ulysses.Error(f"{type(model).__name__} has no .config: attach takes a transformers model")
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _check_heads(model: Any, cp: int) -> None:
    """Ulysses' rule for heads: every rank gets at least one whole query head, in whole GQA groups."""
    config, name = _text_config(model), type(model).__name__
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads < 1 or kv_heads < 1:
        raise _ulysses.Error(f"{name}: its config has no num_attention_heads / num_key_value_heads to split")
    if heads < cp:
        raise _ulysses.Error(
            f"{name}: num_attention_heads ({heads}) must be at least the group's size ({cp}): Ulysses gives "
            f"every rank at least one whole head (num_key_value_heads {kv_heads}); use a group of at most {heads} ranks"
        )
    if heads % kv_heads:
        raise _ulysses.Error(
            f"{name}: num_attention_heads ({heads}) must be divisible by num_key_value_heads ({kv_heads})"
        )


def _global_position_ids(ids, mask, position_ids):
    """``position_ids`` as given, else each row's count of valid tokens before each (pads 1, as
    transformers' generate does), else 0..s-1; refuses positions that restart inside a row."""
    if position_ids is None:
        if mask is None:
            return torch.arange(ids.shape[1]).expand(ids.shape).contiguous()
        return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    position_ids = torch.as_tensor(position_ids).long().expand(ids.shape).contiguous()
    steps = position_ids.diff(dim=-1)
    if mask is not None:
        steps = steps[(mask[:, 1:] != 0) & (mask[:, :-1] != 0)]
    if (steps != 1).any():
        raise _ulysses.Error(
            "position_ids restart or jump inside a row (packed sequences): the ulysses attention masks by the "
            "attention_mask only; put each sequence in a row of its own, padded, with an attention_mask"
        )
    return position_ids


def _shift(labels, mask):
    """Each token's target, the next token's label; IGNORE_INDEX at the end, at a pad and before
    one (a left pad's next token is a sequence's first: nothing predicts it)."""
    shifted = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    if mask is not None:
        both = (mask != 0) & (F.pad(mask[:, 1:], (0, 1), value=0) != 0)
        shifted = shifted.masked_fill(~both, IGNORE_INDEX)
    return shifted


def _cache_keyword(model: Any) -> str:
    """The name ``model.generate`` takes a KV cache by: the model's own (``cache`` in recent
    transformers, which deprecated ``past_key_values``; ``past_key_values`` before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _as_rows(name: str, x: Any, shape: Optional[torch.Size]) -> Optional[torch.Tensor]:
    """``x`` as a 2-D integer CPU tensor of ``shape`` (the input_ids'), or None."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.is_floating_point() or x.device.type != "cpu":
        got = f"{x.dtype} {list(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise _ulysses.Error(f"{name} must be a 2-D integer CPU tensor [b, s], got {got}")
    if shape is not None and x.shape != shape:
        raise _ulysses.Error(f"{name} must have input_ids' shape {list(shape)}, got {list(x.shape)}")
    return x


class SequenceParallel:
    """A Hugging Face causal LM over a context-parallel group with Ulysses attention.

    ``group``: a ``ulysses.Communicator`` (mpi4py under mpirun, or a rank of
    ``ulysses.local_group``), an mpi4py communicator or a ``torch.distributed`` ProcessGroup (None:
    the default group). Every method is collective over the group: every rank calls it, in
    the same order, with the same global batch; a bad or differing argument on any rank raises
    the same ``ulysses.Error`` on every rank before any data moves."""

    def __init__(self, group: Any) -> None:
        self.comm = comm = _communicator(group)
        self.size, self.rank = comm.size, comm.rank
        self._attention = DistributedAttention(self._local_attention, comm, scatter_idx=2, gather_idx=1)
        self._gathered: List[torch.Tensor] = []
        self._captured: Optional[List[Any]] = None
        self._gather = DistributedAttention(self._capture, comm, scatter_idx=2, gather_idx=1)

    def attach(self, model: Any) -> Any:
        """Sets ``model``'s attention to ``"ulysses"`` over this group and returns it. Collective:
        refuses heads that do not split over the group (at least one whole query head per rank,
        whole GQA groups) and parameters that differ between ranks (same seed or same checkpoint
        on every rank). Attach after any ``copy.deepcopy`` of the model."""

        def check():
            _check_heads(model, self.size)
            return _digest(*model.state_dict().values())

        _agree_text(self.comm, "the model's parameters (sha256)", agreed(self.comm, check))
        model.set_attn_implementation(NAME)
        for m in model.modules():
            object.__setattr__(m, "_ulysses_sp", self)
        return model

    def shard_batch(self, input_ids, attention_mask=None, labels=None, position_ids=None) -> ShardedBatch:
        """This rank's tokens of a global batch ``[b, s]`` (the same on every rank), as DeepSpeed's
        ``UlyssesSPDataLoaderAdapter`` shards it: ``input_ids``, global ``position_ids`` (given,
        else counted over the ``attention_mask``'s valid tokens, else 0..s-1) and next-token
        labels shifted *before* sharding, so the target of a rank's last token (on the next rank)
        is kept. Collective: a batch, padding or labels that differ between ranks is an error."""

        def local():
            ids = _as_rows("input_ids", input_ids, None)
            if ids is None:
                raise _ulysses.Error("shard_batch needs input_ids [b, s]")
            if ids.shape[1] < self.size:
                raise _ulysses.Error(f"input_ids has {ids.shape[1]} tokens per row, fewer than the {self.size} ranks")
            mask, lab = _as_rows("attention_mask", attention_mask, ids.shape), _as_rows("labels", labels, ids.shape)
            if mask is not None and ((mask != 0) & (mask != 1)).any():
                raise _ulysses.Error("attention_mask must hold 0 (padding) and 1 (token) only")
            pos = _global_position_ids(ids, mask, position_ids)
            shifted = None if lab is None else _shift(lab, mask)
            items = 0 if shifted is None else int((shifted != IGNORE_INDEX).sum())
            if shifted is not None and items == 0:
                raise _ulysses.Error("labels have no valid target (every one is IGNORE_INDEX or padding)")
            rows = "none" if mask is None else str(mask.sum(-1).tolist())
            return ids, mask, pos, shifted, items, f"valid tokens per row {rows}, sha256 {_digest(ids, mask, lab, pos)}"

        ids, mask, pos, shifted, items, described = agreed(self.comm, local)
        _agree_text(self.comm, "shard_batch's batches (input_ids, attention_mask, labels, position_ids)", described)
        sh = lambda x: x.tensor_split(self.size, dim=1)[self.rank]  # contiguous, as the all-to-all takes them
        inputs = {"input_ids": sh(ids), "position_ids": sh(pos), "use_cache": False}
        if mask is not None:
            inputs["attention_mask"] = mask
        return ShardedBatch(inputs, None if shifted is None else sh(shifted), items)

    def loss(self, logits: torch.Tensor, batch: ShardedBatch) -> torch.Tensor:
        """Cross-entropy over the valid targets of every rank: (sum over the group) / num_items,
        in float32. The value is the whole batch's loss; its gradient reaches this rank's logits
        only, so that after ``backward`` on every rank ``reduce_gradients`` gives cp = 1's."""

        def local():
            if batch.shift_labels is None:
                raise _ulysses.Error("loss needs a batch sharded with labels")
            if logits.dim() != 3 or logits.shape[:2] != batch.shift_labels.shape:
                raise _ulysses.Error(
                    f"logits must be [b, s/cp, vocab] = [{', '.join(map(str, batch.shift_labels.shape))}, vocab], "
                    f"got {list(logits.shape)}"
                )

        agreed(self.comm, local)
        flat = logits.float().reshape(-1, logits.shape[-1])
        mine = F.cross_entropy(flat, batch.shift_labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
        whole = self._all_reduce(mine.detach().double().reshape(1))[0] / batch.num_items
        return _WholeValue.apply(mine / batch.num_items, whole.float())

    def reduce_gradients(self, model: Any) -> None:
        """Sums every parameter's gradient over the group (in rank order, identical on every rank):
        each rank's backward reaches the parameters through its own tokens only. A model trained
        with data parallelism too reduces over its own groups instead (the CP group belongs in its
        gradient reduction; this all-gathers, fine for small models and tests)."""
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        summed = self._all_reduce(torch.cat([g.detach().float().reshape(-1) for g in grads]))
        start = 0
        for p in params:
            p.grad = summed[start : start + p.numel()].view_as(p).to(p.dtype).clone()
            start += p.numel()

    def generate(self, model: Any, input_ids: torch.Tensor, attention_mask=None, **kwargs: Any) -> torch.Tensor:
        """``model.generate`` of the whole prompt on every rank, its prefill sharded: the prompt but
        its last token runs through the model under the ulysses attention (this rank's s/cp
        tokens; every attention over the whole prompt), every layer's keys and values are gathered
        into a transformers ``DynamicCache`` on every rank, and ``model.generate`` continues from
        that cache with transformers' ``sdpa``, one token at a time on every rank (a decode step
        is one query row: not what context parallelism splits). A prompt of cp tokens or fewer
        is not sharded. Collective: the prompt must be the same on every rank; greedy decoding
        (or one seed on every rank) gives every rank the same tokens."""

        def local():
            ids = _as_rows("input_ids", input_ids, None)
            if ids is None:
                raise _ulysses.Error("generate needs input_ids [b, s]")
            if "past_key_values" in kwargs or "cache" in kwargs:
                raise _ulysses.Error("SequenceParallel.generate fills the KV cache itself: pass no past_key_values")
            return _digest(ids, _as_rows("attention_mask", attention_mask, ids.shape))

        _agree_text(self.comm, "generate's prompts (sha256)", agreed(self.comm, local))
        cache = self._prefill(model, input_ids, attention_mask)
        previous = model.config._attn_implementation
        model.set_attn_implementation("sdpa")
        try:
            given = {_cache_keyword(model): cache}
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, **given, **kwargs)
        finally:
            model.set_attn_implementation(previous)

    def _prefill(self, model: Any, ids: torch.Tensor, mask: Optional[torch.Tensor]) -> Optional[DynamicCache]:
        """The KV cache of the prompt but its last token, the same on every rank, from a sharded
        forward of the model's decoder (no logits: the last token's are generate's first step);
        None when that part has fewer tokens than ranks. Collective."""
        n = ids.shape[1] - 1
        if n < self.size:
            return None
        batch = self.shard_batch(ids[:, :n], attention_mask=None if mask is None else mask[:, :n])
        self._captured = []
        try:
            with torch.no_grad():
                model.base_model(**batch.inputs)
            mine = torch.stack([torch.stack(kv) for kv in self._captured])  # [layers, 2, b, h_kv, s/cp, d]
        finally:
            self._captured = None
        sizes = [len(part) for part in torch.arange(n).tensor_split(self.size)]  # shard_batch's split
        every = self._all_gather(F.pad(mine, (0, 0, 0, sizes[0] - mine.shape[-2])))
        whole = torch.cat([every[r, ..., : sizes[r], :] for r in range(self.size)], dim=-2)
        cache = DynamicCache(config=model.config)
        for layer, (k, v) in enumerate(whole):
            cache.update(k, v, layer)
        return cache

    def _attend(self, query, key, value, mask, dropout, scaling, causal, kw) -> torch.Tensor:
        """[b, s/cp, h, d] of this rank's tokens from transformers' [b, h, s/cp, d] (collective)."""

        def local():
            given = [k for k in _UNSUPPORTED if kw.get(k) is not None]
            if given:
                raise _ulysses.Error(f"the ulysses attention does not apply {', '.join(given)}")
            if key.shape[2] != query.shape[2]:  # keys from a KV cache: decoding
                raise _ulysses.Error(
                    "the ulysses attention keeps no KV cache (its keys would be this rank's tokens only): "
                    "call the model with use_cache=False and generate with SequenceParallel.generate"
                )

        agreed(self.comm, local)
        if self._captured is not None:  # a sharded prefill: this rank's tokens' keys and values
            self._captured.append((key, value))
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))
        return self._attention(q, k, v, mask=mask, dropout=dropout, scaling=scaling, causal=causal)

    def _local_attention(self, q, k, v, mask, dropout, scaling, causal) -> torch.Tensor:
        """Attention over the whole sequence for this rank's heads: q [b, s, h_r, d], k and v
        [b, s, kv_r, d] (a GQA group's KV head with its query heads, or shared)."""
        mask = self._global_mask(mask, q.shape[1])
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        if k.shape[1] != q.shape[1]:
            k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
        causal = mask is None and causal and q.shape[2] > 1
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scaling
        )
        return out.transpose(1, 2)

    def _global_mask(self, mask: Any, seq: int) -> Optional[torch.Tensor]:
        """The mask at the global length (collective; built and agreed once per forward)."""
        if isinstance(mask, _LazyMask):
            if mask.built is None:
                built = agreed(self.comm, mask.build, seq)
                padding = mask.request.get("attention_mask")
                rows = "none" if padding is None else str(padding.sum(-1).tolist())
                _agree_text(self.comm, "attention masks", f"valid tokens per row {rows}, sha256 {_digest(padding)}")
                mask.built = [built]
            return mask.built[0]

        def given():
            if mask is not None and (not isinstance(mask, torch.Tensor) or tuple(mask.shape[-2:]) != (seq, seq)):
                got = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
                raise _ulysses.Error(
                    f"a 4-D attention_mask must cover the whole sequence [b, 1, {seq}, {seq}], got {got}"
                )

        agreed(self.comm, given)
        return mask

    def _capture(self, q, k, v) -> torch.Tensor:
        self._gathered.append(torch.cat([q, k, v], dim=3))
        return q[..., :1]

    def _all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[cp, *x.shape]``: every rank's ``x`` (same shape and dtype on every rank; collective).

        Built on the one collective every group of the public API has, the Ulysses all-to-all: a
        rank's x, its bytes viewed as float32, a third each in q, k and v, repeated once per rank
        as heads, travels so that rank j receives head j of every rank's tokens: every rank's x,
        cp times x's bytes as an all-gather moves. The bytes are copied, never added, so any dtype
        arrives exactly."""
        wide = x.detach().reshape(-1)
        if wide.element_size() not in (4, 8):
            wide = wide.to(torch.float64 if wide.is_floating_point() else torch.int64)
        bits = wide.contiguous().view(torch.float32)
        third = -(-bits.numel() // 3)
        parts = F.pad(bits, (0, 3 * third - bits.numel())).view(3, 1, 1, 1, third)
        q, k, v = (part.expand(1, 1, self.size, third) for part in parts)
        self._gathered.clear()
        with torch.no_grad():
            self._gather(q, k, v)
        rows = self._gathered.pop().reshape(self.size, 3 * third)[:, : bits.numel()]
        return rows.reshape(-1).view(wide.dtype).to(x.dtype).reshape(self.size, *x.shape)

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``x``, added in rank order: the same bits on every rank."""
        gathered = self._all_gather(x)
        total = gathered[0].clone()
        for part in gathered[1:]:
            total += part
        return total
