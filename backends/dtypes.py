"""The dtype vocabulary of every gemmlab command: one ``DType`` per name, and which names each
command accepts. Imports only torch, so anything may import it (``tp.comm`` included).

==========  ==============  =====  =========  ====  ========
name        torch           tf32   tolerance  NCCL  MPI
==========  ==============  =====  =========  ====  ========
``fp32``    float32         no     1e-5       7     FLOAT
``tf32``    float32         yes    5e-3       --    --
``fp16``    float16         no     5e-3       6     --
``bf16``    bfloat16        no     1e-2       9     --
``fp64``    float64         no     --         8     DOUBLE
``int32``   int32           no     --         2     INT32_T
``int64``   int64           no     --         4     INT64_T
``int8``    int8            no     --         0     --
``uint8``   uint8           no     --         1     --
==========  ==============  =====  =========  ====  ========

- ``tf32`` is fp32 operands multiplied on the TF32 tensor cores (``allow_tf32=True``); its data
  are fp32, so it has no NCCL or MPI code of its own and ``name_of(torch.float32)`` is fp32.
- ``tolerance``: the relative Frobenius error a GEMM result may have against the float64
  reference. fp32: FMA accumulation over K stays near 1e-6; TF32 and fp16 round the operands
  or D to 10-11 mantissa bits, bf16 to 7-8. The TP layers use the same bounds.
- ``nccl``: the ``ncclDataType_t`` value of nccl.h (fixed by NCCL's ABI).
- ``mpi``: the mpi4py ``MPI`` datatype attribute the ``mpi`` communicator sums with; MPI has
  no standard fp16 or bf16 type, so native MPI cannot sum them. (int8/uint8 are kept only for
  the NCCL codes: the ring transports move bytes as ``uint8``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    """One name of the vocabulary.

    Attributes:
        name: what commands, result rows and the tuned table call it (``fp32``, ``tf32``, ...).
        torch: the tensors' torch dtype (fp32 for ``tf32``).
        tf32: fp32 operands on the TF32 tensor cores (``allow_tf32=True``).
        tolerance: relative Frobenius error allowed against the float64 reference (floating
            GEMM types; None elsewhere).
        nccl: ``ncclDataType_t`` value, None where NCCL is not given this type.
        mpi: name of the mpi4py ``MPI`` datatype the ``mpi`` communicator sums it with, None
            where it cannot sum it.
    """

    name: str
    torch: torch.dtype
    tf32: bool = False
    tolerance: float | None = None
    nccl: int | None = None
    mpi: str | None = None

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.torch.itemsize


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("fp32", torch.float32, tolerance=1e-5, nccl=7, mpi="FLOAT"),
    DType("tf32", torch.float32, tf32=True, tolerance=5e-3),
    DType("fp16", torch.float16, tolerance=5e-3, nccl=6),
    DType("bf16", torch.bfloat16, tolerance=1e-2, nccl=9),
    DType("fp64", torch.float64, nccl=8, mpi="DOUBLE"),
    DType("int32", torch.int32, nccl=2, mpi="INT32_T"),
    DType("int64", torch.int64, nccl=4, mpi="INT64_T"),
    DType("int8", torch.int8, nccl=0),
    DType("uint8", torch.uint8, nccl=1),
)}

# The names each command accepts, in the order it sweeps them.
GEMM = ("fp32", "tf32", "fp16", "bf16")  # gemmlab bench, tune; the tuned table
GEMM_GPU = GEMM  # bench/tune's default sweep on a GPU
GEMM_CPU = ("fp32", "fp16", "bf16")  # ... and on a CPU (no TF32 there)
COMM = ("fp32", "fp64", "fp16", "bf16", "int32", "int64")  # gemmlab comm
TP = ("fp32", "fp16", "bf16")  # gemmlab tp, train, scale

# Relative Frobenius error allowed per GEMM name (``backends.TOLERANCES``).
TOLERANCES: dict[str, float] = {name: DTYPES[name].tolerance for name in GEMM}

# Storage dtype -> its name (tf32 is a way of multiplying fp32, never a storage dtype).
_BY_TORCH = {d.torch: d for d in DTYPES.values() if not d.tf32}


def parse(name: str, allowed: tuple[str, ...] | None = None) -> DType:
    """The ``DType`` called ``name``, which must be one of ``allowed`` (default: every name).

    Raises:
        ValueError: ``unknown dtype X; known: ...`` (the allowed names).
    """
    allowed = tuple(DTYPES) if allowed is None else allowed
    if name not in allowed or name not in DTYPES:
        raise ValueError(f"unknown dtype {name}; known: {', '.join(allowed)}")
    return DTYPES[name]


def of(dtype: torch.dtype, tf32: bool = False) -> DType:
    """The ``DType`` of tensors of torch ``dtype`` (``tf32`` for fp32 with TF32 on).

    Raises:
        ValueError: a torch dtype outside the vocabulary, or ``tf32`` with another dtype than
            fp32.
    """
    if tf32:
        if dtype != torch.float32:
            raise ValueError(f"tf32 applies to torch.float32 only; got {dtype}")
        return DTYPES["tf32"]
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        raise ValueError(f"no gemmlab name for {dtype}; known: "
                         f"{', '.join(str(d) for d in _BY_TORCH)}") from None


def name_of(dtype: torch.dtype, tf32: bool = False) -> str:
    """The name of torch ``dtype`` (``"tf32"`` for fp32 with ``tf32``): ``of(...).name``.

    Raises:
        ValueError: as ``of``.
    """
    return of(dtype, tf32).name
