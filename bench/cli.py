"""The ``gemmlab`` command: a thin dispatcher over ``bench.commands`` (one module per
subcommand, each registering its own parser)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from .commands import COMMANDS
from .recording import interrupt_all
from .session import INTERRUPTED, UsageError, interrupts_ignored, sigterm_as_ctrl_c


def build_parser() -> argparse.ArgumentParser:
    """``gemmlab`` and every subcommand's parser."""
    parser = argparse.ArgumentParser(prog="gemmlab", description=(
        "gemmlab: D = ReLU(A @ B + C) from a naive CUDA kernel to cuBLAS, measured."))
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and ``run`` the subcommand, printing to
    stdout, with SIGTERM handled as Ctrl-C; its exit status."""
    args = build_parser().parse_args(argv)
    # Tables stay unwrapped when the output is a file or a pipe (rich assumes 80 columns).
    console = Console(width=None if sys.stdout.isatty() else 160)
    sigterm_as_ctrl_c()
    return run(args, console)


def run(args: argparse.Namespace, console: Console) -> int:
    """Run parsed ``args``' subcommand; its exit status: 2 after one ``error:`` line for a
    mistake in the arguments; on Ctrl-C (KeyboardInterrupt), the rows that finished are
    written (``bench.recording.interrupt_all``, marked interrupted; further Ctrl-C or SIGTERM
    ignored meanwhile) and the status is 130."""
    try:
        return args.func(args, console)
    except UsageError as exc:
        console.print(f"error: {exc}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        with interrupts_ignored():
            paths = interrupt_all()
        console.print("interrupted" + (f": what finished is in {', '.join(map(str, paths))}"
                                       if paths else ""), highlight=False, soft_wrap=True)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
