"""The notifications the two workers of a P2P hand-off send each other (pure, no vLLM import).

Why typed: a notification comes from another instance over the Transfer Engine's notify channel,
so it is untrusted input. ``decode`` turns its text into one of three messages or raises
``NotifyError`` saying what was wrong; ``encode`` is the only place that writes them. The
notification's name is the transfer id; its text is one of (the forms every release of the
connector speaks, so instances of different versions still hand off to each other)::

    want <decode segment>                       decode -> prefill: send me ``ready`` when you finish
    ready <JSON of RemotePrefill.to_params()>   prefill -> decode: the blocks are ready, read them
    done | failed | release [<sender>/<readers>]   decode -> prefill: free the blocks

``ready`` and ``want`` belong to the concurrent hand-off (``params.concurrent_*_params``); the
confirmations to every hand-off. A confirmation names its sender and the number of readers when
several decode ranks read one prefill rank (decode TP > prefill TP): the prefill frees the
blocks once all of them confirmed. The count travels in the message, like NixlConnector's
``"<request id>:<consumers>"``, because the prefill answers before it knows which decode reads.
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

from mooncake_core.pd.params import MAX_TP, ParamsError, RemotePrefill

#: Longest decode segment name accepted in a ``want`` (ours are "host:port").
MAX_SEGMENT = 1024

Kind = Literal["done", "failed", "release"]
#: The confirmation kinds: ``done`` (read), ``failed`` (the read failed), ``release`` (will not read).
CONFIRMATIONS: tuple[Kind, ...] = ("done", "failed", "release")


class NotifyError(ValueError):
    """A notification is malformed. ``kind`` is the message it claimed to be (``want``,
    ``ready``, a confirmation kind) or None when it names none of ours."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class Want(msgspec.Struct, frozen=True):
    """Decode -> prefill: send ``ready`` for this transfer to ``segment`` once the request finished."""

    segment: str

    def __post_init__(self) -> None:
        s = self.segment
        if not 0 < len(s) <= MAX_SEGMENT or any(c.isspace() or not c.isprintable() for c in s):
            raise NotifyError(f"want: the decode segment must be 1..{MAX_SEGMENT} printable characters without "
                              f"spaces, got {s!r:.80}", "want")


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


Message = Union[Want, Ready, Confirmation]


def encode(msg: Message) -> str:
    """The notification text of ``msg``."""
    if isinstance(msg, Want):
        return f"want {msg.segment}"
    if isinstance(msg, Ready):
        return "ready " + msgspec.json.encode(msg.remote.to_params()).decode()
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
    if head in CONFIRMATIONS:
        if not sep:
            return Confirmation(head)
        a, slash, b = tail.partition("/")
        if not slash or not (a + b).isascii() or not a.isdigit() or not b.isdigit() or len(a) > 3 or len(b) > 3:
            raise NotifyError(f"{head}: expected '{head} <sender>/<readers>', got {text!r:.80}", head)
        return Confirmation(head, int(a), int(b))
    raise NotifyError(f"not a P2P notification: {text!r:.40} (expected want, ready, "
                      f"{', '.join(CONFIRMATIONS)})")


def confirmation(kind: str, sender: int, readers: int) -> str:
    """The text of decode rank ``sender``'s confirmation of ``kind`` with ``readers`` readers;
    raises ``ValueError`` for an unknown kind or a rank outside 0..readers-1."""
    if kind not in CONFIRMATIONS:
        raise NotifyError(f"not a confirmation kind: {kind!r}")
    return encode(Confirmation(kind, sender, readers))
