"""`python -m mooncake.cli [flags]` runs mooncake_master with those flags
(upstream's entry point mooncake.cli:main)."""
import sys

from ._launch import run


def main():
    return run("mooncake_master")


if __name__ == "__main__":
    sys.exit(main())
