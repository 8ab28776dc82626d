"""Ranged reads/writes, put/get sessions and replica clearing (upstream's names and codes).

``RangeApi`` is a delegate of ``MooncakeDistributedStore``, typed against ``StoreInternals``
(``master``, ``engine``, ``pick_order``, ``enter``/``exit``, ...). Why a family of its own:
these methods are a separate job (byte *ranges* of objects rather than whole objects).

Data never goes through a staging copy: a ranged read is a memcpy from our own segment or
one ``batch_transfer_sync_read`` per remote segment straight into the caller's buffer; a
ranged write goes from the caller's buffer straight into every reserved replica.

Safety rules (the store must never serve wrong bytes):

* every read is checked against the lease it was granted under; a read that finished after
  the lease expired reports -707 (the range may have been reused meanwhile). A get session
  caches replica lists, but a cached list whose lease has run out is re-fetched first.
* a put session can only be ended once every byte of each object has been written; a hole
  would publish whatever the reused memory held before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mooncake_core import envs
from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.codes import INVALID, LEASE_EXPIRED, NOT_FOUND, OK, TRANSFER_FAIL
from mooncake_core.store.internals import StoreInternals
from mooncake_core.store.memory import memmove
from mooncake_core.store.packing import expand_gets
from mooncake_core.store.protocol import GetReply, ReplicaDesc
from mooncake_core.store.range_plan import (
    Coverage,
    Fragment,
    plan_get_into_ranges,
    plan_key_ranges,
)
from mooncake_core.store.validate import check_config, check_int, check_key, check_keys
from mooncake_core.utils.log import get_logger

__all__ = ["RangeApi"]

log = get_logger("mooncake.store.range_api")


# The master lets another put take over a reservation never finished within its
# put_start_discard_timeout (30 s by default) and frees the old space at that moment, so a
# session must stop writing well before: past MC_STORE_PUT_SESSION_MAX_S (25 s) its writes
# are refused (-600).


@dataclass
class _Lease:
    """Replica list of one object, when its read lease was granted and when it ends, and
    the granting master's epoch (a read that outlives ``confirm_after_ms`` must confirm that
    this master still leads before its bytes are trusted)."""

    replicas: list[ReplicaDesc]
    size: int
    deadline: float
    granted: float = 0.0
    epoch: int = 0
    confirm_after_ms: int = 0

    def fresh_enough(self, now: float) -> bool:
        """Enough lease left to finish a read: a cached lease in its last 30 % (at least
        0.2 s) is renewed first, so a slow copy does not run past it (-707)."""
        return self.deadline - now > max(0.2, 0.3 * (self.deadline - self.granted))


@dataclass
class _PutSession:
    replicas: list[ReplicaDesc]
    size: int
    started: float = field(default_factory=time.monotonic)
    written: Coverage = field(default_factory=Coverage)


class _RangeState:
    def __init__(self, client_id: str) -> None:
        self.client_id = client_id  # sessions belong to one setup() of the store
        self.lock = threading.Lock()
        self.get_sessions: dict[str, _Lease] = {}
        self.put_sessions: dict[str, _PutSession] = {}


class RangeApi:
    """``get_into_ranges``, ``batch_*_multi_buffer_ranges``, put/get sessions,
    ``batch_replica_clear``, ``put_from_with_metadata``."""

    def __init__(self, core: StoreInternals) -> None:
        self.core = core
        self._state: _RangeState | None = None

    # ------------------------------------------------------------------ internals
    def _range_state(self) -> _RangeState:
        """Session state of the current ``setup()``: after close() and a new setup() the old
        reservations may already be someone else's memory, so old sessions are dropped."""
        cid = self.core.client_id
        st = self._state
        if st is None or st.client_id != cid:
            with self.core.lock:
                st = self._state
                if st is None or st.client_id != cid:
                    st = self._state = _RangeState(cid)
        return st

    def _buffer_capacity(self, ptr: int) -> int | None:
        """Bytes writable from ``ptr`` inside a registered buffer, or None if unregistered."""
        for base, size in list(self.core.registered.items()):
            if base <= ptr < base + size:
                return base + size - ptr
        return None

    def _fetch_leases(self, keys: list[str]) -> dict[str, _Lease | int]:
        """One master round trip: a fresh lease (or an error code) per distinct key."""
        uniq = list(dict.fromkeys(keys))
        if not uniq:
            return {}
        t_req = time.monotonic()
        return self._leases_from(uniq, list(self.core.master.batch_get_replica_list(uniq)), t_req)

    def _leases_from(self, uniq: list[str], replies: list[GetReply | int], t_req: float) -> dict[str, _Lease | int]:
        """The lease (or error code) of each key of a batch get asked for at ``t_req``."""
        out: dict[str, _Lease | int] = {}
        for key, reply in zip(uniq, replies):
            if isinstance(reply, int):
                out[key] = reply
                continue
            order = self.core.pick_order(reply.replicas)
            if not order:
                out[key] = NOT_FOUND
                continue
            out[key] = _Lease(order, order[0].size, t_req + reply.lease_ttl_ms / 1000.0, t_req,
                              reply.epoch, reply.confirm_after_ms)
        return out

    def _any_session(self, keys: list[str]) -> bool:
        """Whether a get session caches the lease of one of ``keys``."""
        st = self._range_state()
        with st.lock:
            return bool(st.get_sessions) and any(k in st.get_sessions for k in keys)

    def _leases_for(self, keys: list[str], use_sessions: bool) -> dict[str, _Lease | int]:
        """Leases from the get-session cache where still valid, else fresh from the master."""
        have: dict[str, _Lease | int] = {}
        if use_sessions:
            st = self._range_state()
            now = time.monotonic()
            with st.lock:
                for k in keys:
                    lease = st.get_sessions.get(k)
                    if lease is not None and lease.fresh_enough(now):
                        have[k] = lease
        missing = [k for k in dict.fromkeys(keys) if k not in have]
        if missing:
            fresh = self._fetch_leases(missing)
            have.update(fresh)
            if use_sessions:
                st = self._range_state()
                with st.lock:
                    for k, v in fresh.items():
                        if k in st.get_sessions and isinstance(v, _Lease):
                            st.get_sessions[k] = v
        return have

    def _read_fragments(self, frags: list[Fragment], leases: dict[str, _Lease | int], op: str,
                        done: Callable[[Fragment, int], None]) -> None:
        """Read each fragment from its object's best memory replica into ``frag.addr``;
        report bytes read or a negative code through ``done``."""
        own = self.core.segment_name if self.core.segment is not None else None
        remote: dict[str, list[tuple[Fragment, ReplicaDesc]]] = {}
        todo: list[Fragment] = []
        live: dict[int, _Lease] = {}  # id(fragment) -> the lease it is read under
        for f in frags:
            lease = leases.get(f.key, NOT_FOUND)
            if isinstance(lease, int):
                done(f, lease)
                continue
            if f.obj_off + f.size > lease.size:
                log.warning("%s: key %r: source range [%d, %d) is beyond the object (%d bytes)",
                            op, f.key, f.obj_off, f.obj_off + f.size, lease.size)
                done(f, INVALID)
                continue
            mem = [r for r in lease.replicas if r.kind == "memory"]
            if not mem:
                log.warning("%s: key %r has no memory replica (ranged reads need one, as upstream)", op, f.key)
                done(f, INVALID)
                continue
            if f.size == 0:
                done(f, 0)
                continue
            todo.append(f)
            live[id(f)] = lease
            first = mem[0]
            if first.segment_name == own:
                memmove(f.addr, first.addr + f.obj_off, f.size)
                continue
            remote.setdefault(first.segment_name, []).append((f, first))
        retry: list[Fragment] = []
        for seg, items in remote.items():
            rc = self.core.engine.batch_transfer_sync_read(
                seg, [f.addr for f, _ in items], [rep.addr + f.obj_off for f, rep in items],
                [f.size for f, _ in items])
            if rc is None or rc < 0:
                log.warning("%s: batched read of %d ranges from %s failed (%s); retrying one by one",
                            op, len(items), seg, rc)
                retry.extend(f for f, _ in items)
        failed: set[int] = set()
        for f in retry:  # fall back through the other memory replicas, fragment by fragment
            ok = False
            for rep in live[id(f)].replicas:
                if rep.kind != "memory":
                    continue
                if rep.segment_name == own:
                    memmove(f.addr, rep.addr + f.obj_off, f.size)
                    ok = True
                    break
                rc = self.core.engine.batch_transfer_sync_read(
                    rep.segment_name, [f.addr], [rep.addr + f.obj_off], [f.size])
                if rc is not None and rc >= 0:
                    ok = True
                    break
            if not ok:
                failed.add(id(f))
                done(f, TRANSFER_FAIL)
        now = time.monotonic()
        unconfirmed = self._unconfirmed_epochs([live[id(f)] for f in todo if id(f) not in failed], now, op)
        for f in todo:
            if id(f) in failed:
                continue
            lease = live[id(f)]
            if now >= lease.deadline:
                log.warning("%s(%r): lease expired during the read; result discarded", op, f.key)
                done(f, LEASE_EXPIRED)
            elif lease.epoch in unconfirmed:
                done(f, LEASE_EXPIRED)
            else:
                done(f, f.size)

    def _unconfirmed_epochs(self, leases: list[_Lease], now: float, op: str) -> set[int]:
        """Epochs of leases held longer than their ``confirm_after_ms`` whose master no longer
        leads (one ping for the whole call). A new master does not know its predecessor's
        leases and may reuse their ranges, so such reads count as -707 -- a miss, never
        foreign bytes."""
        epochs = {lease.epoch for lease in leases
                  if 0 < lease.confirm_after_ms < (now - lease.granted) * 1000.0}
        if not epochs:
            return set()
        current, why = self.core.leading_epoch()
        if current < 0:
            log.warning("%s: cannot confirm the master's epoch (%s); ranged reads discarded (-707)", op, why)
            return epochs
        stale = {e for e in epochs if e != current}
        if stale:
            log.warning("%s: the master changed during the read (epoch %s -> %s); results discarded (-707)",
                        op, sorted(stale), current)
        return stale

    def _write_fragments(self, frags: list[Fragment], sessions: dict[str, _PutSession], op: str,
                         done: Callable[[Fragment, int], None]) -> None:
        """Write each fragment from ``frag.addr`` into every reserved replica of its key."""
        own = self.core.segment_name if self.core.segment is not None else None
        remote: dict[str, tuple[list[Fragment], list[int]]] = {}
        for f in frags:
            for rep in sessions[f.key].replicas:
                if rep.segment_name == own:
                    memmove(rep.addr + f.obj_off, f.addr, f.size)
                else:
                    fl, dl = remote.setdefault(rep.segment_name, ([], []))
                    fl.append(f)
                    dl.append(rep.addr + f.obj_off)
        bad: set[str] = set()
        for seg, (fl, dl) in remote.items():
            rc = self.core.engine.batch_transfer_sync_write(
                seg, [f.addr for f in fl], dl, [f.size for f in fl])
            if rc is None or rc < 0:
                log.warning("%s: write of %d ranges to segment %s failed (%s)", op, len(fl), seg, rc)
                bad.update(f.key for f in fl)
        for f in frags:
            done(f, TRANSFER_FAIL if f.key in bad else f.size)

    # ------------------------------------------------------------------ ranged reads
    def get_into_ranges(self, buffer_ptrs: list[int], all_keys: list[list[str]],
                        all_dst_offsets: list[list[list[int]]], all_src_offsets: list[list[list[int]]],
                        all_sizes: list[list[list[int]]]) -> list[list[list[int]]]:
        results, frags = plan_get_into_ranges(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                                              all_sizes, self._buffer_capacity, lambda m: log.warning("%s", m))
        if not frags:
            return results

        def done(f: Fragment, rc: int) -> None:
            i, j, k = f.slot
            results[i][j][k] = rc

        self._run_ranges(frags, "get_into_ranges", done, use_sessions=True)
        return results

    def read_pieces(self, pieces: list[tuple[str, int, int, int]], op: str) -> list[int]:
        """Read ``(key, dest_addr, object_offset, size)`` pieces in one batch (no buffer
        registration needed: the destinations are our own memory, e.g. a tensor being
        assembled from the shards of a parallel split). Per piece: bytes read or a negative
        code (-704 missing, -600 range past the object's end, -707 lease expired, ...)."""
        out = [0] * len(pieces)
        if not pieces:
            return out
        frags = [Fragment(k, a, o, n, (i,)) for i, (k, a, o, n) in enumerate(pieces)]

        def done(f: Fragment, rc: int) -> None:
            out[f.slot[0]] = rc

        self._run_ranges(frags, op, done, use_sessions=False)
        return out

    def _run_ranges(self, frags: list[Fragment], op: str, done: Callable[[Fragment, int], None],
                    *, use_sessions: bool) -> None:
        t0 = time.perf_counter()
        worst, total = OK, 0

        def tally(f: Fragment, rc: int) -> None:
            nonlocal worst, total
            worst, total = min(worst, rc), total + max(rc, 0)
            done(f, rc)
        try:
            self.core.enter(op)
        except MooncakeError as e:
            log.warning("%s", e)
            for f in frags:
                done(f, e.code)
            return
        try:
            self._read_all(frags, op, tally, use_sessions)
        except MooncakeError as e:
            log.warning("%s: %s", op, e)
            for f in frags:
                tally(f, e.code)
        finally:
            self.core.exit()
        self.core.count(op, worst, total, t0)

    def _read_all(self, frags: list[Fragment], op: str, tally: Callable[[Fragment, int], None],
                  use_sessions: bool) -> None:
        """Read every fragment. Without a cached session lease among them: as arrays under one
        packed batch get (``ReadPath.read_ranges``); else (or for replies of another shape, e.g. disk
        replicas) fragment by fragment under per-key leases."""
        keys = [f.key for f in frags]
        if use_sessions and self._any_session(keys):
            self._read_fragments(frags, self._leases_for(keys, use_sessions), op, tally)
            return
        uniq = list(dict.fromkeys(keys))
        t_req = time.monotonic()
        reply = self.core.master.batch_get_packed(uniq)
        ix = {k: i for i, k in enumerate(uniq)}
        kix = np.fromiter(map(ix.__getitem__, keys), np.int64, len(keys))
        addr, off, size = (np.fromiter((getattr(f, a) for f in frags), np.int64, len(frags))
                           for a in ("addr", "obj_off", "size"))
        rcs = self.core.read_ranges(uniq, reply, t_req, kix, addr, off, size, op)
        if rcs is None:
            self._read_fragments(frags, self._leases_from(uniq, expand_gets(reply, len(uniq)), t_req), op, tally)
            return
        for f, rc in zip(frags, rcs.tolist()):
            tally(f, rc)

    def batch_get_into_multi_buffer_ranges(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]],
                                           all_src_offsets: list[list[int]]) -> list[int]:
        results, plans = plan_key_ranges("batch_get_into_multi_buffer_ranges", keys, all_buffer_ptrs,
                                         all_sizes, all_src_offsets, lambda m: log.warning("%s", m))
        frags = [f for p in plans for f in p.frags]
        if frags:
            self._run_ranges(frags, "batch_get_into_multi_buffer_ranges",
                             lambda f, rc: _accumulate(results, f.slot[0], rc), use_sessions=True)
        return results

    # ------------------------------------------------------------------ get sessions
    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        keys = check_keys(keys, "batch_get_session_start")
        if not keys:
            return []
        try:
            self.core.require_ready("batch_get_session_start")
            leases = self._fetch_leases(keys)
        except MooncakeError as e:
            log.warning("batch_get_session_start: %s", e)
            return [e.code] * len(keys)
        st = self._range_state()
        out = []
        with st.lock:
            for k in keys:
                v = leases[k]
                if isinstance(v, int):
                    out.append(v)
                else:
                    st.get_sessions[k] = v
                    out.append(OK)
        return out

    def batch_get_session_end(self, keys: list[str]) -> int:
        keys = check_keys(keys, "batch_get_session_end")
        st = self._range_state()
        with st.lock:
            for k in keys:
                st.get_sessions.pop(k, None)
        return OK

    # ------------------------------------------------------------------ put sessions
    def batch_put_session_start(self, keys: list[str], sizes: list[int],
                                config: Any = None) -> list[int]:
        keys = check_keys(keys, "batch_put_session_start")
        if not isinstance(sizes, (list, tuple)) or len(sizes) != len(keys):
            log.warning("batch_put_session_start: %d keys but %s sizes", len(keys),
                        len(sizes) if isinstance(sizes, (list, tuple)) else type(sizes).__name__)
            return [INVALID] * len(keys)
        sizes = [check_int(s, f"batch_put_session_start: sizes[{i}]") for i, s in enumerate(sizes)]
        cfg = check_config(config, "batch_put_session_start")
        if not keys:
            return []
        out = [OK] * len(keys)
        st = self._range_state()
        send: list[int] = []
        seen: set[str] = set()
        with st.lock:
            for i, k in enumerate(keys):
                if k in seen or k in st.put_sessions:
                    out[i] = int(ErrorCode.OBJECT_ALREADY_EXISTS)
                else:
                    seen.add(k)
                    send.append(i)
        if not send:
            return out
        msg = cfg.to_msg()
        if cfg.prefer_alloc_in_same_node and self.core.segment is not None \
                and self.core.segment_name not in msg.preferred_segments:
            msg.preferred_segments.insert(0, self.core.segment_name)
        try:
            self.core.require_ready("batch_put_session_start")
            allocs = list(self.core.master.batch_put_start(
                self.core.client_id, [keys[i] for i in send], [sizes[i] for i in send], msg))
        except MooncakeError as e:
            log.warning("batch_put_session_start: %s", e)
            for i in send:
                out[i] = e.code
            return out
        with st.lock:
            for i, a in zip(send, allocs):
                if isinstance(a, int):
                    out[i] = a
                else:
                    st.put_sessions[keys[i]] = _PutSession(list(a), sizes[i])
        return out

    def batch_put_from_multi_buffer_ranges(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]],
                                           all_dst_offsets: list[list[int]]) -> list[int]:
        op = "batch_put_from_multi_buffer_ranges"
        results, plans = plan_key_ranges(op, keys, all_buffer_ptrs, all_sizes, all_dst_offsets,
                                         lambda m: log.warning("%s", m))
        st = self._range_state()
        sessions: dict[str, _PutSession] = {}
        frags: list[Fragment] = []
        with st.lock:
            for p in plans:
                s = st.put_sessions.get(p.key)
                if s is None:
                    log.warning("%s: key %r has no open put session (call batch_put_session_start)", op, p.key)
                    results[p.index] = INVALID
                    continue
                max_age = envs.MC_STORE_PUT_SESSION_MAX_S
                if time.monotonic() - s.started > max_age:
                    log.warning("%s: the put session of %r is older than %.0f s; the master may already have "
                                "given its space to another put. Revoke it and start again", op, p.key, max_age)
                    results[p.index] = INVALID
                    continue
                over = [f for f in p.frags if f.obj_off + f.size > s.size]
                if over:
                    f = over[0]
                    log.warning("%s: key %r: range [%d, %d) is beyond the reserved %d bytes", op, p.key,
                                f.obj_off, f.obj_off + f.size, s.size)
                    results[p.index] = INVALID
                    continue
                sessions[p.key] = s
                frags.extend(f for f in p.frags if f.size > 0)
        if not frags:
            return results
        try:
            self.core.enter(op)
        except MooncakeError as e:
            log.warning("%s", e)
            return [e.code if r >= 0 else r for r in results]
        t0 = time.perf_counter()
        try:
            written: list[Fragment] = []

            def done(f: Fragment, rc: int) -> None:
                _accumulate(results, f.slot[0], rc)
                if rc >= 0:
                    written.append(f)
            self._write_fragments(frags, sessions, op, done)
            with st.lock:
                for f in written:
                    sessions[f.key].written.add(f.obj_off, f.size)
        finally:
            self.core.exit()
        self.core.count(op, min(results), sum(f.size for f in written), t0)
        return results

    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        return self._finish_put_sessions(keys, revoke=False)

    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        return self._finish_put_sessions(keys, revoke=True)

    def _finish_put_sessions(self, keys: Any, *, revoke: bool) -> list[int]:
        op = "batch_put_session_revoke" if revoke else "batch_put_session_end"
        keys = check_keys(keys, op)
        out = [OK] * len(keys)
        st = self._range_state()
        chosen: list[tuple[int, str, _PutSession]] = []
        with st.lock:
            for i, k in enumerate(keys):
                s = st.put_sessions.get(k)
                if s is None or any(k == c[1] for c in chosen):
                    log.warning("%s: key %r has no open put session", op, k)
                    out[i] = INVALID
                elif not revoke and not s.written.complete(s.size):
                    log.warning("%s: key %r: only %d of %d bytes written; session stays open", op, k,
                                s.written.covered(), s.size)
                    out[i] = INVALID
                else:
                    chosen.append((i, k, st.put_sessions.pop(k)))
        if not chosen:
            return out
        names = [k for _, k, _ in chosen]
        try:
            self.core.require_ready(op)
            master = self.core.master
            fn = master.batch_put_revoke if revoke else master.batch_put_end
            rcs: list[int | None] = [*fn(self.core.client_id, names)] or [None] * len(names)
        except MooncakeError as e:
            # the master did not answer: the sessions stay open so the call can be retried
            log.warning("%s: %s", op, e)
            with st.lock:
                for _, k, sess in chosen:
                    st.put_sessions.setdefault(k, sess)
            return [e.code if i in {c[0] for c in chosen} else rc for i, rc in enumerate(out)]
        for (i, k, s), rc in zip(chosen, rcs):
            if isinstance(rc, int) and rc < 0:
                out[i] = rc
            elif not revoke:
                self.core.remember_owned(k, s.replicas, rc)
        return out

    # ------------------------------------------------------------------ misc
    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        keys = check_keys(keys, "batch_replica_clear")
        if not isinstance(segment_name, str):
            raise TypeError(f"batch_replica_clear: segment_name must be str, got {type(segment_name).__name__}")
        if segment_name:
            log.warning("batch_replica_clear: clearing replicas of one segment (%r) is not supported; "
                        "nothing cleared", segment_name)
            return []
        if not keys:
            return []
        try:
            self.core.require_ready("batch_replica_clear")
            rcs = [int(x) for x in self.core.master.batch_remove(keys, False)]
        except MooncakeError as e:
            log.warning("batch_replica_clear: %s", e)
            return []
        cleared = [k for k, rc in zip(keys, rcs) if rc == 0]
        self.core.forget(cleared)
        return cleared

    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int, size: int,
                               metadata_size: int, config: Any = None) -> int:
        op = "put_from_with_metadata"
        key = check_key(key, op)
        buffer_ptr = check_int(buffer_ptr, f"{op}: buffer_ptr", minimum=1)
        metadata_buffer_ptr = check_int(metadata_buffer_ptr, f"{op}: metadata_buffer_ptr", minimum=1)
        size = check_int(size, f"{op}: size")
        metadata_size = check_int(metadata_size, f"{op}: metadata_size")
        cfg = check_config(config, op)
        parts = [(a, n) for a, n in ((metadata_buffer_ptr, metadata_size), (buffer_ptr, size)) if n]
        return self.core.call(lambda: self.core.put_many([key], [parts], cfg, upsert=False,
                                                 op=op)[0])


def _accumulate(results: list[int], i: int, rc: int) -> None:
    """Per-key total over its ranges: bytes add up; the first error sticks."""
    if results[i] < 0:
        return
    results[i] = rc if rc < 0 else results[i] + rc
