#!/usr/bin/env python3
"""Stand-ins for `cargo xtask gpu-check --dry-run`: the GPU run rehearsed without a GPU.

One script plays every program the check starts, chosen by its first argument:

  gpuwarden-controller run ...            waits until killed
  gpuwarden-agent run --socket S ...      makes S, records what each process already held (the
                                          agent counts only what comes after it), waits until
                                          SIGTERM, removes S
  gpuwarden-agent snapshot --json --socket S   the snapshot document, from the state folder
  gpuwarden-agent probe-hooks --json      one refused hook
  gpuwarden-agent suspend|resume-suspended --session ID --socket S   a request the stand-in
                                          agent acts on a moment later, as the real one does:
                                          the session's processes stopped (SIGSTOP) with their
                                          bytes gone from NVML and the snapshot, or back; its
                                          events in the snapshot and its log
  gpuwarden-agent checkpoint --pid P --action A [--gpu-pair OLD=NEW]   the helper's JSON line:
                                          get-state, driver-version (13000), and lock,
                                          checkpoint, restore, unlock moving the process's
                                          bytes out of NVML and the snapshot and back
  gpuwarden ... run -r R... [--memory-policy P] -- CMD...   runs CMD as its child with the
                                          session's limit and policy in its environment
  nvml                                    nvml.py's document, from the state folder
  workload MODE ARGS                      workload.py's records for MODE, with made-up figures

With $GPUCHECK_DRY_FAKE_DIR set (a fake NVIDIA driver mounted there, gpu-check's `--binaries`
mode), the workloads allocate for real through $GPUCHECK_DRY_GPU_CLIENT (the tests' `gpu-client`)
on that driver, so the real agent counts, limits and reports them; a record's pid is then the
gpu-client's, the process holding the GPU files. Otherwise the figures are only bookkept.

The state folder is $GPUCHECK_DRY_STATE: one `proc-PID.json` per workload process (what it
holds), the agent's baseline, and the report events. $GPUCHECK_DRY_FAULTS injects faults, a
comma-separated list of `hang:KEY` (sleep forever instead of printing that record) and
`exit:KEY` (exit 1 instead), KEY being `MODE.STEP` or `MODE-POLICY.STEP` (`steps.tensors`,
`grow-report.grow`, `suspend.checked`, `fill.fill`); `refuse:suspend` and `refuse:resume` make the stand-in
agent's driver refuse that direction with CUDA_ERROR_NOT_SUPPORTED (801), and the agent end the
workload the kill way, as the real one does; `refuse:pairs` makes the helper's driver refuse a
restore with GPU pairs with CUDA_ERROR_INVALID_VALUE (1).
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

MIB = 1 << 20
GIB = 1 << 30
TOTAL = 80 * GIB
UUID = "GPU-d7d7d7d7-0000-4000-8000-000000000038"
STATE = os.environ.get("GPUCHECK_DRY_STATE", "/tmp/gpucheck-dry")


def write_json(path, value):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def read_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def procs():
    out = []
    for name in sorted(os.listdir(STATE)):
        if name.startswith("proc-") and name.endswith(".json"):
            p = read_json(os.path.join(STATE, name), None)
            if p and alive(p["pid"]):
                out.append(p)
    return out


def opt(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def wait_forever():
    while True:
        time.sleep(3600)


def controller(_args):
    print("dry controller: up", flush=True)
    wait_forever()


def agent(args):
    cmd = args[0] if args else ""
    if cmd == "run":
        sock = opt(args, "--socket")
        write_json(os.path.join(STATE, "agent-baseline.json"),
                   {str(p["pid"]): p["bytes"] for p in procs()})
        with open(sock, "w") as f:
            f.write("dry agent\n")

        def stop(*_):
            try:
                os.unlink(sock)
            finally:
                os._exit(0)

        signal.signal(signal.SIGTERM, stop)
        print(f"dry agent: up on {sock}", flush=True)
        while True:
            serve_requests()
            time.sleep(0.05)
    if cmd == "snapshot":
        if not os.path.exists(opt(args, "--socket", "")):
            print("dry agent: no agent on that socket", file=sys.stderr)
            return 1
        baseline = read_json(os.path.join(STATE, "agent-baseline.json"), {})
        events = read_json(os.path.join(STATE, "events.json"), [])
        containers = []
        ops = read_json(os.path.join(STATE, "ops.json"), 0)
        for p in procs():
            counted = max(0, p["bytes"] - baseline.get(str(p["pid"]), 0))
            container = {
                "cgroup_path": f"/dry/{p['pid']}", "pids": [p["pid"]],
                "devices": [{"device": "nvidia0", "ioctls": {}, "memory_bytes": counted}],
                "managed_memory_bytes": p.get("managed", 0),
                "events": [e for e in events if e["pid"] == p["pid"]
                           or ("session" in p and e.get("session") == p["session"])],
            }
            if "session" in p:
                container["session_id"] = p["session"]
            if "share" in p:
                ran_ms = (time.monotonic() - p["started"]) * 1000
                container["enforcement"] = {
                    "gpu_time_ms": int(p["share"] * ran_ms),
                    "throttled_ms": int((1 - p["share"]) * ran_ms)}
            containers.append(container)
        print(json.dumps({
            "node": "gpu-check", "tier": "syscall_tracepoint",
            "memory_tier": "tracepoint_signal", "memory_tier_reason": "dry run",
            "containers": containers,
            "stats": {"gpu_ioctls": ops, "events_received": ops},
            "gpus": [{"device": "nvidia0", "utilization": 0.0, "source": "nvml"}],
            "throttle_mode": "slots",
            "throttle_signals": [{"device": "nvidia0", "period_us": 166667, "jitter_us": 0,
                                  "samples": 0, "late_samples": 0, "gaps": 0,
                                  "unattributed_ms": 0, "read_mean_us": 900,
                                  "read_max_us": 2400}],
        }))
        return 0
    if cmd in ("suspend", "resume-suspended"):
        if not os.path.exists(opt(args, "--socket", "")):
            print("dry agent: no agent on that socket", file=sys.stderr)
            return 1
        session = opt(args, "--session")
        write_json(os.path.join(STATE, f"request-{time.monotonic_ns()}.json"),
                   {"verb": cmd, "session": session})
        print(f"{'suspending' if cmd == 'suspend' else 'resuming'} session {session}: see its "
              "events")
        return 0
    if cmd == "checkpoint":
        return checkpoint(args)
    if cmd == "mig-table":
        print(json.dumps({"ok": False, "error": "dry run: no NVML"}))
        return 0
    if cmd == "probe-hooks":
        print(json.dumps([{"hook": "driver_kprobe", "target": "nvidia_unlocked_ioctl",
                           "loaded": False, "detail": "dry run: no driver"}]))
        return 0
    print(f"dry agent: unknown command {cmd}", file=sys.stderr)
    return 2


# The checkpoint helper's calls and the state each moves a process from and to, as the driver's
# CUprocessState does; a call in another state is CUDA_ERROR_ILLEGAL_STATE (401).
MOVES = {"lock": ("running", "locked"), "checkpoint": ("locked", "checkpointed"),
         "restore": ("checkpointed", "locked"), "unlock": ("locked", "running")}


def checkpoint(args):
    """The helper's JSON line for one call. A checkpoint takes the process's bytes out of NVML
    and the snapshot, a restore brings them back; a restore's `--gpu-pair OLD=NEW` must name the
    stand-in GPU's UUID on both sides, or the driver refuses with CUDA_ERROR_INVALID_VALUE (1),
    as it does for every pair with `refuse:pairs`."""
    faults = set(filter(None, os.environ.get("GPUCHECK_DRY_FAULTS", "").split(",")))
    action = opt(args, "--action")

    def refused(function, code):
        print(json.dumps({"result": "refused", "function": function, "code": code},
                         separators=(",", ":")))
        return 3

    if action == "driver-version":
        print(json.dumps({"result": "ok", "state": None, "driver_version": 13000},
                         separators=(",", ":")))
        return 0
    pid = int(opt(args, "--pid"))
    path = os.path.join(STATE, f"proc-{pid}.json")
    p = read_json(path, None)
    if p is None:
        print(json.dumps({"result": "error", "reason": f"dry run: no CUDA process {pid}"}))
        return 1
    state = p.get("cp") or ("checkpointed" if p.get("suspended") else "running")
    function = f"cuCheckpointProcess{action.capitalize()}" if action in MOVES else ""
    if action in MOVES:
        want, to = MOVES[action]
        if state != want:
            return refused(function, 401)
        pairs = [args[i + 1] for i, a in enumerate(args) if a == "--gpu-pair"]
        if pairs and ("refuse:pairs" in faults or pairs != [f"{UUID}={UUID}"]):
            return refused(function, 1)
        if action == "checkpoint":
            p.update(held=p["bytes"], bytes=0, suspended=True)
        if action == "restore":
            p.update(bytes=p.pop("held"), suspended=False)
        state = p["cp"] = to
        write_json(path, p)
    print(json.dumps({"result": "ok", "state": state}, separators=(",", ":")))
    return 0


def cli(args):
    if "run" not in args or "--" not in args:
        print("dry gpuwarden: only `run ... -- CMD`", file=sys.stderr)
        return 2
    split = args.index("--")
    head, command = args[:split], args[split + 1:]
    env = dict(os.environ)
    for i, a in enumerate(head):
        if a in ("-r", "--resource"):
            key, _, value = head[i + 1].partition("=")
            if key == "cuda.mem":
                env["GPUCHECK_DRY_LIMIT"] = str(int(value.rstrip("g")) * GIB)
            if key == "cuda.shares":
                env["GPUCHECK_DRY_SHARE"] = value
    env["GPUCHECK_DRY_POLICY"] = opt(head, "--memory-policy", "kill")
    env["GPUCHECK_DRY_SESSION"] = f"dry-session-{os.getpid()}"
    child = subprocess.Popen(command, env=env)
    code = child.wait()
    return 128 - code if code < 0 else code


def nvml(args):
    if args and args[0] == "record":
        # A made-up stream in the real recorder's shape: a sample every 1/6 s.
        seconds, path = float(args[1]), args[2]
        with open(path, "w") as out:
            start = int(time.time() * 1e6)
            for i in range(int(seconds * 6) + 1):
                ts = start + i * 166_667
                out.write(json.dumps({"kind": "device", "gpu": 0, "ts_us": ts, "util": 50,
                                      "read_us": ts + 20_000, "mono_us": ts}) + "\n")
                out.write(json.dumps({"kind": "process", "gpu": 0, "ts_us": ts + 5_000,
                                      "pid": 1, "sm": 50, "read_us": ts + 20_000,
                                      "mono_us": ts}) + "\n")
        return 0
    if args and args[0] == "summary":
        return subprocess.call([sys.executable, os.path.join(os.path.dirname(__file__),
                                                             "nvml.py"), "summary", args[1]])
    gpu = {"index": 0, "name": "Dry Run GPU", "uuid": UUID, "total": TOTAL,
           "used": 0, "sm_clock_mhz": 1980, "power_mw": 300000, "throttle_reasons": 0,
           "processes": {}, "mig": {"current": 0, "pending": 0, "instances": []}}
    for p in procs():
        if p.get("suspended"):
            # A checkpointed process holds no context: NVML lists it no more.
            continue
        gpu["processes"][str(p["pid"])] = p["bytes"]
        gpu["used"] += p["bytes"]
    print(json.dumps({"ok": True, "driver": "dry", "gpus": [gpu]}))
    return 0


class Died(Exception):
    """The process holding the GPU files died (the agent killed it)."""


class Refused(Exception):
    """The driver refused a call (an out-of-memory answer from a refusing tier)."""


class FakeGpu:
    """Allocations on the fake driver through a `gpu-client` child."""

    def __init__(self, client_bin, folder):
        self.p = subprocess.Popen([client_bin, "--dir", folder], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.pid = int(self.p.stdout.readline().strip().split("=")[1])
        self.client = self.cmd("client")["client"]
        self.device = self.cmd(f"device {self.client} 0")["handle"]
        self.uvm = False

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        reply = self.p.stdout.readline()
        if not reply:
            raise Died(self.p.wait())
        if not reply.startswith("ok"):
            raise Refused(reply.strip())
        return dict(w.split("=", 1) for w in reply.split()[1:] if "=" in w)

    def alloc(self, size):
        r = self.cmd(f"alloc {self.client} {self.device} {size}")
        return r["handle"], int(r["size"])

    def free(self, handle):
        self.cmd(f"free {self.client} {self.device} {handle}")

    def managed(self, size):
        if not self.uvm:
            self.cmd("uvm init")
            self.uvm = True
        return self.cmd(f"uvm mmap {size}")["addr"]

    def unmanaged(self, addr, size):
        self.cmd(f"uvm munmap {addr} {size}")

    def ioctl(self):
        self.cmd(f"control {self.client} {self.client} 0x0")


class Workload:
    def __init__(self, mode):
        self.mode = mode
        self.policy = os.environ.get("GPUCHECK_DRY_POLICY")
        self.limit = int(os.environ.get("GPUCHECK_DRY_LIMIT", "0"))
        self.faults = set(filter(None, os.environ.get("GPUCHECK_DRY_FAULTS", "").split(",")))
        fake = os.environ.get("GPUCHECK_DRY_FAKE_DIR")
        self.gpu = FakeGpu(os.environ["GPUCHECK_DRY_GPU_CLIENT"], fake) if fake else None
        self.pid = self.gpu.pid if self.gpu else os.getpid()
        self.state = {"pid": self.pid, "bytes": 0, "managed": 0}
        if os.environ.get("GPUCHECK_DRY_SESSION"):
            self.state["session"] = os.environ["GPUCHECK_DRY_SESSION"]
        self.handles = []
        self.save()

    def save(self):
        write_json(os.path.join(STATE, f"proc-{self.pid}.json"), self.state)

    def alloc(self, size):
        """Allocates `size` bytes (on the fake driver when there is one); the bytes held."""
        if self.gpu:
            try:
                handle, size = self.gpu.alloc(size)
            except Died:
                # The agent killed the process holding the GPU: the workload dies with it.
                os.kill(os.getpid(), signal.SIGKILL)
            self.handles.append((handle, size))
        else:
            self.handles.append((None, size))
        self.state["bytes"] += size
        self.save()

    def free_all(self):
        for handle, size in self.handles:
            if self.gpu:
                self.gpu.free(handle)
            self.state["bytes"] -= size
        self.handles = []
        self.save()

    def managed(self, size):
        self.addr = self.gpu.managed(size) if self.gpu else None
        self.state["managed"] += size
        self.save()

    def unmanaged(self, size):
        if self.gpu:
            self.gpu.unmanaged(self.addr, size)
        self.state["managed"] -= size
        self.save()

    def fault(self, step):
        keys = {f"{self.mode}.{step}", f"{self.mode}-{self.policy}.{step}"}
        if {f"hang:{k}" for k in keys} & self.faults:
            wait_forever()
        if {f"exit:{k}" for k in keys} & self.faults:
            sys.exit(1)

    def report(self, event, name, **fields):
        self.fault(name)
        fields.update(event=event, name=name, pid=self.pid)
        print("GPUCHECK " + json.dumps(fields, sort_keys=True), flush=True)

    def step(self, name, **fields):
        self.report("step", name, **fields)
        return sys.stdin.readline() != ""


def log_event(session, action, reason, **fields):
    """An event of the stand-in agent: into the snapshot's history and, as the real agent
    logs each, onto its log (its stdout)."""
    events = read_json(os.path.join(STATE, "events.json"), [])
    events.append(dict(action=action, pid=0, session=session, reason=reason,
                       at_ms=int(time.time() * 1000), **fields))
    write_json(os.path.join(STATE, "events.json"), events)
    print(f" INFO gpuwarden_agent::enforcement::enforcer::events: {reason} "
          f"session=\"{session}\" action=\"{action}\" pid=0", flush=True)


def serve_requests():
    """Acts on the suspend and resume requests waiting in the state folder, oldest first."""
    faults = set(filter(None, os.environ.get("GPUCHECK_DRY_FAULTS", "").split(",")))
    for name in sorted(os.listdir(STATE)):
        if not (name.startswith("request-") and name.endswith(".json")):
            continue
        path = os.path.join(STATE, name)
        req = read_json(path, None)
        os.unlink(path)
        if req is None:
            continue
        session = req["session"]
        held = [p for p in procs() if p.get("session") == session]
        pids = [p["pid"] for p in held]
        start = time.monotonic()
        if req["verb"] == "suspend":
            log_event(session, "suspend", f"suspending (suspended through the agent's socket): "
                      f"{len(pids)} of {len(pids)} processes hold a GPU context")
            time.sleep(0.2)  # the copy to host memory
            if "refuse:suspend" in faults or not pids:
                pid = pids[0] if pids else 0
                why = (f"process {pid}: cuCheckpointProcessCheckpoint on process {pid}: "
                       "CUDA_ERROR_NOT_SUPPORTED (801)")
                log_event(session, "suspend_refused",
                          f"not suspended ({why}): preempted the kill way instead")
                log_event(session, "preempt", f"preempted (suspended through the agent's socket; "
                          f"suspend refused: {why}): SIGTERM to {len(pids)} processes")
                for p in pids:
                    os.kill(p, signal.SIGTERM)
                continue
            moved = 0
            for p in held:
                p.update(held=p["bytes"], bytes=0, suspended=True)
                moved += p["held"]
                write_json(os.path.join(STATE, f"proc-{p['pid']}.json"), p)
                os.kill(p["pid"], signal.SIGSTOP)
            took = int((time.monotonic() - start) * 1000)
            log_event(session, "suspended", f"suspended (suspended through the agent's socket): "
                      f"{len(pids)} processes checkpointed to host memory and the cgroup frozen "
                      f"in {took} ms; their GPU memory is released", used_bytes=moved)
        else:
            held = [p for p in held if p.get("suspended")]
            log_event(session, "resuming", f"resuming after 1 s: {len(held)} processes back to "
                      "the GPU")
            time.sleep(0.2)  # the copy back
            if "refuse:resume" in faults or not held:
                why = "cuCheckpointProcessRestore: CUDA_ERROR_NOT_SUPPORTED (801)"
                log_event(session, "resume_failed", f"not resumed ({why}): its GPU state is lost")
                for p in held:
                    os.kill(p["pid"], signal.SIGKILL)
                continue
            for p in held:
                p.update(bytes=p.pop("held"), suspended=False)
                write_json(os.path.join(STATE, f"proc-{p['pid']}.json"), p)
                os.kill(p["pid"], signal.SIGCONT)
            took = int((time.monotonic() - start) * 1000)
            log_event(session, "resumed", f"resumed after 1 s suspended (suspended through the "
                      f"agent's socket): {len(held)} processes restored and unlocked in {took} ms")


def suspend_workload(w, mib):
    """suspend.py's records: a filled tensor, then a check on each line of input."""
    w.alloc(500 * MIB)
    w.alloc(mib * MIB)
    checksum = f"{mib:08x}" * 4
    w.report("step", "filled", bytes=mib * MIB, checksum=checksum, fill_s=0.01, checksum_s=0.01,
             libcuda="dry run: none", torch_reserved=mib * MIB, cuda_free=TOTAL - mib * MIB,
             cuda_total=TOTAL)
    beats, last, gap = 0, time.monotonic(), 0.0
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.05)
        if ready:
            if sys.stdin.readline() == "":
                return
            w.report("step", "checked", bytes=mib * MIB, checksum=checksum, checksum_s=0.01,
                     heartbeats=beats, longest_gap_s=max(gap, time.monotonic() - last),
                     torch_reserved=mib * MIB, cuda_free=TOTAL - mib * MIB, cuda_total=TOTAL)
            continue
        now = time.monotonic()
        gap, last, beats = max(gap, now - last), now, beats + 1
        if beats % 5 == 0:
            print(f"heartbeat {beats}", flush=True)


def spin(seconds):
    """Busy on the CPU for `seconds` of wall time: the fraction it ran (the throttle's freezer
    stands in for the GPU's scheduler here)."""
    start, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - start < seconds:
        pass
    return (time.process_time() - cpu) / (time.monotonic() - start)


def workload(args):
    mode, rest = args[0], args[1:]
    w = Workload(mode)
    if mode == "steps":
        w.alloc(500 * MIB)
        context = list(w.handles)
        w.step("context")
        for _ in range(4):
            w.alloc(256 * MIB)
        w.step("tensors", torch_reserved=GIB)
        w.handles = w.handles[len(context):]
        w.free_all()
        w.handles = context
        w.step("empty_cache", torch_reserved=0)
        w.managed(GIB)
        w.step("managed", bytes=GIB)
        w.unmanaged(GIB)
        w.step("managed_freed")
    elif mode == "hold":
        w.alloc(500 * MIB)
        w.alloc(int(rest[0]) * MIB)
        w.step("hold", bytes=int(rest[0]) * MIB)
    elif mode == "fill":
        # A context, then the tensor, written and read back.
        w.alloc(500 * MIB)
        w.alloc(int(rest[0]) * MIB)
        w.step("fill", bytes=int(rest[0]) * MIB, verified=True, fill_s=0.01,
               torch_reserved=int(rest[0]) * MIB, cuda_free=TOTAL - w.state["bytes"])
    elif mode == "grow":
        w.alloc(500 * MIB)
        size, tensors = int(rest[0]) * MIB, 0
        while tensors < 128:
            if w.limit and w.state["bytes"] + size > w.limit:
                if w.policy == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if w.policy == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                if w.policy == "report":
                    events = read_json(os.path.join(STATE, "events.json"), [])
                    events.append({"action": "report", "pid": w.pid})
                    write_json(os.path.join(STATE, "events.json"), events)
            try:
                w.alloc(size)
            except Refused as e:
                w.step("oom", tensors=tensors, bytes=tensors * size, error=str(e))
                break
            tensors += 1
            if not w.step("grow", tensors=tensors, bytes=tensors * size):
                break
    elif mode == "matmul":
        seconds = float(rest[0])
        if not w.gpu:
            # What the stand-in agent reports of it: GPU time at its share from now on.
            w.state.update(share=float(os.environ.get("GPUCHECK_DRY_SHARE", "1")),
                           started=time.monotonic())
            w.save()
        w.report("step", "started")
        if w.gpu:
            busy = spin(seconds)
        else:
            busy = w.state["share"]
            time.sleep(seconds)
        w.report("result", "matmul", rate=100.0 * busy, seconds=seconds, gpu_s=seconds * busy,
                 busy=busy, batch_busy=busy)
    elif mode == "cost":
        steps, pairs = int(rest[0]), int(rest[1])
        if w.gpu:
            start = time.monotonic()
            for _ in range(steps):
                w.gpu.ioctl()
            step_s = (time.monotonic() - start) / steps
            start = time.monotonic()
            for _ in range(pairs):
                handle, _ = w.gpu.alloc(2 * MIB)
                w.gpu.free(handle)
            pair_s = (time.monotonic() - start) / pairs
        else:
            # The agent's counters are kept across processes, as the real agent's are.
            total = os.path.join(STATE, "ops.json")
            write_json(total, read_json(total, 0) + 2 * pairs)
            step_s, pair_s = 0.001, 0.00005
        w.report("result", "cost", step_s=step_s, pair_s=pair_s, steps=steps, pairs=pairs)
    elif mode == "suspend":
        suspend_workload(w, int(rest[0]))
    else:
        w.report("error", f"unknown mode {mode}")
        return 2
    return 0


def main():
    os.makedirs(STATE, exist_ok=True)
    tool, args = sys.argv[1], sys.argv[2:]
    tools = {"gpuwarden-controller": controller, "gpuwarden-agent": agent, "gpuwarden": cli,
             "nvml": nvml, "workload": workload}
    return tools[tool](args)


if __name__ == "__main__":
    sys.exit(main())
