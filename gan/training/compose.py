"""The one way code composes this project's configs outside the entry points (the demonstrations,
the benchmarks, the tests): Hydra's compose API on configs/, as ``python train.py`` would see them."""

from __future__ import annotations

from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig, open_dict

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def compose(*overrides: str, config: str = "train", run_dir: str | Path | None = None) -> DictConfig:
    """``configs/<config>.yaml`` with ``overrides``; a train config gets ``paths.run_dir`` (``run_dir``, or
    "unused" for code that builds objects without writing a run)."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = hydra_compose(config_name=config, overrides=list(overrides))
    if config == "train":
        with open_dict(cfg):
            cfg.paths.run_dir = str(run_dir or "unused")
    return cfg
