"""Measured (bench/gpu_attention_shapes.py's JSON lines, from a GPU) against what `ulysses plan`
predicts for the same shapes: the kernel curve per block, one rank's attention per strategy, and
decode. Prints one table per section with measured / predicted.

usage: gpu_attention_compare.py RESULTS.jsonl [--gpu H200] [--kernel fa2] [--backend flash]
                                [--ulysses build/ulysses]
"""

import argparse
import json
import statistics
import subprocess


def plan(args, **kw):
    cmd = [args.ulysses, "plan", "--gpu", args.gpu, "--kernel", args.kernel, "--json", "-"]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if value is True else [flag, str(value)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("\n{") + 1 :])["strategies"]


def compute_s(rows, name):
    return next(r["compute_s"] for r in rows if r["name"] == name)


def curve(args, rows):
    print(f"\ncurve ({args.backend} against --kernel {args.kernel}): measured / predicted seconds")
    print("  d causal      L   fwd TFLOP/s  fwd m/p  fwd+bwd m/p")
    ratios = []
    for r in rows:
        extra = {} if r["causal"] else {"no_causal": True}
        shape = dict(seq=r["L"], batch=r["batch"], heads=r["heads"], head_dim=r["d"], cp=1, **extra)
        fwd = compute_s(plan(args, mode="forward", **shape), "a2a")
        train = compute_s(plan(args, mode="train", **shape), "a2a")
        ratios += [r["fwd_s"] / fwd, r["fwdbwd_s"] / train]
        print(
            f"{r['d']:3} {r['causal']!s:6} {r['L']:6} {r['fwd_tflops']:10.0f} {r['fwd_s'] / fwd:8.2f} "
            f"{r['fwdbwd_s'] / train:11.2f}"
        )
    return ratios


def ranks(args, rows):
    print(f"\nranks ({args.backend} against --kernel {args.kernel}): one rank's attention, measured / predicted")
    ratios, picks = [], []
    for (s, train), group in _groups(rows, ("s", "train")).items():
        shape = dict(seq=s, heads=group[0]["heads"], head_dim=group[0]["head_dim"], cp=group[0]["cp"])
        predicted = plan(args, mode="train" if train else "forward", **shape)
        line = []
        for r in group:
            p = compute_s(predicted, r["strategy"])
            ratios.append(r["seconds"] / p)
            line.append(f"{r['strategy']} {r['seconds'] * 1e3:.2f} ms ({r['seconds'] / p:.2f})")
        fastest_m = min(group, key=lambda r: r["seconds"])["strategy"]
        fastest_p = min(group, key=lambda r: compute_s(predicted, r["strategy"]))["strategy"]
        picks.append(fastest_m == fastest_p)
        print(f"s {s} {'train' if train else 'forward'}: " + "; ".join(line))
        print(f"  fastest measured {fastest_m}, predicted {fastest_p}")
    return ratios, picks


def decode(args, rows):
    print(f"\ndecode (--kernel {args.kernel}): measured / predicted seconds")
    ratios = []
    for r in rows:
        p = compute_s(plan(args, mode="decode", seq=r["T"], batch=r["batch"], heads=32, kv_heads=8, cp=1), "a2a")
        ratios.append(r["seconds"] / p)
        print(f"{r['way']:18} T {r['T']:6} batch {r['batch']:2}: {r['tbps']:.2f} TB/s, {r['seconds'] / p:.2f}")
    return ratios


def _groups(rows, keys):
    out = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def summary(name, ratios):
    if ratios:
        within = sum(1 for x in ratios if 1 / 1.5 <= x <= 1.5)
        print(f"{name}: median measured/predicted {statistics.median(ratios):.2f}, within 1.5x {within}/{len(ratios)}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("--gpu", default="H200")
    p.add_argument("--kernel", default="fa2")
    p.add_argument("--backend", default="flash")
    p.add_argument("--ulysses", default="build/ulysses")
    args = p.parse_args()
    rows = [json.loads(line) for line in open(args.results)]
    ok = [r for r in rows if "error" not in r and r.get("backend", args.backend) == args.backend]
    for r in rows:
        if r["section"] == "ceilings":
            print("ceiling:", r)
    summary("curve", curve(args, [r for r in ok if r["section"] == "curve"]))
    ratios, picks = ranks(args, [r for r in ok if r["section"] == "ranks"])
    summary("ranks", ratios)
    print(f"ranks: predicted fastest = measured fastest in {sum(picks)}/{len(picks)}")
    summary("decode", decode(args, [r for r in ok if r["section"] == "decode"]))


if __name__ == "__main__":
    main()
