#!/usr/bin/env python3
"""Workloads for `cargo xtask gpu-check`, run on a machine with an NVIDIA GPU and PyTorch.

Every line the orchestrator reads starts with `GPUCHECK ` and carries one JSON object; anything
else on stdout is ignored. Interactive modes print a `step` record and then wait for a line on
stdin before going on, so the orchestrator can read the agent and NVML in between.

Modes:
  steps          the allocation steps: CUDA context, plain tensors, the caching allocator's
                 empty_cache, cudaMallocManaged touched on the GPU (ctypes into libcudart)
  hold MIB       a second process: allocate MIB of tensors, report, wait, exit
  fill MIB       a process that reuses freed memory: allocate MIB (one tensor), write every
                 byte and read it all back (its sum), report, wait, exit
  grow MIB       allocate MIB-sized tensors one by one, each after a go-ahead, until stopped,
                 killed or refused (an out-of-memory error is reported as an `oom` step)
  matmul SECS    fp16 matmuls in a loop for SECS seconds: a `started` step, then the rate and
                 the GPU time the tenant got (each kernel between its own CUDA events, less
                 the freezes some spans hold: see `kernel_time`; the raw sum and the batch's
                 events, which also count idling inside a held batch, beside it)
  cost STEPS PAIRS   warmed up: a small MLP's training steps (mean time per step), then
                 cudaMalloc + cudaFree of 2 MiB PAIRS times (mean time per pair)

libcudart is the one this process already maps (PyTorch loaded it), found in /proc/self/maps:
loading another by name could bring a second CUDA runtime into the process.
"""

import ctypes
import json
import os
import sys
import time

MIB = 1 << 20


def report(**fields):
    """One record for the orchestrator."""
    fields.setdefault("pid", os.getpid())
    print("GPUCHECK " + json.dumps(fields, sort_keys=True), flush=True)


def wait():
    """Waits for the orchestrator's go-ahead (a line on stdin); False at end of input."""
    return sys.stdin.readline() != ""


def torch_cuda():
    import torch

    if not torch.cuda.is_available():
        report(event="error", reason="torch.cuda.is_available() is False")
        sys.exit(3)
    return torch


def mapped_cudart(maps_text):
    """The path of the libcudart this process maps, from /proc/self/maps' text; None if none."""
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and os.path.basename(parts[5]).startswith("libcudart.so"):
            return parts[5].strip()
    return None


def cudart():
    """The libcudart PyTorch already loaded (call after CUDA is initialised)."""
    with open("/proc/self/maps") as f:
        path = mapped_cudart(f.read())
    if path is None:
        report(event="error", reason="no libcudart.so* mapped in /proc/self/maps after CUDA init")
        sys.exit(3)
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        report(event="error", reason=f"loading {path}: {e}")
        sys.exit(3)


def check(rt, status, what):
    if status != 0:
        report(event="error", reason=f"{what} returned cudaError {status}")
        sys.exit(4)


def steps():
    torch = torch_cuda()
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    report(event="step", name="context")
    wait()
    tensors = [torch.empty(256 * MIB, dtype=torch.uint8, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    report(event="step", name="tensors", torch_reserved=torch.cuda.memory_reserved())
    wait()
    del tensors
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    report(event="step", name="empty_cache", torch_reserved=torch.cuda.memory_reserved())
    wait()
    rt = cudart()
    ptr = ctypes.c_void_p()
    size = 1024 * MIB
    check(rt, rt.cudaMallocManaged(ctypes.byref(ptr), ctypes.c_size_t(size), 1), "cudaMallocManaged")
    # Touch every page on the GPU: a memset runs there and migrates the pages in.
    check(rt, rt.cudaMemset(ptr, 1, ctypes.c_size_t(size)), "cudaMemset")
    check(rt, rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
    report(event="step", name="managed", bytes=size)
    wait()
    check(rt, rt.cudaFree(ptr), "cudaFree")
    check(rt, rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
    report(event="step", name="managed_freed")
    wait()


def hold(mib):
    torch = torch_cuda()
    held = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    report(event="step", name="hold", bytes=held.numel())
    wait()


def fill(mib):
    torch = torch_cuda()
    held = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
    start = time.monotonic()
    held.fill_(0xA5)
    # Read back as int64 words (no second tensor of its size): their sum wraps the same on any
    # order of the reduction.
    words = held.view(torch.int64)
    word = int.from_bytes(b"\xa5" * 8, "little", signed=True)
    got = int(words.sum().item()) & ((1 << 64) - 1)
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    report(event="step", name="fill", bytes=held.numel(),
           verified=got == (words.numel() * word) & ((1 << 64) - 1),
           fill_s=time.monotonic() - start, torch_reserved=torch.cuda.memory_reserved(),
           cuda_free=free)
    wait()


def grow(mib):
    torch = torch_cuda()
    held = []
    while len(held) * mib < 64 * 1024:
        try:
            held.append(torch.empty(mib * MIB, dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError as e:
            # A refusing tier (BPF LSM, the driver's own limit) answers with an error, not a kill.
            report(event="step", name="oom", tensors=len(held), bytes=len(held) * mib * MIB,
                   error=str(e).splitlines()[0] if str(e) else "out of memory")
            wait()
            return
        report(event="step", name="grow", tensors=len(held), bytes=len(held) * mib * MIB)
        if not wait():
            return


def matmul(seconds):
    torch = torch_cuda()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    report(event="step", name="started")
    timed = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    # Each kernel between its own pair of events: what the GPU spent on this tenant's work.
    # The batch's pair alone also counts the GPU idling inside the batch while the throttle
    # holds the process between two launches, which is not GPU time the tenant got.
    kernels = [(timed(), timed()) for _ in range(10)]
    done, gpu_ms, start = 0, 0.0, time.monotonic()
    spans = []
    while time.monotonic() - start < seconds:
        begin, end = timed(), timed()
        begin.record()
        for k_begin, k_end in kernels:
            k_begin.record()
            a @ b
            k_end.record()
        end.record()
        end.synchronize()
        gpu_ms += begin.elapsed_time(end)
        spans.extend(k_begin.elapsed_time(k_end) for k_begin, k_end in kernels)
        done += len(kernels)
    elapsed = time.monotonic() - start
    kernel_ms, gaps, raw_ms = kernel_time(spans)
    report(event="result", name="matmul", rate=done / elapsed, seconds=elapsed,
           gpu_s=kernel_ms / 1e3, busy=kernel_ms / 1e3 / elapsed,
           raw_busy=raw_ms / 1e3 / elapsed, gaps=gaps, kernel_median_ms=median(spans),
           batch_busy=gpu_ms / 1e3 / elapsed)


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def kernel_time(spans, over=4.0):
    """The GPU time of kernels timed between their own events, less the idle some spans hold.

    A span runs from its start event to its end event, as the GPU reached them. When the
    process is frozen after queueing the start event and before queueing the kernel or the end
    event, the GPU reaches the start event, drains and idles until the process is thawed: that
    span holds the freeze (tens to thousands of ms) beside one kernel (a fraction of a ms), and
    the same matmul cannot take several times its median on any clock (1,470 to 1,980 MHz). Such
    a span counts as the median kernel. Returns (kernel ms, spans so counted, raw ms).
    """
    mid = median(spans)
    raw = sum(spans)
    gaps = [d for d in spans if d > over * mid]
    return raw - sum(gaps) + len(gaps) * mid, len(gaps), raw


def cost(steps, pairs):
    torch = torch_cuda()
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device="cuda")

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    for _ in range(max(50, steps // 10)):
        step()
    torch.cuda.synchronize()
    start = time.monotonic()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    step_s = (time.monotonic() - start) / steps
    rt = cudart()
    ptr = ctypes.c_void_p()
    size = ctypes.c_size_t(2 * MIB)
    for _ in range(max(50, pairs // 10)):
        check(rt, rt.cudaMalloc(ctypes.byref(ptr), size), "cudaMalloc")
        check(rt, rt.cudaFree(ptr), "cudaFree")
    start = time.monotonic()
    for _ in range(pairs):
        check(rt, rt.cudaMalloc(ctypes.byref(ptr), size), "cudaMalloc")
        check(rt, rt.cudaFree(ptr), "cudaFree")
    pair_s = (time.monotonic() - start) / pairs
    report(event="result", name="cost", step_s=step_s, pair_s=pair_s, steps=steps, pairs=pairs)


def main():
    mode, *args = sys.argv[1:] or ["steps"]
    modes = {
        "steps": lambda: steps(),
        "hold": lambda: hold(int(args[0])),
        "fill": lambda: fill(int(args[0])),
        "grow": lambda: grow(int(args[0])),
        "matmul": lambda: matmul(float(args[0])),
        "cost": lambda: cost(int(args[0]), int(args[1])),
    }
    if mode not in modes:
        report(event="error", reason=f"unknown mode {mode}")
        sys.exit(2)
    modes[mode]()


if __name__ == "__main__":
    main()
