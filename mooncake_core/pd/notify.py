"""The notifications the two workers of a P2P hand-off send each other (pure, no vLLM import).

Why typed: a notification comes from another instance over the Transfer Engine's notify channel,
so it is untrusted input. ``decode`` turns its text into one of the messages below or raises
``NotifyError`` saying what was wrong; ``encode`` is the only place that writes them. The
notification's name is the transfer id; its text is one of (the forms every release of the
connector speaks, so instances of different versions still hand off to each other)::

    want <decode segment>                       decode -> prefill: send me ``ready`` when you finish
    ready <JSON of RemotePrefill.to_params()>   prefill -> decode: the blocks are ready, read them
    done | failed | release [<sender>/<readers>]   decode -> prefill: free the blocks
    clock? <decode segment>                     decode -> prefill: what time is it on your host?
    clock= <prefill segment> <its wall clock>   prefill -> decode: the answer, stamped on receipt

``ready`` and ``want`` belong to the concurrent hand-off (``params.concurrent_*_params``); the
confirmations to every hand-off. A confirmation names its sender and the number of readers when
several decode ranks read one prefill rank (decode TP > prefill TP): the prefill frees the
blocks once all of them confirmed. The count travels in the message, like NixlConnector's
``"<request id>:<consumers>"``, because the prefill answers before it knows which decode reads.
The clock messages concern no transfer (their notification name is ``CLOCK_NAME``): a prefill
states its lease expiry on its own wall clock, and the decode measures that clock's offset
against its own with one round trip (``mooncake_connectors.vllm.peer_clock``). A prefill of an
older release ignores ``clock?`` (it logs an unknown notification); the decode then takes the
prefill's clock as its own.
"""

from __future__ import annotations

from typing import Literal, Union

import math

import msgspec

from mooncake_core.pd.params import MAX_TP, ParamsError, RemotePrefill

#: Longest segment name accepted in a ``want`` or a clock message (ours are "host:port").
MAX_SEGMENT = 1024
#: Notification name of the clock messages (they concern no transfer).
CLOCK_NAME = "clock"
#: Longest wall-clock text accepted in a ``clock=`` (a float's repr is at most 24 characters).
MAX_WALL_TEXT = 32

Kind = Literal["done", "failed", "release"]
#: The confirmation kinds: ``done`` (read), ``failed`` (the read failed), ``release`` (will not read).
CONFIRMATIONS: tuple[Kind, ...] = ("done", "failed", "release")


class NotifyError(ValueError):
    """A notification is malformed. ``kind`` is the message it claimed to be (``want``,
    ``ready``, a confirmation kind) or None when it names none of ours."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


def _check_segment(s: str, kind: str, whose: str) -> None:
    if not 0 < len(s) <= MAX_SEGMENT or any(c.isspace() or not c.isprintable() for c in s):
        raise NotifyError(f"{kind}: the {whose} segment must be 1..{MAX_SEGMENT} printable characters without "
                          f"spaces, got {s!r:.80}", kind)


class Want(msgspec.Struct, frozen=True):
    """Decode -> prefill: send ``ready`` for this transfer to ``segment`` once the request finished."""

    segment: str

    def __post_init__(self) -> None:
        _check_segment(self.segment, "want", "decode")


class ClockQuery(msgspec.Struct, frozen=True):
    """Decode -> prefill: answer with your wall clock to ``segment`` (the decode's)."""

    segment: str

    def __post_init__(self) -> None:
        _check_segment(self.segment, "clock?", "decode")


class ClockAnswer(msgspec.Struct, frozen=True):
    """Prefill -> decode: the prefill at ``segment`` read ``wall`` (Unix seconds) on its clock when
    the query arrived."""

    segment: str
    wall: float

    def __post_init__(self) -> None:
        _check_segment(self.segment, "clock=", "prefill")
        if not (math.isfinite(self.wall) and self.wall > 0):
            raise NotifyError(f"clock=: the wall clock must be a positive finite number of seconds, got "
                              f"{self.wall!r}", "clock=")


class Ready(msgspec.Struct, frozen=True):
    """Prefill -> decode: the finished request's blocks, where and until when they are held."""

    remote: RemotePrefill


class Confirmation(msgspec.Struct, frozen=True):
    """Decode rank ``sender`` of ``readers`` is done with the transfer's blocks (read, failed, or
    not reading)."""

    kind: Kind
    sender: int = 0
    readers: int = 1

    def __post_init__(self) -> None:
        if self.kind not in CONFIRMATIONS:
            raise NotifyError(f"not a confirmation kind: {self.kind!r} (one of {', '.join(CONFIRMATIONS)})")
        if not 0 <= self.sender < self.readers <= MAX_TP:
            raise NotifyError(f"{self.kind}: decode rank {self.sender} of {self.readers} readers (1..{MAX_TP})",
                              self.kind)


Message = Union[Want, Ready, Confirmation, ClockQuery, ClockAnswer]


def encode(msg: Message) -> str:
    """The notification text of ``msg``."""
    if isinstance(msg, Want):
        return f"want {msg.segment}"
    if isinstance(msg, Ready):
        return "ready " + msgspec.json.encode(msg.remote.to_params()).decode()
    if isinstance(msg, ClockQuery):
        return f"clock? {msg.segment}"
    if isinstance(msg, ClockAnswer):
        return f"clock= {msg.segment} {msg.wall!r}"
    return msg.kind if msg.readers == 1 else f"{msg.kind} {msg.sender}/{msg.readers}"


def decode(text: str) -> Message:
    """The message a notification's text holds; raises ``NotifyError`` naming what is wrong."""
    head, sep, tail = text.partition(" ")
    if head == "want" and sep:
        return Want(tail)
    if head == "ready" and sep:
        try:
            params = msgspec.json.decode(tail)
        except msgspec.MsgspecError as e:
            raise NotifyError(f"ready: the payload is not JSON ({e})", "ready") from None
        try:
            return Ready(RemotePrefill.from_params(params))
        except ParamsError as e:
            raise NotifyError(f"ready: {e}", "ready") from None
    if head == "clock?" and sep:
        return ClockQuery(tail)
    if head == "clock=" and sep:
        seg, sep2, wall = tail.partition(" ")
        try:
            if not sep2 or len(wall) > MAX_WALL_TEXT or not wall.isascii():
                raise ValueError
            value = float(wall)
        except ValueError:
            raise NotifyError(f"clock=: expected 'clock= <prefill segment> <seconds>', got {text!r:.80}",
                              "clock=") from None
        return ClockAnswer(seg, value)
    if head in CONFIRMATIONS:
        if not sep:
            return Confirmation(head)
        a, slash, b = tail.partition("/")
        if not slash or not (a + b).isascii() or not a.isdigit() or not b.isdigit() or len(a) > 3 or len(b) > 3:
            raise NotifyError(f"{head}: expected '{head} <sender>/<readers>', got {text!r:.80}", head)
        return Confirmation(head, int(a), int(b))
    raise NotifyError(f"not a P2P notification: {text!r:.40} (expected want, ready, clock?, clock=, "
                      f"{', '.join(CONFIRMATIONS)})")


def confirmation(kind: str, sender: int, readers: int) -> str:
    """The text of decode rank ``sender``'s confirmation of ``kind`` with ``readers`` readers;
    raises ``ValueError`` for an unknown kind or a rank outside 0..readers-1."""
    if kind not in CONFIRMATIONS:
        raise NotifyError(f"not a confirmation kind: {kind!r}")
    return encode(Confirmation(kind, sender, readers))
