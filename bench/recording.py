"""Result files shared by every gemmlab command: ``results.jsonl`` (each row as it finishes),
then ``results.json`` (``meta`` + ``rows``), ``results.csv`` (the rows) and a PNG chart, all in
one output directory, checked before any work; an interrupted run keeps what finished."""

from __future__ import annotations

import csv
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
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


def _run(*cmd: str, text: bool = True) -> str | bytes | None:
    """``cmd``'s stdout (stripped when ``text``, raw bytes otherwise), run in REPO; None when it
    cannot start, fails or times out."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=text, check=True, timeout=30,
                             cwd=REPO).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() if text else out


ENV_PREFIXES = ("NCCL_", "CUDA_", "OMPI_", "MPICH_")
# What mpiexec itself gives each process (ranks, sockets, session paths): no setting of the
# run, and machine-specific.
_LAUNCHER_ENV = re.compile(r"OMPI_(COMM_WORLD_|MCA_orte_|MCA_ess|MCA_pmix|MCA_plm|"
                           r"MCA_initial_wdir|MCA_shmem_RUNTIME|FILE_LOCATION|ARGV|COMMAND|"
                           r"APP_CTX|NUM_APP_CTX|FIRST_RANKS|UNIVERSE_SIZE)")


def run_env(environ) -> dict[str, str]:
    """The ``NCCL_*``, ``CUDA_*``, ``OMPI_*`` and ``MPICH_*`` variables of ``environ`` that
    are settings (the launcher's own per-process ones left out), sorted by name."""
    return {name: str(environ[name]) for name in sorted(environ)
            if name.startswith(ENV_PREFIXES) and not _LAUNCHER_ENV.match(name)}


def _git(hash_diff: bool = True) -> dict:
    """``git_commit``, ``git_dirty`` and ``git_diff_sha256`` (only with ``hash_diff``) of the
    checkout (see ``provenance``); all None where there is no git or no commit."""
    commit = _run("git", "rev-parse", "HEAD")
    if not commit:
        return {"git_commit": None, "git_dirty": None, "git_diff_sha256": None}
    status = _run("git", "status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None else bool(status)
    diff = _run("git", "diff", "HEAD", text=False) if dirty and hash_diff else None
    return {"git_commit": commit, "git_dirty": dirty,
            "git_diff_sha256": None if diff is None else hashlib.sha256(diff).hexdigest()}


def _nccl_version() -> str | None:
    try:
        if not torch.cuda.is_available():
            return None
        version = torch.cuda.nccl.version()
        return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:
        return None


def _mpi_version() -> str | None:
    mpi = sys.modules.get("mpi4py.MPI")  # never imported here: that would initialise MPI
    if mpi is None:
        return None
    try:
        lines = mpi.Get_library_version().replace("\x00", "").strip().splitlines()
    except Exception:
        return None
    return lines[0].strip() if lines else None


def provenance() -> dict:
    """What code and environment produced a result:

    - ``git_commit``: ``git rev-parse HEAD`` of the checkout (full sha); None without git or a
      repository. Never taken from the environment.
    - ``git_dirty``: True when tracked files differ from HEAD (``git status --porcelain
      --untracked-files=no`` prints anything; untracked files do not count); None without git.
    - ``git_diff_sha256``: sha256 (hex) of the bytes ``git diff HEAD`` prints, when dirty; else
      None.
    - ``declared_commit``: ``$GEMMLAB_GIT_COMMIT``, the commit a copied tree without ``.git``
      says it is a copy of (not verified); None when unset.
    - ``env``: every environment variable named ``NCCL_*``, ``CUDA_*``, ``OMPI_*`` or
      ``MPICH_*``, sorted by name, less those mpiexec gives each process (``run_env``).
    - ``nccl_version``: torch's NCCL (``"2.28.9"``) when CUDA is available; else None.
    - ``mpi_version``: the first line of ``MPI.Get_library_version()`` when this process has
      already imported ``mpi4py.MPI``; else None (importing it would initialise MPI).
    """
    return {**_git(),
            "declared_commit": declared_commit(),
            "env": run_env(os.environ),
            "nccl_version": _nccl_version(),
            "mpi_version": _mpi_version()}


def declared_commit() -> str | None:
    """``$GEMMLAB_GIT_COMMIT``: the commit a copied tree says it is a copy of (not verified);
    None when unset."""
    return os.environ.get("GEMMLAB_GIT_COMMIT") or None


def git_commit() -> str:
    """HEAD of the checkout, with ``-dirty`` when tracked files differ from it; ``"unknown"``
    without git. Never taken from the environment. For ``gemmlab tune``'s table entries, which
    have one commit field; result files record ``provenance()``."""
    git = _git(hash_diff=False)
    if git["git_commit"] is None:
        return "unknown"
    return git["git_commit"] + ("-dirty" if git["git_dirty"] else "")


def _program() -> list[str]:
    """How this process was started, as a user would type it: ``gemmlab`` (the console
    script, or ``python3 -m bench.cli``), ``python3 -m <module>`` for another module of the
    repository (``bench.train_stages``, ``profiling.overhead``), ``python3 -c CODE`` for
    code given on the command line, else the script's name."""
    if sys.argv[0] == "-c":  # the code is only in the interpreter's own command line,
        # just before the arguments it was given (whatever flags came first, e.g. -Sc)
        return ["python3", "-c", sys.orig_argv[len(sys.orig_argv) - len(sys.argv)]]
    script = Path(sys.argv[0])
    try:
        module = script.resolve().relative_to(REPO)
    except (OSError, ValueError):
        module = None
    if script.name == "gemmlab" or module == Path("bench/cli.py"):
        return ["gemmlab"]
    if module is not None and module.suffix == ".py":
        return ["python3", "-m", ".".join(module.with_suffix("").parts)]
    return [script.name]


def collect_meta() -> dict:
    """Where and how a result was measured: GPU, driver, CUDA, library versions, torch's
    intra-op thread count, the fields of ``provenance()`` (git commit and state, declared
    commit, NCCL/CUDA/MPI environment, NCCL and MPI versions), command line and UTC date."""
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
        "torch_threads": torch.get_num_threads(),
        **provenance(),
        "command": shlex.join([*_program(), *sys.argv[1:]]),
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


RESULT_FILES = ("results.jsonl", "results.json", "results.csv", "results.png")


def out_problem(out: str | Path, overwrite: bool = False) -> str | None:
    """Why ``out`` cannot receive a run's results, or None when it can; changes nothing.

    It must be a directory or not exist yet, with its nearest existing ancestor writable; an
    existing directory must be empty unless ``overwrite`` (gemmlab's own result files in it
    are then replaced; nothing else in it is touched).
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        return f"--out {out} exists and is not a directory"
    if path.is_dir():
        if any(path.iterdir()) and not overwrite:
            return f"--out {out} is not empty; pass --overwrite to replace its results"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"--out {out} is not writable"
        return None
    if (ancestor := unwritable_ancestor(path)) is not None:
        return f"--out {out} cannot be created: {ancestor} is not a writable directory"
    return None


def unwritable_ancestor(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is not a writable directory (so
    ``path`` cannot be created), else None; changes nothing."""
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        return ancestor
    return None


class Recorder:
    """The rows of one run, each written to ``results.jsonl`` the moment it is added, then
    ``results.json`` / ``.csv`` / ``.png`` at ``finish``, or at ``interrupt`` with what
    finished (marked ``"interrupted": true`` in ``meta``).

    ``out`` None records nothing on disk (rows are still kept). ``out`` must have passed
    ``out_problem``: the directory is created here and any earlier result files in it are
    removed. While a Recorder is open, ``interrupt_all`` (what ``gemmlab`` runs on Ctrl-C or
    SIGTERM) finishes it.

    ``progress``: called with each added row, e.g. to print one line per finished row.
    ``meta``: fields the run adds to ``collect_meta()`` in ``results.json``, finished or
    interrupted (e.g. the timing knobs the rows were taken with). ``collect_meta()`` is taken
    here, when the run starts: the commit, tree state, environment and date of the code that
    ran, whatever changes in the checkout while it runs.
    ``comm``: an MPI job's communicator (an mpi4py ``Comm``), every rank constructing its
    Recorder with the same ``out`` and adding the same rows: only rank 0 records on disk, and
    ``finish`` is collective, returning on every rank once rank 0 has written (
    ``tp.mpi.abort_on_exception`` aborts a job whose ranks reach their exit more than
    ``GEMMLAB_EXIT_TIMEOUT`` seconds apart, and rank 0's writing, JSON, CSV and chart, took
    longer than its 10 s on a loaded machine). ``add`` is collective too: the ranks agree
    whether any of them was asked to stop (``stop_collectively``), and if so all raise
    ``KeyboardInterrupt`` there together.
    """

    def __init__(self, out: str | Path | None, plot: Callable[[list[dict], Path], None],
                 progress: Callable[[dict], None] | None = None, meta: dict | None = None,
                 comm=None):
        writes = out is not None and (comm is None or comm.Get_rank() == 0)
        self.out = Path(out) if writes else None
        self.comm = comm
        self.plot, self.progress = plot, progress
        self.meta = dict(meta or {})
        self.started = collect_meta() if self.out is not None else {}
        self.rows: list[dict] = []
        self.stopped_together = False  # every rank of ``comm`` stopped at one add
        self.lines = None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            for name in RESULT_FILES:
                (self.out / name).unlink(missing_ok=True)
            self.lines = (self.out / "results.jsonl").open("w")
        _OPEN.append(self)

    def add(self, row: dict) -> None:
        """Keep ``row`` and append it to ``results.jsonl`` (flushed: a killed run keeps it).

        Raises:
            KeyboardInterrupt: with ``comm``, on every rank, once any rank was asked to stop
                (the row is kept first).
        """
        self.rows.append(row)
        if self.lines is not None:
            self.lines.write(json.dumps(row) + "\n")
            self.lines.flush()
        if self.progress is not None:
            self.progress(row)
        if self.comm is not None and self.comm.allreduce(_STOP_ASKED[0]):  # a sum: any rank
            self.stopped_together = True
            raise KeyboardInterrupt

    def extend(self, rows: Iterable[dict]) -> None:
        for row in rows:
            self.add(row)

    def finish(self, **extra) -> list[Path]:
        """Write results.json (``meta``: ``collect_meta()`` of the run's start with the
        Recorder's own ``meta``; the rows; ``extra`` top-level fields), results.csv and
        results.png; the paths written (none without ``out``). With ``comm``, a barrier over
        it follows the writing."""
        paths = self._write(**extra)
        if self.comm is not None:
            self.comm.Barrier()
        return paths

    def _write(self, **extra) -> list[Path]:
        """``finish`` without the barrier: ``interrupt`` may run on one rank alone."""
        if self in _OPEN:
            _OPEN.remove(self)
        if self.lines is not None:
            self.lines.close()
        if self.out is None:
            return []
        return write_results(self.out, {**self.started, **self.meta}, self.rows, self.plot,
                             **extra)

    def interrupt(self) -> list[Path]:
        """``finish`` with what has been added, ``meta["interrupted"] = True``; a chart that
        cannot be drawn from a partial run is left out rather than lose the rows. With
        ``comm``, a barrier follows the writing only where every rank stopped together
        (``add``): an interrupt that reached one rank alone could wait there forever."""
        self.meta["interrupted"] = True
        try:
            paths = self._write()
        except Exception:  # the plot of a partial run: keep the JSON and CSV written before it
            paths = [p for p in (self.out / "results.json", self.out / "results.csv")
                     if p.exists()] if self.out is not None else []
        if self.stopped_together:
            self.comm.Barrier()
        return paths


_OPEN: list[Recorder] = []
_STOP_ASKED = [False]  # set by stop_collectively's handler on the first SIGINT or SIGTERM


def _ask_to_stop(signum, frame) -> None:
    if _STOP_ASKED[0]:  # the second: stop now, whatever the other ranks do
        raise KeyboardInterrupt
    _STOP_ASKED[0] = True
    print(f"[{signal.Signals(signum).name}] every rank stops after its current row; again to "
          f"stop this rank now", file=sys.stderr, flush=True)


def stop_collectively() -> None:
    """For an MPI job whose ranks record rows through Recorders with ``comm``: the first
    SIGINT or SIGTERM a rank gets only asks it to stop, and every rank raises
    ``KeyboardInterrupt`` at the next row they add together (``Recorder.add``), so no rank
    leaves a collective its peers are in (a rank blocked in one cannot run its handler until
    it returns; one that stopped at once left its peers there, and the job ended by the exit
    guard's abort, without its results files). The second signal stops the rank at once."""
    _STOP_ASKED[0] = False
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ask_to_stop)


def interrupt_all() -> list[Path]:
    """Finish every open Recorder as interrupted; the paths written."""
    paths = []
    while _OPEN:
        paths += _OPEN[-1].interrupt()
    return paths
