"""Training plots (PNG bytes): loss / accuracy curves per epoch (float, then QAT) and the confusion matrix."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tfmcu.files import figure_png
from tfmcu.train.report import History


CLASSIFY_PANELS = (("loss", "loss"), ("accuracy", "accuracy"))


def plot_curves(history: History, title: str, panels: Sequence[tuple[str, str]] = CLASSIFY_PANELS) -> bytes:
    """One panel per (history key, label) of ``panels``, each with the training (``key``) and validation
    (``val_<key>``) values that the history has."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("float", r) for r in history.float] + [("qat", r) for r in history.qat]
    x = np.arange(1, len(rows) + 1)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        for prefix, style in (("", "-o"), ("val_", "-s")):
            ys = [r.get(prefix + key) for _, r in rows]
            if any(v is not None for v in ys):
                ax.plot(x, [np.nan if v is None else v for v in ys], style, markersize=3,
                        label=("validation " if prefix else "train ") + label)
        n_float = len(history.float)
        if history.qat:
            ax.axvspan(n_float + 0.5, len(rows) + 0.5, color="#dddddd", alpha=0.6, label="QAT")
        ax.set_xlabel("epoch (float, then QAT)")
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return figure_png(fig)


def plot_confusion(matrix: np.ndarray, names: list[str], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(names)
    size = max(5.0, 0.5 * k + 2.5)
    fig, ax = plt.subplots(figsize=(size, size * 0.9))
    ax.imshow(matrix, cmap="Blues")
    if k <= 30:
        peak = matrix.max() or 1
        for i in range(k):
            for j in range(k):
                if matrix[i, j]:
                    ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if matrix[i, j] > peak / 2 else "black")
        ax.set_xticks(range(k))
        ax.set_yticks(range(k))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=10)
    return figure_png(fig)
