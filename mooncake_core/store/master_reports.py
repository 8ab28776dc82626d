"""The master's rules for re-reported objects (after a master change or a client's return).

Why a module of its own: which reports are trusted decides whether a removed or overwritten
value can come back, and the rules (ranges, versions, tombstones -- see master_absence) are
one job; ``MasterState.report_objects`` delegates here. Not thread-safe, like MasterState.
"""

from __future__ import annotations

from typing import Callable, Protocol

from mooncake_core.store.key_events import KeyEventLog
from mooncake_core.store.master_absence import Absences
from mooncake_core.store.master_records import (ClientInfo, DiskReplica, MasterConfig, ObjectMeta, PendingPut, Segment,
                                                 VersionClock, safe_rel_path)
from mooncake_core.store.master_tier import Tier
from mooncake_core.store.protocol import ReplicaDesc
from mooncake_core.utils.log import get_logger


class ReportState(Protocol):
    """What the re-report rules use of ``master_state.MasterState`` (the object table, the
    re-reported versions, tombstones, the version clock), declared here so that this module
    does not import the one that delegates to it."""

    cfg: MasterConfig
    clock: Callable[[], float]
    objects: dict[str, ObjectMeta]
    inflight: dict[str, PendingPut]
    segments: dict[str, Segment]
    clients: dict[str, ClientInfo]
    reported: dict[str, int]
    reported_until: float
    absent: Absences
    versions: VersionClock
    key_events: KeyEventLog
    tier: Tier

    def intern_size(self, size: int) -> int: ...
    def touch_client(self, client_id: str, now: float) -> tuple[ClientInfo, bool]: ...
    def drop_object(self, key: str, meta: ObjectMeta, now: float) -> None: ...

log = get_logger("mooncake.store.master")


def report_objects(st: ReportState, client_id: str, objects: list[tuple[str, ReplicaDesc]],
                   versions: list[int] | None = None) -> int:
    """Rebuild state from a client's complete objects (after need_remount).

    A memory replica is only accepted on a segment this client mounted, inside it, and
    when its range is still free here (the allocator then marks it used); anything else is
    ignored (never trusted). ``versions[i]`` is the version ``put_end`` gave object i.
    Several clients may report the same key (an upsert by another client leaves the old
    bytes in the first writer's segment, unknown to it): the highest version wins, and an
    object written through this master beats any report -- so an overwritten value never
    comes back."""
    now = st.clock()
    st.touch_client(client_id, now)
    st.reported_until = now + 2 * st.cfg.client_ttl_s
    st.absent.open_window(now)
    if versions is None or len(versions) != len(objects):
        versions = [0] * len(objects)
    accepted = 0
    for (key, d), version in zip(objects, versions):
        if not isinstance(key, str) or not key or key in st.inflight or d.size <= 0:
            continue
        if not isinstance(version, int) or version < 0:
            continue
        st.versions.observe(version)  # a predecessor's clock ran ahead of ours: stay above it
        tomb = st.absent.stamp(key)
        if tomb and version <= tomb:
            # removed here after another owner's report and before this one: the bytes are
            # of the removed value (or older); tell the owner to forget them
            c = st.clients.get(client_id)
            if c is not None:
                c.removed.append((key, tomb))
            continue
        meta = st.objects.get(key)
        if meta is not None:
            known = st.reported.get(key)
            if known is None or version < known:
                continue  # written through this master, or an older version: stale
            if version > known:  # a newer write of this key: the reported one is stale
                st.drop_object(key, meta, now)
                meta = None
        if meta is not None and meta.size != d.size:
            continue
        if d.kind == "disk":
            if not st.cfg.enable_offload or not safe_rel_path(d.path):
                continue
            if meta is None:
                meta = st.objects[key] = ObjectMeta(st.intern_size(d.size), [])
                st.reported[key] = version
                st.key_events.publish("put", key)
            if meta.disk is None:
                st.tier.add_disk(key, meta, DiskReplica(d.segment_name, client_id, d.path, d.size))
                accepted += 1
            continue
        seg = st.segments.get(d.segment_name)
        if seg is None or seg.client_id != client_id:
            continue
        off = d.addr - seg.base
        if off < 0 or off + d.size > seg.size:
            continue
        if meta is not None and any(r[0] is seg for r in meta.reps()):
            continue
        try:
            seg.alloc.reserve(off, d.size)
        except ValueError:
            continue
        if meta is None:
            st.objects[key] = ObjectMeta(st.intern_size(d.size), [(seg, off)])
            st.reported[key] = version
            st.key_events.publish("put", key)
        else:
            meta.set_reps(meta.reps() + [(seg, off)])
        accepted += 1
    if accepted:
        log.info("objects re-reported", extra={"client": client_id, "accepted": accepted,
                                               "offered": len(objects)})
    return accepted
