"""What the PyTorch anchors (sdpa_anchor.py, deepspeed_anchor.py) share: their dtypes, the
names of SDPA's backends and the query for the one torch picks, the comma-list option parser,
their random inputs and their timing fields; and the check both need first: importing this
module ends the program with exit code 3 and one line when numpy or torch >= 2.0 with
scaled_dot_product_attention is missing."""

import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F

    F.scaled_dot_product_attention  # noqa: B018 - torch >= 2.0
except (ImportError, AttributeError) as e:
    prog = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    print(f"{prog}: needs numpy and torch >= 2.0 with scaled_dot_product_attention ({e})", file=sys.stderr)
    sys.exit(3)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
BACKEND_NAMES = {
    -1: "error",
    0: "math",
    1: "flash_attention",
    2: "efficient_attention",
    3: "cudnn_attention",
    4: "overrideable",
}


def split_list(values, allowed, what, prog):
    """The items of repeated and comma-separated option values, each once, in order; an item
    not in `allowed` ends `prog` with exit code 2."""
    out = []
    for v in values or []:
        for item in v.split(","):
            item = item.strip()
            if not item:
                continue
            if item not in allowed:
                print(f"{prog}: unknown {what} '{item}' (use {', '.join(allowed)})", file=sys.stderr)
                sys.exit(2)
            if item not in out:
                out.append(item)
    return out


def sdpa_backend(q, k, v, causal, **kw):
    """The SDPA backend torch's dispatcher picks for these inputs (private API; None if unavailable)."""
    fn = getattr(torch, "_fused_sdp_choice", None)
    if fn is None:
        return None
    try:
        code = int(fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=causal, **kw))
    except Exception:  # noqa: BLE001 - private API, signature varies across versions
        return None
    return BACKEND_NAMES.get(code, str(code))


def add_attention_args(p, seq, dtypes):
    """The options every attention anchor takes: the shape, --dtype (default: the list
    `dtypes`), --threads, --reps and --seed; parse_attention_args reads them."""
    p.add_argument("--seq", type=int, default=seq, help=f"global sequence length s (default {seq})")
    p.add_argument("--heads", type=int, default=8, help="query heads h (default 8)")
    p.add_argument("--head-dim", type=int, default=64, help="head dimension d (default 64)")
    p.add_argument("--batch", type=int, default=1, help="batch b (default 1)")
    p.add_argument(
        "--dtype",
        action="append",
        default=None,
        help=f"f32|bf16|f16, repeatable or comma list (default {','.join(dtypes)})",
    )
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions; median reported (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(default_dtypes=dtypes)


def parse_attention_args(p, argv, prog):
    """p's arguments, with a.dtypes the list of --dtype values (or the default)."""
    a = p.parse_args(argv)
    a.dtypes = split_list(a.dtype, DTYPES, "dtype", prog) or a.default_dtypes
    return a


def require_positive(p, a, names):
    """Ends with argparse's usage error unless every option in `names` is >= 1."""
    for name in names:
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")


def cpu_capability():
    """torch's CPU capability ("AVX512", ...), or None before torch 2.1."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - added in torch 2.1
        return None


def random_qkv(g, dtype, q_shape, kv_shape):
    """q, k and v (requiring grad) and an output gradient of q's shape, drawn from `g` in that
    order and converted to `dtype`."""
    q = torch.randn(*q_shape, generator=g).to(dtype).requires_grad_(True)
    k = torch.randn(*kv_shape, generator=g).to(dtype).requires_grad_(True)
    v = torch.randn(*kv_shape, generator=g).to(dtype).requires_grad_(True)
    grad = torch.randn(*q_shape, generator=g).to(dtype)
    return q, k, v, grad


def timing_fields(fwd, bwd, b, s, h, d, causal):
    """A case's timing fields from its forward and backward seconds per repetition: the medians,
    GFLOP/s by FlashAttention's count (forward 4*b*s*s*h*d, halved when causal; backward 2.5x
    forward) and every repetition's seconds."""
    flops_fwd = 4.0 * b * s * s * h * d * (0.5 if causal else 1.0)
    flops_bwd = 2.5 * flops_fwd
    fwd_s = float(np.median(fwd))
    bwd_s = float(np.median(bwd))
    return {
        "fwd_s": round(fwd_s, 6),
        "bwd_s": round(bwd_s, 6),
        "fwd_gflops": round(flops_fwd / fwd_s / 1e9, 3),
        "bwd_gflops": round(flops_bwd / bwd_s / 1e9, 3),
        "fwd_s_all": [round(x, 6) for x in fwd],
        "bwd_s_all": [round(x, 6) for x in bwd],
    }
