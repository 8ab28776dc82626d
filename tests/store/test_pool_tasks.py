"""Copy/move tasks and a segment drain over real sockets: a ``mooncake_master`` process, two
clients with segments (the drained one and the target) and a pool-only client that keeps
putting and reading while the drain runs. Every byte read is compared with what was written;
after the scale-in (the drained client closes) every object is still there."""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.request

import pytest

from mooncake_core.store import ReplicateConfig, TaskStatus

KiB = 1 << 10
MiB = 1 << 20


def _cfg(*segments: str, replicas: int = 1) -> ReplicateConfig:
    cfg = ReplicateConfig()
    cfg.replica_num = replicas
    cfg.preferred_segments = list(segments)
    return cfg


def _http(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def _until_done(c, tid, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        resp, rc = c.query_task(tid)
        assert rc == 0
        if resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
            return resp
        assert time.monotonic() < deadline, f"task {tid} still {resp}"
        time.sleep(0.1)


def _where(c, key: str) -> list[str]:
    return sorted(r.segment_name for r in c.get_replica_desc(key))


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_copy_move_tasks_and_a_drain_under_load(master_factory, client_factory) -> None:
    m = master_factory(default_kv_lease_ttl=500)
    a = client_factory(m, segment=16 * MiB)
    b = client_factory(m, segment=16 * MiB)
    c = client_factory(m)
    sa, sb = a.get_hostname(), b.get_hostname()
    base = f"http://127.0.0.1:{m.metrics_port}"

    # ---- copy, move, and their bad input
    data = {f"t{i}": os.urandom(100 * KiB) for i in range(3)}
    for k, v in data.items():
        assert c.put(k, v, _cfg(sa)) == 0
    tid, rc = c.create_copy_task("t0", [sb])
    assert rc == 0 and _until_done(c, tid).status == TaskStatus.SUCCESS
    assert _where(c, "t0") == sorted([sa, sb])
    moves = [c.create_move_task("t1", sa, sb) for _ in range(2)]  # concurrent moves of one key
    done = [_until_done(c, t) for t, rc in moves if rc == 0]
    assert len(done) == 2 and sorted(d.status for d in done) == [TaskStatus.FAILED, TaskStatus.SUCCESS]
    assert "no replica on" in next(d.message for d in done if d.status == TaskStatus.FAILED)
    assert _where(c, "t1") == [sb] and c.get("t1") == data["t1"]
    assert c.create_copy_task("nosuch", [sb]) == ((0, 0), -704)
    assert c.create_move_task("t2", sa, "nosuch:1") == ((0, 0), -600)
    assert c.create_move_task("t2", sa, sa) == ((0, 0), -600)
    assert c.query_task((7, 7)) == (None, -1400)
    with pytest.raises(TypeError, match="task_id"):
        c.query_task("not an id")

    # ---- the original's admin routes
    q = _http(f"{base}/query_key?key=t0")
    assert q["success"] and sorted(d["transport_endpoint_"] for d in q["data"]) == sorted([sa, sb])
    assert _http(f"{base}/query_key?key=nosuch")["error_code"] == -704
    with urllib.request.urlopen(f"{base}/get_all_segments", timeout=5) as r:
        assert sorted(r.read().decode().split()) == sorted([sa, sb])
    assert _http(f"{base}/api/v1/segments/status?segment={sa}")["status_name"] == "OK"
    assert _http(f"{base}/api/v1/drain_jobs", {"segments": ["nosuch:1"]})["success"] is False
    bq = _http(f"{base}/batch_query_keys?keys=t0,nosuch")
    assert bq["success"] and bq["data"]["t0"]["ok"] and len(bq["data"]["t0"]["values"]) == 2
    assert bq["data"]["nosuch"] == {"ok": False, "error": "OBJECT_NOT_FOUND"}
    with urllib.request.urlopen(f"{base}/query_segment?segment={sb}", timeout=5) as r:
        name, used, cap = r.read().decode().splitlines()
    assert name == sb and int(used.split(":")[1]) >= 2 * 100 * KiB and int(cap.split(":")[1]) == 16 * MiB
    detail = _http(f"{base}/get_segments_detail")
    assert detail["total_segments"] == 2 and {s["segment_name"] for s in detail["segments"]} == {sa, sb}
    assert all(s["status"] == "OK" and s["allocator_capacity_bytes"] == 16 * MiB for s in detail["segments"])

    # ---- drain a's segment while a pool-only client keeps putting and reading
    objs = dict(data)
    for i in range(40):
        k, v = f"d{i}", os.urandom(random.choice([4 * KiB, 64 * KiB, 200 * KiB]))
        assert c.put(k, v, _cfg(sa, replicas=2 if i % 5 == 0 else 1)) == 0
        objs[k] = v
    stop = threading.Event()
    wrong: list[str] = []
    missing: list[str] = []
    lock = threading.Lock()
    load = b"" + os.urandom(32 * KiB)

    def traffic() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            k = f"live{n}"
            if n <= 200 and c.put(k, load[: 1 + n % len(load)], _cfg(sa)) == 0:  # about 3 MiB in all
                with lock:
                    objs[k] = load[: 1 + n % len(load)]
            with lock:
                key, want = random.choice(list(objs.items()))
            got = c.get(key)
            if got == b"":
                missing.append(key)
            elif got != want:
                wrong.append(key)

    t = threading.Thread(target=traffic)
    t.start()
    try:
        job = _http(f"{base}/api/v1/drain_jobs", {"segments": [sa], "target_segments": [sb], "max_concurrency": 4})
        assert job["success"], job
        deadline = time.monotonic() + 60
        while True:
            q = _http(f"{base}/api/v1/drain_jobs/query?job_id={job['job_id']}")
            if q["status_name"] != "RUNNING":
                break
            assert time.monotonic() < deadline, q
            time.sleep(0.2)
        assert q["status_name"] == "SUCCEEDED" and q["failed_units"] == 0 and q["active_units"] == 0, q
        assert _http(f"{base}/api/v1/segments/status?segment={sa}")["status_name"] == "DRAINED"
        time.sleep(0.5)  # traffic goes on against the drained pool
    finally:
        stop.set()
        t.join(30)
    assert not wrong and not missing, (wrong[:5], missing[:5])
    a.close()  # scale-in: nothing of a's segment is lost
    time.sleep(0.5)
    for k, v in objs.items():
        assert _where(c, k) == [sb], k
        assert c.get(k) == v, k
    time.sleep(0.6)  # the reads' leases end
    assert _http(f"{base}/api/v1/remove_all?force=true", {}) == {"success": True, "removed_count": len(objs)}
    assert c.get("t0") == b""


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_admin_routes_that_change_state_need_the_token(master_factory, monkeypatch) -> None:
    monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", "s3cret-admin")  # the master (a child) and our pings
    m = master_factory()
    base = f"http://127.0.0.1:{m.metrics_port}"
    for path in ("/api/v1/remove_all", "/api/v1/drain_jobs"):
        req = urllib.request.Request(base + path, data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 401 and b"Authorization: Bearer" in e.value.read()
    req = urllib.request.Request(base + "/api/v1/remove_all", data=b"{}", method="POST",
                                 headers={"Authorization": "Bearer s3cret-admin"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert json.loads(r.read()) == {"success": True, "removed_count": 0}
    with urllib.request.urlopen(base + "/get_all_segments", timeout=5) as r:  # reads stay open
        assert r.status == 200


def _extra_used(base: str) -> dict[str, float]:
    """Bytes used per segment mounted with mount_segment ("name#id"), from the master's /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("mooncake_master_segment_used_bytes{") and "#" in line:
            out[line.split('segment="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_mounted_segments_leave_gracefully_under_load(master_factory, client_factory, tmp_path) -> None:
    m = master_factory(default_kv_lease_ttl=500)
    a = client_factory(m, segment=8 * MiB)
    b = client_factory(m, segment=32 * MiB)
    c = client_factory(m)
    base = f"http://127.0.0.1:{m.metrics_port}"
    backing = tmp_path / "pool.bin"
    backing.write_bytes(b"\0" * (12 * MiB))

    # bad input: clear codes, nothing mounted
    assert a.mount_segment(str(tmp_path / "nosuch"), MiB)["ret"] == -1
    assert a.mount_segment(str(backing), 16 * MiB)["ret"] == -1  # past the file's end
    assert a.mount_segment(str(backing), MiB, 123)["ret"] == -1  # offset not page-aligned
    assert a.allocate_and_mount_segment(0)["ret"] == -1
    got = a.allocate_and_mount_segment(5 * MiB)
    assert got["ret"] == 0 and got["allocated_size"] == 8 * MiB and len(got["segment_ids"]) == 1
    anon = got["segment_ids"][0]
    filed = a.mount_segment(str(backing), 8 * MiB, 4 * MiB)
    assert filed["ret"] == 0
    [fid] = filed["segment_ids"]
    assert a.unmount_segment([anon]) == -1 and a.unmount_and_free_segment([fid]) == -1  # wrong kind
    assert a.unmount_segment(["nosuch"]) == -1
    with urllib.request.urlopen(f"{base}/get_all_segments", timeout=5) as r:
        sa = a.get_hostname()
        assert sorted(r.read().decode().split()) == sorted([sa, b.get_hostname(), f"{sa}#{anon}", f"{sa}#{fid}"])
    assert a.unmount_local_disk_segment() == 0

    objs = {}
    for i in range(60):
        k, v = f"m{i}", os.urandom(random.choice([8 * KiB, 100 * KiB]))
        assert c.put(k, v) == 0
        objs[k] = v
    own_keys = [f"own{i}" for i in range(40)]  # a's batches land in its own mounted memory too
    own_vals = [os.urandom(16 * KiB) for _ in own_keys]
    assert a.put_batch(own_keys, own_vals) == 0
    assert a.get_batch(own_keys) == own_vals
    objs.update(zip(own_keys, own_vals))
    extra = _extra_used(base)
    assert len(extra) == 2 and all(u > 0 for u in extra.values()), extra  # random placement used them

    stop = threading.Event()
    wrong: list[str] = []
    missing: list[str] = []
    keys = list(objs)

    def reads() -> None:
        while not stop.is_set():
            k = random.choice(keys)
            got = c.get(k)
            if got == b"":
                missing.append(k)
            elif got != objs[k]:
                wrong.append(k)

    t = threading.Thread(target=reads)
    t.start()
    try:
        assert a.unmount_and_free_segment([anon], 20) == 0
        assert a.unmount_segment([fid], 20) == 0
        deadline = time.monotonic() + 30
        while _extra_used(base):
            assert time.monotonic() < deadline, _extra_used(base)
            time.sleep(0.2)
        time.sleep(1.0)  # the memory goes after the leases on it ended: reads go on meanwhile
    finally:
        stop.set()
        t.join(30)
    assert not wrong and not missing, (wrong[:5], missing[:5])
    for k, v in objs.items():
        assert c.get(k) == v, k
