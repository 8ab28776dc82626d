"""Transfer Engine internals: transports (tcp, cma same-host, local in-process), wire format,
region tables, descriptors. The public entry point is :class:`mooncake_core.engine.TransferEngine`."""

from mooncake_core.transfer.base import (TRANSPORTS, Transport, TransferError, TransferOpcode,
                                         TransferRequest, register_transport)

__all__ = ["TRANSPORTS", "Transport", "TransferError", "TransferOpcode", "TransferRequest",
           "register_transport"]
