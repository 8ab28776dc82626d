"""A real ``mooncake_master`` that does not know some RPCs, as an older release would (tests
only): ``python older_master.py PutCommitReq,BatchPutCommitReq [master flags...]``.

The listed request types are left out of the master's request decoder, so a request of one of
them is answered exactly as a master built before that RPC existed answers it: INVALID_PARAMS,
"malformed request: ..." (an unknown msgpack tag). Everything else is the real master process
(``master_main.main``) on real sockets -- what a client's fallback to the older RPCs has to
work against.
"""

from __future__ import annotations

import sys
from typing import Union

import msgspec

from mooncake_core.store import master_main
from mooncake_core.store import protocol as P


def forget(names: set[str]) -> None:
    """Rebuild ``P.request_decoder`` without the request types named in ``names``."""
    known = P.Request.__args__  # type: ignore[attr-defined]
    missing = names - {t.__name__ for t in known}
    if missing:
        raise SystemExit(f"older_master: no such request type {sorted(missing)}")
    kept = tuple(t for t in known if t.__name__ not in names)
    P.request_decoder = msgspec.msgpack.Decoder(Union[kept])  # type: ignore[assignment]


if __name__ == "__main__":
    forget({n for n in sys.argv[1].split(",") if n})
    sys.exit(master_main.main(sys.argv[2:]))
