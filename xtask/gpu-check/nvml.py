#!/usr/bin/env python3
"""NVML's view for `cargo xtask gpu-check`: one JSON object on stdout, bytes as NVML gives them.

Uses pynvml (the `nvidia-ml-py` package, present beside PyTorch on the GPU images); where it is
missing, the same calls through ctypes on the driver's own libnvidia-ml.so.1. Prints

  {"ok": true, "driver": "580.159", "gpus": [{"index": 0, "name": ..., "uuid": ...,
   "total": bytes, "used": bytes, "sm_clock_mhz": n, "power_mw": n, "throttle_reasons": n,
   "processes": {"<pid>": bytes or null}}]}

or {"ok": false, "error": "..."} (exit 0 either way, so the caller can say why a figure is missing).
A figure NVML can't give is null, never 0.
"""

import json
import sys


NOT_AVAILABLE = (1 << 64) - 1


def with_ctypes():
    """The document through libnvidia-ml.so.1 directly (pynvml's calls, fewer of them)."""
    import ctypes

    lib = ctypes.CDLL("libnvidia-ml.so.1")

    def call(name, *args):
        ret = getattr(lib, name)(*args)
        if ret != 0:
            raise OSError(f"{name} returned NVML error {ret}")

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    # nvmlProcessInfo_t as _v2/_v3 have it: pid, usedGpuMemory, gpuInstanceId, computeInstanceId.
    class Process(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    def maybe(f):
        try:
            return f()
        except (OSError, AttributeError):
            return None

    def ok(f):
        return maybe(lambda: (f(), True)[1]) is True

    call("nvmlInit_v2")
    text = ctypes.create_string_buffer(96)
    driver = maybe(lambda: (call("nvmlSystemGetDriverVersion", text, 96), text.value.decode())[1])
    count = ctypes.c_uint()
    call("nvmlDeviceGetCount_v2", ctypes.byref(count))
    gpus = []
    for i in range(count.value):
        h = ctypes.c_void_p()
        call("nvmlDeviceGetHandleByIndex_v2", i, ctypes.byref(h))

        def string(name):
            buf = ctypes.create_string_buffer(96)
            call(name, h, buf, 96)
            return buf.value.decode()

        def uint(name, *args, kind=ctypes.c_uint):
            v = kind()
            call(name, h, *args, ctypes.byref(v))
            return v.value

        mem = Memory()
        mem = mem if ok(lambda: call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem))) else None
        procs = {}
        n = ctypes.c_uint(0)
        infos = (Process * 256)()
        n.value = 256
        listed = ok(lambda: call("nvmlDeviceGetComputeRunningProcesses_v3", h, ctypes.byref(n), infos))
        for p in infos[: n.value] if listed else []:
            used = None if p.usedGpuMemory == NOT_AVAILABLE else p.usedGpuMemory
            key = str(p.pid)
            procs[key] = used if key not in procs or procs[key] is None else procs[key] + (used or 0)
        gpus.append({
            "index": i,
            "name": maybe(lambda: string("nvmlDeviceGetName")),
            "uuid": maybe(lambda: string("nvmlDeviceGetUUID")),
            "total": mem.total if mem else None,
            "used": mem.used if mem else None,
            "sm_clock_mhz": maybe(lambda: uint("nvmlDeviceGetClockInfo", 1)),
            "power_mw": maybe(lambda: uint("nvmlDeviceGetPowerUsage")),
            "throttle_reasons": maybe(lambda: uint("nvmlDeviceGetCurrentClocksThrottleReasons",
                                                   kind=ctypes.c_ulonglong)),
            "processes": procs,
        })
    lib.nvmlShutdown()
    return {"ok": True, "driver": driver, "gpus": gpus, "via": "ctypes"}


def main():
    try:
        import pynvml
    except ImportError as e:
        try:
            print(json.dumps(with_ctypes()))
        except Exception as e2:  # no library, no driver
            print(json.dumps({"ok": False, "error": f"pynvml not importable ({e}; install "
                              f"nvidia-ml-py), and libnvidia-ml.so.1 through ctypes: {e2}"}))
        return
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError and friends
        print(json.dumps({"ok": False, "error": f"nvmlInit: {e}"}))
        return

    def maybe(f, *a):
        try:
            return f(*a)
        except Exception:
            return None

    def text(v):
        return v.decode() if isinstance(v, bytes) else v

    out = {"ok": True, "driver": text(maybe(pynvml.nvmlSystemGetDriverVersion)), "gpus": []}
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = maybe(pynvml.nvmlDeviceGetMemoryInfo, h)
        procs = {}
        for p in maybe(pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []:
            used = p.usedGpuMemory
            # NVML's "not available" is a huge sentinel; pynvml maps some versions to None.
            if used is not None and used >= (1 << 63):
                used = None
            key = str(p.pid)
            procs[key] = used if key not in procs or procs[key] is None else procs[key] + (used or 0)
        out["gpus"].append({
            "index": i,
            "name": text(maybe(pynvml.nvmlDeviceGetName, h)),
            "uuid": text(maybe(pynvml.nvmlDeviceGetUUID, h)),
            "total": mem.total if mem else None,
            "used": mem.used if mem else None,
            "sm_clock_mhz": maybe(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            "power_mw": maybe(pynvml.nvmlDeviceGetPowerUsage, h),
            "throttle_reasons": maybe(reasons, h) if reasons else None,
            "processes": procs,
        })
    pynvml.nvmlShutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
