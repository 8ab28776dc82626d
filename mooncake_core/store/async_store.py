"""``MooncakeDistributedStoreAsync``: the store with an ``async_<name>`` coroutine for every
method ``<name>`` (upstream's ``mooncake.async_store``).

Why threads: every store call is blocking I/O that releases the GIL while it waits (sockets,
memcpy of large buffers), so running it in the event loop's default executor lets an asyncio
program overlap many store calls without blocking its loop -- the same model as upstream's
module, which wraps its pybind methods the same way.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from mooncake_core.store.client import MooncakeDistributedStore

__all__ = ["MooncakeDistributedStoreAsync"]

_PREFIX = "async_"


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """``await store.async_put(key, value)`` == ``store.put(key, value)`` run off the loop."""

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        # only reached for names the class does not define
        if not name.startswith(_PREFIX):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        sync_name = name[len(_PREFIX):]
        method = getattr(type(self), sync_name, None)
        if sync_name.startswith("_") or not callable(method):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} "
                                 f"(and no method {sync_name!r} to run asynchronously)")
        bound = getattr(self, sync_name)

        @functools.wraps(bound)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.get_running_loop().run_in_executor(None, functools.partial(bound, *args, **kwargs))

        self.__dict__[name] = call  # built once per name and instance
        return call
