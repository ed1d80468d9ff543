"""Shared fixtures: real Hydra composition and a few short real training runs shared by many tests."""

from __future__ import annotations

import os

# The suite runs in pytest-xdist workers side by side (pyproject.toml): one torch thread each, in them and in the
# processes they start, so that workers never wait on each other's threads. Set before torch loads.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"

import sys  # noqa: E402
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from omegaconf import DictConfig

from gan.config.compose import compose
from gan.training.observer import Observer

if TYPE_CHECKING:
    from gan.config.eval_settings import EvalSettings

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
MNIST_T10K = ROOT.parent / "shared" / "data" / "mnist_t10k"

# The longest tests first (a recipe trained for a quality check, two-rank runs, sweeps), longest of all at the head:
# pytest-xdist deals tests to its workers in collection order, so these start on both workers at once rather than
# leave one worker finishing them alone at the end.
LONGEST_FIRST = ("test_experiments.py", "test_ddp.py", "test_sweeps.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: in file order within each


# Every test run is tiny and CPU-only.
TINY = ["debug=tiny", "trainer.enable_progress_bar=false"]


def compose_config(*overrides: str, run_dir: Path | None = None) -> DictConfig:
    """configs/train.yaml composed by Hydra, as train.py would see it."""
    return compose(*overrides, run_dir=run_dir)


def eval_settings(*overrides: str) -> EvalSettings:
    """gan.metrics.EvalSettings as `python evaluate.py <overrides>` composes and checks them (e.g. "num_samples=50")
    for a run of the default recipe (whose eval.classifier_steps evaluate.py's null default takes)."""
    from gan.config.eval_settings import EvalSettings
    from gan.config.schema import EvaluateConfig, conform
    from gan.evaluation.app import with_run_classifier_steps

    cfg = conform(compose(*overrides, config="evaluate"), EvaluateConfig)
    run_cfg = {"eval": {"classifier_steps": compose_config().eval.classifier_steps}}
    return EvalSettings.from_config(with_run_classifier_steps(cfg, run_cfg))


def run_main(script: str, *args: str) -> int:
    """Run an entry point's real Hydra main (train.py, evaluate.py) in-process; returns its exit code."""
    import importlib

    argv = sys.argv
    sys.argv = [f"{script}.py", *args]
    try:
        importlib.import_module(script).main()
        return 0
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = argv


def run_train(run_dir: Path, *overrides: str) -> int:
    """train.py with the TINY settings into ``run_dir``; returns its exit code."""
    flags = [o for o in overrides if o.startswith("-")]  # e.g. -m: Hydra's flags come before overrides
    return run_main("train", *flags, *TINY, f"hydra.run.dir={run_dir}", *(o for o in overrides if o not in flags))


class LearningRates(Observer):
    """The learning rates of G's and D's optimizers at the start of every generator step of a run."""

    def __init__(self):
        self.seen: list[list[float]] = []

    def on_step_start(self, run, batch):
        self.seen.append([group["lr"] for optimizer in run.optimizers for group in optimizer.param_groups])


def read_events(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> Path:
    """One 6-step digits run (DCGAN, EMA, audit on), checkpoints at steps 3 and 6."""
    run_dir = tmp_path_factory.mktemp("runs") / "digits"
    assert run_train(run_dir) == 0
    return run_dir


@pytest.fixture(scope="session")
def feature_cache(tmp_path_factory) -> Path:
    """One cache of trained feature classifiers for the session: tests that score MNIST share its classifier."""
    return tmp_path_factory.mktemp("feature_cache")


@pytest.fixture(scope="session")
def ring_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "ring"
    assert run_train(run_dir, "experiment=ring", "loss=hinge", "log.every=2") == 0
    return run_dir
