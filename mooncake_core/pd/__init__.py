"""The PD hand-off contract: what the proxy and the framework connectors say to each other.

Pure modules, no framework import, so the proxy (``mooncake_proxy``) and every connector
(``mooncake_connectors``) import the same definitions and neither imports the other:

- ``params``: the ``kv_transfer_params`` a prefill answers with and a decode reads
  (``RemotePrefill``), and the concurrent hand-off's params the proxy writes;
- ``notify``: the notifications the two workers of a P2P hand-off send each other
  (``want``, ``ready``, confirmations);
- ``keys``: the chained store keys of KV blocks (the connectors write them, the proxy's store
  view recomputes them from the master's key events);
- ``store_hint`` / ``peer_prefix``: the prefix hints the proxy adds to a prefill request.
"""
