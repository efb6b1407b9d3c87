#!/usr/bin/env python3
"""The static half of the device-neutrality check (the runtime half is test_device_ops).

The code that moves tensors between ranks and strategies (src/cp/**, src/comm/all_to_all.cpp)
and over the sharded KV cache (src/infer: the prefills, pass-Q, the decode step) must never
read or write tensor memory itself: it builds views and calls the device's table
(include/ulysses/core/device_ops.hpp), the kernels and the communicator. This lists every line
there that touches memory directly (memcpy and friends, typed element pointers, row loads and
stores, host-only fills) or hands the communicator a raw pointer instead of a Buffer (which
carries the device), and fails when there is one.

Usage: device_neutral_test.py <source root>
"""

import pathlib
import re
import sys

CHECKED = ["src/cp/**/*.cpp", "src/cp/**/*.hpp", "src/comm/all_to_all.cpp", "src/infer/*.cpp"]

# What reads or writes tensor memory on the host.
TOUCHES = re.compile(
    r"\bstd::(memcpy|memmove|memset|fill|fill_n|copy|copy_n)\b"
    r"|\b(memcpy|memmove|memset)\s*\("
    r"|[.>](f32|bf16)\s*\("  # TensorView::f32/bf16, Tensor::f32: typed element pointers
    r"|\b(load_row|store_row)\s*\("
    r"|\bfill_uniform\s*\("
    r"|\breinterpret_cast\b"
)

# Host-only helpers that live in src/cp by concept, each with the reason it may touch memory.
ALLOWED = {
    # fill_uniform_shard fills a host tensor with the test pattern (tests, the CLI's --check).
    ("src/cp/sharding.cpp", "fill_uniform(part, seed, chunks[i].begin);"),
    # halo_volume's sweep fills its own index of segments (planner arithmetic, no tensor).
    ("src/cp/halo_volume.cpp", "std::fill(seg_of.begin() + starts[s], seg_of.begin() + starts[s + 1], s);"),
}


# A collective or message over tensor memory must say which device it is on: a Buffer made by
# buffer_of, never host memory's {pointer, bytes}.
COLLECTIVE = re.compile(
    r"[.>](isend|irecv|ialltoallv|alltoallv|alltoall|allgatherv|allgather|gather|reduce_scatter_sum|broadcast)\s*\("
)


def untyped_collectives(rel, text):
    code = re.sub(r"//[^\n]*", "", text)
    for m in COLLECTIVE.finditer(code):
        statement = code[m.start() : code.find(";", m.start())]
        if "buffer_of(" not in statement and "Buffer{" not in statement:
            yield f"{rel}:{code.count(chr(10), 0, m.start()) + 1}: {m.group(1)} without a Buffer (buffer_of)"


def offenders(root):
    found = []
    for pattern in CHECKED:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            found.extend(untyped_collectives(rel, path.read_text()))
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("//", 1)[0]
                if TOUCHES.search(code) and (rel, code.strip()) not in ALLOWED:
                    found.append(f"{rel}:{n}: {line.strip()}")
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    found = offenders(root)
    for f in found:
        print(f)
    if found:
        print(f"{len(found)} line(s) touch tensor memory outside the device table (device_ops.hpp)")
        return 1
    print("src/cp, src/comm/all_to_all.cpp and src/infer move data only through the device table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
