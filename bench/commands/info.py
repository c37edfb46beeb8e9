"""``gemmlab info``: which backends run on this machine, and why not."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from ..session import prepare_backends


def run(args: argparse.Namespace, console: Console) -> int:
    """Print the registry in ladder order, with what runs here; exit status 0."""
    prepare_backends(console)
    import backends
    from backends.dtypes import name_of

    table = Table(title="gemmlab backends, in ladder order")
    for col in ("backend", "technique", "dtypes", "devices", "fused +C/ReLU", "TF32", "runs here"):
        table.add_column(col)
    for backend, status in zip(backends.LADDER, backends.available()):
        table.add_row(backend.name, backend.summary,
                      ",".join(name_of(d) for d in backend.dtypes), ",".join(backend.devices),
                      {True: "yes", False: "no", None: "autotuner's pick"}[backend.fused_epilogue],
                      "yes" if backend.tf32 else "no",
                      "yes" if status.runs else f"no: {status.reason}")
    console.print(table)
    return 0




def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab info``."""
    info = subparsers.add_parser("info", help="which backends run on this machine, and why not")
    info.set_defaults(func=run)
    return info
