"""Transfer Engine internals: transports (tcp, cma same-host, local in-process), wire format,
region tables, descriptors. The public entry point is :class:`mooncake_core.engine.TransferEngine`;
transports are plugins (:mod:`mooncake_core.plugins`)."""

from mooncake_core.transfer.base import (Capabilities, Transport, TransportContext, TransferError,
                                         TransferOpcode, TransferRequest)

__all__ = ["Capabilities", "Transport", "TransportContext", "TransferError", "TransferOpcode",
           "TransferRequest"]
