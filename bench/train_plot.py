"""The loss-curve charts of ``gemmlab train`` and of its stages' report (``bench.train_stages``)."""

from __future__ import annotations

from pathlib import Path


def plot_curves(curves: list[dict], path: Path, *, baseline: int | None = None) -> None:
    """Loss per step of each curve (``{"label", "steps", "loss"}``, optionally ``"style"``, a
    matplotlib format such as ``"--"``) on one chart, written to ``path`` (PNG). With
    ``baseline`` (an index into ``curves``) a second panel below shows each other curve's
    |loss - baseline loss| at the steps both have, on a symmetric log scale (exact agreement
    is drawn at 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 1 if baseline is None else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7, 4 * panels), squeeze=False, sharex=True)
    ax = axes[0, 0]
    for curve in curves:
        ax.plot(curve["steps"], curve["loss"], curve.get("style", "-"), label=curve["label"])
    ax.set_ylabel("loss (cross-entropy, nats)")
    ax.legend()
    ax.grid(alpha=0.3)
    if baseline is not None:
        base = dict(zip(curves[baseline]["steps"], curves[baseline]["loss"]))
        diff = axes[1, 0]
        for i, curve in enumerate(curves):
            if i == baseline:
                continue
            gaps = [(s, abs(loss - base[s])) for s, loss in zip(curve["steps"], curve["loss"])
                    if s in base]
            diff.plot([s for s, _ in gaps], [gap for _, gap in gaps], curve.get("style", "-"),
                      label=curve["label"], color=f"C{i}")  # the colour it has above
        diff.set_yscale("symlog", linthresh=1e-8)
        diff.set_ylabel(f"|loss - {curves[baseline]['label']}|")
        diff.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_loss(rows: list[dict], path: Path, *, label: str, reference: dict | None = None) -> None:
    """Loss per step of this run (``rows``: step, loss) and, dashed, of a reference run
    (``{"configuration": ..., "loss": [...]}``, from step 0) when one is given."""
    curves = [{"label": label, "steps": [r["step"] for r in rows],
               "loss": [r["loss"] for r in rows]}]
    if reference is not None:
        curves.append({"label": reference["configuration"], "style": "--",
                       "steps": list(range(len(reference["loss"]))), "loss": reference["loss"]})
    plot_curves(curves, path)
