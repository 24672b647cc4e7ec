"""Mooncake Transfer Engine (compatible with upstream Mooncake's Python API).

    from mooncake.engine import TransferEngine

See help(mooncake.engine) for the conventions and error codes.
"""
try:
    from ._version import __version__
except ImportError:  # a source checkout that was not built
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
