"""The run's loggers, one Lightning logger per entry of the ``logger`` config group (configs/logger/).

Every logger receives the scalars (``logger.log_metrics``) and the hyperparameters (Lightning's
``log_hyperparams`` when training starts). Pictures -- sample grids, the autograd graph of the G loss --
the hyperparameter table with its metric columns and the Custom Scalars layout are TensorBoard
summaries: they go to the run's TensorBoard logger, when it has one (:func:`summary_writer`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger, TensorBoardLogger

from gan.errors import ConfigError

# A logger class (the end of its _target_) -> the package it needs beyond Lightning, and the extra that installs it.
PACKAGES = {"WandbLogger": "wandb", "MLFlowLogger": "mlflow"}


def check_loggers(loggers: Mapping[str, Any]) -> None:
    """A ConfigError for a logger entry without a ``_target_``, or one whose package is not installed."""
    for name, spec in loggers.items():
        target = spec.get("_target_") if isinstance(spec, Mapping) else None
        if not target:
            raise ConfigError(f"logger.{name} has no _target_: a logger is a Lightning logger class and its "
                              "arguments (configs/logger/*.yaml)")
        package = PACKAGES.get(str(target).rpartition(".")[2])
        if package and not installed(package):
            raise ConfigError(f"logger={name} needs the {package} package: pip install -e \".[{package}]\", or "
                              "choose logger=tensorboard|csv|many")


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def build_loggers(loggers: Mapping[str, Any]) -> list[Logger]:
    """One Lightning logger per entry, in the order of the config."""
    check_loggers(loggers)
    return [instantiate(spec) for spec in loggers.values()]


def summary_writer(loggers: list[Logger]) -> Any:
    """The SummaryWriter of the run's TensorBoard logger among ``loggers``, which takes what only TensorBoard
    can show; None when the run has none (e.g. ``logger=csv``)."""
    return next((lg.experiment for lg in loggers if isinstance(lg, TensorBoardLogger)), None)
