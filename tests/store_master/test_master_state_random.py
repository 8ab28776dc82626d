"""Randomized (seeded) check of the pure master state: after every operation

* no two live ranges overlap (complete objects, in-flight puts, ranges waiting for a lease
  to end), all lie inside their segment, and each allocator's ``used`` equals their sum;
* a get returns either a miss or exactly the replicas of the last completed put/upsert of
  that key (never another object's range), and a leased range is never handed out again
  before the lease ends.
"""

from __future__ import annotations

import random

import pytest

from mooncake_core.errors import MooncakeError
from mooncake_core.store.master_state import MasterConfig, MasterState
from mooncake_core.store.protocol import ReplicateConfigMsg as Cfg


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _round(n: int) -> int:
    return (n + 63) & ~63


def check_invariants(st: MasterState) -> None:
    spans: dict[str, list[tuple[int, int]]] = {name: [] for name in st.segments}
    for meta in st.objects.values():
        for seg, off in meta.reps():
            assert st.segments.get(seg.name) is seg, "replica on an unmounted segment"
            spans[seg.name].append((off, off + min(_round(meta.size), seg.size - off)))
    for p in st.inflight.values():
        for seg, off in p.reps:
            spans[seg.name].append((off, off + min(_round(p.size), seg.size - off)))
    for _, _, seg, off, size in st.graveyard:
        if st.segments.get(seg.name) is seg:
            spans[seg.name].append((off, off + min(_round(size), seg.size - off)))
    for c in st.clients.values():  # ranges of failed puts, freed after the owner's heartbeats
        for _, seg, off, size in c.quarantine:
            if st.segments.get(seg.name) is seg:
                spans[seg.name].append((off, off + min(_round(size), seg.size - off)))
    for name, sp in spans.items():
        seg = st.segments[name]
        sp.sort()
        for (s1, e1), (s2, _) in zip(sp, sp[1:]):
            assert e1 <= s2, f"overlap in {name}: [{s1},{e1}) and [{s2},..)"
        assert all(0 <= s and e <= seg.size for s, e in sp)
        assert sum(e - s for s, e in sp) == seg.alloc.used, f"{name}: used mismatch"


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_operations_keep_invariants(seed: int) -> None:
    rng = random.Random(seed)
    clock = Clock()
    st = MasterState(MasterConfig(default_kv_lease_ttl_ms=500, eviction_ratio=0.1,
                                  eviction_high_watermark_ratio=0.85, client_ttl_s=5,
                                  put_start_discard_timeout_s=3), clock=clock)
    seg_names = ["s0", "s1", "s2"]
    for i, n in enumerate(seg_names):
        st.mount_segment(f"c{i}", n, 0x100000 * (i + 1), 96 * 1024)
    keys = [f"k{i}" for i in range(40)]
    truth: dict[str, set[tuple[str, int, int]]] = {}   # key -> replicas of the last completed put
    pending: dict[str, tuple[str, list, bool]] = {}     # key -> (client, descs, upsert)
    leased: list[tuple] = []  # (lease end, segment, addr, size, Segment) of reads
    for step in range(3000):
        op = rng.random()
        key = rng.choice(keys)
        client = rng.choice(["c0", "c1", "c2"])
        try:
            if op < 0.30:
                upsert = rng.random() < 0.3
                cfg = Cfg(replica_num=rng.choice([1, 1, 2, 3]), with_hard_pin=rng.random() < 0.05,
                          soft_pin=rng.random() < 0.1, soft_pin_ttl_ms=1000,
                          preferred_segments=[rng.choice(seg_names)] if rng.random() < 0.3 else [])
                descs = st.put_start(client, key, rng.randint(1, 9000), cfg, upsert=upsert)
                pending[key] = (client, descs, upsert)
                if rng.random() < 0.7:  # most puts finish at once; the rest stay in flight a while
                    st.put_end(client, key)
                    truth[key] = {(d.segment_name, d.addr, d.size) for d in descs}
                    del pending[key]
                # a new allocation never overlaps a range a reader still holds a lease on
                for end, seg, addr, size, segobj in leased:
                    # (an unmount ends every lease on that segment: its owner is gone)
                    if end > clock.t and st.segments.get(seg) is segobj:
                        for d in descs:
                            if d.segment_name == seg:
                                assert d.addr + d.size <= addr or d.addr >= addr + size
            elif op < 0.50:
                if key in pending:
                    c, descs, _ = pending[key]
                    if rng.random() < 0.85:
                        st.put_end(c, key)
                        truth[key] = {(d.segment_name, d.addr, d.size) for d in descs}
                    else:
                        st.put_revoke(c, key)
                    del pending[key]
            elif op < 0.75:
                got = st.get_replica_list(key)
                seen = {(r.segment_name, r.addr, r.size) for r in got.replicas}
                assert seen <= truth.get(key, set()), f"{key}: get returned replicas of another put"
                for r in got.replicas:
                    leased.append((clock.t + 0.5, r.segment_name, r.addr, r.size, st.segments[r.segment_name]))
            elif op < 0.82:
                st.remove(key, force=rng.random() < 0.3)
                truth.pop(key, None)
            elif op < 0.95:
                clock.t += rng.choice([0.01, 0.1, 0.3, 1.0])
                for c in ("c0", "c1", "c2"):
                    if rng.random() < 0.98:
                        st.heartbeat(c)
                st.tick()
            else:
                name = rng.choice(seg_names)
                owner = f"c{seg_names.index(name)}"
                if name in st.segments and rng.random() < 0.5:
                    st.unmount_segment(owner, name)
                else:
                    st.mount_segment(owner, name, 0x100000 * (seg_names.index(name) + 1), 96 * 1024)
        except MooncakeError:
            pass
        # objects dropped by eviction / unmount / expiry disappear from the truth as misses
        for k in list(truth):
            if k not in st.objects:
                del truth[k]
        for k in list(pending):
            if k not in st.inflight or st.inflight[k].client_id != pending[k][0]:
                del pending[k]
        check_invariants(st)
