"""`python -m mooncake.cli_client [flags]` runs mooncake_client with those flags
(upstream's entry point mooncake.cli_client:main)."""
import sys

from ._launch import run


def main():
    return run("mooncake_client")


if __name__ == "__main__":
    sys.exit(main())
