"""MooncakeDistributedStoreAsync: every method of MooncakeDistributedStore also as a
coroutine, `await store.async_<name>(...)`, run in the event loop's default executor (the
Store's calls release the GIL while they wait), as upstream's mooncake.async_store."""
import asyncio
import functools

from .store import MooncakeDistributedStore

_PREFIX = "async_"


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    def __getattr__(self, name):
        # Only reached for names the class does not define.
        if not name.startswith(_PREFIX):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        target = getattr(self, name[len(_PREFIX):], None)
        if not callable(target):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} "
                                 f"(nor a method {name[len(_PREFIX):]!r})")

        @functools.wraps(target)
        async def call(*args, **kwargs):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(target, *args, **kwargs))

        setattr(self, name, call)
        return call


__all__ = ["MooncakeDistributedStoreAsync"]
