"""Every raw CUDA C kernel of the ladder, launched once per dtype at an odd shape and checked
against the float64 reference: the program to run under NVIDIA's compute-sanitizer.

    compute-sanitizer --tool memcheck --kernel-name kns=gemm_ --error-exitcode 1 \\
        python3 -m bench.sanitize
    compute-sanitizer --tool racecheck --racecheck-report all --kernel-name kns=gemm_ \\
        --error-exitcode 1 python3 -m bench.sanitize

``--kernel-name kns=gemm_`` instruments only the ladder's kernels (their names start with
``gemm_``), not PyTorch's. The default shape, 1000 x 1999 x 777, is a multiple of no tile
size and of no vector width, so every edge path runs. Each line names the build that ran (the
backend's ``config()``: its tile sizes, and the tuned entry that chose them, if one did;
``GEMMLAB_TUNED_FILE`` points ``gemm()`` at another table). Exit status 1 when a result is
wrong.
"""

from __future__ import annotations

import argparse
import sys

import torch

import backends
from backends import dtypes
from backends.registry import CUDA_KERNELS

from .gemm_bench import parse_shape, random_operand


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.sanitize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1000x1999x777", help="MxNxK (default 1000x1999x777)")
    parser.add_argument("--backend", default=",".join(CUDA_KERNELS),
                        help="comma list of CUDA C backends (default: all)")
    args = parser.parse_args(argv)
    m, n, k = parse_shape(args.shape)
    generator = torch.Generator(device="cuda").manual_seed(0)
    wrong = 0
    for name in args.backend.split(","):
        for dtype in CUDA_KERNELS[name].dtypes:
            a, b, c = (random_operand(*shape, dtype=dtype, device=torch.device("cuda"),
                                      generator=generator) for shape in ((m, k), (k, n), (m, n)))
            out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            backends.gemm(a, b, c, activation="relu", backend=name, out=out)
            torch.cuda.synchronize()
            err = backends.relative_error(out, backends.reference(a, b, c, "relu"))
            spec = dtypes.of(dtype)
            ok = err <= spec.tolerance
            wrong += not ok
            print(f"{name:16s} {spec.name:5s} {m}x{n}x{k}  rel err {err:.1e}  "
                  f"{'PASS' if ok else 'FAIL'}  ({backends.BACKENDS[name].config()})", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
