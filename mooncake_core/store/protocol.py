"""Wire protocol between store clients and the store master.

Transport: plain TCP with length-prefixed frames, bodies in msgpack via msgspec.

Why msgspec msgpack: the messages are small and frequent (``is_exist`` must reach tens of
thousands per second from one Python thread); msgspec encodes/decodes typed Structs in about
a microsecond, validates types on decode (a malformed message becomes a clear error instead
of a crash), needs no code generation or .proto files, and msgpack is compact.

Why plain TCP and not ZeroMQ (the first version used pyzmq DEALER/ROUTER): measured on the
2-core reference machine, a Python request/reply over ZeroMQ costs ~50 us of CPU per round
trip (every message crosses two I/O threads on each side), a plain TCP round trip ~7 us.
With ZeroMQ the master topped out well below the 20k is_exist/s target; with one epoll loop
on the server and one blocking socket per calling thread on the client it does not.

Framing (all integers big-endian):

* request:  ``u32 length | u16 version | u64 request_id | body``
* reply:    ``u32 length | u16 version | u64 request_id | i32 status | payload``

``length`` counts the bytes after itself. ``request_id`` is echoed back so a client can
drop a reply to a request it already gave up on. ``body`` is one of the request Structs
below, msgpack-encoded as a tagged union (the tag is the method name). ``status`` is a
Mooncake error code (0 = OK); on success ``payload`` is the msgpack-encoded result (type given
per method in ``RESULT_TYPES``), otherwise the UTF-8 error message.

Authentication (``MOONCAKE_AUTH_TOKEN`` on the master): a connection's first requests are
``auth_challenge`` (answered with a nonce) and ``auth`` (the HMAC of it); any other request
of a connection that has not passed them is answered -600 naming the refusal, and the master
closes the connection. Adding the two methods kept PROTOCOL_VERSION 2 (clients without a
token never send them).
"""

from __future__ import annotations

import struct
from typing import Literal, Union

import msgspec

#: 2: lease epochs (GetReply.epoch/confirm_after_ms, MountSegmentReq.prev_epoch);
#: 3: packed batch messages (sizes, codes and replica placements as arrays: see packing.py)
PROTOCOL_VERSION = 3
#: frames larger than this are refused (and the connection closed: it cannot be resynced)
MAX_FRAME = 256 << 20

_LEN = struct.Struct(">I")
_HEADER = struct.Struct(">HQ")
_STATUS = struct.Struct(">i")
_REQ_PREFIX = struct.Struct(">IHQ")
_REPLY_PREFIX = struct.Struct(">IHQi")
LEN_SIZE = _LEN.size
HEADER_SIZE = _HEADER.size
REPLY_HEADER_SIZE = HEADER_SIZE + _STATUS.size

ReplicaKind = Literal["memory", "disk"]


def pack_header(version: int, request_id: int) -> bytes:
    return _HEADER.pack(version, request_id & 0xFFFFFFFFFFFFFFFF)


def unpack_header(data: bytes) -> tuple[int, int]:
    """(version, request_id) from the first HEADER_SIZE bytes of a frame."""
    if len(data) < HEADER_SIZE:
        raise ValueError(f"bad header: expected {HEADER_SIZE} bytes, got {len(data)}")
    return _HEADER.unpack_from(data)


def pack_status(code: int) -> bytes:
    return _STATUS.pack(code)


def unpack_status(data: bytes) -> int:
    if len(data) != _STATUS.size:
        raise ValueError(f"bad status: expected {_STATUS.size} bytes, got {len(data)}")
    return _STATUS.unpack(data)[0]


def unpack_len(data: bytes | bytearray | memoryview, offset: int = 0) -> int:
    return _LEN.unpack_from(data, offset)[0]


def request_frame(request_id: int, body: bytes, version: int = PROTOCOL_VERSION) -> bytes:
    """A complete request frame (length prefix included)."""
    return _REQ_PREFIX.pack(HEADER_SIZE + len(body), version, request_id & 0xFFFFFFFFFFFFFFFF) + body


def reply_frame(version: int, request_id: int, status: int, payload: bytes) -> bytes:
    """A complete reply frame (length prefix included)."""
    return _REPLY_PREFIX.pack(REPLY_HEADER_SIZE + len(payload), version, request_id, status) + payload


def parse_reply(frame: bytes | memoryview) -> tuple[int, int, int, bytes | memoryview]:
    """(version, request_id, status, payload) of a reply frame without its length prefix."""
    if len(frame) < REPLY_HEADER_SIZE:
        raise ValueError(f"bad reply: {len(frame)} bytes, shorter than its header")
    version, rid = _HEADER.unpack_from(frame)
    status = _STATUS.unpack_from(frame, HEADER_SIZE)[0]
    return version, rid, status, frame[REPLY_HEADER_SIZE:]


# --------------------------------------------------------------------------- data types
class ReplicaDesc(msgspec.Struct, array_like=True, frozen=True):
    """Where one copy of an object lives.

    ``addr`` is the absolute address inside the owning client's registered segment memory
    (segment ``segment_name`` = that client's Transfer Engine hostname). Disk replicas have
    ``path`` relative to the owner's ``root_fs_dir`` and ``addr`` 0.
    """

    segment_name: str
    addr: int
    size: int
    kind: ReplicaKind = "memory"
    path: str = ""
    status: str = "complete"

    # the original's ReplicaDescriptor accessors (code written against it inspects replicas so)
    def is_memory_replica(self) -> bool:
        return self.kind == "memory"

    def is_disk_replica(self) -> bool:
        return self.kind == "disk"

    def is_local_disk_replica(self) -> bool:
        """The original's local-SSD replicas (a client's own disk, not the shared tier): none here."""
        return False

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if self.kind != "memory":
            raise RuntimeError(f"replica on {self.segment_name!r} is a {self.kind} replica, not a memory one")
        return MemoryDescriptor(BufferDescriptor(self.size, self.addr, self.segment_name))

    def get_disk_descriptor(self) -> DiskDescriptor:
        if self.kind != "disk":
            raise RuntimeError(f"replica on {self.segment_name!r} is a {self.kind} replica, not a disk one")
        return DiskDescriptor(self.path, self.size)


class BufferDescriptor(msgspec.Struct, frozen=True):
    """Where a memory replica's bytes are (the original's ``Descriptor``)."""

    size: int
    buffer_address: int
    transport_endpoint: str  # the owning client's segment ("host:port")


class MemoryDescriptor(msgspec.Struct, frozen=True):
    buffer_descriptor: BufferDescriptor


class DiskDescriptor(msgspec.Struct, frozen=True):
    file_path: str  # relative to the SSD tier's directory
    object_size: int


class ReplicateConfigMsg(msgspec.Struct, array_like=True):
    """Placement options of a put (the wire form of ``ReplicateConfig``)."""

    replica_num: int = 1
    soft_pin: bool = False
    soft_pin_ttl_ms: int | None = None
    with_hard_pin: bool = False
    preferred_segments: list[str] = msgspec.field(default_factory=list)
    #: the original's ``group_ids``: the object group of each key of the put (one per key, or
    #: one for all), leased and evicted together (``master_groups``); empty = none
    group_ids: list[str] = msgspec.field(default_factory=list)
    #: segments the writer could not reach a moment ago (a retry of a put whose write there
    #: failed): the master places this put on none of them, and fails it when nothing else
    #: fits. Last, with a default: a master or writer of an older release reads the rest.
    avoid_segments: list[str] = msgspec.field(default_factory=list)


class OffloadTask(msgspec.Struct, array_like=True):
    """Ask the owner client to write ``replica``'s bytes to ``root_fs_dir`` (SSD tier)."""

    key: str
    replica: ReplicaDesc


class ReplicaTask(msgspec.Struct, array_like=True):
    """Ask the client that holds ``source`` (a replica in its own segment) to write its bytes
    into the ranges ``targets`` the master allocated (a copy or move task, a drain unit), then
    answer ``replica_task_done``. ``task_id`` is the original's UUID pair."""

    task_id: tuple[int, int]
    key: str
    source: ReplicaDesc
    targets: list[ReplicaDesc]


class TaskInfo(msgspec.Struct, array_like=True):
    """A copy/move task as ``query_task`` reports it (the original's QueryTaskResponse)."""

    task_id: tuple[int, int]
    type: int  #: 0 REPLICA_COPY, 1 REPLICA_MOVE
    status: int  #: 0 PENDING, 1 PROCESSING, 2 FAILED, 3 SUCCESS (the original's numbers)
    created_at_ms_epoch: int
    last_updated_at_ms_epoch: int
    assigned_client: str
    message: str


class HeartbeatReply(msgspec.Struct, array_like=True):
    need_remount: bool = False
    offload_tasks: list[OffloadTask] = msgspec.field(default_factory=list)
    #: objects in this client's segment removed/overwritten since the last heartbeat, with the
    #: version clock at that time: stop re-reporting entries at or below it
    removed: list[tuple[str, int]] = msgspec.field(default_factory=list)
    removed_all_before: int = 0  #: >0: every entry at or below this version is gone (remove_all, overflow)
    #: copy/move work for this client (its segment holds the source replicas)
    replica_tasks: list[ReplicaTask] = msgspec.field(default_factory=list)


class GetReply(msgspec.Struct, array_like=True):
    replicas: list[ReplicaDesc]
    lease_ttl_ms: int
    #: the granting master's epoch, and how long a read may take before the reader must confirm
    #: (ping) that this epoch still leads before trusting its bytes (0 = no confirmation)
    epoch: int = 0
    confirm_after_ms: int = 0


class Placements(msgspec.Struct, array_like=True):
    """Answer to batch_put_start / batch_upsert_start, packed (layouts in ``packing``): per
    key a code (``i32``, 0 = placed) and its replica count (``u8``); per replica, in key
    order, an index (``u32``) into ``segments`` and its absolute address (``u64``). The
    replicas' sizes are the request's; their status is "processing"."""

    codes: bytes
    counts: bytes
    segments: list[str]
    seg: bytes
    addrs: bytes
    #: > 0: keys answered -200 may be asked for again after this many ms -- the space is held
    #: by reservations or quarantined ranges being taken back (``master_space.SpaceReclaiming``)
    retry_after_ms: int = 0


class BatchGetReply(msgspec.Struct, array_like=True):
    """Answer to batch_get_replica_list, packed like ``Placements``: per key a code (0 =
    found, else -704 ...), its size (``u64``) and its complete memory replicas; disk
    replicas (rare) as ``(key index, replica)``. One lease, epoch and confirmation rule for
    the whole batch (see GetReply)."""

    codes: bytes
    sizes: bytes
    counts: bytes
    segments: list[str]
    seg: bytes
    addrs: bytes
    disk: list[tuple[int, ReplicaDesc]]
    lease_ttl_ms: int
    epoch: int = 0
    confirm_after_ms: int = 0


class BatchPutCommitReply(msgspec.Struct, array_like=True):
    """Answer to batch_put_commit: per key of the request an ``i64`` as batch_put_end's (the
    version > 0, 0 when nothing was published, or a code); the reservation for the client's
    next batch -- one absolute address (``u64``) per reserved object, all in ``segment``
    (none: empty) -- and the epoch of the master that granted it."""

    versions: bytes
    segment: str
    addrs: bytes
    epoch: int = 0


class MountReply(msgspec.Struct, array_like=True):
    """Answer to mount_segment: what the client needs to know about the master's setup."""

    enable_offload: bool = False
    root_fs_dir: str = ""
    client_ttl_s: float = 10.0
    epoch: int = 0  #: pass back as MountSegmentReq.prev_epoch when re-mounting after a master change


class PutCommitReply(msgspec.Struct, array_like=True):
    """Answer to put_commit: the published version (as put_end's), the reservation for the
    next put (no replica: none) and the epoch of the master that granted it."""

    version: int
    reservation: list[ReplicaDesc]
    epoch: int = 0


class MasterInfo(msgspec.Struct, array_like=True):
    version: int
    rpc_address: str
    is_leader: bool
    enable_offload: bool
    root_fs_dir: str
    num_keys: int
    num_segments: int
    epoch: int = 0
    #: the master's wall clock (Unix seconds) when it answered: ``mooncake_doctor`` measures this
    #: host's clock offset against it (0 from masters that predate the field)
    wall_time: float = 0.0


class KeyEventsReply(msgspec.Struct, array_like=True):
    """Answer to WatchKeysReq: ``events`` are ``(seq, kind, key)`` (kind 1 put, 2 remove,
    3 evict, 4 expire); pass ``cursor`` and ``epoch`` back next time. ``gap``: events were
    lost (or this is the first call) -- ``snapshot`` then lists every current key under the
    prefix and replaces what the subscriber knew."""

    events: list[tuple[int, int, str]]
    cursor: int
    gap: bool
    epoch: int
    snapshot: list[str]


# --------------------------------------------------------------------------- requests
class _Req(msgspec.Struct, array_like=True, tag_field="m"):
    pass


class PingReq(_Req, tag="ping"):
    pass


class AuthChallengeReq(_Req, tag="auth_challenge"):
    """First request of a connection when the client has a token: the answer is a fresh nonce
    (empty: this master requires no token). See ``mooncake_core.auth``."""


class AuthReq(_Req, tag="auth"):
    """``HMAC-SHA256(token, "mooncake-master-rpc-v1|" + nonce)``: the answer to the challenge."""

    proof: bytes


class MountSegmentReq(_Req, tag="mount_segment"):
    client_id: str
    segment_name: str
    base: int
    size: int
    prev_epoch: int = 0
    #: more memory of this client (``mount_segment``): kept as ``segment_name#segment_id``
    segment_id: str = ""


class UnmountSegmentReq(_Req, tag="unmount_segment"):
    client_id: str
    segment_name: str
    #: > 0: drain first, unmount when done or after this long (``MasterState.unmount_segment``)
    grace_period_ms: int = 0


class SegmentStatusReq(_Req, tag="segment_status"):
    """(SegmentStatus number, ms until the memory may be reused); 0 once unmounted."""

    client_id: str
    segment_name: str


class HeartbeatReq(_Req, tag="heartbeat"):
    """``release``: addresses of reservations the client lets go of (held unused past their
    age; ``MasterState.release_reservations``). A trailing field with a default: a master
    or client without it reads the others' messages unchanged."""

    client_id: str
    release: list[int] = msgspec.field(default_factory=list)


class ReportObjectsReq(_Req, tag="report_objects"):
    client_id: str
    objects: list[tuple[str, ReplicaDesc]]
    versions: list[int] = msgspec.field(default_factory=list)  #: put_end's version of each object


class PutStartReq(_Req, tag="put_start"):
    """``release``: as HeartbeatReq's -- the reservation this put does not use, freed first."""

    client_id: str
    key: str
    size: int
    cfg: ReplicateConfigMsg
    release: list[int] = msgspec.field(default_factory=list)


class UpsertStartReq(_Req, tag="upsert_start"):
    client_id: str
    key: str
    size: int
    cfg: ReplicateConfigMsg


class PutEndReq(_Req, tag="put_end"):
    client_id: str
    key: str


class PutCommitReq(_Req, tag="put_commit"):
    """``put_end`` of ``key`` plus a reservation for the client's next single put (one round
    trip; see ``MasterState.put_commit``). ``reserved``: ``key`` was written into the
    reservation the client held (no ``put_start``). ``next_size``: bytes to reserve, placed
    by ``cfg`` (0: none). Answer: ``PutCommitReply``."""

    client_id: str
    key: str
    size: int
    cfg: ReplicateConfigMsg
    reserved: bool
    next_size: int


class PutRevokeReq(_Req, tag="put_revoke"):
    client_id: str
    key: str


class BatchPutStartReq(_Req, tag="batch_put_start"):
    """``sizes``: one ``u64`` per key (packed, see ``packing``); ``release``: as PutStartReq's.
    Answer: ``Placements``."""

    client_id: str
    keys: list[str]
    sizes: bytes
    cfg: ReplicateConfigMsg
    release: list[int] = msgspec.field(default_factory=list)


class BatchUpsertStartReq(_Req, tag="batch_upsert_start"):
    client_id: str
    keys: list[str]
    sizes: bytes
    cfg: ReplicateConfigMsg


class BatchPutEndReq(_Req, tag="batch_put_end"):
    """Answer: one ``i64`` per key -- the version (> 0), 0 (nothing published) or a code."""

    client_id: str
    keys: list[str]


class BatchPutCommitReq(_Req, tag="batch_put_commit"):
    """``batch_put_end`` of ``keys`` plus a reservation for the client's next batch, in one
    round trip (see ``master_batch.put_commits``). ``reserved``: the keys were written into
    the batch reservation the client held (no ``batch_put_start``), one per reserved object
    in order, of the ``sizes`` (``u64`` per key) it was asked for. ``next_sizes``: the objects
    to reserve (``u64`` each), placed by ``cfg``; empty: none. Answer: ``BatchPutCommitReply``."""

    client_id: str
    keys: list[str]
    sizes: bytes
    cfg: ReplicateConfigMsg
    reserved: bool
    next_sizes: bytes


class BatchPutRevokeReq(_Req, tag="batch_put_revoke"):
    """Answer: one ``i64`` per key, 0 or a code."""

    client_id: str
    keys: list[str]


class GetReplicaListReq(_Req, tag="get_replica_list"):
    key: str


class BatchGetReplicaListReq(_Req, tag="batch_get_replica_list"):
    keys: list[str]


class ExistKeyReq(_Req, tag="exist_key"):
    key: str


class BatchExistKeyReq(_Req, tag="batch_exist_key"):
    keys: list[str]


class GetSizeReq(_Req, tag="get_size"):
    key: str


class RemoveReq(_Req, tag="remove"):
    key: str
    force: bool = False


class RemoveAllReq(_Req, tag="remove_all"):
    # trailing field with a default: older peers that omit it decode as force=False
    force: bool = False


class RemoveByRegexReq(_Req, tag="remove_by_regex"):
    pattern: str
    force: bool = False


class BatchRemoveReq(_Req, tag="batch_remove"):
    keys: list[str]
    force: bool = False


class OffloadDoneReq(_Req, tag="offload_done"):
    client_id: str
    key: str
    path: str
    size: int


class OffloadFailedReq(_Req, tag="offload_failed"):
    client_id: str
    key: str


class WatchKeysReq(_Req, tag="watch_keys"):
    """Pull the key events after ``after`` (0 = start with a snapshot) under ``prefix``."""

    after: int
    prefix: str = ""
    limit: int = 0
    epoch: int = 0


class CreateCopyTaskReq(_Req, tag="create_copy_task"):
    client_id: str
    key: str
    targets: list[str]


class CreateMoveTaskReq(_Req, tag="create_move_task"):
    client_id: str
    key: str
    source: str
    target: str


class QueryTaskReq(_Req, tag="query_task"):
    task_id: tuple[int, int]


class ReplicaTaskDoneReq(_Req, tag="replica_task_done"):
    """The executing client's answer to a ReplicaTask: ``ok``, or why not in ``message``."""

    client_id: str
    task_id: tuple[int, int]
    ok: bool
    message: str = ""


class BatchReplicaClearReq(_Req, tag="batch_replica_clear"):
    """Drop the replicas of ``keys`` on ``segment_name`` (all of them when empty) whose
    read leases have ended; answers the keys cleared."""

    keys: list[str]
    segment_name: str = ""


Request = Union[
    PingReq, AuthChallengeReq, AuthReq, MountSegmentReq, UnmountSegmentReq, HeartbeatReq, ReportObjectsReq,
    PutStartReq, UpsertStartReq, PutEndReq, PutCommitReq, PutRevokeReq, BatchPutStartReq,
    BatchUpsertStartReq, BatchPutEndReq, BatchPutCommitReq, BatchPutRevokeReq, GetReplicaListReq,
    BatchGetReplicaListReq, ExistKeyReq, BatchExistKeyReq, GetSizeReq, RemoveReq,
    RemoveAllReq, RemoveByRegexReq, BatchRemoveReq, OffloadDoneReq, OffloadFailedReq,
    WatchKeysReq, SegmentStatusReq, CreateCopyTaskReq, CreateMoveTaskReq, QueryTaskReq, ReplicaTaskDoneReq,
    BatchReplicaClearReq,
]

#: result type of each method (what the success payload decodes to)
RESULT_TYPES: dict[type, object] = {
    PingReq: MasterInfo,
    AuthChallengeReq: bytes,
    AuthReq: None,
    MountSegmentReq: MountReply,
    UnmountSegmentReq: None,
    HeartbeatReq: HeartbeatReply,
    ReportObjectsReq: int,
    PutStartReq: list[ReplicaDesc],
    UpsertStartReq: list[ReplicaDesc],
    PutEndReq: int,
    PutCommitReq: PutCommitReply,
    PutRevokeReq: None,
    BatchPutStartReq: Placements,
    BatchUpsertStartReq: Placements,
    BatchPutEndReq: bytes,
    BatchPutCommitReq: BatchPutCommitReply,
    BatchPutRevokeReq: bytes,
    GetReplicaListReq: GetReply,
    BatchGetReplicaListReq: BatchGetReply,
    ExistKeyReq: bool,
    BatchExistKeyReq: list[bool],
    GetSizeReq: int,
    RemoveReq: None,
    RemoveAllReq: int,
    RemoveByRegexReq: int,
    BatchRemoveReq: list[int],
    OffloadDoneReq: None,
    OffloadFailedReq: None,
    WatchKeysReq: KeyEventsReply,
    SegmentStatusReq: tuple[int, int],
    CreateCopyTaskReq: tuple[int, int],
    CreateMoveTaskReq: tuple[int, int],
    QueryTaskReq: TaskInfo,
    ReplicaTaskDoneReq: None,
    BatchReplicaClearReq: list[str],
}

request_encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(Request)
result_encoder = msgspec.msgpack.Encoder()
#: per-request-type decoders of the success payload (built once: decoding is hot)
result_decoders: dict[type, msgspec.msgpack.Decoder] = {
    req: msgspec.msgpack.Decoder(rt) for req, rt in RESULT_TYPES.items()
}

__all__ = [
    "PROTOCOL_VERSION", "MAX_FRAME", "HEADER_SIZE", "REPLY_HEADER_SIZE", "LEN_SIZE", "pack_header",
    "unpack_header", "pack_status", "unpack_status", "unpack_len", "request_frame", "reply_frame",
    "parse_reply", "ReplicaDesc", "ReplicateConfigMsg", "OffloadTask", "ReplicaTask", "TaskInfo", "HeartbeatReply",
    "GetReply", "Placements", "BatchGetReply", "PutCommitReply", "BatchPutCommitReply",
    "MountReply", "MasterInfo", "KeyEventsReply", "Request", "RESULT_TYPES", "request_encoder",
    "request_decoder", "result_encoder", "result_decoders",
] + [t.__name__ for t in RESULT_TYPES]
