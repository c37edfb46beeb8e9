"""The roofline of ``gemmlab bench --roofline``: the ceilings measured in the same run, and
every timed row as a point under them (Williams, Waterman and Patterson, "Roofline: an
insightful visual performance model for multicore architectures", CACM 2009).

- Compute ceiling per dtype: cuBLAS (plain A @ B, no epilogue) at 8192^3 in that dtype, the
  best this GPU does in practice rather than the datasheet peak (kernel time, CUDA-graph
  replay).
- Memory ceiling: a device-to-device copy of 1 GiB, counting the bytes read and written,
  timed eagerly (``do_bench``): captured in a CUDA graph the copy becomes a memcpy node,
  which measured 2.70 TB/s against 4.22 TB/s eager on the H200 (bandwidth_gbps 2698.2, run
  at commit 10bbff3: ``git show eb6d44b:bench/results/h200-ladder/results.json``; 4224.3,
  commit 6d5e28a: ``bench/results/h200-ladder-6d5e28a/results.json``; not investigated
  further); at half a millisecond per copy the host is not in the eager time.
- A row's arithmetic intensity = 2*M*N*K FLOP / the bytes it must move at least: A, B and C
  (a full C or a bias) read once and D written once, in the row's dtype.
"""

from __future__ import annotations

from pathlib import Path

import torch

import backends
from backends.dtypes import DTYPES, GEMM

from .style import backend_color
from .timing import kernel_ms

CEILING_SHAPE = 8192
COPY_BYTES = 1 << 30


def measure_ceilings(dtype_names: list[str], device: torch.device) -> dict:
    """``{"bandwidth_gbps": GB/s, "peak_tflops": {dtype name: TFLOP/s}}`` measured now
    (dtype names of ``backends.dtypes.GEMM``)."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = kernel_ms(lambda: dst.copy_(src), device, timing="eager")
    peaks = {}
    for name in dtype_names:
        dtype, tf32 = DTYPES[name].torch, DTYPES[name].tf32
        a = torch.randn(CEILING_SHAPE, CEILING_SHAPE, device=device).to(dtype)
        b = torch.randn(CEILING_SHAPE, CEILING_SHAPE, device=device).to(dtype)
        t = kernel_ms(lambda: backends.gemm(a, b, backend="cublas", allow_tf32=tf32), device)
        peaks[name] = 2 * CEILING_SHAPE**3 / (t * 1e-3) / 1e12
    return {"bandwidth_gbps": 2 * COPY_BYTES / (ms * 1e-3) / 1e9, "peak_tflops": peaks,
            "ceiling_shape": [CEILING_SHAPE] * 3, "copy_bytes": COPY_BYTES}


def min_bytes(row: dict, element_size: int, c_kind: str | None) -> int:
    """Bytes a GEMM row must move at least: A, B, C (full or bias) read, D written."""
    m, n, k = row["M"], row["N"], row["K"]
    c = {"full": m * n, "bias": n, None: 0}[c_kind]
    return element_size * (m * k + k * n + c + m * n)


def intensity(row: dict, element_size: int, c_kind: str | None) -> float:
    """Arithmetic intensity in FLOP per byte."""
    return 2 * row["M"] * row["N"] * row["K"] / min_bytes(row, element_size, c_kind)


def plot(rows: list[dict], ceilings: dict, epilogues: dict, path: Path) -> None:
    """Log-log roofline: one compute ceiling per dtype, the copy bandwidth slope, and a point
    per timed row (colour: backend, marker: dtype)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r["tflops"] is not None]
    markers = dict(zip(GEMM, "osD^v"))
    fig, ax = plt.subplots(figsize=(10, 6))
    points = {}
    for r in timed:
        size = DTYPES[r["dtype"]].itemsize
        x = intensity(r, size, epilogues[r["epilogue"]][0])
        points.setdefault((r["backend"], r["dtype"]), []).append((x, r["tflops"]))
    xs = [x for pts in points.values() for x, _ in pts]
    lo, hi = min(xs + [1.0]) / 2, max(xs + [1e4]) * 2
    bw = ceilings["bandwidth_gbps"] / 1e3  # TFLOP/s per FLOP/byte
    for name, peak in ceilings["peak_tflops"].items():
        knee = peak / bw
        ax.plot([lo, knee, hi], [lo * bw, peak, peak], color="grey", lw=1)
        ax.text(hi, peak, f" {name} cuBLAS {peak:.0f}", va="center", fontsize=8)
    ax.text(lo * 1.1, lo * bw * 1.3, f"copy {ceilings['bandwidth_gbps']:.0f} GB/s",
            rotation=30, fontsize=8, color="grey")
    for (name, dtype_name), pts in points.items():
        ax.scatter([x for x, _ in pts], [y for _, y in pts], color=backend_color(name),
                   marker=markers[dtype_name], s=28, label=f"{name} {dtype_name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi * 8)  # room for the ceilings' labels
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved at least)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("roofline: ceilings measured in the same run", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=3, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
