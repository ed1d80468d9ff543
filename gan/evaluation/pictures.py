"""What a person looks at: samples as image grids or 2D scatter plots (PNG and TensorBoard), latent
interpolations, the TensorBoard dashboard layout and hyperparameter table, and a TensorBoard server."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.utils import make_grid, save_image

from gan.core.phases import NAMES
from gan.data.datasets import data_shape, is_points
from gan.files import atomic_write

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

# Opens TensorBoard's "Custom Scalars" tab arranged: related curves share a chart.
DASHBOARD_LAYOUT = {
    "GAN": {
        "losses": ["Multiline", ["loss/d", "loss/g"]],
        "D output on real and fake": ["Multiline", ["d/real", "d/fake", "d/real_running", "d/fake_running"]],
        "gradient norms": ["Multiline", ["grad_norm/g", "grad_norm/d"]],
        "augmentation probability": ["Multiline", ["augment/p"]],
    },
    # Written during training (eval.every: gan/training/outputs.py's Metrics) and by evaluate.py
    # (gan/evaluation/app.py).
    "metrics": {
        "FID": ["Multiline", ["metrics/fid"]],
        "KID": ["Multiline", ["metrics/kid"]],
        "precision and recall": ["Multiline", ["metrics/precision", "metrics/recall"]],
        "density and coverage": ["Multiline", ["metrics/density", "metrics/coverage"]],
        "class accuracy (conditional runs)": ["Multiline", ["metrics/class_accuracy"]],
        "modes captured": ["Multiline", ["metrics/modes"]],
        "high quality and reverse KL": ["Multiline", ["metrics/high_quality", "metrics/reverse_kl"]],
        "spread around the modes (data: 0.97)": ["Multiline", ["metrics/spread", "metrics/spread_min",
                                                                "metrics/spread_max"]],
    },
    # Written by gan/training/timing.py's StepTimer: where a generator step's time goes.
    "speed": {
        "step time by phase (ms)": ["Multiline", [f"time/{name}_ms" for name in NAMES] + ["time/step_ms"]],
        "generator steps per second": ["Multiline", ["perf/g_steps_per_s"]],
        "images per second": ["Multiline", ["perf/images_per_s"]],
        "peak memory (MiB)": ["Multiline", ["perf/peak_memory_mb"]],
    },
}


def class_grid(samples: Tensor, num_classes: int, per_class: int = 8, limit: int = 64) -> Tensor:
    """The first ``limit`` images; for a conditional generator (labels cycling 0..K-1, as
    :func:`gan.core.models.balanced_labels` draws them) ``per_class`` of each class, a row per class."""
    if not num_classes:
        return image_grid(samples[:limit])
    per_class = min(per_class, len(samples) // num_classes)
    by_class = samples[: per_class * num_classes].unflatten(0, (per_class, num_classes)).transpose(0, 1)
    return image_grid(by_class.flatten(0, 1), nrow=per_class)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a/b': 1}; values TensorBoard's hparams cannot hold become strings."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def write_hparams(writer: Any, cfg: dict[str, Any]) -> None:
    """The HPARAMS tab: every config value, with the final losses and the data's metrics
    (``metrics/*``, from ``eval.every`` or evaluate.py) as its metric columns.

    Written directly rather than through Lightning's ``log_hyperparams(params, metrics)``, which would
    log a placeholder value for each metric at step 0.
    """
    from torch.utils.tensorboard.summary import hparams

    config = {k: v for k, v in cfg.items() if k not in ("hydra", "paths", "logger")}  # how, not what, it trains
    points = is_points(data_shape(cfg["data"]))
    metrics = (("modes", "high_quality", "reverse_kl", "spread") if points else
               ("fid", "kid", "precision", "recall", "density", "coverage"))
    if cfg["data"]["name"] == "stacked_mnist":  # its protocol's mode count (docs/protocols.md)
        metrics += ("stacked_modes", "stacked_kl")
    columns = {tag: float("nan") for tag in ("loss/d", "loss/g", *(f"metrics/{m}" for m in metrics))}
    for summary in hparams(flatten(config), columns):
        writer.file_writer.add_summary(summary)


def image_grid(images: Tensor, nrow: int | None = None, min_width: int = 512) -> Tensor:
    """[-1, 1] images -> one (C, H, W) grid in [0, 1], upscaled (nearest) to at least ``min_width``."""
    nrow = nrow or int(np.ceil(np.sqrt(len(images))))
    grid = make_grid(images.float().cpu().clamp(-1, 1), nrow=nrow, normalize=True, value_range=(-1, 1),
                     pad_value=1.0)
    scale = max(1, int(np.ceil(min_width / grid.shape[-1])))
    return grid.repeat_interleave(scale, -1).repeat_interleave(scale, -2)


def scatter_figure(samples: Tensor | None, real: Tensor, means: Tensor | None = None,
                   title: str = "") -> matplotlib.figure.Figure:
    """Generated points (when given) over the real data (and the mixture means, when known)."""
    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    ax.scatter(*real.cpu().T.numpy(), s=2, c="0.75", label="real")
    if samples is not None:
        ax.scatter(*samples.cpu().T.numpy(), s=3, c="tab:red", alpha=0.6, label="generated")
    if means is not None:
        ax.scatter(*means.cpu().T.numpy(), s=40, marker="x", c="black", label="modes")
    lim = float(real.abs().max()) * 1.25 + 0.5
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", title=title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def render_samples(samples: Tensor, path: Path, writer: Any, tag: str, step: int, *, num_classes: int = 0,
                   real_points: Tensor | None = None, means: Tensor | None = None, title: str = "",
                   per_class: int = 8, limit: int = 64) -> None:
    """One picture of ``samples``, saved as a PNG at ``path`` and, when ``writer`` (a SummaryWriter) is
    given, added to TensorBoard as ``tag`` at ``step``.

    Points (``real_points`` given: the caller asked :func:`gan.data.datasets.is_points`) become a scatter
    plot over the real points and the mixture ``means``, titled ``title``; images become
    :func:`class_grid` (``per_class``, ``limit``: which images it shows).
    """
    if real_points is not None:
        fig = scatter_figure(samples, real_points, means, title=title)
        try:
            if writer is not None:
                writer.add_figure(tag, fig, step, close=False)
            atomic_write(path, lambda f: fig.savefig(f, format="png"))
        finally:
            plt.close(fig)  # pyplot keeps every open figure alive: one per call would pile up
    else:
        grid = class_grid(samples, num_classes, per_class=per_class, limit=limit)
        if writer is not None:
            writer.add_image(tag, grid, step)
        atomic_write(path, lambda f: save_image(grid, f, format="png"))


def render_interpolation(samples: Tensor, steps: int, path: Path, writer: Any, tag: str, step: int, *,
                         real_points: Tensor | None = None, means: Tensor | None = None, title: str = "") -> None:
    """Samples along latent paths (:func:`gan.evaluation.sampling.interpolate`: ``steps`` per path, path after
    path) as one picture, saved as a PNG at ``path`` and, when ``writer`` is given, added to
    TensorBoard as ``tag`` at ``step``.

    Images: one row per path, one column per step. Points (``real_points`` given): each path drawn as a
    line through its points over the real data, from a circle (start) to a square (end).
    """
    if real_points is None:
        grid = image_grid(samples, nrow=steps)
        if writer is not None:
            writer.add_image(tag, grid, step)
        atomic_write(path, lambda f: save_image(grid, f, format="png"))
        return
    fig = scatter_figure(None, real_points, means, title=title)
    try:
        ax = fig.axes[0]
        for points in samples.cpu().unflatten(0, (-1, steps)).numpy():
            line, = ax.plot(*points.T, "-", lw=1, marker=".", ms=3)
            ax.plot(*points[0], "o", c=line.get_color(), ms=6)
            ax.plot(*points[-1], "s", c=line.get_color(), ms=6)
        if writer is not None:
            writer.add_figure(tag, fig, step, close=False)
        atomic_write(path, lambda f: fig.savefig(f, format="png"))
    finally:
        plt.close(fig)


def real_points_for_plot(dataset: Any, n: int = 2000) -> Tensor:
    """A fixed subset of a point dataset's real points: the backdrop of every scatter plot."""
    points = dataset.tensors[0]
    return points[torch.randperm(len(points), generator=torch.Generator().manual_seed(0))[:n]]


def save_pngs(images: np.ndarray, labels: np.ndarray | None, directory: Path) -> None:
    """uint8 images (N, C, H, W) as ``directory/NNNNNN.png``, or ``directory/<label>/NNNNNN.png`` given each
    image's class label: what FID tools read (one folder per class for per-class scores).

    Written into a temporary directory beside ``directory`` and renamed onto it (which must be new or
    empty): a killed run leaves no folder holding part of the images.
    """
    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for folder in {str(label) for label in labels} if labels is not None else {""}:
            (staging / folder).mkdir(parents=True)
        for i, image in enumerate(images):
            pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)  # (H, W) or (H, W, 3)
            folder = staging / str(labels[i]) if labels is not None else staging
            Image.fromarray(pixels).save(folder / f"{i:06d}.png")
        directory.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, directory)  # onto a missing or empty directory: one rename
    finally:
        shutil.rmtree(staging, ignore_errors=True)
