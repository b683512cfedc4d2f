#!/usr/bin/env python3
"""NVML's view for `cargo xtask gpu-check`: one JSON object on stdout, bytes as NVML gives them.

Uses pynvml (the `nvidia-ml-py` package, present beside PyTorch on the GPU images). Prints

  {"ok": true, "driver": "580.159", "gpus": [{"index": 0, "name": ..., "uuid": ...,
   "total": bytes, "used": bytes, "sm_clock_mhz": n, "power_mw": n, "throttle_reasons": n,
   "processes": {"<pid>": bytes or null}}]}

or {"ok": false, "error": "..."} (exit 0 either way, so the caller can say why a figure is missing).
A figure NVML can't give is null, never 0.
"""

import json
import sys


def main():
    try:
        import pynvml
    except ImportError as e:
        print(json.dumps({"ok": False, "error": f"pynvml not importable ({e}); install nvidia-ml-py"}))
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
