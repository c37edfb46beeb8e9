"""What every gemmlab command shares before it measures anything: comma lists, the options
every command has (``--out``, ``--overwrite``, ``--threads``), the device and the Triton
interpreter policy, torch's thread count, MPI start-up, arguments checked on every rank, and
user errors as one ``error:`` line (exit status 2)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import sys
from collections.abc import Callable

import torch
from rich.console import Console

NO_GPU_BANNER = ("No CUDA GPU found: running the CPU functional check only (small shapes; "
                 "cublas and torch_unfused run torch's CPU BLAS, triton_fused runs under the "
                 "Triton interpreter). Times below are CPU times, not GPU performance.")


class UsageError(ValueError):
    """A mistake in the command line: printed as one ``error:`` line, exit status 2."""


CANNOT_RUN = 3  # exit status: the command is right, the machine cannot run it (a GPU per rank)
INTERRUPTED = 130  # the shell's status for a process ended by SIGINT (128 + 2)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def sigterm_as_ctrl_c() -> None:
    """Handle SIGTERM (a job scheduler's or ``timeout``'s stop) as Ctrl-C: a
    ``KeyboardInterrupt``, after which a command writes what finished."""
    signal.signal(signal.SIGTERM, _raise_interrupt)


@contextlib.contextmanager
def interrupts_ignored():
    """Inside, SIGINT and SIGTERM are ignored: a second Ctrl-C while an interrupted run
    writes what finished would cut the writing short."""
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class CannotRun(UsageError):
    """A command this machine cannot run (more ranks on a node than a GPU each where one is
    needed): printed as one ``cannot run:`` line, exit status ``CANNOT_RUN``, which
    ``bench.scale_series`` reports and skips."""


def add_run_options(parser: argparse.ArgumentParser, out_help: str = "directory for "
                    "results.jsonl (rows as they finish), results.json, results.csv and "
                    "results.png") -> None:
    """``--out``, ``--overwrite`` and ``--threads``, the same in every command."""
    parser.add_argument("--out", help=out_help)
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --out (its result files are replaced)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="torch CPU threads per rank (default: the machine's cores divided "
                        "by the ranks on it)")


def add_layer_options(parser: argparse.ArgumentParser, timed: str | None = None) -> None:
    """The options of the commands that run the TP layers (tp, train, scale): ``--backend``
    (GEMM), ``--comm``, ``--device``; with ``timed`` (what one timed iteration is) also
    ``--chunks``, ``--sm-margin``, ``--iters`` and ``--warmup-iters``."""
    parser.add_argument("--backend", default="cublas", help="GEMM backend of the TP layers "
                        "(gemmlab info lists them)")
    parser.add_argument("--comm", help="communicator: mpi, ring, nccl or symm (and "
                        "symm's fixed-algorithm variants; default nccl on GPUs, mpi on CPUs)")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="default cuda when a GPU is visible")
    if timed is None:
        return
    parser.add_argument("--chunks", type=int, default=4,
                        help="row chunks of the row-parallel GEMMs")
    parser.add_argument("--sm-margin", type=int, default=0,
                        help="GPU only: SMs the overlapped cuBLAS GEMMs leave free for NCCL "
                        "(cuBLASLt SM count target; 0: all SMs)")
    parser.add_argument("--iters", type=int, default=10, help=f"timed {timed}")
    parser.add_argument("--warmup-iters", type=int, default=3, help=f"warm-up {timed}")


def check_run_options(args) -> None:
    """The checks of ``add_run_options``'s options, before any work.

    Raises:
        UsageError: ``--out`` unusable (``bench.recording.out_problem``), ``--threads`` < 1.
    """
    from .recording import out_problem

    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1; got {args.threads}")
    if args.out and (why := out_problem(args.out, args.overwrite)) is not None:
        raise UsageError(why)


def check_timing_options(warmup_ms: float, rep_ms: float, min_reps: int | None = None) -> None:
    """The checks of the timing options ``--warmup-ms``, ``--rep-ms`` and ``--min-reps``.

    Raises:
        UsageError: ``--warmup-ms`` < 0, ``--rep-ms`` <= 0, either not finite (a NaN time
            never ends a loop), ``--min-reps`` < 1 (a row with no sample has no median).
    """
    if not (warmup_ms >= 0 and math.isfinite(warmup_ms)):
        raise UsageError(f"--warmup-ms must be a finite number >= 0; got {warmup_ms:g}")
    if not (rep_ms > 0 and math.isfinite(rep_ms)):
        raise UsageError(f"--rep-ms must be a finite number > 0; got {rep_ms:g}")
    if min_reps is not None and min_reps < 1:
        raise UsageError(f"--min-reps must be >= 1; got {min_reps}")


def set_threads(requested: int | None, local_ranks: int = 1) -> int:
    """Set torch's intra-op threads: ``requested``, or the machine's cores divided by the
    ranks on it (at least 1), so one process and P ranks of a run use the machine alike and
    a comparison between them compares like with like. Returns the count set (``meta``
    records it as ``torch_threads``)."""
    threads = requested or max(1, (os.cpu_count() or 1) // max(local_ranks, 1))
    torch.set_num_threads(threads)
    return threads


def row_printer(console: Console, describe: Callable[[dict], str],
                total: int | None = None) -> Callable[[dict], None] | None:
    """One line per finished row (``[i/total] <describe(row)>``) when stdout is not a
    terminal (a log file, a pipe, a batch job); None on a terminal, where a progress bar or
    the tables show progress."""
    if sys.stdout.isatty():
        return None
    done = [0]

    def line(row: dict) -> None:
        done[0] += 1
        console.print(f"[{done[0]}{'' if total is None else f'/{total}'}] {describe(row)}",
                      highlight=False)

    return line


def agree(world, check: Callable[[], None]) -> UsageError | None:
    """Run ``check`` on every rank of ``world``; the first rank's error (its ``UsageError``
    or ``CannotRun``) when any rank's check failed, else None. Collective: every rank gets the
    same answer, so a mistake one rank sees (an ``--out`` another rank can write) stops them
    all, before any work and without MPI_Abort."""
    try:
        check()
        error = None
    except UsageError as exc:
        error = (isinstance(exc, CannotRun), str(exc))
    errors = [e for e in world.allgather(error) if e is not None]
    if not errors:
        return None
    cannot_run, message = errors[0]
    return (CannotRun if cannot_run else UsageError)(message)


def csv_list(text: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; None or empty -> ``[]``."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def int_list(text: str | None, flag: str) -> list[int]:
    """``"1, 2,4"`` -> ``[1, 2, 4]``: ``csv_list`` of positive integers.

    Raises:
        UsageError: empty, or an item that is not an integer >= 1 (the message names ``flag``).
    """
    try:
        values = [int(item) for item in csv_list(text)]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UsageError(f"{flag} must be a comma list of positive integers; got {text!r}")
    return values


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


def check_gemm_backend(name: str, dtype_name: str, device_type: str) -> None:
    """That GEMM backend ``name`` exists, runs here, and takes ``dtype_name`` on
    ``device_type``.

    Raises:
        UsageError: it does not, saying why.
    """
    import backends

    from .gemm_bench import unsupported

    if name not in backends.BACKENDS:
        raise UsageError(f"unknown backend {name}; known: {', '.join(backends.BACKENDS)}")
    impl = backends.BACKENDS[name]
    if (why := impl.unavailable()) is not None:
        raise UsageError(f"backend {name} cannot run here: {why}")
    if (why := unsupported(impl, dtype_name, torch.device(device_type))) is not None:
        raise UsageError(f"backend {name} {why}")


def default_comm(device_type: str) -> str:
    """The communicator when ``--comm`` is not given: nccl on GPUs, mpi on CPUs."""
    return "nccl" if device_type == "cuda" else "mpi"


def check_comm(name: str, dtype_name: str, device_type: str) -> None:
    """That communicator ``name`` exists, runs on ``device_type`` and can sum ``dtype_name``
    (the TP layers all-reduce and reduce-scatter their partial sums).

    Raises:
        UsageError: it cannot, saying why.
    """
    import tp.comm
    from backends.dtypes import DTYPES

    if name not in tp.comm.BACKENDS:
        raise UsageError(f"unknown communicator {name}; known: {', '.join(tp.comm.BACKENDS)}")
    if name in ("nccl", "ring/nccl") and device_type != "cuda":
        raise UsageError(f"--comm {name} needs GPUs (--device cuda)")
    summable = tp.comm.reduce_dtypes(name, device_type)
    if summable is not None and DTYPES[dtype_name].torch not in summable:
        raise UsageError(f"the {name} communicator cannot sum {dtype_name}; use --comm ring"
                         + (" or nccl" if device_type == "cuda" else ""))


def check_cuda_graph(device_type: str, comm: str) -> None:
    """That ``--cuda-graph`` can capture work on ``device_type`` over communicator ``comm``.

    Raises:
        UsageError: not a CUDA device, or a communicator that steps through the host.
    """
    import tp.comm

    # Their GPU collectives are enqueued on streams (no host step inside), so a CUDA graph
    # can capture them; mpi and ring/mpi move data from the host.
    graphed = ("nccl", *tp.comm.SYMM, "ring", "ring/nccl")
    if device_type != "cuda" or comm not in graphed:
        raise UsageError(f"--cuda-graph needs --device cuda and a stream-ordered communicator "
                         f"({', '.join(graphed)}); got {device_type} and {comm}")


def launch_in_order() -> None:
    """Make the GPU start kernels in launch order (``CUDA_DEVICE_MAX_CONNECTIONS=1``), as
    Megatron-LM does for TP overlap: a communication kernel launched before a GEMM then gets
    its SMs first, instead of waiting until the GEMM has taken all of them. CUDA reads it when
    it initialises, so this must run before anything touches CUDA, MPI_Init included (set
    after MPI_Init on the H200 machines, it had no effect: 29% overlap efficiency, not 67%). An
    explicit setting is left alone."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")


def mpi_setup(args, console: Console, check: Callable[[str, int], None] | None = None):
    """The start of every ``mpiexec``-launched command, before any work: kernels in launch
    order (``launch_in_order``), abort-on-exception (``tp.mpi``), Ctrl-C and SIGTERM
    stopping every rank at one row (``bench.recording.stop_collectively``), the device type
    (``args.device``, or cuda when a GPU is visible) and with it the Triton interpreter
    policy (set before ``tp`` or ``backends`` is imported), then on every rank the
    command line (the same on every rank), the run options and ``check(device_type,
    ranks)`` (the command's own argument checks, raising ``UsageError``), agreed between
    ranks; then the bound GPU or the CPU and the torch threads (cores over the ranks on
    this node).

    Returns:
        ``(world, device, say)``, ``say`` printing on rank 0 only; or an ``int`` exit status
        after one line on rank 0: 2 (``error:``) when any rank found a mistake,
        ``CANNOT_RUN`` (``cannot run:``) when a check raised ``CannotRun``.
    """
    launch_in_order()  # before MPI_Init, which may already initialise CUDA
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    use_interpreter_without_gpu(device_type)
    from mpi4py import MPI

    from tp.mpi import abort_on_exception, bind_device

    from .recording import stop_collectively

    abort_on_exception()
    stop_collectively()
    world = MPI.COMM_WORLD
    say = console.print if world.Get_rank() == 0 else (lambda *a, **k: None)

    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    local_ranks = local.Get_size()
    local.Free()
    argvs = world.allgather(sys.argv[1:])  # ranks run alike only on the same arguments

    def checks() -> None:
        if (other := next((r for r, v in enumerate(argvs) if v != argvs[0]), None)) is not None:
            raise UsageError(f"the ranks were started with different arguments (rank 0: "
                             f"{shlex.join(argvs[0])}; rank {other}: {shlex.join(argvs[other])})")
        if device_type == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda but no CUDA GPU is visible")
        check_run_options(args)
        if check is not None:
            check(device_type, world.Get_size())
        _check_gpu_per_nccl_rank(getattr(args, "comm", None), device_type, local_ranks)

    if (error := agree(world, checks)) is not None:
        if isinstance(error, CannotRun):
            say(f"cannot run: {error}", highlight=False, soft_wrap=True)
            return CANNOT_RUN
        say(f"error: {error}", highlight=False, soft_wrap=True)
        return 2
    device = bind_device(world) if device_type == "cuda" else torch.device("cpu")
    set_threads(args.threads, local_ranks)
    return world, device, say


def _check_gpu_per_nccl_rank(comm: str | None, device_type: str, local_ranks: int) -> None:
    """NCCL refuses two ranks on one GPU (ncclInvalidUsage at start-up): say so before it
    starts. ``comm``: the ``--comm`` text (None: the command's default, nccl among them)."""
    names = csv_list(comm) or ["nccl"]
    if device_type != "cuda" or not {"nccl", "ring/nccl", "nccl_direct"} & set(names):
        return
    gpus = torch.cuda.device_count()
    if local_ranks > gpus:
        raise CannotRun(f"NCCL needs a GPU per rank: {local_ranks} ranks share {gpus} GPU(s) "
                         f"on this node; use --comm symm, ring or mpi")
