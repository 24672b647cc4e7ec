"""`python -m mooncake.cli_bench [flags]` runs transfer_engine_bench with those flags
(upstream's entry point mooncake.cli_bench:main)."""
import sys

from ._launch import run


def main():
    return run("transfer_engine_bench")


if __name__ == "__main__":
    sys.exit(main())
