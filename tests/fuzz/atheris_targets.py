"""Coverage-guided fuzzing (atheris, libFuzzer's engine for Python) of the decoders a peer's
bytes reach first, in process: the master's request handling (a whole frame through
``MasterServer._handle`` into the real ``MasterState``, no socket), the Transfer Engine's wire
headers, and the vLLM connector's ``kv_transfer_params``.

Why atheris beside the hypothesis-driven surfaces (mooncake_lab/fuzz/surfaces.py): those feed real
servers over sockets at a few hundred inputs/s with structured generators; atheris mutates
inputs towards new branches of the decoders themselves at thousands per second, finding the
malformed-but-almost-valid inputs a generator does not think of.

Oracle per target: only the errors the decoder documents may escape (WireError/struct.error;
ParamsError), and the master answers every frame with a well-formed reply frame whose status
is never INTERNAL_ERROR (its catch-all for a bug in a handler).

    python tests/fuzz/atheris_targets.py master -runs=20000        # libFuzzer flags after the target
"""

from __future__ import annotations

import json
import struct
import sys

import atheris

with atheris.instrument_imports():
    import msgspec

    import mooncake_core.store.protocol as P
    from mooncake_core.pd.params import (PARAMS_VERSION, ParamsError, RemotePrefill, concurrent_decode_params,
                                                 is_pending, parse_pending)
    from mooncake_core.errors import ErrorCode
    from mooncake_core.store.master_records import MasterConfig
    from mooncake_core.store.master_server import MasterServer, _Conn
    from mooncake_core.store.master_state import MasterState
    from mooncake_core.transfer.wire import REQ, RESP, Op, Request, Response, WireError, unpack_request, unpack_response


def _frame(*fields: object) -> bytes:
    """A request frame (header + msgpack body) as the client sends it, without the length."""
    return P.request_frame(1, msgspec.msgpack.encode(list(fields)))[P.LEN_SIZE:]


CFG = [1, False, None, False, []]
SEEDS = [
    _frame("ping"),
    _frame("mount_segment", "fuzz-client", "fuzz-seg", 1 << 20, 64 << 20),
    _frame("put_start", "fuzz-client", "k1", 4096, CFG),
    _frame("put_end", "fuzz-client", "k1"),
    _frame("batch_put_start", "fuzz-client", ["a", "b"], struct.pack("<QQ", 100, 200), CFG),
    _frame("batch_put_end", "fuzz-client", ["a", "b"]),
    _frame("batch_get_replica_list", ["a", "b", "k1"]),
    _frame("batch_exist_key", ["a", "zz"]),
    _frame("heartbeat", "fuzz-client"),
]

PARAMS_SEEDS = [json.dumps(d).encode() for d in (
    {"do_remote_prefill": True, "mooncake_version": PARAMS_VERSION, "mooncake_transfer_id": "e:r:1",
     "mooncake_segment": "127.0.0.1:12345", "remote_block_ids": [3, 1, 2], "remote_num_tokens": 40,
     "mooncake_block_size": 16, "mooncake_block_bytes": 4096, "mooncake_num_slabs": 2,
     "mooncake_lease_expiry": 1.9e9, "mooncake_kv_heads": 2, "mooncake_tp_size": 2,
     "mooncake_segments": ["127.0.0.1:12345", "127.0.0.1:12346"]},
    concurrent_decode_params("e:r:2", "127.0.0.1:12345"),
)]
WIRE_SEEDS = [Request(op=int(op), req_id=7, addr=4096, length=64).pack() for op in Op][:4] + [
    Response(op=1, req_id=7, length=64).pack()]


class MasterTarget:
    def __init__(self) -> None:
        self.server = MasterServer(MasterState(MasterConfig()), "127.0.0.1", 0, auth_token="")
        self.conn = _Conn(None, "atheris", True)  # type: ignore[arg-type]  # no socket is used
        for f in SEEDS:  # a mounted segment and a few objects for the inputs to reach
            self(f)

    def __call__(self, data: bytes) -> None:
        reply = self.server._handle(memoryview(data), self.conn)
        if len(reply) < P.LEN_SIZE or P.unpack_len(reply) != len(reply) - P.LEN_SIZE:
            raise AssertionError(f"reply frame length prefix wrong for input {data[:80]!r}")
        _, _, status, payload = P.parse_reply(reply[P.LEN_SIZE:])
        if status == ErrorCode.INTERNAL_ERROR:
            raise AssertionError(f"internal error for input {data[:120]!r}: {bytes(payload)[:300]!r}")


def wire(data: bytes) -> None:
    for unpack, size in ((unpack_request, REQ.size), (unpack_response, RESP.size)):
        try:  # a header read off the socket is always exactly its size
            unpack(data[:size].ljust(size, b"\0"))
        except WireError:
            pass


def params(data: bytes) -> None:
    try:
        d = json.loads(data)
    except (ValueError, RecursionError):
        return
    try:
        if is_pending(d):
            parse_pending(d)
        else:
            RemotePrefill.from_params(d)
    except ParamsError:
        pass


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in ("master", "wire", "params"):
        sys.exit(f"usage: {argv[0]} master|wire|params [libFuzzer flags]")
    name = argv.pop(1)
    target = MasterTarget() if name == "master" else wire if name == "wire" else params
    if not any(not a.startswith("-") for a in argv[1:]):
        import tempfile  # libFuzzer starts from the seed inputs (a corpus directory)

        seeds = tempfile.mkdtemp(prefix=f"atheris-{name}-")
        for i, f in enumerate({"master": SEEDS, "wire": WIRE_SEEDS, "params": PARAMS_SEEDS}[name]):
            with open(f"{seeds}/seed{i}", "wb") as fh:
                fh.write(f)
        argv.append(seeds)
    atheris.Setup(argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
