"""Fuzz drivers for every surface a peer or a client can reach, shared by the CI tests
(``test_fuzz_*.py``, through hypothesis) and the million-input bench (``bench/robustness/bench_fuzz.py``).

Each driver owns one connection to a *real* server process and turns a ``random.Random`` into
one input: raw garbage, or a structurally valid message with hostile field values. It sends the
input and checks the server's answer against an oracle written here from the protocol's
description (not from the server's code):

* a complete, well-formed request gets a reply within ``timeout`` (else: a hang);
* anything else ends with the server closing the connection once we stop writing (else: a
  hang); garbage must never get a success answer;
* Transfer Engine data ops succeed exactly when every byte is inside registered memory, a read
  returns exactly what the fuzzer's shadow copy says is there, and the target's unregistered
  guard bytes stay untouched (checked by the target process itself, ``te_target.py``);
* HTTP servers never answer 5xx to a client's input (5xx = an internal error = a bug).

Why ``random.Random`` and not hypothesis strategies: the bench needs ~10^6 inputs per surface
and hypothesis costs about a millisecond per example; the tests hand the drivers hypothesis'
``st.randoms()``, so a failure still shrinks and replays.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import time
from collections import Counter
from typing import Any, Callable

import msgspec
import numpy as np

# The protocol constants are the wire format's published contract (docs/transfer-engine.md,
# docs/store-master.md); the oracles below do not reuse any of the servers' checking code.
from mooncake_core.store import protocol as SP
from mooncake_core.transfer import wire as W


class FuzzFailure(AssertionError):
    """A server broke a rule of its surface; the message names the input."""


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    s = socket.create_connection((host, port), timeout=timeout)
    # RST on close: a million short connections must not exhaust ports in TIME_WAIT
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _recv_exact(s: socket.socket, n: int, what: str, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FuzzFailure(f"hang: no complete {what} ({len(out)}/{n} bytes) within the timeout")
        s.settimeout(left)
        try:
            chunk = s.recv(min(n - len(out), 1 << 20))
        except socket.timeout:
            continue
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise ConnectionAbortedError(f"closed while sending {what} ({len(out)}/{n} bytes)")
        out += chunk
    return bytes(out)


def _expect_close(s: socket.socket, timeout: float, what: str) -> None:
    """We stopped writing: the server must close the connection (it may send some bytes first)."""
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        return
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FuzzFailure(f"hang: server kept the connection open after EOF ({what})")
        s.settimeout(left)
        try:
            if not s.recv(1 << 16):
                return
        except socket.timeout:
            continue
        except OSError:
            return


def rand_bytes(rng: random.Random, n: int) -> bytes:
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def rand_json_value(rng: random.Random, depth: int = 0) -> Any:
    k = rng.randrange(9 if depth < 3 else 6)
    if k == 0:
        return None
    if k == 1:
        return rng.choice([True, False])
    if k == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, -(2**63), 2**64, 10**30, rng.randrange(-10**6, 10**6)])
    if k == 3:
        return rng.choice([0.0, -0.0, 1e308, -1e308, 1.5, float(rng.randrange(10**9))])
    if k == 4:
        return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(0, 12)))
    if k == 5:
        return rng.choice(["", "x" * rng.randrange(1000, 5000), "127.0.0.1:1", "../../etc", "\u202e", "%00"])
    if k in (6, 7):
        return [rand_json_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    return {str(rand_json_value(rng, 3)): rand_json_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))}


class _Driver:
    """One persistent connection to the server under test and the dispatch of one input to a
    ``_<kind>`` method (``KINDS`` lists them, repeated names weigh more)."""

    KINDS: tuple[str, ...] = ()

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self.kinds: Counter[str] = Counter()
        self.reconnects = 0

    def _sock(self) -> socket.socket:
        if self.sock is None:
            self.sock = _connect(self.host, self.port, self.timeout)
            self.reconnects += 1
        return self.sock

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def close(self) -> None:
        self._drop()

    def one(self, rng: random.Random) -> str:
        kind = rng.choice(self.KINDS)
        self.kinds[kind] += 1
        try:
            getattr(self, "_" + kind)(rng)
        except (ConnectionAbortedError, ConnectionResetError, BrokenPipeError):
            self._drop()  # the server closed: allowed whenever the oracle did not demand a reply
        except BaseException:
            self._drop()  # never carry a half-read exchange into the next input
            raise
        return kind


# =========================================================================== Transfer Engine
class TeWireFuzzer(_Driver):
    """Raw-socket fuzzer of a Transfer Engine's rpc port (data, vectored and control ops)."""

    KINDS = ("raw", "data", "data", "data", "vec", "vec", "ctl", "hdr")

    def __init__(self, host: str, port: int, base: int, size: int, initial: bytes, *,
                 timeout: float = 5.0) -> None:
        super().__init__(host, port, timeout)
        self.base, self.size = base, size
        self.shadow = bytearray(initial)  # what the registered bytes must hold

    def in_bounds(self, addr: int, length: int) -> bool:
        return length == 0 or (self.base <= addr and addr + length <= self.base + self.size)

    def _addr(self, rng: random.Random) -> int:
        b, n = self.base, self.size
        return rng.choice([b, b + 1, b - 1, b + n - 1, b + n, b + n + 1, b + rng.randrange(n), b - 4096,
                           0, 1, 2**62 - 1, 2**62, 2**63, 2**64 - 1, rng.getrandbits(64),
                           b + rng.randrange(n)]) & (2**64 - 1)

    def _len(self, rng: random.Random) -> int:
        n = self.size
        return rng.choice([0, 1, 8, 4096, n, n - 1, n + 1, rng.randrange(1, 4096), rng.randrange(1, n),
                           2**32, 2**63, 2**64 - 1, rng.randrange(1, 512)])

    def _header(self, op: int, rid: int, addr: int, length: int, aux_len: int, *, magic: int = W.MAGIC,
                version: int = W.WIRE_VERSION, flags: int = 0) -> bytes:
        return W.REQ.pack(magic & 0xFFFFFFFF, version & 0xFFFF, op & 0xFF, flags & 0xFF, rid, addr & (2**64 - 1),
                          length & (2**64 - 1), aux_len & 0xFFFFFFFF, 0)

    def _reply(self, rid: int, what: str, must: bool = False) -> tuple[int, bytes, int]:
        """(status, aux, payload length) of the reply to request ``rid``. ``must``: the request
        was well-formed and in bounds, so closing the connection instead is a failure too."""
        s = self._sock()
        deadline = time.monotonic() + self.timeout
        try:
            hdr = _recv_exact(s, W.RESP.size, f"reply header to {what}", deadline)
        except (ConnectionAbortedError, ConnectionResetError) as e:
            if must:
                raise FuzzFailure(f"{what}: well-formed and in bounds, but the connection was closed ({e})") from None
            raise
        magic, ver, _op, _f, got_rid, status, aux_len, length = W.RESP.unpack(hdr)
        if magic != W.MAGIC or got_rid != rid:
            raise FuzzFailure(f"{what}: bad reply header magic={magic:#x} rid={got_rid} (want {rid})")
        aux = _recv_exact(s, aux_len, f"reply aux to {what}", deadline) if aux_len else b""
        return status, aux, length

    def resync(self) -> None:
        """After a write whose payload we cut short, the target holds some of it: read it all."""
        self._drop()
        rid = 1 << 40
        self._sock().sendall(self._header(W.Op.READ, rid, self.base, self.size, 0))
        status, aux, length = self._reply(rid, "resync READ", must=True)
        if status != 0 or length != self.size:
            raise FuzzFailure(f"in-bounds READ of the whole region refused: {status} {aux[:200]!r}")
        self.shadow[:] = _recv_exact(self._sock(), length, "resync payload", time.monotonic() + self.timeout)

    # -------------------------------------------------------------- the kinds of input
    def _raw(self, rng: random.Random) -> None:
        data = rand_bytes(rng, rng.randrange(0, 120))
        if rng.random() < 0.5:  # plausible start: our magic and version, then garbage
            data = struct.pack("<IH", W.MAGIC, W.WIRE_VERSION) + data
        s = self._sock()
        s.sendall(data)
        _expect_close(s, self.timeout, f"raw {data[:48].hex()}")
        self._drop()

    def _hdr(self, rng: random.Random) -> None:
        rid = rng.getrandbits(64)
        variant = rng.randrange(4)
        if variant == 0:
            h = self._header(rng.choice(list(W.Op)), rid, self.base, 8, 0, magic=rng.getrandbits(32))
        elif variant == 1:
            h = self._header(W.Op.PROBE, rid, 0, 0, 0, version=rng.choice([0, 2, 255, 65535]))
        elif variant == 2:
            h = self._header(rng.randrange(max(W.Op) + 1, 256), rid, 0, 0, rng.randrange(0, 64))  # unknown ops
        else:
            h = self._header(rng.choice(list(W.Op)), rid, 0, 0, W.MAX_AUX + 1 + rng.randrange(2**20))
        s = self._sock()
        s.sendall(h)
        if variant in (1, 2):  # a reply naming the problem, then the close
            status, aux, _ = self._reply(rid, f"header variant {variant}")
            if status == 0 or not aux:
                raise FuzzFailure(f"header variant {variant} answered {status} {aux[:100]!r}: must be an error")
        _expect_close(s, self.timeout, f"header variant {variant}")
        self._drop()

    def _data(self, rng: random.Random) -> None:
        op = rng.choice([W.Op.WRITE, W.Op.READ])
        addr, length = self._addr(rng), self._len(rng)
        if rng.random() < 0.5:  # mostly near or inside the region
            length = rng.randrange(0, self.size + 2)
            addr = self.base + rng.randrange(-2, self.size + 2)
        aux = rand_bytes(rng, rng.randrange(1, 64)) if rng.random() < 0.15 else b""
        rid = rng.getrandbits(64)
        ok = self.in_bounds(addr, length)
        s = self._sock()
        s.sendall(self._header(op, rid, addr, length, len(aux)) + aux)
        what = f"{op.name} addr={addr:#x} len={length} aux={len(aux)}"
        if op == W.Op.WRITE:
            if length > 4 * self.size:  # we will not send 2^63 bytes: stop and expect a close
                _expect_close(s, self.timeout, what)
                self._drop()
                return
            payload = rand_bytes(rng, length)
            if rng.random() < 0.1 and length > 1:  # cut short, then EOF
                s.sendall(payload[:rng.randrange(length)])
                _expect_close(s, self.timeout, what + " (payload cut short)")
                self._drop()
                if ok:
                    self.resync()
                return
            s.sendall(payload)
            status, err, _ = self._reply(rid, what, must=ok)
            if ok and status != 0:
                raise FuzzFailure(f"{what}: in bounds but refused with {status} {err[:200]!r}")
            if not ok and status == 0:
                raise FuzzFailure(f"{what}: OUTSIDE registered memory but answered OK")
            if ok and length:
                off = addr - self.base
                self.shadow[off:off + length] = payload
            return
        status, err, plen = self._reply(rid, what, must=ok)
        if not ok:
            if status == 0:
                raise FuzzFailure(f"{what}: OUTSIDE registered memory but answered OK ({plen} bytes)")
            return
        if status != 0:
            raise FuzzFailure(f"{what}: in bounds but refused with {status} {err[:200]!r}")
        if plen != length:
            raise FuzzFailure(f"{what}: reply carries {plen} bytes, asked {length}")
        got = _recv_exact(s, plen, what + " payload", time.monotonic() + self.timeout)
        off = addr - self.base
        if got != bytes(self.shadow[off:off + length]):
            raise FuzzFailure(f"{what}: returned bytes differ from what was written there")

    def _vec(self, rng: random.Random) -> None:
        op = rng.choice([W.Op.WRITEV, W.Op.READV])
        n = rng.choice([0, 1, 2, rng.randrange(1, 64), 1024, 1025, rng.randrange(1, 1100)])
        blocks = []
        for _ in range(n):
            if rng.random() < 0.9:
                ln = rng.randrange(0, 2048)
                a = self.base + rng.randrange(0, self.size - ln + 1)
            else:
                a, ln = self._addr(rng), rng.choice([self._len(rng), rng.randrange(0, 64)])
            blocks.append((a & (2**64 - 1), ln & (2**64 - 1)))
        aux = b"".join(struct.pack("<QQ", a, ln) for a, ln in blocks)
        total = sum(ln for _, ln in blocks)
        mangle = rng.random()
        if mangle < 0.05 and aux:
            aux = aux[:-rng.randrange(1, 16)]  # not a whole number of entries
        elif mangle < 0.1:
            total = (total + rng.choice([1, -1, 2**40])) % 2**64  # lengths do not add up
        well_formed = mangle >= 0.1 and 1 <= n <= 1024 and total <= 64 << 20
        ok = well_formed and all(self.in_bounds(a, ln) for a, ln in blocks)
        rid = rng.getrandbits(64)
        s = self._sock()
        s.sendall(self._header(op, rid, 0, total, len(aux)) + aux)
        what = f"{op.name} of {n} blocks total={total} mangle={mangle:.2f}"
        if op == W.Op.WRITEV:
            if not well_formed or total > 4 * self.size:
                _expect_close(s, self.timeout, what)
                self._drop()
                return
            payload = rand_bytes(rng, total)
            s.sendall(payload)
            status, err, _ = self._reply(rid, what, must=ok)
            if ok and status != 0:
                raise FuzzFailure(f"{what}: all blocks in bounds but refused with {status} {err[:200]!r}")
            if not ok and status == 0:
                raise FuzzFailure(f"{what}: a block OUTSIDE registered memory but answered OK")
            if ok:
                pos = 0
                for a, ln in blocks:
                    off = a - self.base
                    self.shadow[off:off + ln] = payload[pos:pos + ln]
                    pos += ln
            return
        if not well_formed:
            _expect_close(s, self.timeout, what)
            self._drop()
            return
        status, err, plen = self._reply(rid, what, must=ok)
        if not ok:
            if status == 0:
                raise FuzzFailure(f"{what}: a block OUTSIDE registered memory but answered OK")
            return
        if status != 0 or plen != total:
            raise FuzzFailure(f"{what}: in bounds but answered {status} with {plen} bytes: {err[:200]!r}")
        got = _recv_exact(s, plen, what + " payload", time.monotonic() + self.timeout)
        want = b"".join(bytes(self.shadow[a - self.base:a - self.base + ln]) for a, ln in blocks)
        if got != want:
            raise FuzzFailure(f"{what}: returned bytes differ from what was written there")

    def _ctl(self, rng: random.Random) -> None:
        op = rng.choice([W.Op.GET_DESC, W.Op.PROBE, W.Op.NOTIFY, W.Op.NOTIFY])
        valid_notify = False
        if op == W.Op.NOTIFY:
            k = rng.randrange(4)
            if k == 0:
                aux = json.dumps({"name": str(rand_json_value(rng)), "msg": str(rand_json_value(rng))}).encode()
                valid_notify = True
            elif k == 1:
                aux = json.dumps(rand_json_value(rng)).encode()
            elif k == 2:
                aux = rand_bytes(rng, rng.randrange(0, 200))
            else:
                aux = b'{"name": "a", "msg": ' + rand_bytes(rng, 20)
        else:
            aux = rand_bytes(rng, rng.randrange(0, 40)) if rng.random() < 0.3 else b""
        rid = rng.getrandbits(64)
        s = self._sock()
        s.sendall(self._header(op, rid, rng.getrandbits(64), rng.choice([0, rng.getrandbits(64)]), len(aux)) + aux)
        what = f"{op.name} aux={aux[:60]!r}"
        if op == W.Op.NOTIFY and not valid_notify:
            # malformed notify: an error or a close, never a hang and never a success
            try:
                status, _, _ = self._reply(rid, what)
            except ConnectionAbortedError:
                self._drop()
                return
            if status == 0 and not _is_notify(aux):
                raise FuzzFailure(f"{what}: malformed notification accepted")
            return
        status, body, _ = self._reply(rid, what, must=True)
        if status != 0:
            raise FuzzFailure(f"{what}: control op refused with {status} {body[:200]!r}")
        if op == W.Op.GET_DESC:
            json.loads(body)  # the descriptor must be JSON


def _is_notify(aux: bytes) -> bool:
    try:
        d = json.loads(aux)
    except ValueError:
        return False
    return isinstance(d, dict) and "name" in d and "msg" in d


# =========================================================================== store master RPC
_TAGS = [t.__struct_config__.tag for t in SP.RESULT_TYPES]


class MasterRpcFuzzer(_Driver):
    """Frames to the store master's RPC port: garbage, bad framing, valid framing with hostile
    msgpack bodies (known method names with values of random types and sizes)."""

    KINDS = ("raw", "frame", "frame", "frame", "frame", "badlen", "version")

    def __init__(self, host: str, port: int, *, timeout: float = 5.0) -> None:
        super().__init__(host, port, timeout)
        self.statuses: Counter[int] = Counter()

    def _value(self, rng: random.Random, depth: int = 0) -> Any:
        k = rng.randrange(10 if depth < 2 else 7)
        if k == 0:
            return None
        if k == 1:
            return rng.choice([True, False])
        if k == 2:
            return rng.choice([0, 1, -1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, rng.randrange(1 << 40),
                               rng.randrange(-100, 100)])
        if k == 3:
            return rng.choice([0.5, -1e300, float("inf"), float("nan")])
        if k == 4:  # keys and names: mostly fuzz-owned, sometimes hostile
            return rng.choice(["fuzz/" + str(rng.randrange(1000)), "", "x" * rng.randrange(1, 3000),
                               "127.0.0.1:" + str(rng.randrange(70000)), "(a|aa)+$", "a" * 40 + "!", ".*", "[", "\x00"])
        if k == 5:
            return rand_bytes(rng, rng.randrange(0, 64))
        if k == 6:
            return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(0, 10)))
        if k in (7, 8):
            return [self._value(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 3, rng.randrange(0, 300)]))]
        return {str(self._value(rng, 2)): self._value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}

    def _body(self, rng: random.Random) -> bytes:
        tag = rng.choice(_TAGS) if rng.random() < 0.9 else self._value(rng, 2)
        if tag in ("remove_all", "remove_by_regex") and rng.random() < 0.9:
            tag = "ping"  # rarely wipe the store: the liveness client's keys should mostly survive
        fields = [self._value(rng) for _ in range(rng.randrange(0, 9))]
        obj: Any = [tag, *fields] if rng.random() < 0.95 else self._value(rng)
        return msgspec.msgpack.encode(obj)

    def _read_reply(self, rid: int, what: str) -> int:
        s = self._sock()
        deadline = time.monotonic() + self.timeout
        n = SP.unpack_len(_recv_exact(s, SP.LEN_SIZE, f"reply length to {what}", deadline))
        if n < SP.REPLY_HEADER_SIZE or n > SP.MAX_FRAME:
            raise FuzzFailure(f"{what}: reply frame length {n} out of range")
        _ver, got, status, _ = SP.parse_reply(_recv_exact(s, n, f"reply to {what}", deadline))
        if got != rid:
            raise FuzzFailure(f"{what}: reply carries request id {got}, sent {rid}")
        self.statuses[status] += 1
        return status

    def _raw(self, rng: random.Random) -> None:
        data = rand_bytes(rng, rng.randrange(1, 100))
        s = self._sock()
        s.sendall(data)
        # a length prefix that promises more than we sent: the master waits, then sees EOF
        _expect_close(s, self.timeout, f"raw {data[:40].hex()}")
        self._drop()

    def _frame(self, rng: random.Random) -> None:
        rid = rng.getrandbits(64)
        body = self._body(rng)
        self._sock().sendall(SP.request_frame(rid, body))
        self._read_reply(rid, f"frame {body[:60]!r}")

    def _version(self, rng: random.Random) -> None:
        rid = rng.getrandbits(64)
        ver = rng.choice([v for v in (0, 1, 2, 3, 4, 65535) if v != SP.PROTOCOL_VERSION])
        self._sock().sendall(SP.request_frame(rid, self._body(rng), version=ver))
        status = self._read_reply(rid, f"version {ver}")
        if status == 0:
            raise FuzzFailure(f"a request of protocol version {ver} was served")

    def _badlen(self, rng: random.Random) -> None:
        body = self._body(rng)
        n = rng.choice([0, 1, SP.HEADER_SIZE - 1, SP.MAX_FRAME + 1, 2**32 - 1])
        s = self._sock()
        s.sendall(struct.pack(">I", n) + struct.pack(">HQ", SP.PROTOCOL_VERSION, 1)[:max(0, n)] + body[:8])
        _expect_close(s, self.timeout, f"frame length {n}")
        self._drop()


# =========================================================================== HTTP surfaces
class HttpFuzzer:
    """Raw HTTP/1.1 requests to an aiohttp server (metadata server, proxy): hostile methods,
    paths, queries, headers and bodies. Rule: never a 5xx, never a hang; the server answers
    the next valid request (checked by the caller's ``liveness``)."""

    def __init__(self, host: str, port: int, routes: list[tuple[str, str]],
                 body_gen: Callable[[random.Random], bytes], *, timeout: float = 10.0,
                 grace: float = 1.0, allowed_5xx: tuple[int, ...] = (),
                 documented_5xx: Callable[[bytes, bytes], bool] | None = None) -> None:
        self.host, self.port, self.routes, self.body_gen = host, port, routes, body_gen
        self.timeout, self.grace = timeout, grace
        self.allowed_5xx = allowed_5xx
        #: (request, response) -> True for a 5xx the service documents as a correct answer
        #: (the proxy's /health says 503 + why when it cannot serve); counted, not a failure
        self.documented_5xx = documented_5xx
        self.kinds: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()

    def _request(self, rng: random.Random) -> bytes:
        method, path = rng.choice(self.routes)
        if rng.random() < 0.1:
            method = rng.choice(["GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO"])
        q = rng.random()
        if q < 0.3:
            path += "?key=" + rng.choice(["", "a", "fuzz/" + str(rng.randrange(100)), "%ZZ", "%00",
                                          "x" * rng.randrange(1, 4000), "mooncake/ram/%2e%2e"])
        elif q < 0.4:
            path += "?" + "&".join(f"{rand_bytes(rng, 3).hex()}={rng.randrange(9)}" for _ in range(rng.randrange(5)))
        elif q < 0.45:
            path += "?prefix=" + rng.choice(["", "mooncake/", "%", "fuzz"])
        elif q < 0.5:
            path = "/" + rand_bytes(rng, rng.randrange(0, 30)).hex()
        body = self.body_gen(rng) if method in ("PUT", "POST", "PATCH") or rng.random() < 0.1 else b""
        headers = [f"Host: {self.host}", "Connection: close"]
        if rng.random() < 0.9:
            headers.append(f"Content-Length: {len(body)}")
        if rng.random() < 0.3:
            headers.append("Content-Type: " + rng.choice(["application/json", "text/plain", "", "multipart/x"]))
        if rng.random() < 0.05:
            headers.append("Transfer-Encoding: chunked")
        if rng.random() < 0.05:
            headers.append("X-" + "a" * rng.randrange(1, 9000) + ": 1")
        return f"{method} {path} HTTP/1.1\r\n".encode("latin-1", "replace") + \
            "\r\n".join(headers).encode("latin-1", "replace") + b"\r\n\r\n" + body

    def one(self, rng: random.Random) -> str:
        """Send one request and read the answer. A complete request must be answered while we
        keep our side open (an early half-close reads as a client that went away, and servers
        rightly cancel the work); after ``grace`` s without an answer we half-close, and then the
        server must answer or close within ``timeout`` (an incomplete request)."""
        raw = rng.random() < 0.1
        self.kinds["raw" if raw else "http"] += 1
        data = rand_bytes(rng, rng.randrange(1, 200)) if raw else self._request(rng)
        s = _connect(self.host, self.port, self.timeout)
        resp = bytearray()
        try:
            try:
                s.sendall(data)
            except OSError:
                return "closed"
            half_closed = False
            deadline = time.monotonic() + self.grace
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    if half_closed:
                        raise FuzzFailure(f"hang: no answer and no close after EOF for {data[:120]!r}")
                    try:
                        s.shutdown(socket.SHUT_WR)
                    except OSError:
                        break
                    half_closed, deadline = True, time.monotonic() + self.timeout
                    continue
                s.settimeout(left)
                try:
                    chunk = s.recv(1 << 16)
                except socket.timeout:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                resp += chunk
        finally:
            s.close()
        if resp.startswith(b"HTTP/1."):
            try:
                status = int(resp.split(b" ", 2)[1])
            except (IndexError, ValueError):
                raise FuzzFailure(f"unparseable status line {bytes(resp[:80])!r}") from None
            self.statuses[status] += 1
            if status >= 500 and self.documented_5xx is not None and self.documented_5xx(data, bytes(resp)):
                self.kinds["documented-5xx"] += 1
            elif status >= 500 and status not in self.allowed_5xx:
                raise FuzzFailure(f"HTTP {status} for {data[:200]!r}: {bytes(resp[:400])!r}")
        else:
            self.statuses[0] += 1  # closed without an HTTP answer
        return "http"


def metadata_routes() -> list[tuple[str, str]]:
    return [("GET", "/metadata"), ("PUT", "/metadata"), ("DELETE", "/metadata"), ("GET", "/health"),
            ("GET", "/metrics"), ("POST", "/metadata")]


def proxy_routes() -> list[tuple[str, str]]:
    return [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/generate"),
            ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/healthcheck"), ("GET", "/metrics"),
            ("GET", "/admin/instances"), ("POST", "/admin/instances"), ("DELETE", "/admin/instances")]


def proxy_health_503(request: bytes, response: bytes) -> bool:
    """The proxy's /health (and /healthcheck) answers 503 with ``can_serve: false`` and its
    reasons while no instance of a role answers its probes -- the documented answer (a load
    balancer must see it), which a machine loaded enough to delay the engines' probes past
    their timeout does produce. Any other 5xx stays a failure."""
    line = request.split(b"\r\n", 1)[0]
    if not (line.startswith(b"GET /health") and response.startswith(b"HTTP/1.1 503")):
        return False
    try:
        body = json.loads(response.split(b"\r\n\r\n", 1)[1])
    except (IndexError, ValueError):
        return False
    return isinstance(body, dict) and body.get("can_serve") is False and bool(body.get("reasons"))


def json_body(rng: random.Random) -> bytes:
    """Mostly completion-shaped JSON with hostile values, sometimes not JSON at all."""
    k = rng.random()
    if k < 0.1:
        return rand_bytes(rng, rng.randrange(0, 300))
    if k < 0.2:
        return json.dumps(rand_json_value(rng)).encode()
    body: dict[str, Any] = {}
    for key in ("model", "prompt", "messages", "max_tokens", "stream", "temperature", "n",
                "kv_transfer_params", "role", "url", "bootstrap_port", "text", "input_ids",
                "stream_options", "max_completion_tokens", "sampling_params"):
        if rng.random() < 0.4:
            body[key] = rand_json_value(rng)
    if rng.random() < 0.5:
        body["prompt"] = rng.choice(["hello", "x " * rng.randrange(1, 3000), [1, 2, 3], [[1, 2], [3]], ""])
    if rng.random() < 0.3:
        body["messages"] = [{"role": rand_json_value(rng), "content": rand_json_value(rng)}
                            for _ in range(rng.randrange(0, 3))]
    if rng.random() < 0.5:
        body["max_tokens"] = rng.choice([1, 2, 0, -1, 2**40, "3", None])
    return json.dumps(body).encode()


def check_shadow_matches(buf: np.ndarray, shadow: bytes | bytearray, what: str) -> None:
    if bytes(buf) != bytes(shadow):
        diff = int(np.flatnonzero(buf != np.frombuffer(bytes(shadow), dtype=np.uint8))[0])
        raise FuzzFailure(f"{what}: registered memory differs from the fuzzer's model at offset {diff}")


# =========================================================================== P2P handshake
class EvilPeer:
    """A fake Transfer Engine peer that answers *our* engine's requests (descriptor fetch,
    reads, writes, probes) with replies chosen per input: valid, mutated, truncated, garbage,
    closed or late. The engine under test must return 0 or an error within its timeout, never
    hang, crash, or touch memory outside the local range it was given."""

    def __init__(self) -> None:
        import threading

        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.segment = f"127.0.0.1:{self.port}"
        self.plan: dict[str, Any] = {}
        self.served: Counter[str] = Counter()
        self.region = (0x7F0000000000, 1 << 20)  # what the descriptor claims by default
        self.last_read_payload = b""
        self._stop = threading.Event()
        self._threads: list[Any] = []
        t = threading.Thread(target=self._accept, daemon=True, name="evil-peer")
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        self.lsock.close()

    def _accept(self) -> None:
        import threading

        while not self._stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def descriptor(self, rng: random.Random, victim: dict | None) -> bytes:
        base, size = self.region
        d: dict[str, Any] = {"version": 1, "name": self.segment, "protocol": "tcp", "host": "127.0.0.1",
                             "port": self.port, "tcp_data_port": self.port,
                             "buffers": [{"addr": base, "length": size, "name": "cpu:0", "location": "cpu:0"}],
                             "boot_id": "", "pidns": "", "pid": 0, "start_time": 0, "generation": 1}
        k = rng.randrange(12)
        if k == 0:
            d["version"] = rng.choice([0, 2, "1", None])
        elif k == 1:
            d["buffers"] = rand_json_value(rng)
        elif k == 2:
            d["buffers"] = [{"addr": rng.choice([-1, 2**64, 2**70, "x", None]), "length": rng.choice([-5, 2**64])}]
        elif k == 3:
            d["port"] = rng.choice([0, -1, 70000, "p", None])
        elif k == 4:
            del d[rng.choice(["host", "port"])]
        elif k == 5 and victim is not None:
            # claims to be another process on this host, owning its memory: writes through
            # cross-memory attach would land in the victim, unless the engine verifies the claim
            d.update(boot_id=victim["boot_id"], pidns=victim["pidns"], pid=victim["pid"],
                     start_time=victim.get("start_time", 0),
                     buffers=[{"addr": victim["addr"], "length": victim["length"], "name": "cpu:0"}])
        elif k == 6:
            d["host"] = rng.choice(["", "::1", "256.1.1.1", "x" * 300])
        elif k == 7:
            return rand_bytes(rng, rng.randrange(0, 100))
        elif k == 8:
            return json.dumps(rand_json_value(rng)).encode()
        return json.dumps(d).encode()

    def _serve(self, c: socket.socket) -> None:
        c.settimeout(30)
        try:
            while True:
                hdr = _recv_exact(c, W.REQ.size, "request", time.monotonic() + 30)
                _m, _v, op, _f, rid, addr, length, aux_len, _ = W.REQ.unpack(hdr)
                if aux_len:
                    _recv_exact(c, aux_len, "aux", time.monotonic() + 30)
                if op == W.Op.WRITE and length:
                    _recv_exact(c, length, "payload", time.monotonic() + 30)
                name = W.Op(op).name if op in W.Op._value2member_map_ else str(op)
                self.served[name] += 1
                how = self.plan.get("how", "ok")
                if how == "close":
                    return
                if how == "late":
                    time.sleep(self.plan.get("late_s", 3.0))
                if how == "garbage":
                    c.sendall(self.plan.get("garbage", b"\xff" * 32))
                    return
                status = self.plan.get("status", 0)
                if op == W.Op.GET_DESC:
                    aux = self.plan["desc"]
                    c.sendall(W.Response(op, rid, status, len(aux)).pack() + aux)
                    continue
                if op == W.Op.READ or op == W.Op.READV:
                    n = self.plan.get("reply_len", length)
                    payload = self.plan.get("payload", b"")[:n]
                    self.last_read_payload = payload
                    if self.plan.get("bad_rid"):
                        rid ^= 1
                    c.sendall(W.Response(op, rid, status, 0, n).pack() + payload)
                    if len(payload) < n:  # promised more than it sends
                        return
                    continue
                aux = self.plan.get("err", b"")
                c.sendall(W.Response(op, rid ^ int(bool(self.plan.get("bad_rid"))), status, len(aux)).pack() + aux)
        except (OSError, ConnectionAbortedError, FuzzFailure, ValueError):
            pass
        finally:
            c.close()

    def new_plan(self, rng: random.Random, victim: dict | None, length: int, late_weight: float = 1 / 9) -> None:
        """The replies for the next call. ``late_weight``: share of answers held back past the
        engine's timeout (each costs a timeout; the million-input bench keeps it small)."""
        how = "late" if rng.random() < late_weight else rng.choice(
            ["ok", "ok", "ok", "close", "garbage", "status", "short", "bad_rid"])
        plan: dict[str, Any] = {"how": how if how in ("ok", "close", "late", "garbage") else "ok",
                                "desc": self.descriptor(rng, victim)}
        plan["payload"] = rand_bytes(rng, length)
        if how == "status":
            plan["status"] = rng.choice([-1, -10, -600, 1, 2**31 - 1])
            plan["err"] = rand_bytes(rng, rng.randrange(0, 50))
        elif how == "short":
            plan["reply_len"] = rng.choice([0, max(0, length - 1), length + 1, 2**40])
        elif how == "bad_rid":
            plan["bad_rid"] = True
        elif how == "garbage":
            plan["garbage"] = rand_bytes(rng, rng.randrange(1, 64))
        self.plan = plan
