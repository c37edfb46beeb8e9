"""Result files shared by every gemmlab benchmark: ``results.json`` (``meta`` + ``rows``),
``results.csv`` (the rows) and a PNG chart, all in one output directory."""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cupy_version() -> str | None:
    for name in ("cupy-cuda13x", "cupy-cuda12x", "cupy"):
        if (version := _version(name)) is not None:
            return version
    return None


def _run(*cmd: str) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30,
                              cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit() -> str:
    """``GEMMLAB_GIT_COMMIT`` when set (a copy of the tree, whose own ``.git``, if any, may be
    stale); else HEAD of the checkout (``-dirty`` with local changes); else ``"unknown"``."""
    if commit := os.environ.get("GEMMLAB_GIT_COMMIT"):
        return commit
    commit = _run("git", "rev-parse", "HEAD")
    if commit is None:
        return "unknown"
    return commit + ("-dirty" if _run("git", "status", "--porcelain") else "")


def collect_meta() -> dict:
    """Where and how a result was measured: GPU, driver, CUDA, library versions, git commit,
    command line and UTC date."""
    cuda = torch.cuda.is_available()
    driver = (_run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
              if cuda else None)
    return {
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "cpu": platform.processor() or platform.machine(),
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cupy": _cupy_version(),
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "command": shlex.join(["gemmlab", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_results(out_dir: str | Path, meta: dict, rows: list[dict],
                  plot: Callable[[list[dict], Path], None], **extra) -> list[Path]:
    """Write ``results.json`` (``meta``, ``rows`` and any ``extra`` top-level fields),
    ``results.csv`` (the rows) and ``results.png`` (drawn by ``plot``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.csv", out / "results.png"]
    paths[0].write_text(json.dumps({"meta": meta, "rows": rows, **extra}, indent=1) + "\n")
    with paths[1].open("w", newline="") as f:
        fields = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, paths[2])
    return paths
