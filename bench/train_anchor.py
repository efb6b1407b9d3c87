#!/usr/bin/env python3
"""External anchor for `ulysses train`: the same GPT, data and optimizer in PyTorch.

The model follows src/train/gpt.cpp exactly: byte vocabulary (256), token embedding (no
position embedding), L x [RMSNorm -> q, k, v projections (no bias) -> RoPE ("rotate half",
base 10000, global positions) -> causal GQA attention (torch SDPA, enable_gqa) -> output
projection -> residual -> RMSNorm -> SwiGLU MLP (w2 . silu(w1 x) * w3 x) -> residual] ->
RMSNorm -> untied LM head -> mean cross-entropy. Weights are initialised with the same
splitmix64 stream as Gpt::init_params, the batches are the same synthetic needle-retrieval
batches as data.cpp, and the optimizer is the trainer's: global-norm clipping at 1.0, AdamW
(lr 3e-3, linear warm-up over 20 steps, betas 0.9/0.95, eps 1e-8, weight decay 0.1 except on
the RMSNorm gains). So the parameter count equals the `ulysses train` header's and the losses of
the first steps equal ulysses' to float rounding (checked by bench/train_anchors.sh).

Two modes:
  single      one process, --threads torch threads (default 2); attention = SDPA.
  deepspeed   DeepSpeed-Ulysses: deepspeed.sequence.layer.DistributedAttention around SDPA,
              one rank per process over gloo (launch with mpirun -n P or torchrun); each rank
              holds s/P contiguous tokens of every sequence and the full weights; the weight
              gradients are all-reduced (sum; the loss is already divided by the global token
              count), then clipping and AdamW run identically on every rank.
--dtype bf16 runs forward and backward under torch.autocast("cpu", torch.bfloat16) (weights and
AdamW stay float32); f32 runs everything in float32.

Timing: per step, a barrier, then data, forward, backward, all-reduce, clipping and AdamW; the
slowest rank's time. tokens/s = batch*seq / median step time over the steps after the first
(the first is the warm-up; --warmup-seq runs it shorter). Peak memory: VmHWM of
/proc/self/status at the end, the largest over ranks. Model FLOPs per step as
GptConfig::train_flops (src/train/gpt.cpp): 3 x the forward (backward = 2 x forward, recompute
excluded), the forward being 2 FLOPs per weight per token of the projections, the MLP and the LM
head, plus the causal attention's 2 * s^2 * heads * head_dim per layer. --peak-gflops (one
thread's register-resident peak of the dtype's unit, as `ulysses train` prints it: "peak for
MFU") gives "mfu" = model FLOPs / (median step time * peak * threads * ranks), as the trainer's.

Rank 0 prints ONE JSON line on stdout; logs go to stderr. Needs torch >= 2.5 (SDPA with
enable_gqa) and, for --mode deepspeed, deepspeed; exits with code 3 and says so otherwise.
Not part of the tests.

  python bench/train_anchor.py --mode single --seq 8192 --width 512 --heads 8 --kv-heads 2 \
      --head-dim 64 --layers 4 --hidden 1376 --steps 3 --dtype f32
  mpirun -n 2 --oversubscribe --bind-to none python bench/train_anchor.py --mode deepspeed ...
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepspeed_anchor as dsa  # noqa: E402 - exits 3 without numpy / torch >= 2.0
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def _die(msg):
    print(f"train_anchor: {msg}", file=sys.stderr)
    sys.exit(3)


# ---- the same numbers as ulysses: splitmix64 weights and data --------------------------------


def _mix(z):
    """splitmix64's output function on uint64 numpy arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class InitStream:
    """Gpt::init_params' uniform [-1, 1) stream, vectorised: the k-th draw mixes state0 + k*G."""

    def __init__(self, seed):
        self.state = (seed * GOLDEN + 1) & M64
        self.drawn = 0

    def fill(self, shape, scale):
        n = int(np.prod(shape))
        k = np.arange(self.drawn + 1, self.drawn + n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = _mix(np.uint64(self.state) + k * np.uint64(GOLDEN))
        self.drawn += n
        u = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 2.0 - 1.0
        return torch.from_numpy((u * scale).astype(np.float32).reshape(shape))


class Rng:
    """data.cpp's splitmix64 (scalar)."""

    def __init__(self, seed):
        self.s = seed & M64

    def next(self):
        self.s = (self.s + GOLDEN) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def synthetic_batch(B, S, seed, step, pairs=1, queries=16):
    """DataSource::batch of the synthetic task: tokens, labels [B, S] (int64)."""
    tokens = np.empty((B, S), dtype=np.int64)
    labels = np.empty((B, S), dtype=np.int64)
    for b in range(B):
        rng = Rng(((seed * 0x100000001B3) & M64) ^ ((step << 20) & M64) ^ ((b * GOLDEN) & M64))
        phase = rng.below(16)
        buf = ord("a") + (np.arange(S + 1) + phase) % 16
        span = S + 1 - 2 * queries
        slots = list(range(pairs))  # the partial Fisher-Yates only ever touches the first `pairs`
        moved = {}
        value = []
        for k in range(pairs):
            j = k + rng.below(span - k)
            sk, sj = moved.get(k, k), moved.get(j, j)
            moved[k], moved[j] = sj, sk
            slots[k] = moved[k]
            value.append(rng.below(10))
            buf[slots[k]] = 128 + 10 * k + value[k]
        for i in range(queries):
            k = rng.below(pairs)
            at = span + 2 * i
            buf[at] = 224 + k
            buf[at + 1] = ord("0") + value[k]
        tokens[b], labels[b] = buf[:S], buf[1:]
    return torch.from_numpy(tokens), torch.from_numpy(labels)


# ---- the model -------------------------------------------------------------------------------


class Gpt(torch.nn.Module):
    """src/train/gpt.cpp in PyTorch; weights [in, out] as ulysses stores them (x @ w)."""

    def __init__(self, a, attention):
        super().__init__()
        self.a, self.attention = a, attention
        C, H, Hkv, D, Fh, V = a.width, a.heads, a.kv_heads, a.head_dim, a.hidden, a.vocab
        init = InitStream(a.seed)
        P = torch.nn.Parameter
        s_in = math.sqrt(3.0 / C)
        self.wte = P(init.fill((V, C), 1.0))
        self.layers = torch.nn.ModuleList()
        for _ in range(a.layers):
            m = torch.nn.Module()
            m.rms1, m.rms2 = P(torch.ones(C)), P(torch.ones(C))
            m.wq = P(init.fill((C, H * D), s_in))
            m.wk = P(init.fill((C, Hkv * D), s_in))
            m.wv = P(init.fill((C, Hkv * D), s_in))
            m.wo = P(init.fill((H * D, C), math.sqrt(3.0 / (H * D)) / math.sqrt(2.0 * a.layers)))
            m.w1 = P(init.fill((C, Fh), s_in))
            m.w3 = P(init.fill((C, Fh), s_in))
            m.w2 = P(init.fill((Fh, C), math.sqrt(3.0 / Fh) / math.sqrt(2.0 * a.layers)))
            self.layers.append(m)
        self.rmsf = P(torch.ones(C))
        self.lm_head = P(init.fill((C, V), s_in))

    def rope_tables(self, pos):
        """cos, sin [n, 1, D/2] of pos * 10000^(-2i/D), computed in float64 as layers.hpp."""
        D = self.a.head_dim
        inv = torch.pow(10000.0, -2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
        ang = pos.to(torch.float64)[:, None] * inv[None, :]
        return ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]

    @staticmethod
    def rope(x, cos, sin):  # x [B, n, h, D]
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).to(x.dtype)

    def forward(self, tokens, labels, pos, grad_scale):
        a = self.a
        B, n = tokens.shape
        cos, sin = self.rope_tables(pos)
        x = F.embedding(tokens, self.wte)
        for m in self.layers:
            xn = F.rms_norm(x, (a.width,), m.rms1, 1e-5)
            q = (xn @ m.wq).view(B, n, a.heads, a.head_dim)
            k = (xn @ m.wk).view(B, n, a.kv_heads, a.head_dim)
            v = (xn @ m.wv).view(B, n, a.kv_heads, a.head_dim)
            att = self.attention(self.rope(q, cos, sin), self.rope(k, cos, sin), v)
            x = x + att.reshape(B, n, a.heads * a.head_dim) @ m.wo
            xn = F.rms_norm(x, (a.width,), m.rms2, 1e-5)
            x = x + (F.silu(xn @ m.w1) * (xn @ m.w3)) @ m.w2
        logits = F.rms_norm(x, (a.width,), self.rmsf, 1e-5) @ self.lm_head
        return F.cross_entropy(logits.float().view(-1, a.vocab), labels.reshape(-1), reduction="sum") * grad_scale


def sdpa_bshd(q, k, v):
    """Causal GQA attention on [b, s, h, d] (DeepSpeed's layout), SDPA inside."""
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return o.transpose(1, 2)


class LocalSDPA(torch.nn.Module):
    def forward(self, q, k, v):
        return sdpa_bshd(q, k, v)


# ---- the trainer -----------------------------------------------------------------------------


def flops_per_step(a):
    C, QD, KD, F = a.width, a.heads * a.head_dim, a.kv_heads * a.head_dim, a.hidden
    gemms = 2.0 * a.seq * (a.layers * (C * QD + 2 * C * KD + QD * C + 3 * C * F) + C * a.vocab)
    attention = a.layers * 2.0 * a.seq * a.seq * QD
    return 3.0 * a.batch * (gemms + attention)


def proc_status_mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="`ulysses train`'s model in PyTorch / DeepSpeed-Ulysses (JSON line)")
    p.add_argument("--mode", choices=("single", "deepspeed"), default="single")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="optimizer steps; the first is the warm-up (default 3)")
    p.add_argument(
        "--warmup-seq",
        type=int,
        default=None,
        help="run the warm-up step (the first) on sequences of this length instead of --seq: saves "
        "its time where a step takes minutes (default: --seq)",
    )
    for name, default in (
        ("layers", 2),
        ("width", 64),
        ("heads", 4),
        ("kv-heads", 2),
        ("head-dim", 16),
        ("hidden", 172),
    ):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank (single: 2, deepspeed: 1)")
    p.add_argument("--port", type=int, default=29533, help="MASTER_PORT under mpirun (default 29533)")
    p.add_argument(
        "--peak-gflops",
        type=float,
        default=None,
        help="one thread's peak of the dtype's unit (`ulysses train`'s \"peak for MFU\"): adds mfu",
    )
    a = p.parse_args(argv)
    if a.threads is None:
        a.threads = 2 if a.mode == "single" else 1
    a.warmup_seq = a.warmup_seq or a.seq
    if a.steps < 1 or min(a.seq, a.warmup_seq) < 64:
        p.error("--steps >= 1 and --seq, --warmup-seq >= 64 (the synthetic task)")
    return a


def main():
    a = parse_args()
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):
        _die(f"needs torch >= 2.5 (scaled_dot_product_attention with enable_gqa), found {torch.__version__}")
    torch.set_num_threads(a.threads)
    ds_version = None
    if a.mode == "deepspeed":
        launcher = dsa._mpi_env(a.port)
        deepspeed, ds_comm, DistributedAttention = dsa._import_deepspeed()
        ds_version = deepspeed.__version__
        tdist.init_process_group("gloo")
        dsa.init_deepspeed_comm(ds_comm, build_shm_op=False)
        rank, world = tdist.get_rank(), tdist.get_world_size()
        group = tdist.new_group(list(range(world)))
        dattn = DistributedAttention(LocalSDPA(), group, scatter_idx=2, gather_idx=1)
        attention = lambda q, k, v: dattn(q, k, v, 0)  # noqa: E731 - batch_dim_idx 0
    else:
        launcher, rank, world, attention = "single", 0, 1, sdpa_bshd
    if a.seq % world or a.warmup_seq % world or a.kv_heads % world or a.heads % a.kv_heads:
        _die(
            f"--seq {a.seq}, --warmup-seq {a.warmup_seq} and --kv-heads {a.kv_heads} must divide by {world} ranks, "
            "--heads by --kv-heads"
        )
    rss_imported = proc_status_mib("VmRSS")

    model = Gpt(a, attention)
    params = sum(p.numel() for p in model.parameters())
    gains = {id(p) for name, p in model.named_parameters() if "rms" in name}
    groups = [
        {"params": [p for p in model.parameters() if id(p) not in gains], "weight_decay": 0.1},
        {"params": [p for p in model.parameters() if id(p) in gains], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.dtype == "bf16" else contextlib.nullcontext()

    losses, seconds = [], []
    for step in range(a.steps):
        if world > 1:
            tdist.barrier()
        t0 = time.perf_counter()
        seq = a.warmup_seq if step == 0 else a.seq
        n = seq // world
        lo = rank * n
        tokens, labels = synthetic_batch(a.batch, seq, a.seed, step)
        opt.zero_grad(set_to_none=False)
        with autocast:
            loss = model(
                tokens[:, lo : lo + n], labels[:, lo : lo + n], torch.arange(lo, lo + n), 1.0 / (a.batch * seq)
            )
        loss.backward()
        loss_sum = loss.detach().double().reshape(1)
        if world > 1:  # one flat all-reduce of the gradients, as the trainer's
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            tdist.all_reduce(flat)
            tdist.all_reduce(loss_sum)
            at = 0
            for p in model.parameters():
                p.grad.copy_(flat[at : at + p.numel()].view_as(p))
                at += p.numel()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, (step + 1) / max(1, a.warmup))
        opt.step()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        if world > 1:
            tdist.all_reduce(dt, op=tdist.ReduceOp.MAX)
        losses.append(float(loss_sum))
        seconds.append(float(dt))
        if rank == 0:
            print(
                f"train_anchor: step {step + 1}/{a.steps} loss {losses[-1]:.6f} {seconds[-1]:.2f} s",
                file=sys.stderr,
                flush=True,
            )

    peak = torch.tensor([proc_status_mib("VmHWM"), rss_imported], dtype=torch.float64)
    if world > 1:
        tdist.all_reduce(peak, op=tdist.ReduceOp.MAX)
    timed = seconds[1:] or seconds
    med = float(np.median(timed))
    fl = flops_per_step(a)
    mfu = fl / med / (a.peak_gflops * 1e9 * a.threads * world) if a.peak_gflops else None
    if rank == 0:
        print(
            json.dumps(
                {
                    "tool": "train_anchor",
                    "mode": a.mode,
                    "launcher": launcher,
                    "world_size": world,
                    "threads": a.threads,
                    "dtype": a.dtype,
                    "torch_version": torch.__version__,
                    "deepspeed_version": ds_version,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "model": {
                        k: getattr(a, k)
                        for k in ("vocab", "layers", "width", "heads", "kv_heads", "head_dim", "hidden")
                    },
                    "params": params,
                    "batch": a.batch,
                    "seq": a.seq,
                    "warmup_seq": a.warmup_seq,
                    "steps": a.steps,
                    "losses": [round(x, 6) for x in losses],
                    "step_s": [round(x, 4) for x in seconds],
                    "median_step_s": round(med, 4),
                    "tokens_per_s": round(a.batch * a.seq / med, 1),
                    "flops_per_step": fl,
                    "gflops": round(fl / med * 1e-9, 2),
                    "peak_gflops_per_thread": a.peak_gflops,
                    "mfu": None if mfu is None else round(mfu, 4),
                    "peak_rss_mib": round(float(peak[0]), 1),
                    "rss_after_import_mib": round(float(peak[1]), 1),
                    "timing": "per step: barrier, then data + forward + backward + all-reduce + clip + AdamW; "
                    "slowest rank; median over the steps after the first",
                    "memory": "VmHWM at the end, largest over ranks",
                }
            ),
            flush=True,
        )
    if world > 1:
        tdist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
