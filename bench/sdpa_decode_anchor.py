"""PyTorch SDPA decoding one token over a KV cache: the outside anchor of the decode kernel
(docs/inference.md). One query row per head against T cached rows in the layout a KV-cached
decode keeps ([1, h_kv, capacity, d], sliced to T), `layers` layers a step, one thread, process
CPU time, best of 20. Measuring only (not a test; needs torch >= 2.5 for enable_gqa).

usage: sdpa_decode_anchor.py T HEADS KV_HEADS HEAD_DIM [LAYERS]
"""

import sys
import time

import torch
import torch.nn.functional as F


def main():
    T, h, hkv, d = (int(x) for x in sys.argv[1:5])
    layers = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    torch.set_num_threads(1)
    k = [torch.randn(1, hkv, T + 16, d) for _ in range(layers)]
    v = [torch.randn(1, hkv, T + 16, d) for _ in range(layers)]
    q = torch.randn(1, h, 1, d)
    best = float("inf")
    for _ in range(20):
        t0 = time.process_time()
        for layer in range(layers):
            F.scaled_dot_product_attention(q, k[layer][:, :, :T], v[layer][:, :, :T], enable_gqa=h != hkv)
        best = min(best, time.process_time() - t0)
    cached = layers * 2 * T * hkv * d * 4
    print(
        f"torch {torch.__version__} SDPA decode, T={T}, h={h}, h_kv={hkv}, d={d}, {layers} layers: "
        f"{best * 1e3:.2f} ms a step, {cached / best / 1e9:.2f} GB/s of cache"
    )


if __name__ == "__main__":
    main()
