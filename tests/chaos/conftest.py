"""The chaos tests reuse the store tests' real-master and in-process client fixtures."""

from store.conftest import client_factory, master_factory  # noqa: F401
