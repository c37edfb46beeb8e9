"""Checkpoints of ``tp.train``: save a DP x TP run every few steps, resume it bit for bit, and
load its weights into one process (``gemmlab generate``).

One checkpoint is one directory, ``<dir>/step-<s>`` (s: the steps done, 8 digits), holding

- ``checkpoint.json``, the manifest: ``format`` (``FORMAT``), ``step``, the run's
  ``settings`` (``run_settings``: model config, seed, batch, learning rate, TP, DP, SP,
  dtype, device type, GEMM backend) and ``loss``, the global loss of steps 0 .. s-1 (JSON
  floats round-trip exactly);
- ``model.pt``: the weights in the dense (TP = 1) layout, i.e. the ``state_dict`` of the same
  ``GPT`` built at TP = 1 (same names and shapes; the TP layers keep (in, out) weights),
  gathered from the shards of DP rank 0's TP group and written by its TP rank 0. One process
  loads it as it is (``load_dense``); a resumed run cuts each rank's shards from it with the
  layers' own ``shard``, the cut that built them from their dense masters;
- ``rank-dp<d>-tp<t>.pt``: each rank's own state, its Adam ``state_dict`` (the moments of
  its shards, the step counts) and the state of its batch generator.

Saving is atomic: every file goes into ``.step-<s>.partial`` (fsynced), and when all ranks
have written theirs, rank 0 writes the manifest there and renames the directory to
``step-<s>``. The rename is the commit: a directory named ``step-*`` is complete, and a save
interrupted before it leaves only the ``.partial`` directory, which ``find`` ignores and the
next save of that step replaces. Checkpoints are kept; none is deleted by a save.

Resuming is exact because every piece of state that the next steps read is restored as it
was: the parameters (a gather then a cut are copies), Adam's moments and step counts, and the
generator that draws the batches. Gradients are zeroed before every step (a resumed run's
first backward writes them afresh: the same values), and nothing else is random (no
dropout). A resumed run with the same ``run_settings`` (checked), the same communicator
and the same torch thread count (not checked: they change the order of sums, not the model)
therefore computes exactly the losses of the uninterrupted run; the DP
replicas are identical (every rank gets the same averaged gradient), so rank 0's dense
weights stand for all of them. Files are written by ``torch.save`` and read with
``weights_only=True``. The ranks must share the checkpoint's file system.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch

from backends.dtypes import DTYPES, name_of

from .layers import _TPLinear
from .transformer import GPT, GPTConfig

FORMAT = 1
MANIFEST = "checkpoint.json"
MODEL = "model.pt"


def run_settings(config: GPTConfig, *, tp: int, dp: int, sequence_parallel: bool, seed: int,
                 batch: int, lr: float, dtype: torch.dtype, device_type: str,
                 backend: str) -> dict:
    """What a resumed run must share with the saved one (the manifest's ``settings``): the
    model (``GPTConfig``'s fields, under ``"model"``), the data and optimizer (seed, global
    batch, learning rate), the layout (TP, DP, SP, which decide the files' shards) and the
    arithmetic (dtype name, ``"cpu"`` or ``"cuda"``, GEMM backend). JSON-ready."""
    return {"model": dataclasses.asdict(config), "seed": seed, "batch": batch, "lr": lr,
            "tp": tp, "dp": dp, "sequence_parallel": sequence_parallel,
            "dtype": name_of(dtype), "device": device_type, "backend": backend}


def mismatches(saved: dict, settings: dict) -> list[str]:
    """Each setting that differs between a checkpoint's ``saved`` settings and a run's, as
    ``"<name> <saved> in the checkpoint, <this run's> here"``; empty when they agree."""
    def flat(s: dict) -> dict:
        return {**s.get("model", {}), **{k: v for k, v in s.items() if k != "model"}}

    old, new = flat(saved), flat(settings)
    return [f"{key} {old.get(key)!r} in the checkpoint, {new.get(key)!r} here"
            for key in dict.fromkeys([*new, *old]) if old.get(key) != new.get(key)]


def find(path: str | Path) -> Path:
    """The checkpoint at ``path``: ``path`` itself when it holds a manifest, else the
    complete checkpoint of the most steps in it.

    Raises:
        FileNotFoundError: ``path`` is neither a checkpoint nor a directory holding one.
    """
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    found = sorted(_complete(path).items())
    if not found:
        raise FileNotFoundError(f"{path} is not a checkpoint, nor a directory holding "
                                f"step-* checkpoints")
    return found[-1][1]


def read_manifest(path: str | Path) -> dict:
    """The manifest of the checkpoint directory ``path`` (see the module doc).

    Raises:
        ValueError: it cannot be read, or is not a manifest of format ``FORMAT``.
    """
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text())
        if manifest["format"] != FORMAT:
            raise ValueError(f"format {manifest['format']}, not {FORMAT}")
        manifest["step"], manifest["settings"]["model"], manifest["loss"]  # noqa: B018
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{Path(path) / MANIFEST} is not a gemmlab checkpoint manifest "
                         f"({type(exc).__name__}: {exc})") from None
    return manifest


def missing(path: str | Path, manifest: dict) -> list[str]:
    """The files of the checkpoint at ``path`` that its ``manifest`` implies (``model.pt``
    and a rank file per DP x TP rank of its settings) and that are not there."""
    settings = manifest["settings"]
    names = [MODEL, *(_rank_file(d, t) for d in range(settings["dp"])
                      for t in range(settings["tp"]))]
    return [name for name in names if not (Path(path) / name).is_file()]


def later(directory: str | Path, step: int) -> list[Path]:
    """The complete checkpoints in ``directory`` past ``step`` (a run starting at ``step``
    would otherwise leave another run's later checkpoints beside its own), by step."""
    return [path for s, path in sorted(_complete(Path(directory)).items()) if s > step]


def _complete(directory: Path) -> dict[int, Path]:
    """step -> ``step-<s>`` directory of every complete checkpoint in ``directory``."""
    if not directory.is_dir():
        return {}
    return {int(p.name[5:]): p for p in directory.glob("step-*")
            if p.name[5:].isdigit() and (p / MANIFEST).is_file()}


def _rank_file(dp_rank: int, tp_rank: int) -> str:
    return f"rank-dp{dp_rank}-tp{tp_rank}.pt"


def _owner(model: GPT, name: str) -> tuple[_TPLinear | None, bool]:
    """The TP layer that holds state ``name`` (None for any other module), and whether the
    state is its bias."""
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    return (module if isinstance(module, _TPLinear) else None), leaf == "bias"


def dense_state(model: GPT, tp_comm) -> dict[str, torch.Tensor]:
    """``model``'s weights in the dense (TP = 1) layout, CPU tensors of the model's dtype:
    each TP layer's shards all-gathered along their cut dimension. Collective over the TP
    group ``tp_comm``."""
    state = {}
    for name, tensor in model.state_dict().items():
        layer, bias = _owner(model, name)
        dim = None if layer is None else layer.split_dim(bias)
        if dim is not None and tp_comm.size > 1:  # all_gather stacks along dim 0
            tensor = tp_comm.all_gather(tensor.movedim(dim, 0).contiguous()).movedim(0, dim)
        state[name] = tensor.detach().cpu().contiguous()
    return state


def load_sharded(model: GPT, dense: dict[str, torch.Tensor]) -> None:
    """Load dense (TP = 1) weights into ``model``: each rank takes its shards of the TP
    layers (``shard``, the cut that built them), everything else whole.

    Raises:
        RuntimeError: names or shapes that do not fit the model (``load_state_dict``).
    """
    own, state = model.state_dict(), {}
    for name, tensor in dense.items():
        layer, bias = _owner(model, name) if name in own else (None, False)
        state[name] = tensor if layer is None else layer.shard(tensor, bias)
    model.load_state_dict(state)


def _barrier(tp_comm, dp_comm, device: torch.device) -> None:
    """Every rank of the DP x TP grid gets here before any leaves: a one-element all-reduce
    over the TP group, then over the DP group (each DP peer enters the second only after its
    whole TP group entered the first, and the DP peers' TP groups cover the grid); ``item()``
    makes the host wait for stream-ordered communicators too."""
    flag = torch.zeros(1, device=device)
    tp_comm.all_reduce(flag)
    dp_comm.all_reduce(flag)
    flag.item()


def _fsynced(path: Path, obj) -> None:
    """``torch.save(obj)`` to ``path``, on disk before returning."""
    with path.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def save(directory: str | Path, step: int, *, model: GPT, optimizer: torch.optim.Optimizer,
         generator: torch.Generator, loss: list[float], settings: dict, tp_comm,
         dp_comm) -> Path:
    """Write the checkpoint of a run after ``step`` steps, ``directory/step-<step>``
    (module doc), atomically. Collective over the grid (``tp_comm`` x ``dp_comm``).

    Args:
        loss: the global loss of steps 0 .. ``step`` - 1.
        settings: the run's ``run_settings``.

    Returns:
        The checkpoint's directory, complete on every rank's return.

    Raises:
        OSError: a file cannot be written, or ``step-<step>`` exists already.
    """
    device = next(model.parameters()).device
    final = Path(directory) / f"step-{step:08d}"
    partial = final.with_name(f".{final.name}.partial")
    writer = tp_comm.rank == 0 and dp_comm.rank == 0
    if writer:
        shutil.rmtree(partial, ignore_errors=True)  # what an interrupted save left
        partial.mkdir(parents=True)
    _barrier(tp_comm, dp_comm, device)
    if dp_comm.rank == 0:  # one TP group gathers: the DP replicas hold the same weights
        dense = dense_state(model, tp_comm)
        if writer:
            _fsynced(partial / MODEL, dense)
    _fsynced(partial / _rank_file(dp_comm.rank, tp_comm.rank),
             {"optimizer": optimizer.state_dict(), "generator": generator.get_state()})
    _barrier(tp_comm, dp_comm, device)
    if writer:
        manifest = {"format": FORMAT, "step": step, "settings": settings, "loss": loss}
        with (partial / MANIFEST).open("w") as f:
            f.write(json.dumps(manifest, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        partial.rename(final)  # the commit (fails when final exists: never replaced)
    _barrier(tp_comm, dp_comm, device)
    return final


def restore(path: str | Path, *, model: GPT, optimizer: torch.optim.Optimizer,
            generator: torch.Generator, settings: dict, tp_comm, dp_comm) -> tuple[int,
                                                                                  list[float]]:
    """Put the state of checkpoint ``path`` (``find``'s rules) into this rank's ``model``,
    ``optimizer`` and ``generator``, built as the saved run built them.

    Returns:
        (the steps done, their losses).

    Raises:
        FileNotFoundError: as ``find``; this rank's file is missing.
        ValueError: an unreadable manifest, or ``settings`` that differ from the saved ones
            (``mismatches`` lists them).
    """
    path = find(path)
    manifest = read_manifest(path)
    if problems := mismatches(manifest["settings"], settings):
        raise ValueError(f"checkpoint {path} was saved by another run or layout: "
                         + "; ".join(problems))
    load_sharded(model, torch.load(path / MODEL, map_location="cpu", weights_only=True))
    mine = torch.load(path / _rank_file(dp_comm.rank, tp_comm.rank), map_location="cpu",
                      weights_only=True)
    optimizer.load_state_dict(mine["optimizer"])
    generator.set_state(mine["generator"])
    return manifest["step"], manifest["loss"]


def load_dense(path: str | Path, comm, *, device: torch.device | str = "cpu",
               backend: str = "cublas") -> tuple[GPT, dict]:
    """The model of checkpoint ``path`` (``find``'s rules) in one process, in the saved dtype,
    on ``device``, its GEMMs through ``backend``; ``comm``: a one-rank communicator.

    Returns:
        (the model in eval mode, the manifest).

    Raises:
        FileNotFoundError, ValueError: as ``find`` and ``read_manifest``.
    """
    path = find(path)
    manifest = read_manifest(path)
    settings = manifest["settings"]
    model = GPT(GPTConfig(**settings["model"]), comm, backend=backend, device=device,
                dtype=DTYPES[settings["dtype"]].torch)
    model.load_state_dict(torch.load(path / MODEL, map_location="cpu", weights_only=True))
    return model.eval(), manifest
