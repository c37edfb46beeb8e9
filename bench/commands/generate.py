"""``gemmlab generate``: text from a ``gemmlab train`` checkpoint, in one process (CPU or one
GPU), printed to stdout."""

from __future__ import annotations

import argparse
import pickle

import torch
from rich.console import Console

from ..session import UsageError, check_gemm_backend, use_interpreter_without_gpu


def run(args: argparse.Namespace, console: Console) -> int:
    """Print the prompt and ``--tokens`` bytes drawn after it (invalid UTF-8 shown as U+FFFD);
    0, or 2 for a mistake in the arguments."""
    if not args.prompt:
        raise UsageError("--prompt must not be empty (the model continues a text)")
    if args.tokens < 0 or args.temperature < 0:
        raise UsageError(f"--tokens and --temperature must be >= 0; got {args.tokens} and "
                         f"{args.temperature}")
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible")
    use_interpreter_without_gpu(device_type)
    from mpi4py import MPI

    import tp.comm
    from tp import checkpoint
    from tp.generate import generate

    try:
        found = checkpoint.find(args.checkpoint)
        dtype = checkpoint.read_manifest(found)["settings"]["dtype"]
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if not (found / checkpoint.MODEL).is_file():
        raise UsageError(f"{found} is incomplete: no {checkpoint.MODEL}")
    check_gemm_backend(args.backend, dtype, device_type)
    device = torch.device("cpu") if device_type == "cpu" else torch.device(
        "cuda", torch.cuda.current_device())
    try:
        model, _ = checkpoint.load_dense(found, tp.comm.create("mpi", MPI.COMM_SELF, device),
                                         device=device, backend=args.backend)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:  # a damaged model.pt
        raise UsageError(f"cannot load {found / checkpoint.MODEL}: {exc}") from None
    prompt = torch.tensor(list(args.prompt.encode("utf-8")), dtype=torch.int64)
    ids = generate(model, prompt, args.tokens, temperature=args.temperature,
                   generator=torch.Generator().manual_seed(args.seed))
    console.out(bytes(ids.tolist()).decode("utf-8", errors="replace"), highlight=False)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``gemmlab generate``."""
    gen = subparsers.add_parser("generate", help="text from a gemmlab train checkpoint "
                                "(one process)")
    gen.add_argument("checkpoint", help="a checkpoint (DIR/step-<s>) or a train --checkpoint "
                     "DIR (its latest)")
    gen.add_argument("--prompt", required=True, help="the text to continue (its UTF-8 bytes "
                     "are the tokens; the model sees the last --seq of them)")
    gen.add_argument("--tokens", type=int, default=200, help="bytes to generate")
    gen.add_argument("--temperature", type=float, default=1.0,
                     help="softmax temperature of the draws; 0: greedy (the most likely byte)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the draws")
    gen.add_argument("--device", choices=("cpu", "cuda"),
                     help="default cuda when a GPU is visible")
    gen.add_argument("--backend", default="cublas", help="GEMM backend (gemmlab info lists "
                     "them)")
    gen.set_defaults(func=run)
    return gen
