"""A scheduling client the product did not write (issue 40): Python grpcio, with grpcio-status for
the error details, on stubs generated from proto/ at test time by grpcio-tools. It holds the
controller to docs/api.md. `controller/tests/api_python_client.rs` runs it; each command exits
non-zero, saying why, when the controller breaks the contract.

    api_client.py STUBS create ADDR REQUEST_ID     prints the id of the session made
    api_client.py STUBS retry ADDR REQUEST_ID ID   the retry answers ID; one session listed
    api_client.py STUBS errors CAP_ADDR RATE_ADDR  reason codes and retry hints from details
    api_client.py STUBS watch ADDR                 list-then-watch on an empty store, then
                                                   the waiting sessions' conditions
    api_client.py STUBS pages ADDR N               pages of ListNodes hold node-00000.. once
"""

import os
import sys
import threading
import time


def stubs(out, proto_root):
    """Generates the gpuwarden.v1 stubs into `out` and imports them."""
    os.makedirs(out, exist_ok=True)
    from grpc_tools import protoc  # noqa: PLC0415 (only after the venv is known good)

    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "gpuwarden/v1/gpuwarden.proto",
        ]
    )
    if rc != 0:
        sys.exit(f"protoc failed ({rc})")
    sys.path.insert(0, out)


def fail(message):
    sys.exit(f"contract broken: {message}")


def main():
    out, proto_root, command, *args = sys.argv[1:]
    stubs(out, proto_root)
    import grpc
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from gpuwarden.v1 import gpuwarden_pb2 as pb
    from gpuwarden.v1 import gpuwarden_pb2_grpc as rpc

    def client(addr):
        return rpc.SchedulerServiceStub(grpc.insecure_channel(addr))

    def request(name, request_id=""):
        return pb.CreateSessionRequest(
            requested=pb.ResourceSlot(values={"cpu": "1"}),
            owner="alice",
            name=name,
            request_id=request_id,
        )

    def details(err):
        """(code name, ErrorInfo reason, RetryInfo delay in s or None, NotLeader or None)."""
        status = rpc_status.from_call(err)
        if status is None:
            return (err.code().name, None, None, None)
        reason, delay, leader = None, None, None
        for any_ in status.details:
            if any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_.Unpack(info)
                if info.domain != "gpuwarden.io":
                    fail(f"ErrorInfo domain {info.domain!r}")
                reason = info.reason
            elif any_.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                any_.Unpack(retry)
                delay = retry.retry_delay.ToTimedelta().total_seconds()
            elif any_.Is(pb.NotLeader.DESCRIPTOR):
                leader = pb.NotLeader()
                any_.Unpack(leader)
        return (err.code().name, reason, delay, leader)

    def refused(call, *a, **kw):
        try:
            call(*a, **kw)
        except grpc.RpcError as err:
            return details(err)
        fail(f"{call} was not refused")

    if command == "create":
        addr, request_id = args
        print(client(addr).CreateSession(request("across", request_id), timeout=30).id)
    elif command == "retry":
        addr, request_id, first = args
        stub = client(addr)
        again = stub.CreateSession(request("across", request_id), timeout=30)
        if again.id != first:
            fail(f"the retry made {again.id}, not the first session {first}")
        ids = [s.id for s in stub.ListSessions(pb.ListSessionsRequest(), timeout=30).sessions]
        if ids != [first]:
            fail(f"sessions after the retry: {ids}")
        print("one session")
    elif command == "errors":
        cap_addr, rate_addr = args
        stub = client(cap_addr)
        seen = {}
        bad = pb.ResourceSlot(values={"fpga": "1"})
        seen["unknown slot"] = refused(
            stub.CreateSession, pb.CreateSessionRequest(requested=bad, owner="alice")
        )
        seen["unknown node"] = refused(
            stub.CreateSession,
            pb.CreateSessionRequest(
                requested=pb.ResourceSlot(values={"cpu": "1"}), owner="alice", node_id="nowhere"
            ),
        )
        seen["oversized"] = refused(stub.CreateSession, request("x", "r" * 10_000))
        stub.CreateSession(request("first"))
        seen["cap"] = refused(stub.CreateSession, request("second"))
        seen["not found"] = refused(stub.GetSession, pb.GetSessionRequest(id="none"))
        rate = client(rate_addr)
        for _ in range(20):
            try:
                rate.ListNodes(pb.ListNodesRequest())
            except grpc.RpcError as err:
                seen["rate"] = details(err)
                break
        want = {
            "unknown slot": ("FAILED_PRECONDITION", "UNKNOWN_SLOT", None),
            "unknown node": ("FAILED_PRECONDITION", "UNKNOWN_NODE", None),
            "oversized": ("INVALID_ARGUMENT", "OVERSIZED", None),
            "cap": ("RESOURCE_EXHAUSTED", "CAP", None),
            "not found": ("NOT_FOUND", "SESSION_NOT_FOUND", None),
            "rate": ("RESOURCE_EXHAUSTED", "RATE", 0.25),
        }
        for what, expected in want.items():
            got = seen.get(what, ("not refused",))[:3]
            if got != expected:
                fail(f"{what}: {got}, expected {expected}")
            print(f"{what}: {got[0]} {got[1]} retry={got[2]}")
    elif command == "not-leader":
        addr, leader = args
        code, reason, _, named = refused(client(addr).CreateSession, request("x"))
        if (code, reason) != ("UNAVAILABLE", "NOT_LEADER") or named is None:
            fail(f"a standby answered {code} {reason} {named}")
        if named.leader != leader:
            fail(f"the standby named {named.leader!r}, not {leader!r}")
        print(f"standby names {named.leader}")
    elif command == "watch":
        (addr,) = args
        stub = client(addr)
        listed = stub.ListSessions(pb.ListSessionsRequest())
        if listed.sessions:
            fail("the store is not empty")
        made = {stub.CreateSession(request(f"between-{i}")).id for i in range(3)}
        # As an older client would: since_revision alone, no `start`.
        stream = stub.WatchSessions(pb.WatchSessionsRequest(since_revision=listed.revision))
        seen = set()
        timer = threading.Timer(10, stream.cancel)
        timer.start()
        try:
            for s in stream:
                seen.add(s.id)
                if made <= seen:
                    break
        except grpc.RpcError as err:
            fail(f"listed at {listed.revision}; saw {len(seen & made)} of 3 then {err.code()}")
        finally:
            timer.cancel()
        if not made <= seen:
            fail(f"listed at {listed.revision}; saw {len(seen & made)} of 3")
        print(f"listed at revision {listed.revision}; the watch from it saw all 3 creates")
        # Room for one: one placed, two waiting for capacity, as their conditions say.
        deadline = time.monotonic() + 10
        while True:
            reasons = []
            for id_ in sorted(made):
                s = stub.GetSession(pb.GetSessionRequest(id=id_))
                cond = [c for c in s.conditions if c.type == "Scheduled"]
                if cond:
                    reasons.append((pb.ConditionStatus.Name(cond[0].status), cond[0].reason))
            want = [
                ("CONDITION_STATUS_FALSE", "WaitingForCapacity"),
                ("CONDITION_STATUS_FALSE", "WaitingForCapacity"),
                ("CONDITION_STATUS_TRUE", "Placed"),
            ]
            if sorted(reasons) == want:
                print("conditions: 1 Placed, 2 WaitingForCapacity")
                break
            if time.monotonic() > deadline:
                fail(f"Scheduled conditions {reasons}")
            time.sleep(0.1)
    elif command == "pages":
        addr, n = args
        stub = client(addr)
        count, token, pages = {}, "", 0
        while True:
            page = stub.ListNodes(pb.ListNodesRequest(page_size=1000, page_token=token))
            pages += 1
            for node in page.nodes:
                count[node.info.node_id] = count.get(node.info.node_id, 0) + 1
            token = page.next_page_token
            if not token:
                break
        want = {f"node-{i:05}" for i in range(int(n))}
        twice = [k for k, v in count.items() if v != 1]
        missing = want - count.keys()
        if twice or missing:
            fail(f"{len(twice)} nodes on two pages, {len(missing)} on none")
        print(f"{len(count)} nodes in {pages} pages, each once")
    else:
        fail(f"no command {command}")


if __name__ == "__main__":
    main()
