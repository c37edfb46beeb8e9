"""The loss-curve chart of ``gemmlab train``."""

from __future__ import annotations

from pathlib import Path


def plot_loss(rows: list[dict], path: Path, *, label: str, reference: dict | None = None) -> None:
    """Loss per step of this run (``rows``: step, loss) and, dashed, of a reference run
    (``{"configuration": ..., "loss": [...]}``) when one is given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=label)
    if reference is not None:
        ax.plot(reference["loss"], "--", label=reference["configuration"])
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
