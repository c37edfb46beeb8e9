"""How gemmlab prints and draws its numbers, the same in every command and chart: FLOP/s with
three significant digits and a unit that fits, and one colour per backend."""

from __future__ import annotations

# matplotlib's tab20 palette (its dark and light shades interleaved), as hex: enough colours
# for every backend of the registry without wrapping, and the same on every chart.
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
            "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")


def flops(tflops: float | None) -> str:
    """``tflops`` (TFLOP/s) as text with three significant digits: ``"623 TFLOP/s"``,
    ``"1.20 TFLOP/s"``, below 1 TFLOP/s in GFLOP/s (``"7.71 GFLOP/s"``, ``"0.00771 GFLOP/s"``);
    ``"-"`` for None."""
    if tflops is None:
        return "-"
    value, unit = (tflops, "TFLOP/s") if abs(tflops) >= 1 else (tflops * 1e3, "GFLOP/s")
    return f"{_significant(value)} {unit}"


def _significant(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, trailing zeros kept, never in e-notation for
    the magnitudes gemmlab prints (``623``, ``1.20``, ``0.00771``)."""
    if x == 0:
        return "0"
    text = f"{x:#.{digits}g}"
    if "e" in text:  # below 1e-4 or above 1e3 digits: plain decimals instead
        mantissa, exponent = text.split("e")
        places = max(digits - 1 - int(exponent), 0)
        text = f"{x:.{places}f}"
    return text.rstrip(".")


def backend_color(name: str) -> str:
    """The colour of backend ``name`` in every gemmlab chart: its place in the registry's ladder
    (``backends.LADDER``) picks a colour of a 20-colour palette, so no two of the registry's
    backends share one; a name outside the registry gets black."""
    from backends.registry import LADDER

    names = [b.name for b in LADDER]
    if name not in names:
        return "#000000"
    return _PALETTE[names.index(name) % len(_PALETTE)]
