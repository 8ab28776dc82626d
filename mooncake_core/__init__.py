"""mooncake_core: the engine of this Mooncake implementation.

Subpackages:
- ``transfer``: Transfer Engine transports (tcp, same-host cma/shm, in-process).
- ``metadata``: segment-descriptor metadata backends (HTTP, etcd, Redis, P2P handshake).
- ``store``: Mooncake Store (master and client).
- ``engine``: the Mooncake-compatible ``TransferEngine`` Python API.
"""

__version__ = "0.1.0"

# Wire/metadata format version. Peers refuse a mismatch with a message naming both.
WIRE_VERSION = 1
