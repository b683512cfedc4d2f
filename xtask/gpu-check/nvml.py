#!/usr/bin/env python3
"""NVML's view for `cargo xtask gpu-check`: one JSON object on stdout, bytes as NVML gives them.

Uses pynvml (the `nvidia-ml-py` package, present beside PyTorch on the GPU images); where it is
missing, the same calls through ctypes on the driver's own libnvidia-ml.so.1. Prints

  {"ok": true, "driver": "580.159", "gpus": [{"index": 0, "name": ..., "uuid": ...,
   "total": bytes, "used": bytes, "sm_clock_mhz": n, "power_mw": n, "throttle_reasons": n,
   "processes": {"<pid>": bytes or null}}]}

or {"ok": false, "error": "..."} (exit 0 either way, so the caller can say why a figure is missing).
A figure NVML can't give is null, never 0.

  nvml.py record SECONDS PATH   the raw streams the compute-share throttle reads, as NVML gives
                                them, one JSON object a line into PATH, until SECONDS pass or it
                                is killed: every device utilization sample and process
                                utilization sample (with NVML's own timestamps), the SM clock
                                every 100 ms and GPM's graphics activity every 200 ms where the
                                GPU has GPM. Each line carries the host's real-time and monotonic
                                clocks at the read (`read_us`, `mono_us`). The file is a fixture
                                for the throttle's GPU model.
  nvml.py summary PATH          what a recording shows: the device sample period (median gap),
                                its jitter (the largest stray of a gap within half a period of
                                it), lost samples (gaps of 1.5 periods or more) and short gaps
                                (under half a period), where process samples fall after the
                                device sample before them, how late samples are read, and
                                whether GPM works.
  nvml.py periods PATH          the gaps between a recording's device samples (GPU 0), µs, one a
                                line, in order: what the throttle's GPU model replays
                                (agent/src/enforcement/throttle/gpu_sim/).
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


def mig(pynvml, h, text):
    """The GPU's MIG mode and instances, read only (nothing here changes them). For each
    instance: its memory as NVML counts it on the MIG handle, and which of the calls the agent
    reads a GPU through answer on that handle ("ok", or the error NVML gave)."""
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(h)
    except Exception:  # no MIG on this GPU or driver
        return None
    instances = []
    if current == 1:
        try:
            count = pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
        except Exception:
            count = 0
        for i in range(count):
            try:
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except Exception:  # an empty slot
                continue
            instances.append(mig_instance(pynvml, m, text))
    return {"current": current, "pending": pending, "instances": instances}


def mig_instance(pynvml, m, text):
    """One MIG device handle: name, UUID, memory, and each signal's answer."""
    def answer(f, *a):
        try:
            f(m, *a)
            return "ok"
        except Exception as e:  # NVMLError_NotSupported and friends
            return type(e).__name__ + (f": {e}" if str(e) else "")

    def maybe(f):
        try:
            return f()
        except Exception:
            return None

    mem = maybe(lambda: pynvml.nvmlDeviceGetMemoryInfo(m))
    signals = {
        # The agent's NVML cross-check of per-instance memory.
        "memory_info": answer(pynvml.nvmlDeviceGetMemoryInfo),
        # Its per-process memory (and its check before a layout change).
        "running_processes": answer(pynvml.nvmlDeviceGetComputeRunningProcesses),
        # Its utilization figure and the compute-share throttle's samples (nvml.h: not on MIG).
        "utilization_rates": answer(pynvml.nvmlDeviceGetUtilizationRates),
        "samples": answer(pynvml.nvmlDeviceGetSamples, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0),
        "process_utilization": answer(pynvml.nvmlDeviceGetProcessUtilization, 0),
    }
    gpm = getattr(pynvml, "nvmlGpmQueryDeviceSupport", None)
    if gpm is not None:
        signals["gpm_support"] = answer(gpm)
    return {
        "name": text(maybe(lambda: pynvml.nvmlDeviceGetName(m))),
        "uuid": text(maybe(lambda: pynvml.nvmlDeviceGetUUID(m))),
        "memory_total": mem.total if mem else None,
        "memory_used": mem.used if mem else None,
        "signals": signals,
    }


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
            "mig": mig(pynvml, h, text),
        })
    pynvml.nvmlShutdown()
    print(json.dumps(out))


def now_us():
    import time
    return time.clock_gettime_ns(time.CLOCK_REALTIME) // 1000, time.monotonic_ns() // 1000


def record(seconds, path):
    """The raw streams into `path` (see the module's doc)."""
    import time
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as e:  # no pynvml, no driver
        with open(path, "w") as out:
            out.write(json.dumps({"kind": "error", "error": f"NVML: {e}"}) + "\n")
        return 0
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    last_dev = [0] * len(handles)
    last_proc = [0] * len(handles)
    gpm = [None] * len(handles)
    for i, h in enumerate(handles):
        try:
            support = pynvml.nvmlGpmQueryDeviceSupport(h)
            if support.isSupportedDevice:
                sample = pynvml.nvmlGpmSampleAlloc()
                pynvml.nvmlGpmSampleGet(h, sample)
                gpm[i] = sample
        except Exception:
            gpm[i] = None
    start = time.monotonic()
    next_clock, next_gpm = start, start + 0.2
    with open(path, "w") as out:
        def line(**fields):
            read, mono = now_us()
            fields.update(read_us=read, mono_us=mono)
            out.write(json.dumps(fields) + "\n")

        line(kind="start", gpus=len(handles), gpm=[g is not None for g in gpm])
        while time.monotonic() - start < seconds:
            now = time.monotonic()
            for i, h in enumerate(handles):
                try:
                    _, samples = pynvml.nvmlDeviceGetSamples(
                        h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_dev[i])
                    for smp in samples:
                        last_dev[i] = max(last_dev[i], smp.timeStamp)
                        line(kind="device", gpu=i, ts_us=smp.timeStamp,
                             util=smp.sampleValue.uiVal)
                except pynvml.NVMLError as e:
                    if "Not Found" not in str(e):
                        line(kind="device_error", gpu=i, error=str(e))
                try:
                    for p in pynvml.nvmlDeviceGetProcessUtilization(h, last_proc[i]):
                        last_proc[i] = max(last_proc[i], p.timeStamp)
                        line(kind="process", gpu=i, ts_us=p.timeStamp, pid=p.pid, sm=p.smUtil)
                except pynvml.NVMLError as e:
                    if "Not Found" not in str(e):
                        line(kind="process_error", gpu=i, error=str(e))
                if now >= next_clock:
                    try:
                        line(kind="clock", gpu=i,
                             sm_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
                    except pynvml.NVMLError:
                        pass
                if now >= next_gpm and gpm[i] is not None:
                    try:
                        sample = pynvml.nvmlGpmSampleAlloc()
                        pynvml.nvmlGpmSampleGet(h, sample)
                        get = pynvml.c_nvmlGpmMetricsGet_t()
                        get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
                        get.numMetrics = 1
                        get.sample1 = gpm[i]
                        get.sample2 = sample
                        get.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
                        pynvml.nvmlGpmMetricsGet(get)
                        line(kind="gpm", gpu=i, graphics_util=get.metrics[0].value)
                        pynvml.nvmlGpmSampleFree(gpm[i])
                        gpm[i] = sample
                    except Exception as e:
                        line(kind="gpm_error", gpu=i, error=str(e))
                        gpm[i] = None
            if now >= next_clock:
                next_clock = now + 0.1
            if now >= next_gpm:
                next_gpm = now + 0.2
            out.flush()
            time.sleep(0.02)
    pynvml.nvmlShutdown()
    return 0


def records(path):
    """A recording's records, one dict each; a line that is not JSON (a cut write) is skipped."""
    with open(path) as f:
        for text in f:
            try:
                yield json.loads(text)
            except ValueError:
                continue


def summary(path):
    """What a recording shows (see the module's doc), as one JSON object."""
    device, process, late, gpm, errors = [], [], [], [], []
    for r in records(path):
        kind = r.get("kind")
        if kind == "device" and r.get("gpu") == 0:
            device.append(r["ts_us"])
            late.append(r["read_us"] - r["ts_us"])
        elif kind == "process" and r.get("gpu") == 0:
            process.append(r["ts_us"])
        elif kind == "gpm":
            gpm.append(r["graphics_util"])
        elif kind and kind.endswith("error"):
            errors.append(r.get("error"))
    device.sort()
    gaps = sorted(b - a for a, b in zip(device, device[1:]) if b > a)
    median = lambda v: v[len(v) // 2] if v else None  # noqa: E731
    period = median(gaps)
    # A gap of 1.5 periods or more is a lost sample, one under half a period a sample out of
    # step (the H200 once published two 354 µs apart): neither is jitter, each is counted.
    usual = [g for g in gaps if 0.5 * period <= g < 1.5 * period] if period else []
    jitter = max((abs(g - period) for g in usual), default=None) if period else None
    lost = sum(1 for g in gaps if g >= 1.5 * period) if period else None
    short = sum(1 for g in gaps if g < 0.5 * period) if period else None
    offsets = []
    for ts in process:
        before = [d for d in device if d <= ts]
        if before:
            offsets.append(ts - before[-1])
    offsets.sort()
    print(json.dumps({
        "device_samples": len(device), "process_samples": len(process),
        "period_us": period, "jitter_us": jitter, "lost_samples": lost,
        "short_gaps": short,
        "process_offset_us": {"min": offsets[0], "median": median(offsets), "max": offsets[-1]}
        if offsets else None,
        "read_lag_us": median(sorted(late)), "gpm_samples": len(gpm),
        "errors": sorted(set(e for e in errors if e))[:5],
    }))
    return 0


def periods(path):
    """The gaps between a recording's device samples of GPU 0, µs, one a line (module doc)."""
    device = sorted(set(r["ts_us"] for r in records(path)
                        if r.get("kind") == "device" and r.get("gpu") == 0))
    for a, b in zip(device, device[1:]):
        print(b - a)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "record":
        sys.exit(record(float(sys.argv[2]), sys.argv[3]))
    if len(sys.argv) > 1 and sys.argv[1] == "summary":
        sys.exit(summary(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "periods":
        sys.exit(periods(sys.argv[2]))
    sys.exit(main())
