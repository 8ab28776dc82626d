"""Integration: the real mooncake_master process driven through MasterClient over TCP."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import httpx
import msgspec
import pytest

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store import protocol as P
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.protocol import ReplicateConfigMsg as Cfg
from mooncake_core.utils.net import free_port

pytestmark = pytest.mark.integration
MiB = 1 << 20


def code_of(fn, *a, **kw) -> int:
    with pytest.raises(MooncakeError) as ei:
        fn(*a, **kw)
    return ei.value.code


def test_round_trips_and_error_codes(start_master) -> None:
    m = start_master("--default_kv_lease_ttl=60000")
    with MasterClient(m.addr) as c:
        info = c.ping()
        assert info.version == P.PROTOCOL_VERSION and info.is_leader
        reply = c.mount_segment("cA", "127.0.0.1:7001", 0x7F0000000000, 4 * MiB)
        assert reply.client_ttl_s == 10.0
        c.mount_segment("cB", "127.0.0.1:7002", 0x7E0000000000, 4 * MiB)
        reps = c.put_start("cA", "k1", 12345, Cfg(replica_num=2))
        assert {r.segment_name for r in reps} == {"127.0.0.1:7001", "127.0.0.1:7002"}
        assert not c.exist_key("k1")
        c.put_end("cA", "k1")
        assert c.exist_key("k1") and c.get_size("k1") == 12345
        got = c.get_replica_list("k1")
        assert got.lease_ttl_ms == 60000
        assert sorted(r.addr for r in got.replicas) == sorted(r.addr for r in reps)
        assert code_of(c.put_start, "cA", "k1", 10) == ErrorCode.OBJECT_ALREADY_EXISTS
        assert code_of(c.get_replica_list, "missing") == ErrorCode.OBJECT_NOT_FOUND
        assert code_of(c.get_size, "missing") == ErrorCode.OBJECT_NOT_FOUND
        assert code_of(c.remove, "k1") == ErrorCode.OBJECT_HAS_LEASE
        c.remove("k1", force=True)
        assert not c.exist_key("k1")
        # batches with per-key results
        res = c.batch_put_start("cA", ["a", "b", "c"], [100, 200, 300], Cfg(preferred_segments=["127.0.0.1:7002"]))
        assert all(isinstance(r, list) and r[0].segment_name == "127.0.0.1:7002" for r in res)
        ends = c.batch_put_end("cA", ["a", "b", "zz"])  # versions (increasing), or a code
        assert 0 < ends[0] < ends[1] and ends[2] == ErrorCode.OBJECT_NOT_FOUND
        assert c.batch_put_revoke("cA", ["c"]) == [0]
        assert c.batch_exist_key(["a", "b", "c"]) == [True, True, False]
        gets = c.batch_get_replica_list(["a", "c"])
        assert isinstance(gets[0], P.GetReply) and gets[1] == ErrorCode.OBJECT_NOT_FOUND
        assert c.batch_remove(["a", "c"], force=True) == [0, ErrorCode.OBJECT_NOT_FOUND]
        # upsert replaces
        c.put_start("cA", "u", 100)
        c.put_end("cA", "u")
        c.upsert_start("cA", "u", 500)
        c.put_end("cA", "u")
        assert c.get_size("u") == 500
        for k in ("x1", "x2", "y1"):
            c.put_start("cA", k, 64)
            c.put_end("cA", k)
        assert c.remove_by_regex("^x") == 2
        assert code_of(c.remove_by_regex, "([") == ErrorCode.INVALID_PARAMS
        assert c.remove_all() == 3  # 'b', 'u' and 'y1'
        assert code_of(c.put_start, "cA", "huge", 64 * MiB) == ErrorCode.INVALID_PARAMS
        assert code_of(c.unmount_segment, "cB", "127.0.0.1:7001") == ErrorCode.INVALID_PARAMS
        hb = c.heartbeat("cA")
        assert hb.need_remount is False and hb.offload_tasks == []


def test_store_full_then_eviction_frees_space(start_master) -> None:
    m = start_master("--default_kv_lease_ttl=3000", "--eviction_ratio=0.25", "--eviction_high_watermark_ratio=1.0")
    with MasterClient(m.addr) as c:
        c.mount_segment("cA", "seg", 0x1000, 1 * MiB)
        for i in range(4):
            c.put_start("cA", f"k{i}", 256 * 1024)
            c.put_end("cA", f"k{i}")
        for i in range(4):
            c.get_replica_list(f"k{i}")  # all leased
        assert code_of(c.put_start, "cA", "new", 256 * 1024) == ErrorCode.NO_AVAILABLE_HANDLE
        time.sleep(3.2)  # leases over: eviction can free the LRU object
        c.put_start("cA", "new", 256 * 1024)
        c.put_end("cA", "new")
        assert c.exist_key("new") and not c.exist_key("k0")


def test_malformed_messages_get_error_replies_and_master_survives(start_master) -> None:
    import socket
    import struct

    m = start_master()

    def exchange(sock: socket.socket, raw: bytes) -> tuple[int, str]:
        sock.sendall(raw)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "master closed the connection without replying"
            buf += chunk
        _, _, status, payload = P.parse_reply(buf[4:])
        return status, bytes(payload).decode() if status else ""

    def frame(body: bytes, version: int = P.PROTOCOL_VERSION) -> bytes:
        return P.request_frame(42, body, version)

    cases = [
        (struct.pack(">I", 5) + b"short", "shorter than"),
        (frame(b"\xc1\xff\x00garbage"), "malformed request"),
        (frame(msgspec.msgpack.encode(["exist_key", 12345])), "Expected `str`"),
        (frame(msgspec.msgpack.encode(["no_such_method", "k"])), "malformed request"),
        (frame(msgspec.msgpack.encode(["put_start", "c", "k", "not-a-size", [1, False, None, False, []]])),
         "Expected `int`"),
        (frame(msgspec.msgpack.encode(["ping"]), version=99), "protocol version mismatch"),
        (frame(b""), "malformed request"),
    ]
    with socket.create_connection(("127.0.0.1", m.port), timeout=5) as sock:
        for raw, fragment in cases:
            status, msg = exchange(sock, raw)
            assert status == ErrorCode.INVALID_PARAMS
            assert fragment in msg, msg
        # two requests in one write, split oddly: both answered in order
        raw = frame(msgspec.msgpack.encode(["exist_key", "a"])) + frame(msgspec.msgpack.encode(["exist_key", "b"]))
        sock.sendall(raw[:7])
        time.sleep(0.05)
        status, _ = exchange(sock, raw[7:])
        assert status == 0
    with socket.create_connection(("127.0.0.1", m.port), timeout=5) as sock:
        status, msg = exchange(sock, struct.pack(">I", 0xFFFFFFF0) + b"x" * 100)
        assert status == ErrorCode.INVALID_PARAMS and "exceeds" in msg
        assert sock.recv(100) == b"", "an oversize frame closes that connection"
    assert m.proc.poll() is None
    with MasterClient(m.addr) as c:
        assert c.ping().is_leader
        assert c.exist_key("anything") is False


def test_wrong_argument_types_from_client_are_clear_errors(start_master) -> None:
    m = start_master()
    with MasterClient(m.addr) as c:
        with pytest.raises(MooncakeError) as ei:
            c.put_start("c", 123, 10)  # type: ignore[arg-type]
        assert ei.value.code == ErrorCode.INVALID_PARAMS and "str" in ei.value.message
        assert code_of(c.put_start, "c", "k", -1) == ErrorCode.INVALID_PARAMS


def test_unreachable_master_is_900_within_timeout() -> None:
    port = free_port()
    with MasterClient(f"127.0.0.1:{port}", timeout=1.0) as c:
        t0 = time.monotonic()
        assert code_of(c.exist_key, "k") == ErrorCode.RPC_FAIL
        assert time.monotonic() - t0 < 3.0
    with pytest.raises(ValueError):
        MasterClient("no-port-here")


def test_metrics_endpoint(start_master) -> None:
    m = start_master()
    with MasterClient(m.addr) as c:
        c.mount_segment("cA", "segM", 0x1000, 1 * MiB)
        c.put_start("cA", "k", 1000)
        c.put_end("cA", "k")
        c.get_replica_list("k")
        code_of(c.get_replica_list, "nope")
        code_of(c.remove, "k")
    text = httpx.get(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=5).text
    assert "mooncake_master_keys 1.0" in text
    assert 'mooncake_master_segment_capacity_bytes{segment="segM"} 1.048576e+06' in text
    assert 'mooncake_master_segment_used_bytes{segment="segM"} 1024.0' in text
    assert "mooncake_master_hits_total 1.0" in text
    assert "mooncake_master_misses_total 1.0" in text
    assert "mooncake_master_lease_refusals_total 1.0" in text
    assert "mooncake_master_active_clients 1.0" in text
    assert 'mooncake_master_rpc_seconds_count{method="put_start"} 1.0' in text
    assert "mooncake_master_evictions_total" in text


def test_client_ttl_expiry_drops_objects(start_master) -> None:
    m = start_master("--client_ttl=1")
    with MasterClient(m.addr) as c:
        c.mount_segment("dead", "segD", 0x1000, 1 * MiB)
        c.mount_segment("alive", "segL", 0x9000000, 1 * MiB)
        c.put_start("dead", "kd", 100, Cfg(preferred_segments=["segD"]))
        c.put_end("dead", "kd")
        c.put_start("alive", "kl", 100, Cfg(preferred_segments=["segL"]))
        c.put_end("alive", "kl")
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and c.exist_key("kd"):
            c.heartbeat("alive")
            time.sleep(0.2)
        assert not c.exist_key("kd"), "objects of a silent client must be dropped after client_ttl"
        assert code_of(c.get_replica_list, "kd") == ErrorCode.OBJECT_NOT_FOUND
        assert c.exist_key("kl")
        assert c.heartbeat("dead").need_remount is True
    assert "client expired" in m.log()


def test_master_restart_client_remounts_and_reports(start_master) -> None:
    m = start_master()
    with MasterClient(m.addr, timeout=8.0) as c:
        c.mount_segment("cA", "segR", 0x1000, 1 * MiB)
        reps = {}
        for i in range(20):
            reps[f"k{i}"] = c.put_start("cA", f"k{i}", 1000 + i)[0]
            c.put_end("cA", f"k{i}")
        m.kill()
        m2 = start_master(port=m.port, wait=False)
        # the same stub reconnects by itself
        hb = c.heartbeat("cA")
        assert hb.need_remount is True
        assert not c.exist_key("k0")
        c.mount_segment("cA", "segR", 0x1000, 1 * MiB)
        assert c.report_objects("cA", list(reps.items())) == 20
        for k, r in reps.items():
            assert c.get_replica_list(k).replicas[0].addr == r.addr
        new = c.put_start("cA", "fresh", 5000)[0]
        assert all(new.addr + new.size <= r.addr or new.addr >= r.addr + r.size for r in reps.values())
        assert m2.proc.poll() is None


def test_many_threads_share_one_client(start_master) -> None:
    m = start_master()
    errors: list[BaseException] = []
    with MasterClient(m.addr) as c:
        c.mount_segment("cA", "segT", 0x1000, 64 * MiB)

        def worker(t: int) -> None:
            rng = random.Random(t)
            try:
                for i in range(60):
                    key = f"t{t}-{i}"
                    size = rng.randint(1, 100_000)
                    r = c.put_start("cA", key, size)
                    c.put_end("cA", key)
                    assert c.get_size(key) == size
                    assert c.get_replica_list(key).replicas[0].addr == r[0].addr
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors[:3]
        # no two objects overlap
        spans = sorted((g.replicas[0].addr, g.replicas[0].addr + g.replicas[0].size)
                       for g in c.batch_get_replica_list([f"t{t}-{i}" for t in range(8) for i in range(60)]))
        for (s1, e1), (s2, _) in zip(spans, spans[1:]):
            assert e1 <= s2


def test_port_in_use_is_a_clear_startup_error(start_master) -> None:
    m = start_master()
    p = subprocess.run([sys.executable, "-m", "mooncake_core.store.master_main", f"--port={m.port}",
                        "--rpc_address=127.0.0.1", "--metrics_port=0"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert f"cannot bind 127.0.0.1:{m.port}" in p.stderr
    # said once, as the command's error, without the errno prefix
    assert p.stderr.count("cannot bind") == 1 and p.stderr.startswith("mooncake_master: error: "), p.stderr
    assert "[Errno" not in p.stderr


def test_bad_flag_exits_2() -> None:
    p = subprocess.run([sys.executable, "-m", "mooncake_core.store.master_main", "--eviction_ratio=2"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "between 0.0 and 1.0" in p.stderr


def test_embedded_http_metadata_server(start_master, tmp_path) -> None:
    hport = free_port()
    flags = ("--enable_http_metadata_server", f"--http_metadata_server_port={hport}",
             "--http_metadata_server_host=127.0.0.1",
             f"--http_metadata_server_persist_path={tmp_path / 'meta.json'}")
    m = start_master(*flags)
    url = f"http://127.0.0.1:{hport}/metadata"
    r = httpx.put(url, params={"key": "mooncake/test"}, content=b'{"v": 1}', timeout=5)
    assert r.status_code < 300
    assert httpx.get(url, params={"key": "mooncake/test"}, timeout=5).content == b'{"v": 1}'
    # a restarted master keeps the segment descriptors (persisted)
    m.kill(signal.SIGTERM)
    assert m.proc.returncode == 0
    start_master(*flags)
    assert httpx.get(url, params={"key": "mooncake/test"}, timeout=5).content == b'{"v": 1}'


def test_offload_tier_through_rpc(start_master, tmp_path) -> None:
    root = tmp_path / "ssd"
    m = start_master("--enable_offload", f"--root_fs_dir={root}", "--eviction_high_watermark_ratio=0.9",
                     "--eviction_ratio=0.3", "--default_kv_lease_ttl=200")
    with MasterClient(m.addr) as c:
        reply = c.mount_segment("cA", "segO", 0x1000, 1 * MiB)
        # the tier lives under the cluster id, as the original master's fsdir (root_fs_dir/cluster_id)
        assert reply.enable_offload and reply.root_fs_dir == str(root / "mooncake_cluster")
        tier = root / "mooncake_cluster"
        for i in range(4):
            c.put_start("cA", f"k{i}", 256 * 1024 - 64)
            c.put_end("cA", f"k{i}")
        # above the watermark: the master asks the owner to offload the LRU objects
        tasks = []
        deadline = time.monotonic() + 5
        while not tasks and time.monotonic() < deadline:
            tasks = c.heartbeat("cA").offload_tasks
            time.sleep(0.1)
        assert [t.key for t in tasks] == ["k0", "k1"]
        for t in tasks:
            rel = f"ab/{t.key}.bin"
            (tier / "ab").mkdir(parents=True, exist_ok=True)
            (tier / rel).write_bytes(b"x" * t.replica.size)  # the owner writes its bytes
            c.offload_done("cA", t.key, rel, t.replica.size)
        got = c.get_replica_list("k0").replicas
        assert [(r.kind, r.path) for r in got] == [("disk", "ab/k0.bin")]
        time.sleep(0.3)  # lease over
        c.remove("k0")
        deadline = time.monotonic() + 5
        while (tier / "ab/k0.bin").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (tier / "ab/k0.bin").exists(), "the master deletes SSD-tier files of removed objects"
        assert (tier / "ab/k1.bin").exists()
        assert code_of(c.offload_done, "cA", "k2", "../../etc/passwd", 10) == ErrorCode.INVALID_PARAMS


PEER_SCRIPT = r"""
import json, random, sys
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.protocol import ReplicateConfigMsg
addr, name, base = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(name)
out = {}
with MasterClient(addr) as c:
    c.mount_segment(name, name, base, 8 << 20)
    print("mounted", flush=True)
    sys.stdin.readline()  # wait until every peer mounted
    for i in range(150):
        key = f"{name}/{i}"
        reps = c.put_start(name, key, rng.randint(1, 20000), ReplicateConfigMsg(replica_num=2))
        c.put_end(name, key)
        out[key] = [(r.segment_name, r.addr, r.size) for r in reps]
        c.heartbeat(name)
print(json.dumps(out), flush=True)
"""


def test_three_client_processes_allocate_disjoint_ranges(start_master, python_exe) -> None:
    import json

    m = start_master()
    peers = []
    for i in range(3):
        p = subprocess.Popen([python_exe, "-c", PEER_SCRIPT, m.addr, f"peer{i}", str((i + 1) << 32)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        peers.append(p)
    for p in peers:
        assert p.stdout.readline().strip() == "mounted"
    for p in peers:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = {}
    for p in peers:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        results.update(json.loads(out.strip().splitlines()[-1]))
    assert len(results) == 450
    spans: dict[str, list] = {}
    for key, reps in results.items():
        assert len({r[0] for r in reps}) == 2, f"{key}: replicas must be on distinct segments"
        for seg, addr, size in reps:
            spans.setdefault(seg, []).append((addr, addr + size, key))
    for seg, sp in spans.items():
        sp.sort()
        for (s1, e1, k1), (s2, _, k2) in zip(sp, sp[1:]):
            assert e1 <= s2, f"{k1} and {k2} overlap in {seg}"
    with MasterClient(m.addr) as c:
        got = c.batch_get_replica_list(list(results))
        for key, g in zip(results, got):
            assert sorted((r.segment_name, r.addr, r.size) for r in g.replicas) == sorted(map(tuple, results[key]))


def test_recovery_hold_after_restart(start_master) -> None:
    m = start_master("--recovery_hold_ms=1500")
    with MasterClient(m.addr) as c:
        epoch = c.ping().epoch
        assert epoch > 0
        reply = c.mount_segment("cA", "segH", 0x1000, 1 * MiB, prev_epoch=epoch + 1)  # from an "old" master
        assert reply.epoch == epoch
        t0 = time.monotonic()
        with pytest.raises(MooncakeError) as ei:
            c.put_start("cA", "k", 100)
        assert ei.value.code == ErrorCode.NO_AVAILABLE_HANDLE and "recovering" in ei.value.message
        while time.monotonic() - t0 < 10:
            try:
                c.put_start("cA", "k", 100)
                break
            except MooncakeError:
                time.sleep(0.1)
        assert time.monotonic() - t0 >= 1.4
        c.put_end("cA", "k")
        assert c.exist_key("k")
        got = c.get_replica_list("k")
        assert got.epoch == epoch and got.confirm_after_ms == 1200
        # a fresh segment is not held
        c.mount_segment("cB", "segFresh", 0x900000, 1 * MiB)
        assert c.put_start("cB", "k2", 100, Cfg(preferred_segments=["segFresh"]))[0].segment_name == "segFresh"


@pytest.mark.parametrize("poll_us", [0, 100, 5000])
def test_busy_poll_settings_give_the_same_answers(start_master, monkeypatch, poll_us: int) -> None:
    """Busy polling (server --rpc_busy_poll_us, client MC_MASTER_BUSY_POLL_US) only changes
    how replies are waited for: small and multi-read (large) replies are identical."""
    monkeypatch.setenv("MC_MASTER_BUSY_POLL_US", str(poll_us))
    m = start_master(f"--rpc_busy_poll_us={poll_us}")
    with MasterClient(m.addr) as c:
        c.mount_segment("cA", "segP", 0x1000, 64 * MiB)
        keys = [f"poll-{poll_us}-{i:05d}-" + "x" * 100 for i in range(3000)]
        res = c.batch_put_start("cA", keys, [1000] * len(keys))
        assert all(isinstance(r, list) for r in res)
        assert all(v > 0 for v in c.batch_put_end("cA", keys))
        got = c.batch_get_replica_list(keys)  # a reply of several hundred KiB
        assert [g.replicas[0].addr for g in got] == [r[0].addr for r in res]
        for k in keys[:500]:
            assert c.exist_key(k) and not c.exist_key(k + "-missing")


def test_idle_master_does_not_spin(start_master) -> None:
    """Busy polling follows a burst of requests only: an idle master sleeps."""
    def cpu_s(pid: int) -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    m = start_master("--rpc_busy_poll_us=100000")
    with MasterClient(m.addr) as c:
        for _ in range(200):
            c.exist_key("k")
        time.sleep(0.3)  # the 100 ms spin window after the burst ends
        t0 = cpu_s(m.proc.pid)
        time.sleep(2.0)
        used = cpu_s(m.proc.pid) - t0
    assert used < 0.25, f"idle master used {used:.2f} s of CPU in 2 s"


def test_bad_busy_poll_env_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("MC_MASTER_BUSY_POLL_US", "fast")
    with pytest.raises(ValueError, match="MC_MASTER_BUSY_POLL_US"):
        MasterClient("127.0.0.1:1")


def test_batches_do_not_back_the_poller_off(start_master) -> None:
    """A batch's answer takes longer than a poll (each key is handled): polling for it and
    counting the misses backed the connection off for the single calls that followed (issue 18).
    Batches over ``POLL_MAX_REQUEST`` bytes are neither polled for nor counted."""
    from mooncake_core.utils.busypoll import POLL_MAX_REQUEST

    m = start_master()
    with MasterClient(m.addr) as c:
        c.mount_segment("cA", "127.0.0.1:7001", 0x7F0000000000, 64 * MiB)
        assert c.exist_key("warm-up") is False
        conn = c._pool[-1][1]
        conn.poller.record(True)
        for b in range(30):
            keys = [f"batch-{b}-{i:04d}" for i in range(200)]
            assert len(P.request_encoder.encode(P.BatchPutStartReq("cA", keys, b"", Cfg()))) > POLL_MAX_REQUEST
            c.batch_put_start("cA", keys, [1024] * len(keys))
            c.batch_put_end("cA", keys)
        assert c._pool[-1][1] is conn and conn.poller._misses == 0 and conn.poller._skip == 0
