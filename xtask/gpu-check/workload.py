#!/usr/bin/env python3
"""Workloads for `cargo xtask gpu-check`, run on a machine with an NVIDIA GPU and PyTorch.

Every line the orchestrator reads starts with `GPUCHECK ` and carries one JSON object; anything
else on stdout is ignored. Interactive modes print a `step` record and then wait for a line on
stdin before going on, so the orchestrator can read the agent and NVML in between.

Modes:
  steps          the allocation steps: CUDA context, plain tensors, the caching allocator's
                 empty_cache, cudaMallocManaged touched on the GPU (ctypes into libcudart)
  hold MIB       a second process: allocate MIB of tensors, report, wait, exit
  grow MIB       allocate MIB-sized tensors one by one until stopped or killed (limit checks)
  matmul SECS    fp16 matmuls in a loop for SECS seconds; the rate
  train STEPS    a small MLP's training steps; the mean time per step
  malloc COUNT   cudaMalloc + cudaFree of 2 MiB, COUNT times; the mean time per pair
"""

import ctypes
import glob
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


def cudart():
    """libcudart as ctypes sees it: the one PyTorch ships, else the system's."""
    candidates = []
    try:
        import nvidia.cuda_runtime  # the pip wheel PyTorch depends on

        base = os.path.dirname(nvidia.cuda_runtime.__file__)
        candidates += glob.glob(os.path.join(base, "lib", "libcudart.so*"))
    except ImportError:
        pass
    try:
        import torch

        candidates += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcudart*.so*"))
    except ImportError:
        pass
    candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    report(event="error", reason="libcudart not found")
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


def grow(mib):
    torch = torch_cuda()
    held = []
    while True:
        held.append(torch.empty(mib * MIB, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        report(event="step", name="grow", tensors=len(held), bytes=len(held) * mib * MIB)
        time.sleep(0.3)
        if len(held) * mib >= 64 * 1024:
            return


def matmul(seconds):
    torch = torch_cuda()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    done, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        done += 10
    elapsed = time.monotonic() - start
    report(event="result", name="matmul", rate=done / elapsed, seconds=elapsed)


def train(count):
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

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    start = time.monotonic()
    for _ in range(count):
        step()
    torch.cuda.synchronize()
    report(event="result", name="train", step_s=(time.monotonic() - start) / count)


def malloc(count):
    torch_cuda().ones(1, device="cuda")
    rt = cudart()
    ptr = ctypes.c_void_p()
    size = ctypes.c_size_t(2 * MIB)
    start = time.monotonic()
    for _ in range(count):
        check(rt, rt.cudaMalloc(ctypes.byref(ptr), size), "cudaMalloc")
        check(rt, rt.cudaFree(ptr), "cudaFree")
    report(event="result", name="malloc", pair_s=(time.monotonic() - start) / count)


def main():
    mode, *args = sys.argv[1:] or ["steps"]
    modes = {
        "steps": lambda: steps(),
        "hold": lambda: hold(int(args[0])),
        "grow": lambda: grow(int(args[0])),
        "matmul": lambda: matmul(float(args[0])),
        "train": lambda: train(int(args[0])),
        "malloc": lambda: malloc(int(args[0])),
    }
    if mode not in modes:
        report(event="error", reason=f"unknown mode {mode}")
        sys.exit(2)
    modes[mode]()


if __name__ == "__main__":
    main()
