"""The Python API, for notebooks and scripts: ``from gan import train, evaluate``.

Each composes configs/ with the overrides train.py and evaluate.py take on their command lines, spelled
the same way (gan/config/compose.py; ``data=X`` trains X's recipe here too), runs the same code and
writes the same run directory. Bad input raises :class:`gan.errors.ConfigError` instead of ending the
process, so a notebook keeps its state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict
from torch import nn

from gan.config.compose import compose


@dataclass(frozen=True)
class Run:
    """A run directory and numbers about it: from :func:`train`, the last logged losses and metrics
    (``loss/d``, ``loss/g``, and ``metrics/*`` where ``eval.every`` is set), keyed as TensorBoard shows
    them; from :func:`evaluate`, the contents of ``<run>/eval/metrics.json``."""

    dir: Path
    metrics: dict[str, Any] = field(default_factory=dict)

    def generator(self, device: str = "cpu") -> nn.Module:
        """The run's generator, from ``<run>/generator.pt``, in eval mode: ``G(torch.randn(n, G.z_dim))``."""
        from gan.core.snapshot import FILE, load_generator

        return load_generator(self.dir / FILE, device)


def train(*overrides: str, run_dir: str | Path | None = None) -> Run:
    """``python train.py <overrides>`` from Python: trains, writes the run directory (``.hydra/config.yaml``,
    ``train.log``, checkpoints, TensorBoard, ``generator.pt``) and returns it with the last logged numbers.

    ``run_dir`` takes the place of ``hydra.run.dir`` (default: ``outputs/<date>/<time>`` under the
    current directory, as train.py's).
    """
    from gan.run.hold import holding
    from gan.training.checks import check_before_writing, check_writable
    from gan.training.loop import train as fit

    run = Path(run_dir) if run_dir is not None else new_run_dir()
    cfg = compose(*overrides, run_dir=run)
    # train.py's checks before anything is written (Hydra's callback makes the same, and holds the run first:
    # gan/run/hold.py), then what Hydra would write: the composed config, which evaluate.py looks for, and the
    # overrides.
    check_writable(run)
    with holding(run, "training", "wait until it ends, or train into another run_dir"):
        start = check_before_writing(cfg, run)
        (run / ".hydra").mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.create(list(overrides)), run / ".hydra" / "overrides.yaml")
        with log_file(run / "train.log"):
            trained = fit(cfg, start=start)
    return Run(run, {**trained.last_losses, **trained.last_metrics})


def evaluate(run: Run | str | Path, *overrides: str) -> Run:
    """``python evaluate.py run_dir=<run> <overrides>`` from Python: scores the run's checkpoint, writes
    ``<run>/eval/`` (and what ``images=``, ``snapshot=true`` and ``export=`` ask for) and returns the run
    with the metrics written to ``<run>/eval/metrics.json``."""
    from gan.evaluation.app import evaluate_run

    directory = run.dir if isinstance(run, Run) else Path(run)
    cfg = compose(*overrides, config="evaluate")
    with open_dict(cfg):  # not an override: a path may hold characters Hydra's override grammar reserves
        cfg.run_dir = str(directory)
    result = evaluate_run(cfg)
    return Run(directory, json.loads(json.dumps(result)))  # plain JSON values, as metrics.json holds them


def new_run_dir(root: str | Path = "outputs") -> Path:
    """``<root>/<date>/<time>`` as train.py names its runs; ``_1``, ``_2``, ... for another in the same second."""
    now = datetime.now()
    base = Path(root) / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    run, n = base, 0
    while run.exists():
        n += 1
        run = base.with_name(f"{base.name}_{n}")
    return run


@contextmanager
def log_file(path: Path) -> Iterator[None]:
    """The log lines of the block (INFO and above) also in ``path``, in the format of Hydra's train.log;
    the root logger's level and handlers are as they were afterwards."""
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(min(level, logging.INFO))  # NOTSET (0) stays: it lets everything through
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()
