"""Store client semantics against a real ``mooncake_master`` process and real client
processes: two workers with segments plus the test process as a client without one.
Payloads are random (seeded), verified byte for byte via sha256."""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest

from mooncake_core.store import MooncakeDistributedStore, ReplicateConfig

from mooncake_lab.store_procs import make_client, payload, sha

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MiB = 1 << 20


def test_api_semantics_across_processes(master_factory, worker_factory, client_factory) -> None:
    m = master_factory(default_kv_lease_ttl=1000)
    a = worker_factory(m, 16 * MiB)
    b = worker_factory(m, 16 * MiB)
    c = client_factory(m)  # no segment: uses the pool only
    assert a.hostname != b.hostname and a.hostname.startswith("127.0.0.1:")

    # put from the segment-less client, read everywhere (remote, local memcpy, same host)
    data = payload(1, 300_000)
    cfg = ReplicateConfig()
    cfg.preferred_segment = a.hostname
    assert c.put("k1", data, cfg) == 0
    assert c.get("k1") == data
    assert a.cmd(op="get", key="k1") == {"len": len(data), "sha": sha(data)}
    assert b.cmd(op="get_into", key="k1", cap=len(data) + 10) == {"rc": len(data), "sha": sha(data)}
    assert c.get_size("k1") == len(data)
    assert c.is_exist("k1") == 1

    # objects are immutable: a second put succeeds and keeps the old value; upsert replaces
    assert c.put("k1", payload(2, 1000)) == 0
    assert c.get("k1") == data
    new = payload(3, 5000)
    assert c.upsert("k1", new) == 0
    assert c.get("k1") == new and b.cmd(op="get", key="k1")["sha"] == sha(new)

    # workers put into their own / the other segment
    assert a.cmd(op="put", key="ka", seed=4, size=2 * MiB, preferred=b.hostname)["rc"] == 0
    assert b.cmd(op="put", key="kb", seed=5, size=MiB + 7)["rc"] == 0
    assert c.get("ka") == payload(4, 2 * MiB)
    assert a.cmd(op="get", key="kb")["sha"] == sha(payload(5, MiB + 7))

    # missing keys
    assert c.get("nope") == b""
    assert c.get_size("nope") == -704
    assert c.is_exist("nope") == 0
    assert c.remove("nope") == -704
    buf = np.zeros(16, dtype=np.uint8)
    assert c.get_into("nope", int(buf.ctypes.data), 16) == -704
    assert c.batch_is_exist(["k1", "nope", "ka"]) == [1, 0, 1]

    # batches
    keys = [f"batch-{i}" for i in range(12)]
    vals = [payload(100 + i, 1000 * (i + 1)) for i in range(12)]
    assert c.put_batch(keys, vals) == 0
    assert c.get_batch(keys + ["nope"]) == vals + [b""]
    shas = b.cmd(op="get_batch", keys=keys)["shas"]
    assert shas == [sha(v) for v in vals]

    # zero copy: registered buffers, put_from / get_into / batch variants
    src = np.frombuffer(payload(7, 3 * MiB), dtype=np.uint8).copy()
    dst = np.zeros_like(src)
    assert c.register_buffer(int(src.ctypes.data), src.nbytes) == 0
    assert c.register_buffer(int(dst.ctypes.data), dst.nbytes) == 0
    assert c.put_from("zc", int(src.ctypes.data), src.nbytes) == 0
    assert c.get_into("zc", int(dst.ctypes.data), dst.nbytes) == src.nbytes
    assert np.array_equal(src, dst)
    assert c.get_into("zc", int(dst.ctypes.data), src.nbytes - 1) == -600  # buffer too small
    n, part = 8, src.nbytes // 8
    bkeys = [f"zc-{i}" for i in range(n)]
    sptrs = [int(src.ctypes.data) + i * part for i in range(n)]
    assert c.batch_put_from(bkeys, sptrs, [part] * n) == [0] * n
    dst[:] = 0
    dptrs = [int(dst.ctypes.data) + i * part for i in range(n)]
    assert c.batch_get_into(bkeys + ["nope"], dptrs + [dptrs[0]], [part] * n + [part]) == [part] * n + [-704]
    assert np.array_equal(src[: n * part], dst[: n * part])
    # scatter-gather: an object is the concatenation of several buffers, read back into a
    # different split of buffers
    base = int(src.ctypes.data)
    pieces = [[(base + 5, 1000), (base + 70_000, 33_333), (base + 200_000, 7)],
              [(base + 1_000_000, 65_536), (base + 3, 1)]]
    expect = [b"".join(bytes(src[p - base:p - base + n]) for p, n in ps) for ps in pieces]
    assert c.batch_put_from_multi_buffers(["mb-0", "mb-1"], [[p for p, _ in ps] for ps in pieces],
                                          [[n for _, n in ps] for ps in pieces]) == [0, 0]
    dst[:] = 0
    d = int(dst.ctypes.data)
    got = c.batch_get_into_multi_buffers(["mb-0", "mb-1", "nope"], [[d, d + 500_000], [d + 900_000], [d]],
                                         [[20_000, 20_000], [65_537], [10]])
    assert got == [len(expect[0]), len(expect[1]), -704]
    assert bytes(dst[:20_000]) + bytes(dst[500_000:500_000 + len(expect[0]) - 20_000]) == expect[0]
    assert bytes(dst[900_000:900_000 + 65_537]) == expect[1]
    assert b.cmd(op="get", key="mb-0")["sha"] == sha(expect[0])
    assert c.batch_get_into_multi_buffers(["mb-0"], [[d]], [[100]]) == [-600]  # too small
    assert c.put_parts("parts", b"abc", bytearray(b"def"), memoryview(b"ghi")) == 0
    assert c.get("parts") == b"abcdefghi"
    assert a.cmd(op="put_from", key="zc-a", seed=8, size=MiB)["rc"] == 0
    assert c.get("zc-a") == payload(8, MiB)
    assert c.unregister_buffer(int(src.ctypes.data)) == 0
    assert c.unregister_buffer(int(src.ctypes.data)) == -600
    assert c.unregister_buffer(int(dst.ctypes.data)) == 0

    # prefer_alloc_in_same_node: a client with a segment places the object in its own memory
    local_first = ReplicateConfig()
    local_first.prefer_alloc_in_same_node = True
    assert a.cmd(op="call", method="get_hostname")["result"] == a.hostname
    seg_client = make_client(m, 4 * MiB)
    try:
        assert seg_client.put("local-first", payload(12, 1000), local_first) == 0
        assert [d.segment_name for d in c.get_replica_desc("local-first")] == [seg_client.get_hostname()]
    finally:
        seg_client.close()

    # two replicas on distinct segments
    two = ReplicateConfig()
    two.replica_num = 2
    assert c.put("r2", payload(9, 100_000), two) == 0
    assert c.get("r2") == payload(9, 100_000)
    descs = c.get_replica_desc("r2")
    assert sorted(d.segment_name for d in descs) == sorted([a.hostname, b.hostname])
    assert c.get_replica_desc("nope") == []
    assert [bytes(x) if x is not None else None for x in c.batch_get_buffer(["r2", "nope"])] == \
        [payload(9, 100_000), None]

    # removal
    assert c.get("k1") == new
    assert c.remove("k1") == -706  # just read: a reader holds a lease
    assert c.remove("k1", force=True) == 0 and c.get("k1") == b"" and c.is_exist("k1") == 0
    assert c.batch_remove(["batch-0", "batch-1", "nope"], force=True) == [0, 0, -704]
    time.sleep(1.1)  # leases of the reads above run out (regex/all removal skips leased objects)
    assert c.remove_by_regex("^batch-") == 10
    assert c.get_batch(keys[:3]) == [b"", b"", b""]
    left = c.remove_all()
    assert left >= 5
    assert c.is_exist("ka") == 0 and c.remove_all() == 0

    # tensors
    torch = pytest.importorskip("torch")
    t = torch.randn(64, 33, dtype=torch.float32)
    assert c.put_tensor("t1", t) == 0
    assert torch.equal(c.get_tensor("t1"), t)
    h = torch.randn(8, 8).to(torch.bfloat16)
    assert b.call("get_hostname") == b.hostname
    assert c.put_tensor("t2", h) == 0 and torch.equal(c.get_tensor("t2"), h)
    assert c.get_tensor("missing") is None
    assert c.put_tensor_with_tp("tp", t, tp_size=2, split_dim=1) == -600  # 33 columns: uneven, as the original
    assert c.put_tensor_with_tp("tp", t, tp_size=2, split_dim=0) == 0
    assert torch.equal(c.get_tensor_with_tp("tp", tp_rank=1, tp_size=2, split_dim=0), t.chunk(2, dim=0)[1])


@pytest.mark.integration
def test_remove_all_and_regex_force_through_client(master_factory, worker_factory, client_factory) -> None:
    """force=True reaches the master over RPC: leased objects go only when forced."""
    m = master_factory(default_kv_lease_ttl=60_000)  # leases outlive the test
    worker_factory(m, 8 * MiB)
    c = client_factory(m)
    vals = {k: payload(40 + i, 10_000 + i) for i, k in enumerate(["fa-1", "fa-2", "fb-1", "fb-2"])}
    for k, v in vals.items():
        assert c.put(k, v) == 0
    assert c.get("fa-1") == vals["fa-1"] and c.get("fb-1") == vals["fb-1"]  # now leased
    with pytest.raises(TypeError, match="force must be bool"):
        c.remove_all(force="yes")  # type: ignore[arg-type]
    assert c.remove_by_regex("^fa-") == 1
    assert c.is_exist("fa-1") == 1 and c.is_exist("fa-2") == 0
    assert c.remove_by_regex("^fa-", force=True) == 1
    assert c.is_exist("fa-1") == 0
    assert c.remove_all() == 1
    assert c.is_exist("fb-1") == 1 and c.get("fb-1") == vals["fb-1"]
    assert c.remove_all(force=True) == 1
    assert c.is_exist("fb-1") == 0 and c.get("fb-1") == b""


def test_leased_keys_skipped_by_remove_all_survive_a_master_restart(master_factory, client_factory) -> None:
    """remove_all / remove_by_regex without force leave leased objects in place; their owner
    must keep re-reporting them, so they are still there after the master restarts."""
    m = master_factory(default_kv_lease_ttl=60_000, client_ttl=30)
    owner = client_factory(m, 8 * MiB)  # the objects live in this client's own segment
    vals = {k: payload(60 + i, 20_000 + i) for i, k in enumerate(["ra-1", "ra-2", "rb-1", "rb-2"])}
    for k, v in vals.items():
        assert owner.put(k, v) == 0
    assert owner.get("ra-1") == vals["ra-1"] and owner.get("rb-1") == vals["rb-1"]  # leased
    assert owner.remove_by_regex("^ra-") == 1
    assert owner.remove_all() == 1  # rb-2; ra-1 and rb-1 stay (leased)
    m.stop(sig=9)
    m.start()
    deadline = time.monotonic() + 15
    while not (owner.is_exist("ra-1") == 1 and owner.is_exist("rb-1") == 1):
        assert time.monotonic() < deadline, f"leased objects lost after the restart\n{m.log_tail()}"
        time.sleep(0.2)
    assert owner.get("ra-1") == vals["ra-1"] and owner.get("rb-1") == vals["rb-1"]
    assert owner.is_exist("ra-2") == 0 and owner.is_exist("rb-2") == 0


def test_value_overwritten_by_another_client_never_comes_back_after_a_restart(master_factory,
                                                                            client_factory) -> None:
    """O writes k into its own segment, X upserts k into X's: O still holds the old bytes
    after a master restart, but it has dropped them from its re-report list; never the old value."""
    m = master_factory(client_ttl=30)
    o = client_factory(m, 8 * MiB)
    x = client_factory(m, 8 * MiB)
    v1, v2 = payload(71, 100_000), payload(72, 100_000)
    c1, c2 = ReplicateConfig(), ReplicateConfig()
    c1.preferred_segment = o.get_hostname()
    c2.preferred_segment = x.get_hostname()
    assert o.put("k", v1, c1) == 0
    assert x.upsert("k", v2, c2) == 0
    assert o.get("k") == v2
    # O hears of the overwrite with its next heartbeat. (Had the master died before that, both
    # would report k and the higher version would win -- test_master_state covers that rule --
    # but O's stale copy could be served until X's report arrived: see docs/store-master.md.)
    time.sleep(2.5)  # a heartbeat (1 s) with margin for a loaded machine
    m.stop(sig=9)
    m.start()
    deadline = time.monotonic() + 15
    while (got := o.get("k")) != v2:
        assert got == b"", "the overwritten value came back"
        assert time.monotonic() < deadline, f"k never came back\n{m.log_tail()}"
        time.sleep(0.1)
    time.sleep(2.5)  # both writers have re-reported by now (heartbeat ~1 s)
    assert o.get("k") == v2 and x.get("k") == v2


def test_value_removed_by_another_client_stays_removed_after_a_restart(master_factory,
                                                                     client_factory) -> None:
    """X removes keys O wrote into O's own segment: O hears of it in its next heartbeat and
    stops re-reporting them, so a master restart does not bring them back."""
    m = master_factory(client_ttl=30)
    o = client_factory(m, 8 * MiB)
    x = client_factory(m, 8 * MiB)
    cfg = ReplicateConfig()
    cfg.preferred_segment = o.get_hostname()
    vals = {k: payload(80 + i, 50_000) for i, k in enumerate(["gone-1", "gone-2", "kept"])}
    for k, v in vals.items():
        assert o.put(k, v, cfg) == 0
    assert x.remove("gone-1") == 0
    assert x.remove_by_regex("^gone-2$") == 1
    time.sleep(2.5)  # O's heartbeats (every second) deliver the removals
    m.stop(sig=9)
    m.start()
    deadline = time.monotonic() + 15
    while o.get("kept") != vals["kept"]:
        assert time.monotonic() < deadline, f"'kept' never came back\n{m.log_tail()}"
        time.sleep(0.1)
    assert o.get("gone-1") == b"" and o.get("gone-2") == b""


def test_bad_input_gives_clear_errors(master_factory, worker_factory, client_factory) -> None:
    m = master_factory()
    worker_factory(m, 4 * MiB)
    c = client_factory(m)
    # oversize value: larger than any mounted segment
    assert c.put("big", payload(1, 5 * MiB)) == -600
    assert c.get("big") == b""
    with pytest.raises(TypeError, match="key must be str"):
        c.put(b"bytes-key", b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes-like"):
        c.put("k", "a str value")
    with pytest.raises(TypeError):
        c.put("k", b"x", replica=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="force must be bool"):
        c.remove("k", "yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid regular expression"):
        c.remove_by_regex("([")
    with pytest.raises(RuntimeError, match="already set up"):
        c.setup("127.0.0.1", m.meta, 0, 0, "tcp", "", m.addr)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", m.meta, "50%", "16MB", "tcp", "", m.addr) == -600  # a code, as upstream
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": m.meta, "master_addr": m.addr}) == -600
    # an unreachable master: a code, within the RPC timeout, not a hang or a crash
    os.environ["MC_STORE_RPC_TIMEOUT"] = "1.5"
    try:
        t0 = time.monotonic()
        rc = s.setup({"local_hostname": "127.0.0.1", "metadata_server": m.meta,
                      "global_segment_size": 0, "master_server_addr": "127.0.0.1:1"})
        assert rc == -900 and time.monotonic() - t0 < 15
    finally:
        del os.environ["MC_STORE_RPC_TIMEOUT"]
    assert s.close() == 0


def test_leased_object_removal_is_refused(master_factory, worker_factory, client_factory) -> None:
    m = master_factory(default_kv_lease_ttl=3000)
    a = worker_factory(m, 8 * MiB)
    c = client_factory(m)
    assert c.put("leased", payload(11, 4096)) == 0
    assert a.cmd(op="get", key="leased")["sha"] == sha(payload(11, 4096))  # grants a lease
    assert c.remove("leased") == -706
    assert c.batch_remove(["leased"]) == [-706]
    assert c.remove("leased", force=True) == 0
    assert c.get("leased") == b""


def test_store_full_then_eviction_frees_space(master_factory, worker_factory, client_factory) -> None:
    # leases long enough that the "full" put surely comes before they end on a loaded box
    lease_s = 4.0
    # no background eviction at the watermark (the segment is ~100 % used after the puts: a
    # tick between the last put and the gets below would evict f0): only a put that needs room
    m = master_factory(default_kv_lease_ttl=int(lease_s * 1000), eviction_high_watermark_ratio=1.0)
    worker_factory(m, 4 * MiB)
    c = client_factory(m)
    vals = {f"f{i}": payload(20 + i, MiB - 4096) for i in range(4)}
    for k, v in vals.items():
        assert c.put(k, v) == 0
    # leases on everything: nothing can be evicted -> store full
    t_leased = time.monotonic()
    assert [c.get(k) == v for k, v in vals.items()] == [True] * 4, ([len(c.get(k)) for k in vals], m.log_tail())
    rc = c.put("extra", payload(30, MiB))
    assert rc == -200 or time.monotonic() - t_leased > lease_s, rc
    time.sleep(max(0.0, lease_s + 0.2 - (time.monotonic() - t_leased)))  # leases run out: eviction may free
    deadline = time.monotonic() + 10
    while (rc := c.put("extra", payload(30, MiB))) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rc == 0
    assert c.get("extra") == payload(30, MiB)
    hits = 0
    for k, v in vals.items():
        got = c.get(k)
        assert got in (b"", v)
        hits += got == v
    assert hits < 4  # something was evicted


def test_sigkill_client_objects_disappear(master_factory, worker_factory, client_factory) -> None:
    m = master_factory(client_ttl=2)
    a = worker_factory(m, 8 * MiB)
    b = worker_factory(m, 8 * MiB)
    c = client_factory(m)
    on_a = ReplicateConfig()
    on_a.preferred_segment = a.hostname
    old = payload(40, 2 * MiB)
    assert c.put("doomed", old, on_a) == 0
    assert c.get("doomed") == old
    both = ReplicateConfig()
    both.replica_num = 2
    assert c.put("both", payload(41, MiB), both) == 0
    a.kill()
    # a dead replica holder: the read falls back to the surviving replica at once
    assert c.get("both") == payload(41, MiB)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        got = c.get("doomed")
        assert got in (b"", old)
        if got == b"" and c.is_exist("doomed") == 0:
            break
        time.sleep(0.3)
    else:
        pytest.fail("object of the killed client still listed after client_ttl")
    # new objects take the space; the dead key never comes back with other bytes
    for i in range(3):
        assert c.put(f"after-{i}", payload(50 + i, 2 * MiB)) == 0
    assert c.get("doomed") == b""
    assert b.cmd(op="get", key="after-1")["sha"] == sha(payload(51, 2 * MiB))
    assert c.get("both") == payload(41, MiB)  # its replica on b survived the unmount of a


def test_setup_from_env_and_config_file(master_factory, worker_factory, tmp_path, monkeypatch) -> None:
    m = master_factory()
    worker_factory(m, 4 * MiB)
    monkeypatch.setenv("MOONCAKE_MASTER", m.addr)
    monkeypatch.setenv("MOONCAKE_TE_META_DATA_SERVER", m.meta)
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "2 MB")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "16 MB")
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    s = MooncakeDistributedStore()
    assert s.setup() == 0
    try:
        assert s.put("env-key", payload(60, 1000)) == 0
        assert s.get("env-key") == payload(60, 1000)
    finally:
        s.close()
    # the optional client metrics endpoint (upstream's enable_client_http_server)
    import urllib.request

    from mooncake_core.utils.net import free_port

    port = free_port()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", m.meta, 0, 1 << 20, "tcp", "", m.addr, enable_client_http_server=True,
                   client_http_port=port) == 0
    try:
        assert s.put("metrics-key", payload(61, 4096)) == 0 and s.get("metrics-key") == payload(61, 4096)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'mooncake_store_client_ops_total{op="put",result="ok"} 1.0' in body
        assert 'mooncake_store_client_bytes_total{op="get"} 4096.0' in body
    finally:
        s.close()
    p = tmp_path / "mooncake.json"
    p.write_text('{"local_hostname": "127.0.0.1", "metadata_server": "%s", "global_segment_size": "50%%",'
                 ' "protocol": "tcp", "master_server_address": "%s"}' % (m.meta, m.addr))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(p))
    assert MooncakeDistributedStore().setup() == -600  # logged naming global_segment_size, as upstream: a code


def test_master_restart_under_running_loop(master_factory, worker_factory, client_factory) -> None:
    m = master_factory(client_ttl=5)
    a = worker_factory(m, 16 * MiB)
    os.environ["MC_STORE_RPC_TIMEOUT"] = "1.0"
    try:
        c = client_factory(m)
    finally:
        del os.environ["MC_STORE_RPC_TIMEOUT"]
    rng = random.Random(7)
    written: dict[str, bytes] = {}
    errors_during_outage = 0
    restart_at = time.monotonic() + 1.5
    restarted_at = None
    recovered_at = None
    i = 0
    end = time.monotonic() + 30
    while time.monotonic() < end:
        now = time.monotonic()
        if restarted_at is None and now >= restart_at:
            m.stop(sig=9)
            time.sleep(0.5)
            m.start()
            restarted_at = time.monotonic()
        key = f"loop-{i % 20}"
        val = payload(1000 + i, rng.randint(1, 300_000))
        rc = c.upsert(key, val)
        if rc == 0:
            written[key] = val
        got = c.get(key)
        assert got in (b"", written.get(key, b""), val), f"wrong bytes for {key}"
        if rc != 0 or got != val:
            errors_during_outage += 1
        elif restarted_at is not None and recovered_at is None:
            recovered_at = time.monotonic()
            if recovered_at - restarted_at > 0 and i > 0:
                break
        i += 1
    assert restarted_at is not None
    assert recovered_at is not None, f"loop never recovered after the master restart\n{m.log_tail()}"
    assert recovered_at - restarted_at < 15
    # the worker re-mounted: new puts land and old keys are either right or gone
    assert a.cmd(op="put", key="post", seed=99, size=MiB)["rc"] == 0
    assert c.get("post") == payload(99, MiB)

    for k, v in written.items():
        assert c.get(k) in (b"", v)


class _LastWriteModel:
    """Seeded random put/upsert/get/remove from a segment-less client ``c`` and two workers
    ``a``/``b``, checking that every get returns the last value written for its key or a miss.
    ``ok`` holds the acceptable sha256s per key (a put on a key that may have been evicted or
    lost can take either value)."""

    def __init__(self, rng: random.Random, a, b, c, *, keys: int, weights: list[int], sizes: list[int],
                 write_errors: tuple[int, ...], remove_codes: tuple[int, ...]) -> None:
        self.rng, self.a, self.b, self.c = rng, a, b, c
        self.keys, self.weights, self.sizes = keys, weights, sizes
        self.write_errors, self.remove_codes = write_errors, remove_codes
        self.ok: dict[str, set[str]] = {}
        self.served = 0
        self.misses_of_written = 0

    def step(self, seed: int, where: str) -> None:
        rng, ok = self.rng, self.ok
        key = f"r{rng.randrange(self.keys)}"
        who = rng.choice(["c", "a", "b"])
        op = rng.choices(["put", "upsert", "get", "remove"], self.weights)[0]
        size = rng.choice(self.sizes)
        worker = self.a if who == "a" else self.b
        if op in ("put", "upsert"):
            data = payload(seed, size)
            if who == "c":
                rc = self.c.upsert(key, data) if op == "upsert" else self.c.put(key, data)
            else:
                rc = worker.cmd(op="put", key=key, seed=seed, size=size, upsert=op == "upsert")["rc"]
            if rc == 0:
                ok[key] = {sha(data)} if op == "upsert" else ok.get(key, set()) | {sha(data)}
            else:  # nothing was written
                assert rc in self.write_errors, f"{where}: {op} {key} -> {rc}"
        elif op == "get":
            if who == "c":
                got = self.c.get(key)
                h, n = sha(got), len(got)
            else:
                r = worker.cmd(op="get", key=key)
                h, n = r["sha"], r["len"]
            if n:
                assert h in ok.get(key, set()), f"{where}: get {key} returned bytes never written last"
                ok[key] = {h}
                self.served += 1
            elif ok.get(key):
                self.misses_of_written += 1  # evicted (or lost)
        else:
            assert self.c.remove(key, force=True) in self.remove_codes
            ok[key] = set()


def test_randomized_get_is_last_write_or_miss(master_factory, worker_factory, client_factory) -> None:
    """Seeded random mix of put/upsert/get/remove from three clients over a small pool (so
    eviction happens): every get returns the last value written for that key, or a miss."""
    m = master_factory(default_kv_lease_ttl=200)
    model = _LastWriteModel(random.Random(2024), worker_factory(m, MiB), worker_factory(m, MiB),
                            client_factory(m), keys=12, weights=[3, 2, 5, 1],
                            sizes=[1, 4096, 65_536, 300_000, 600_000], write_errors=(-200,),
                            remove_codes=(0, -704))
    for step in range(260):
        model.step(10_000 + step, f"step {step}")
    assert model.ok and model.misses_of_written > 0  # the pool was small enough for eviction to happen


def test_randomized_last_write_or_miss_across_master_restarts(master_factory, worker_factory,
                                                              client_factory) -> None:
    """Seeded random put/upsert/get/remove from three clients (two owning segments, so
    values of one key end up in different segments), with the master SIGKILLed and restarted
    between rounds: every get returns the last value written for that key, or a miss --
    never an overwritten or removed value brought back by a re-report."""
    m = master_factory(default_kv_lease_ttl=200, client_ttl=30)
    # writes may also meet the recovery hold (-200) or the restart itself (-900)
    model = _LastWriteModel(random.Random(77), worker_factory(m, 2 * MiB), worker_factory(m, 2 * MiB),
                            client_factory(m), keys=8, weights=[2, 3, 5, 1],
                            sizes=[1, 4096, 65_536, 200_000], write_errors=(-200, -900),
                            remove_codes=(0, -704, -900))
    for rnd in range(4):
        for step in range(60):
            model.step(50_000 + rnd * 1000 + step, f"round {rnd} step {step}")
        time.sleep(2.5)  # removal notices reach the owners with their next heartbeat (1 s), with margin
        m.stop(sig=9)
        m.start()
        time.sleep(1.5)  # owners re-mount and re-report
    assert model.served > 20


def test_ssd_tier_evicted_object_read_back_from_disk(master_factory, worker_factory, client_factory,
                                                    tmp_path) -> None:
    root = tmp_path / "ssd"
    root.mkdir()
    m = master_factory(enable_offload=True, root_fs_dir=str(root), default_kv_lease_ttl=300)
    worker_factory(m, 4 * MiB)
    c = client_factory(m)
    vals = {f"s{i}": payload(70 + i, MiB - 8192) for i in range(8)}
    for k, v in vals.items():
        deadline = time.monotonic() + 20
        while (rc := c.put(k, v)) == -200 and time.monotonic() < deadline:
            time.sleep(0.2)  # offload in progress: memory is freed once the file is written
        assert rc == 0, f"put {k} -> {rc}\n{m.log_tail()}"
    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    assert files, "nothing was offloaded to the SSD tier"
    kinds = {k: {d.kind for d in c.get_replica_desc(k)} for k in vals}
    disk_only = [k for k, ks in kinds.items() if ks == {"disk"}]
    assert disk_only, f"no object lives only on disk: {kinds}"
    # every object is still readable: from memory, or from its file on disk
    for k, v in vals.items():
        assert c.get(k) == v, f"{k} lost or corrupted"
    # promotion on hit: a disk-only object read back is put into memory again (in the
    # background, once the eviction that makes room has been offloaded)
    time.sleep(0.4)  # leases of the reads above expire
    k = disk_only[0]
    assert c.get(k) == vals[k]
    deadline = time.monotonic() + 10
    while "memory" not in {d.kind for d in c.get_replica_desc(k)}:
        assert time.monotonic() < deadline, f"{k} was not promoted back to memory\n{m.log_tail()}"
        time.sleep(0.2)
    assert c.get(k) == vals[k]
    # zero-copy reads also work from the disk tier
    buf = np.zeros(MiB, dtype=np.uint8)
    n = c.get_into("s0", int(buf.ctypes.data), buf.nbytes)
    assert n == MiB - 8192 and bytes(buf[:n]) == vals["s0"]


def test_client_outlives_master(master_factory, worker_factory, client_factory) -> None:
    m = master_factory()
    w = worker_factory(m, 4 * MiB)
    # an object the worker wrote into its own segment: re-reported to the restarted master
    assert w.cmd(op="put", key="own", seed=83, size=MiB, preferred=w.hostname)["rc"] == 0
    os.environ["MC_STORE_RPC_TIMEOUT"] = "1.0"
    try:
        c = client_factory(m)
    finally:
        del os.environ["MC_STORE_RPC_TIMEOUT"]
    assert c.put("x", payload(80, 1000)) == 0
    m.stop(sig=9)
    t0 = time.monotonic()
    assert c.put("y", payload(81, 1000)) == -900
    assert c.get("x") == b""
    assert c.is_exist("x") == -1 and not c.is_exist("x")  # falsy: an unreachable master is no hit
    assert c.get_size("x") == -900
    assert c.health_check() == 2
    assert time.monotonic() - t0 < 25  # five calls, each bounded by the 1 s RPC timeout (+ CI slack)
    m.start()
    deadline = time.monotonic() + 15
    while c.get("own") != payload(83, MiB):
        assert time.monotonic() < deadline, f"the worker's object was not re-reported\n{m.log_tail()}"
        time.sleep(0.3)
    assert c.get("x") in (b"", payload(80, 1000))
    while c.put("z", payload(82, 1000)) != 0:
        assert time.monotonic() < deadline, "client did not reconnect to the restarted master"
        time.sleep(0.3)
    assert c.get("z") == payload(82, 1000)
    assert c.health_check() == 0


def test_ha_failover_under_running_loop(etcd_endpoint, master_factory, worker_factory, client_factory) -> None:
    """Two HA masters on a real etcd; clients given etcd:// follow the leader. SIGKILL the
    leader mid-loop: no wrong bytes, and puts/gets work again within a few seconds."""
    from types import SimpleNamespace

    from mooncake_core.store.ha import parse_etcd_endpoints, resolve_leader

    eps = parse_etcd_endpoints(etcd_endpoint)
    deadline = time.monotonic() + 20
    while resolve_leader(eps) is not None and time.monotonic() < deadline:
        time.sleep(0.2)  # a leader key left by an earlier test expires with its lease
    flags = dict(enable_ha=True, etcd_endpoints=etcd_endpoint, client_ttl=5)
    first = master_factory(http=False, **flags)
    deadline = time.monotonic() + 20
    while resolve_leader(eps) != first.addr:
        assert time.monotonic() < deadline, f"no leader elected\n{first.log_tail()}"
        time.sleep(0.1)
    second = master_factory(http=False, **flags)
    ha = SimpleNamespace(addr=f"etcd://{etcd_endpoint}", meta=f"etcd://{etcd_endpoint}")
    w = worker_factory(ha, 16 * MiB)
    from mooncake_core.store import MooncakeDistributedStore

    c = MooncakeDistributedStore()
    assert c.setup({"local_hostname": "127.0.0.1", "metadata_server": ha.meta, "global_segment_size": 0,
                    "master_server_addr": ha.addr}) == 0
    try:
        rng = random.Random(11)
        written: dict[str, bytes] = {}
        killed_at = recovered_at = None
        t_kill = time.monotonic() + 1.0
        end = time.monotonic() + 40
        i = 0
        while time.monotonic() < end:
            if killed_at is None and time.monotonic() >= t_kill:
                first.stop(sig=9)
                killed_at = time.monotonic()
            key = f"ha-{i % 10}"
            val = payload(5000 + i, rng.randint(1, 200_000))
            rc = c.upsert(key, val)
            if rc == 0:
                written[key] = val
            got = c.get(key)
            assert got in (b"", written.get(key, b""), val), f"wrong bytes for {key}"
            if killed_at is not None and rc == 0 and got == val:
                recovered_at = time.monotonic()
                break
            i += 1
        assert killed_at is not None and recovered_at is not None, f"no recovery\n{second.log_tail()}"
        assert recovered_at - killed_at < 15
        assert resolve_leader(eps) == second.addr
        assert w.cmd(op="put", key="ha-post", seed=77, size=MiB)["rc"] == 0
        assert c.get("ha-post") == payload(77, MiB)
    finally:
        c.close()


def test_read_past_its_lease_is_refused(master_factory, worker_factory, client_factory) -> None:
    """With a 1 ms lease no read of 32 MiB can finish in time: the client must report -707
    (or b'' for get) instead of handing back bytes that may have been overwritten."""
    m = master_factory(default_kv_lease_ttl=1)
    worker_factory(m, 40 * MiB)
    c = client_factory(m)
    v = payload(90, 32 * MiB)
    assert c.put("short-lease", v) == 0
    buf = np.zeros(32 * MiB, dtype=np.uint8)
    assert c.get_into("short-lease", int(buf.ctypes.data), buf.nbytes) == -707
    assert c.get("short-lease") == b""
    assert c.batch_get_into(["short-lease"], [int(buf.ctypes.data)], [buf.nbytes]) == [-707]
    assert c.get_batch(["short-lease"]) == [b""]


def test_close_while_threads_read_and_write(master_factory, worker_factory) -> None:
    """close() during concurrent puts/gets on our own segment: calls end with codes, the
    process never touches unmapped memory (no crash), and close returns promptly."""
    import threading

    m = master_factory()
    worker_factory(m, 8 * MiB)
    c = make_client(m, 16 * MiB)
    stop = threading.Event()
    codes: list[int] = []

    errors: list[str] = []

    def loop(tid: int) -> None:
        i = 0
        v = payload(tid, 512 * 1024)
        try:
            while not stop.is_set():
                codes.append(c.upsert(f"cl-{tid}-{i % 4}", v))
                got = c.get(f"cl-{tid}-{i % 4}")
                if got not in (b"", v):
                    errors.append(f"thread {tid}: wrong bytes")
                i += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {tid}: {e!r}")

    ts = [threading.Thread(target=loop, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    assert c.close() == 0
    assert time.monotonic() - t0 < 20
    stop.set()
    for t in ts:
        t.join(20)
    assert not errors, errors
    assert 0 in codes and codes[-1] in (0, -600)


def test_p2p_handshake_metadata(master_factory, worker_factory, client_factory) -> None:
    """metadata_server="P2PHANDSHAKE": no metadata service at all, peers handshake directly."""
    from types import SimpleNamespace

    m = master_factory(http=False)
    p2p = SimpleNamespace(addr=m.addr, meta="P2PHANDSHAKE", log_tail=m.log_tail)
    w = worker_factory(p2p, 8 * MiB)
    c = make_client(p2p)
    try:
        v = payload(95, 3 * MiB)
        assert c.put("p2p", v) == 0 and c.get("p2p") == v
        assert w.cmd(op="get", key="p2p")["sha"] == sha(v)
    finally:
        c.close()
