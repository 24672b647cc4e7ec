"""Mooncake Transfer Engine and Store (compatible with upstream Mooncake's Python API).

    from mooncake.engine import TransferEngine
    from mooncake.store import MooncakeDistributedStore
    from mooncake import BufferPool            # = mooncake.buffer_pool.BufferPool

See help(mooncake.engine) for the conventions and error codes.
"""
from pkgutil import extend_path

try:
    from ._version import __version__
except ImportError:  # a source checkout that was not built
    __version__ = "0.0.0+unknown"

# As upstream: other distributions may add mooncake.* modules.
__path__ = extend_path(__path__, __name__)

__all__ = ["__version__", "BufferPool", "RegisteredBufferPool"]


def __getattr__(name):
    # BufferPool loads the extension; `import mooncake` alone does not.
    if name in ("BufferPool", "RegisteredBufferPool"):
        from . import buffer_pool
        return getattr(buffer_pool, name)
    raise AttributeError(f"module 'mooncake' has no attribute {name!r}")
