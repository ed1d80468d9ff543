"""Checks of a composed training config and its run directory, made before anything is written: each
failure is a ConfigError that names the value and the fix."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset

from gan.cli import reported
from gan.config.schema import TrainConfig, check_optimizer, conform, deleted_keys
from gan.core.models import d_classifies, g_condition
from gan.data.datasets import build_dataset, data_shape, num_classes
from gan.errors import ConfigError
from gan.run.build import build_module
from gan.run.checkpoint import read_checkpoint
from gan.run.finetune import init_checkpoint, start_from
from gan.run.hold import TRAIN_FIX, held_for_task
from gan.run.legacy import upgrade_config
from gan.run.module import GANModule
from gan.training.loggers import check_loggers
from gan.training.resume import Change, changes_from, check_changes, check_steps_left

# trainer.strategy=ddp_separate (configs/trainer/ddp.yaml): G and D each in a DistributedDataParallel of its own,
# built with the run (gan/training/assemble.py).
SEPARATE_DDP = "ddp_separate"


def check_run_dir(run_dir: Path, ckpt_path: str | None) -> None:
    """Refuse to write a new run over an existing one's checkpoints."""
    existing = run_dir / "checkpoints"
    if existing.is_dir() and any(existing.iterdir()):
        resuming_here = ckpt_path is not None and Path(str(ckpt_path)).resolve().parent == existing.resolve()
        if not resuming_here:
            resume = shlex.quote(f"ckpt_path={existing / 'last.ckpt'}")
            raise ConfigError(f"{run_dir} already holds a run's checkpoints: choose a new hydra.run.dir, "
                              f"or resume it with {resume}")


def check_writable(run_dir: Path) -> None:
    """Refuse a run directory that cannot be created or written to."""
    existing = next(p for p in (run_dir.absolute(), *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "is not a directory" if not existing.is_dir() else "is not writable"
        raise ConfigError(f"hydra.run.dir={run_dir} cannot be written: {existing} {why}; choose another hydra.run.dir")


def validate(cfg: DictConfig) -> DictConfig:
    """``cfg`` with its values converted to their types and within the bounds gan/config/schema.py declares for each
    key (its ``conform``), then checked across keys and against this machine; a ConfigError names the first
    problem and the fix."""
    # A device this machine has, named by any value (unset or missing: refused below, with the other keys).
    accelerator = OmegaConf.select(cfg, "trainer.accelerator", default=None, throw_on_missing=False)
    if accelerator is not None:
        check_accelerator(str(accelerator))
    deleted = deleted_keys(cfg)
    if deleted:
        raise ConfigError(f"{deleted[0]} is not in the config, and every run of these options needs it: drop the "
                          f"~{deleted[0]} override, or add the key back with +{deleted[0]}=<value>")
    cfg = conform(cfg, TrainConfig)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} has no value: give one, e.g. python train.py {missing[0]}=<value>")
    for network in ("g", "d"):
        check_optimizer(f"optim.{network}", cfg.optim[network])
    if cfg.trainer.strategy == "ddp":
        raise ConfigError("trainer.strategy=ddp is not one of the loop's DDP settings: the loop wraps G and D in a "
                          "DistributedDataParallel each, either without the unused-parameter search and with rank 0's "
                          "buffers copied once a step, or with the search at every backward and the buffers broadcast "
                          f"at every forward: use trainer=ddp ({SEPARATE_DDP}, the first) or trainer=ddp_find_unused "
                          "(the second)")
    if cfg.trainer.get("sync_batchnorm", False) and (cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available()):
        raise ConfigError("trainer.sync_batchnorm=true needs CUDA devices (torch's SyncBatchNorm does not run on "
                          "CPUs): leave it false here")
    metric = cfg.get("metric")
    if metric is not None and metric.startswith("metrics/") and not cfg.eval.every:
        raise ConfigError(f"metric={metric} is measured only during training with eval.every=N: set it, e.g. "
                          f"eval.every={cfg.trainer.max_steps} (once, at the last generator step)")
    if metric is not None and metric.startswith("metrics/") and cfg.eval.every > cfg.trainer.max_steps:
        raise ConfigError(f"metric={metric} is measured every eval.every={cfg.eval.every} generator steps and the run "
                          f"ends at trainer.max_steps={cfg.trainer.max_steps}, so it would never be logged: set "
                          f"eval.every={cfg.trainer.max_steps} (once, at the last generator step) or fewer")
    if cfg.ckpt_path is not None and not Path(cfg.ckpt_path).is_file():
        raise ConfigError(f"ckpt_path={cfg.ckpt_path} does not exist: give the path of a .ckpt file, e.g. "
                          "<run>/checkpoints/last.ckpt")
    # What the layers below refuse themselves, given plain values as they take them: the model's condition, the
    # loggers, the run to fine-tune from.
    plain = OmegaConf.to_container(cfg, resolve=True)
    d_classifies(plain["model"])  # model.codes beside model.conditional
    check_loggers(plain.get("logger") or {})
    if plain["init_from"] is not None and plain["ckpt_path"] is None:  # a resume takes its weights from ckpt_path
        init_checkpoint(plain["init_from"])
    return cfg


# trainer.accelerator values that name a kind of device, and whether this machine has one (Lightning's own
# refusal of a missing one is a traceback from its accelerator connector).
DEVICE_KINDS = {"gpu": lambda: torch.cuda.is_available() or torch.backends.mps.is_available(),
                "cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}


def check_accelerator(accelerator: str) -> None:
    """Refuse ``trainer.accelerator`` naming a kind of device this machine does not have."""
    available = DEVICE_KINDS.get(accelerator)
    if available is not None and not available():
        raise ConfigError(f"trainer.accelerator={accelerator}: this machine has no such device (torch sees none): "
                          "use trainer.accelerator=auto, which takes what there is, or trainer.accelerator=cpu")


# paths.run_dir as configs/train.yaml sets it: the directory Hydra runs the job in.
HYDRA_RUN_DIR = "${hydra:runtime.output_dir}"


def check_run_dir_key(given: str) -> None:
    """Refuse ``paths.run_dir`` set on train.py's command line: the checkpoints would go there and
    ``.hydra/`` and train.log to ``hydra.run.dir``, a run evaluate.py cannot read."""
    if given != HYDRA_RUN_DIR:
        raise ConfigError(f"paths.run_dir={given}: train.py puts a run where Hydra runs it, so set "
                          f"hydra.run.dir={shlex.quote(str(given))} instead")


class CheckBeforeWriting(Callback):
    """A Hydra callback (configs/train.yaml): train.py's checks of its config and run directory, made
    before Hydra writes ``<run>/.hydra/`` -- which, for a run refused because its directory holds
    another run, would overwrite that run's. What they read is not kept: the loop makes the same checks as the run
    starts, and uses what they read (gan/training/loop.py's ``train``)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(config.hydra.run.dir)
        task = OmegaConf.to_container(config)
        del task["hydra"]
        task["paths"]["run_dir"] = os.path.abspath(run_dir)  # what ${hydra:runtime.output_dir} will be; not set yet
        with reported():  # Hydra turns an exception raised in a callback into a warning, and runs on
            check_run_dir_key(OmegaConf.to_container(config, resolve=False)["paths"]["run_dir"])
            check_writable(run_dir)
            with held_for_task(run_dir, "training", TRAIN_FIX):  # before Hydra writes .hydra/ (gan/run/hold.py)
                check_before_writing(OmegaConf.create(task), run_dir)


@dataclass
class FineTuned:
    """A fine-tuning run's networks as the checks built them from the run's seed (``module``: with another run's
    weights where it starts, with its frozen blocks), the random state building them left (``rng``), and what to log
    of it."""

    module: GANModule
    rng: torch.Tensor
    lines: list[str]


@dataclass
class Start:
    """A training run's checked config (``cfg``), where a resume starts -- its checkpoint, read once, and what the
    config changes of the one it was trained with (``changes``, gan/training/resume.py); None and [] for a new run
    -- and what the checks built that the run uses as it is: the ``dataset`` of a subset or a fine-tuning start,
    and a fine-tuning run's networks (``fine_tuned``; a resume puts its checkpoint's state into them)."""

    cfg: DictConfig
    checkpoint: dict[str, Any] | None = None
    changes: list[Change] = field(default_factory=list)
    dataset: Dataset | None = None
    fine_tuned: FineTuned | None = None


def check_before_writing(cfg: DictConfig, run_dir: Path) -> Start:
    """Every check of a training run that can be made before its directory is written, for train.py (Hydra's
    callback, and the loop as the run starts) and gan.train alike: the config's values, the run directory, the data
    subset and fine-tuning start, and what a resume changes (a refused resume into its own run leaves that run's
    .hydra/ as it was). Returns the run's :class:`Start`: what the checks read, for the run to use."""
    check_run_dir(run_dir, cfg.get("ckpt_path"))
    check_writable(run_dir)
    cfg = validate(cfg)
    start = Start(cfg)
    check_finetune(start)
    if cfg.ckpt_path is not None:
        start.checkpoint = read_checkpoint(cfg.ckpt_path, "ckpt_path")  # in the current layout, as read
        composed = OmegaConf.to_container(cfg, resolve=True)
        upgrade_config(composed)  # alike: a key this config's options lack at the value older runs trained with
        start.changes = changes_from(start.checkpoint, composed)
        check_changes(start.changes, cfg)
        check_steps_left(start.checkpoint, cfg)
    return start


def check_finetune(start: Start) -> None:
    """Refuse a subset of the data (``data.classes``, ``data.limit``) it does not have, an ``init_from`` whose
    networks do not fit this config's, or a ``finetune.freeze_*`` naming no block, by doing each here; the run keeps
    what this built (``start.dataset``, ``start.fine_tuned``: a resume puts its checkpoint's state into them)."""
    cfg = start.cfg
    container = OmegaConf.to_container(cfg, resolve=True)
    finetune, data = container["finetune"], container["data"]
    subset = data.get("classes") is not None or data.get("limit") is not None
    starts = (cfg.init_from is not None and cfg.ckpt_path is None) or finetune["freeze_d"] or finetune["freeze_g"]
    if not (subset or starts):
        return
    start.dataset = build_dataset(data, cfg.seed)
    if starts:
        condition = g_condition(container["model"], num_classes(start.dataset), data.get("classes"))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)  # as assemble seeds the run before it builds: the same networks
            module = build_module(container, data_shape(data), condition)
            rng = torch.get_rng_state()
        start.fine_tuned = FineTuned(module, rng, start_from(module, container))
