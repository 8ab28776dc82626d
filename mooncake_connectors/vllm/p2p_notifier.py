"""The notifier of a ``MooncakeCoreConnector`` worker: its messages to peer workers.

Both sides use it: the decode's puller tells a prefill it wants ``ready``, and confirms
(``done``/``failed``/``release``) so the prefill frees its blocks; the prefill's sender answers
with ``ready``. A message travels as a Transfer Engine notification named by the transfer id,
its text written by ``mooncake_core.pd.notify``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from vllm.logger import init_logger

from mooncake_connectors.vllm.tp import notify_targets, readers
from mooncake_core.engine import TransferEngine, TransferNotify, TransferOpcode
from mooncake_core.pd import notify
from mooncake_core.pd.notify import Confirmation, Kind, Message

logger = init_logger("vllm.mooncake_core.p2p_connector")


class Notifier:
    """Sends one worker's notifications: inline (one quick round trip from the calling thread)
    or in the background (a peer that may be dead cannot stall the engine's step)."""

    def __init__(self, te: TransferEngine, tp_rank: int, tp_size: int):
        self._te = te
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooncake-kv-notify")

    def send(self, segment: str, transfer_id: str, msg: Message, inline: bool = False) -> bool:
        """Send ``msg`` about ``transfer_id`` to the worker at ``segment``.

        ``inline`` (after a successful read: the peer just answered, so this is one quick round
        trip) sends from the calling thread. A background thread would have to win the GIL from
        the busy model loop several times per round trip, delaying the message by up to hundreds
        of ms -- and the prefill's engine spins while it holds blocks, stealing CPU from
        everything else on the host. Failure paths (peer maybe dead) stay in the background.
        Returns False when an inline send failed (a background one counts as sent)."""
        text = notify.encode(msg)

        def send() -> bool:
            rc = self._te.batch_transfer_sync(segment, [], [], [], TransferOpcode.READ,
                                              TransferNotify(transfer_id, text))
            if rc != 0:
                logger.warning("MooncakeCoreConnector: could not send %r about transfer %s to %s (%s)",
                               text.split(" ", 1)[0], transfer_id, segment, self._te.last_error)
            return rc == 0

        if inline:
            return send()
        self._pool.submit(send)
        return True

    def confirm(self, segment: str, transfer_id: str, kind: Kind, n_readers: int, inline: bool = False) -> bool:
        """Tell a prefill rank this decode rank is done with ``transfer_id`` (read, failed, or not
        reading); with several decode ranks reading it (``n_readers``) the message says which."""
        return self.send(segment, transfer_id, Confirmation(kind, self.tp_rank % n_readers, n_readers), inline)

    def targets(self, segments: tuple[str, ...], remote_tp: int) -> list[str]:
        """The prefill segments this rank tells that it will not read a transfer."""
        return notify_targets(self.tp_rank, self.tp_size, segments, remote_tp)

    def release(self, segments: tuple[str, ...], remote_tp: int, transfer_id: str) -> None:
        """Decode: this rank will not read ``transfer_id`` (local hit, abort): free it now."""
        for seg in self.targets(segments, remote_tp):
            self.confirm(seg, transfer_id, "release", readers(self.tp_size, remote_tp))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)
