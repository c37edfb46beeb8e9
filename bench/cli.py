"""The ``gemmlab`` command: a thin dispatcher over ``bench.commands`` (one module per
subcommand, each registering its own parser)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from .commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    """``gemmlab`` and every subcommand's parser."""
    parser = argparse.ArgumentParser(prog="gemmlab", description=(
        "gemmlab: D = ReLU(A @ B + C) from a naive CUDA kernel to cuBLAS, measured."))
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the subcommand; its exit status."""
    args = build_parser().parse_args(argv)
    # Tables stay unwrapped when the output is a file or a pipe (rich assumes 80 columns).
    return args.func(args, Console(width=None if sys.stdout.isatty() else 160))


if __name__ == "__main__":
    sys.exit(main())
