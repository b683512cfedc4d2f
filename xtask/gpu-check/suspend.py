#!/usr/bin/env python3
"""The suspend section's workload for `cargo xtask gpu-check` (issue 38, docs/suspend.md).

  suspend.py MIB

fills MIB of GPU memory (one int64 tensor) with seeded pseudo-random data, prints a `filled`
record with its checksum, then works on it lightly until told to check it: every 0.2 s it adds
1 to one element and takes it away again (so the data is the same between two iterations) and
synchronizes, printing a plain `heartbeat N` line every fifth time. Each line on stdin makes it
compute the checksum again and print a `checked` record, with the longest gap between two
heartbeats (the time it stood still while suspended); the end of stdin ends it.

The checksum is exact and independent of how the GPU orders the reduction: the int64 sum of
each 256 MiB chunk (integer addition wraps the same whatever the order), the chunk sums hashed
in order. It allocates nothing beside the tensor but the reductions' few bytes. The records also
carry what the CUDA runtime itself says (PyTorch's reserved bytes, `cudaMemGetInfo`), never
NVML, and the libcuda this process maps (the checkpoint helper loads the driver library too).

Records and the helpers that print them are workload.py's, so the two read alike.
"""

import hashlib
import os
import select
import sys
import time

from workload import MIB, report, torch_cuda

CHUNK = 256 * MIB
SEED = 38


def mapped_libcuda():
    """The path of the libcuda this process maps; None if none."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.basename(parts[5]).startswith("libcuda.so"):
                return parts[5].strip()
    return None


def checksum(torch, t):
    """The ordered chunk sums of `t`, hashed; and the seconds it took."""
    start = time.monotonic()
    digest = hashlib.sha256()
    for chunk in t.split(CHUNK // t.element_size()):
        digest.update((int(chunk.sum().item()) & ((1 << 64) - 1)).to_bytes(8, "little"))
    torch.cuda.synchronize()
    return digest.hexdigest()[:32], time.monotonic() - start


def runtime_view(torch):
    free, total = torch.cuda.mem_get_info()
    return {"torch_reserved": torch.cuda.memory_reserved(), "cuda_free": free,
            "cuda_total": total}


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    torch = torch_cuda()
    start = time.monotonic()
    generator = torch.Generator(device="cuda")
    generator.manual_seed(SEED)
    t = torch.empty(mib * MIB // 8, dtype=torch.int64, device="cuda")
    t.random_(generator=generator)
    torch.cuda.synchronize()
    filled_s = time.monotonic() - start
    total, took = checksum(torch, t)
    report(event="step", name="filled", bytes=t.numel() * t.element_size(), checksum=total,
           fill_s=filled_s, checksum_s=took, libcuda=mapped_libcuda(), **runtime_view(torch))
    beats, last, gap = 0, time.monotonic(), 0.0
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.2)
        if ready:
            if sys.stdin.readline() == "":
                return
            # A stall not yet ended by a heartbeat counts up to now.
            longest = max(gap, time.monotonic() - last)
            total, took = checksum(torch, t)
            report(event="step", name="checked", bytes=t.numel() * t.element_size(),
                   checksum=total, checksum_s=took, heartbeats=beats, longest_gap_s=longest,
                   **runtime_view(torch))
            continue
        t[:1].add_(1)
        t[:1].sub_(1)
        torch.cuda.synchronize()
        now = time.monotonic()
        gap, last, beats = max(gap, now - last), now, beats + 1
        if beats % 5 == 0:
            print(f"heartbeat {beats}", flush=True)


if __name__ == "__main__":
    main()
