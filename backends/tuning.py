"""The tuned table: the fastest configuration ``gemmlab tune`` found per (GPU, backend, dtype,
shape bucket), which ``gemm()`` then pins for the backends that have something to tune
(``Backend.pin``; ``Backend.search_space`` lists what ``gemmlab tune`` tries).

The table is a JSON file, ``backends/tuned.json`` unless the environment variable
``GEMMLAB_TUNED_FILE`` names another. ``gemm()`` reads it when it binds a new call signature
(never per call); ``reload()`` makes it read again::

    {"entries": [
      {"gpu": "NVIDIA H200", "backend": "triton_fused", "dtype": "fp16",
       "bucket": [4096, 4096, 4096],
       "config": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
                  "PERSISTENT": 1, "num_warps": 8, "num_stages": 3},
       "tflops": 640.2, "ms": 0.2147, "default_tflops": 607.7, "shape": [4096, 4096, 4096],
       "date": "2026-11-21T12:00:00+00:00", "git_commit": "ecfdceb..."}]}

- ``gpu``: ``torch.cuda.get_device_name()`` of the device the tensors live on; ``"cpu"`` for
  CPU tensors (triton_fused under the Triton interpreter, where times are CPU times).
- ``dtype``: ``fp32`` (IEEE), ``tf32`` (fp32 operands, ``allow_tf32=True``), ``fp16``, ``bf16``.
- ``bucket``: the shape bucket (below). One entry serves every shape of its bucket.
- ``config``: one of the backend's ``search_space`` configurations, which its ``pin`` takes:
  e.g. a CUDA C kernel's compile-time macros (``BLOCK_M``, ``TM``, ..., as passed to
  ``CudaKernel``), or triton_fused's ``BLOCK_M``/``BLOCK_N``/``BLOCK_K``/``GROUP_M``,
  ``num_warps``, ``num_stages`` and ``PERSISTENT`` (1: the persistent TMA kernel, for the
  calls that qualify; 0, or absent as in entries tuned before it existed: the pointer
  kernel).
- ``tflops`` and ``ms``: the entry measured at ``shape`` (TFLOP/s = 2*M*N*K / t);
  ``default_tflops``: the backend's default configuration (Triton's autotuner, the registry's
  tile sizes) measured in the same run, null when it failed.
- ``git_commit``: the checkout's HEAD, ``-dirty`` when tracked files differed from it;
  ``declared_commit`` (only when ``$GEMMLAB_GIT_COMMIT`` was set): the commit a copied tree
  said it was a copy of, as results files record it (``bench.recording.provenance``).

Shape bucket: M, N and K each rounded up to a power of two (1000 -> 1024, 1024 -> 1024,
1025 -> 2048), so shapes that tile alike share an entry and the table stays small. A call
whose (GPU, backend, dtype, bucket) has no entry runs the backend's default configuration.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .dtypes import GEMM, name_of

ENV_VAR = "GEMMLAB_TUNED_FILE"
DEFAULT_PATH = Path(__file__).resolve().parent / "tuned.json"
_REPOSITORY = DEFAULT_PATH.parent.parent
_DEFAULT_TEXT = str(DEFAULT_PATH)
_REQUIRED = {"gpu": str, "backend": str, "dtype": str, "bucket": list, "config": dict,
             "tflops": (int, float), "ms": (int, float), "shape": list}


def table_path() -> Path:
    """The table ``gemm()`` reads: ``$GEMMLAB_TUNED_FILE`` when set, else
    ``backends/tuned.json``."""
    return Path(_path_text(None))


def _path_text(path: str | Path | None) -> str:
    # A str, not a Path: building a Path costs more than the stat that load() makes per call.
    return (os.environ.get(ENV_VAR) or _DEFAULT_TEXT) if path is None else os.fspath(path)


def bucket(m: int, n: int, k: int) -> tuple[int, int, int]:
    """The shape bucket of an M x N x K problem: each size rounded up to a power of two.

    Raises:
        ValueError: a size below 1.
    """
    if min(m, n, k) < 1:
        raise ValueError(f"shape {m}x{n}x{k} has no bucket: sizes must be >= 1")
    return 1 << (m - 1).bit_length(), 1 << (n - 1).bit_length(), 1 << (k - 1).bit_length()


def dtype_name(dtype: torch.dtype, allow_tf32: bool = False) -> str:
    """The table's name for operands of ``dtype``: fp32, tf32 (fp32 with TF32 on), fp16, bf16."""
    return name_of(dtype, allow_tf32)


@functools.cache
def device_name(device: torch.device) -> str:
    """The ``gpu`` key for tensors on ``device``: the CUDA device's name, ``"cpu"`` on the CPU.
    Asked once per device (``torch.cuda.get_device_name`` costs microseconds)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _key(entry: dict) -> tuple[str, str, str, tuple[int, ...]]:
    return entry["gpu"], entry["backend"], entry["dtype"], tuple(entry["bucket"])


def _shape(dims) -> str:
    return "x".join(str(d) for d in dims)


@functools.lru_cache(maxsize=64)
def _shown(path: Path) -> str:
    """``path`` as notes print it: relative to the repository root when the table lives inside
    it (``backends/tuned.json``; no absolute path of this machine in committed results), else
    as given."""
    try:
        return str(path.resolve().relative_to(_REPOSITORY))
    except (OSError, ValueError):
        return str(path)


@dataclass(eq=False)
class Table:
    """One read of a tuned table file.

    Attributes:
        path: the file.
        exists: whether the file was there (a missing file is an empty table).
        entries: the entries, as stored.
        memo: ``resolve()``'s cache of per-call decisions, dropped with the table when the
            file changes.
    """

    path: Path
    exists: bool
    entries: list[dict]
    memo: dict = field(default_factory=dict)

    def __post_init__(self):
        self._index = _by_key(self.entries)

    def get(self, backend: str, gpu: str, dtype: str, m: int, n: int, k: int) -> dict | None:
        """The entry for this backend, GPU name, dtype name and the bucket of M x N x K."""
        return self._index.get((gpu, backend, dtype, bucket(m, n, k)))


_loaded: dict[str, tuple[tuple[int, int, int] | None, Table]] = {}
# Bumped whenever the table gemm() reads may have changed (``reload``, ``save``, or ``load``
# finding a changed file): gemm() keys its bound calls by it, so they resolve again.
generation = 0


def reload() -> None:
    """Forget every table read so far: the next ``gemm()`` of any signature resolves its
    tuned entry again from ``table_path()``. ``gemm()`` reads the table (and
    ``GEMMLAB_TUNED_FILE``) when it binds a new call signature, never per call; call this
    after changing either in a running process (``save`` does it itself)."""
    global generation
    _loaded.clear()
    generation += 1


def load(path: str | Path | None = None) -> Table:
    """The table in ``path`` (default ``table_path()``), read again only when the file changed
    (its mtime, size or inode; a change also counts as a ``reload``); a missing file is an
    empty table.

    Raises:
        ValueError: the file is not a valid table, or a directory; the message names the
            file and the entry.
    """
    global generation
    text = _path_text(path)
    try:
        st = os.stat(text)
        stamp = st.st_mtime_ns, st.st_size, st.st_ino
    except FileNotFoundError:
        stamp = None
    cached = _loaded.get(text)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    if cached is not None:
        generation += 1
    path = Path(text)
    if stamp is None:
        table = Table(path, False, [])
    elif stat.S_ISDIR(st.st_mode):
        raise ValueError(f"malformed tuned table {path}: a directory, not a file")
    else:
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed tuned table {path}: not JSON ({exc})") from None
        table = Table(path, True, _validated(data, path))
    _loaded[text] = stamp, table
    return table


def _validated(data, path: Path) -> list[dict]:
    """The entries of a parsed table file, each checked for the fields gemm() relies on."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError(f'malformed tuned table {path}: expected {{"entries": [...]}}')
    for i, entry in enumerate(data["entries"]):
        problem = _problem(entry)
        if problem:
            raise ValueError(f"malformed tuned table {path}: entry {i}: {problem}")
    return data["entries"]


def _problem(entry) -> str | None:
    if not isinstance(entry, dict):
        return "not an object"
    for name, kind in _REQUIRED.items():
        if not isinstance(entry.get(name), kind):
            return f"{name!r} missing or not a {getattr(kind, '__name__', 'number')}"
    if entry["dtype"] not in GEMM:
        return f"dtype {entry['dtype']!r} is not one of {', '.join(GEMM)}"
    b = entry["bucket"]
    if len(b) != 3 or not all(isinstance(x, int) and x >= 1 and x & (x - 1) == 0 for x in b):
        return f"bucket {b} is not three powers of two"
    shape = entry["shape"]
    if (len(shape) != 3 or not all(isinstance(x, int) and x >= 1 for x in shape)
            or bucket(*shape) != tuple(b)):
        return f"shape {entry['shape']} is not an M x N x K of bucket {b}"
    if not all(isinstance(v, int) for v in entry["config"].values()):
        return f"config {entry['config']} holds a value that is not an integer"
    return None


def lookup(backend: str, gpu: str, dtype: str, m: int, n: int, k: int,
           path: str | Path | None = None) -> dict | None:
    """The entry for ``backend`` on GPU ``gpu`` (``device_name()``), dtype name ``dtype`` and
    the bucket of M x N x K, or None.

    Raises:
        ValueError: the table file is malformed.
    """
    return load(path).get(backend, gpu, dtype, m, n, k)


def why_not(backend: str, gpu: str, dtype: str, m: int, n: int, k: int,
            path: str | Path | None = None) -> str | None:
    """One line saying why ``lookup()`` finds no entry (no file; nothing for this GPU, backend
    or dtype; or which buckets exist), or None when it finds one. It names a table inside the
    repository by its path from the repository root (``backends/tuned.json``).

    Raises:
        ValueError: the table file is malformed.
    """
    table = load(path)
    if table.get(backend, gpu, dtype, m, n, k) is not None:
        return None
    where = _shown(table.path)
    if not table.exists:
        return f"no tuned table at {where} (gemmlab tune writes one)"
    keys = list(table._index)
    gpus = sorted({g for g, *_ in keys})
    if gpu not in gpus:
        return (f"tuned table {where} has no entry for GPU {gpu!r} "
                f"(it has {', '.join(map(repr, gpus)) or 'no entries'})")
    dtypes = sorted({d for g, b, d, _ in keys if (g, b) == (gpu, backend)})
    if not dtypes:
        return f"tuned table {where} has no {backend} entry for {gpu}"
    if dtype not in dtypes:
        return (f"tuned table {where} has no {backend} {dtype} entry for {gpu} "
                f"(tuned dtypes: {', '.join(dtypes)})")
    buckets = sorted(s for g, b, d, s in keys if (g, b, d) == (gpu, backend, dtype))
    return (f"tuned table {where} has no {backend} {dtype} entry for {gpu} at shape bucket "
            f"{_shape(bucket(m, n, k))} (M, N, K rounded up to powers of two; tuned buckets: "
            f"{', '.join(map(_shape, buckets))})")


def _by_key(entries: list[dict]) -> dict[tuple, dict]:
    """The entries by (gpu, backend, dtype, bucket); where a file edited by hand repeats a
    key, the entry with the most TFLOP/s (the one a lookup has used)."""
    index: dict[tuple, dict] = {}
    for entry in entries:
        old = index.get(_key(entry))
        if old is None or entry["tflops"] > old["tflops"]:
            index[_key(entry)] = entry
    return index


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with ``new`` merged in: a new entry replaces the one of the same (gpu, backend,
    dtype, bucket); of an ``old`` key repeated (a hand edit), the one lookups use stays (see
    ``_by_key``). Which is faster is decided before, with both timed in one run (``gemmlab
    tune`` times the table's entry beside the candidates); TFLOP/s recorded in different runs
    do not compare. Sorted by that key, for stable diffs."""
    merged = _by_key(old)
    merged.update((_key(e), e) for e in new)
    return [merged[key] for key in sorted(merged)]


def save(entries: list[dict], path: str | Path | None = None) -> list[dict]:
    """Merge ``entries`` into the table at ``path`` (default ``table_path()``; see ``merge``)
    and write it atomically (a temporary file in the same directory, then ``os.replace``), so a
    reader never sees half a file. Returns the entries now in the file.

    Raises:
        ValueError: an entry is malformed, or the file holds a malformed table (it is left
            as it is).
    """
    path = table_path() if path is None else Path(path)
    for entry in entries:
        if problem := _problem(entry):
            raise ValueError(f"cannot store tuned entry {entry}: {problem}")
    return _write(merge(load(path).entries, entries), path)


def remove(gpu: str, backend: str, dtype: str, shape_bucket: tuple[int, int, int] | list[int],
           path: str | Path | None = None) -> list[dict]:
    """Drop the entry of (gpu, backend, dtype, bucket) from the table at ``path`` (default
    ``table_path()``), written as ``save`` writes it, so that bucket runs the backend's
    default configuration. Returns the entries now in the file (unchanged when there was no
    such entry).

    Raises:
        ValueError: the file holds a malformed table (it is left as it is).
    """
    path = table_path() if path is None else Path(path)
    key = (gpu, backend, dtype, tuple(shape_bucket))
    entries = load(path).entries
    kept = [e for e in entries if _key(e) != key]
    return entries if len(kept) == len(entries) else _write(kept, path)


def _write(merged: list[dict], path: Path) -> list[dict]:
    """Write ``merged`` to ``path`` atomically and make gemm() read it again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            # One entry per line: a committed table then diffs entry by entry.
            f.write('{"entries": [\n' + ",\n".join(json.dumps(e) for e in merged) + "\n]}\n")
        os.chmod(temporary, 0o644)  # mkstemp makes it private; the table is for every user
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    reload()
    return merged


@dataclass(frozen=True)
class Choice:
    """How a tunable backend runs one call.

    Attributes:
        config: the backend's own configuration (a ``triton.Config``, a ``CudaKernel``) built
            from a tuned entry by ``Backend.pin``, or None for its default configuration.
        note: which entry was used, or why none applies; ``Backend.config()`` reports it.
    """

    config: Any
    note: str


def resolve(backend, device: torch.device, dtype: torch.dtype, allow_tf32: bool, m: int, n: int,
            k: int) -> Choice:
    """The Choice for a call of ``backend`` (a ``Backend`` with ``pin``) on (M, K) @ (K, N)
    operands of ``dtype`` on ``device``, from the table at ``table_path()``.

    Decided once per (table file version, backend, device, dtype, bucket). ``gemm()`` calls
    it only when it binds a new call signature.

    Raises:
        ValueError: the table is malformed, or its entry holds a config the backend cannot use.
    """
    table = load()
    key = backend.name, device, dtype, allow_tf32, bucket(m, n, k)
    choice = table.memo.get(key)
    if choice is None:
        choice = table.memo[key] = _choose(table, backend, device_name(device),
                                           dtype_name(dtype, allow_tf32), key[-1])
    return choice


def _choose(table: Table, backend, gpu: str, dtype: str, shape: tuple[int, int, int]) -> Choice:
    entry = table.get(backend.name, gpu, dtype, *shape)
    if entry is None:
        return Choice(None, "untuned: " + why_not(backend.name, gpu, dtype, *shape, table.path))
    try:
        config = backend.pin(entry["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"tuned table {table.path}: the {backend.name} {dtype} entry for {gpu} "
                         f"at bucket {_shape(shape)} has a config it cannot use "
                         f"({type(exc).__name__}: {exc})") from None
    return Choice(config, f"tuned: {table.path.name} entry for {gpu} {dtype} bucket "
                          f"{_shape(shape)}, {entry['tflops']:.4g} TFLOP/s at "
                          f"{_shape(entry['shape'])}")
