"""What every gemmlab command shares before it measures anything: comma lists, the device and
the Triton interpreter policy, MPI start-up, and user errors as one ``error:`` line."""

from __future__ import annotations

import os

import torch
from rich.console import Console

NO_GPU_BANNER = ("No CUDA GPU found: running the CPU functional check only (small shapes; "
                 "cublas and torch_unfused run torch's CPU BLAS, triton_fused runs under the "
                 "Triton interpreter). Times below are CPU times, not GPU performance.")


class UsageError(ValueError):
    """A mistake in the command line: printed as one ``error:`` line, exit status 2."""


def csv_list(text: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; None or empty -> ``[]``."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def use_interpreter_without_gpu(device_type: str) -> None:
    """The one Triton interpreter policy of every command: on a CPU device triton_fused runs
    under the interpreter (``TRITON_INTERPRET=1``, set before ``backends`` first imports the
    kernel); an explicit setting is left alone."""
    if device_type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


def prepare_backends(console: Console) -> bool:
    """Say whether a GPU is here, first; without one, turn the Triton interpreter on before
    the backends (and with them the Triton kernel) are imported. Returns whether a GPU is
    here."""
    gpu = torch.cuda.is_available()
    if gpu:
        console.print(f"GPU: {torch.cuda.get_device_name()} (torch {torch.__version__}, "
                      f"CUDA {torch.version.cuda})")
    else:
        console.print(NO_GPU_BANNER)
    use_interpreter_without_gpu("cuda" if gpu else "cpu")
    return gpu


def launch_in_order() -> None:
    """Make the GPU start kernels in launch order (``CUDA_DEVICE_MAX_CONNECTIONS=1``), as
    Megatron-LM does for TP overlap: a communication kernel launched before a GEMM then gets
    its SMs first, instead of waiting until the GEMM has taken all of them. CUDA reads it when
    it initialises, so this must run before anything touches CUDA, MPI_Init included (set
    after MPI_Init on the H200 machines, it had no effect: 29% overlap efficiency, not 67%). An
    explicit setting is left alone."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")


def mpi_setup(args, console: Console):
    """Abort-on-exception, the device (bound GPU or CPU; ``args.device`` or cuda when a GPU is
    visible), the Triton interpreter policy, and a printer for rank 0 only. Returns
    ``(world, device, say)``.

    Raises:
        UsageError: ``--device cuda`` without a visible GPU.
    """
    from mpi4py import MPI

    from tp.mpi import abort_on_exception, bind_device

    abort_on_exception()
    world = MPI.COMM_WORLD
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible")
    use_interpreter_without_gpu(device_type)
    device = bind_device(world) if device_type == "cuda" else torch.device("cpu")
    say = console.print if world.Get_rank() == 0 else (lambda *a, **k: None)
    return world, device, say
