"""Mooncake Store benches against the original's store: the put/get API, more of the API, scale, master RPC and memory."""
