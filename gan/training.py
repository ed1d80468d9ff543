"""Builds the data, module, callbacks and Trainer from a composed config, fits, and says what it did."""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.experimental.callback import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig, OmegaConf

from gan import strategy  # registers trainer=ddp's strategy with Lightning
from gan.audit import AutogradAudit
from gan.callbacks import GeneratorStepCheckpoint, GeneratorStepProgressBar, MetricsLogger, SampleLogger
from gan.checkpoint import AtomicCheckpointIO, mismatched, read_checkpoint
from gan.data import GANDataModule, data_shape, is_point_data, mixture_means, num_classes
from gan.errors import ConfigError, Interrupted, reported
from gan.metrics import EvalSettings
from gan.module import GANModule
from gan.schema import TrainConfig, conform
from gan.timing import StepTimer
from gan.visuals import real_points_for_plot

log = logging.getLogger(__name__)


class LightningNoise(logging.Filter):
    """Drops two of Lightning's console messages that mislead or distract here; every other one passes.

    * "`Trainer.fit` stopped: `max_steps=N` reached.": Lightning counts every optimizer step, so N is
      (train.d_steps + 1) times the generator steps asked for; :func:`log_summary` reports the run in
      generator steps instead.
    * "💡 Tip: For seamless cloud ... [litlogger] / [litmodels] ...": advertisements for Lightning's
      hosted services, nothing a user of this project acts on.
    """

    DROPPED = re.compile(r"`Trainer\.fit` stopped: `max_steps=\d+` reached\."
                         r"|💡 Tip: For seamless cloud .*\[lit(logger|models)\].*", re.DOTALL)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.DROPPED.fullmatch(record.getMessage())


# Lightning logs both through its rank-zero helpers, on this logger. A logger's filters see only the
# records logged on that very logger, not those its children pass up: the filter must sit on this one.
LIGHTNING_RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"
LIGHTNING_NOISE = LightningNoise()  # one instance: addFilter ignores a filter already present


def check_run_dir(run_dir: Path, ckpt_path: str | None) -> None:
    """Refuse to write a new run over an existing one's checkpoints."""
    existing = run_dir / "checkpoints"
    if existing.is_dir() and any(existing.iterdir()):
        resuming_here = ckpt_path is not None and Path(ckpt_path).resolve().parent == existing.resolve()
        if not resuming_here:
            raise ConfigError(f"{run_dir} already holds a run's checkpoints: choose a new hydra.run.dir, "
                              f"or resume it with ckpt_path={existing / 'last.ckpt'}")


def check_writable(run_dir: Path) -> None:
    """Refuse a run directory that cannot be created or written to."""
    existing = next(p for p in (run_dir.absolute(), *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "is not a directory" if not existing.is_dir() else "is not writable"
        raise ConfigError(f"hydra.run.dir={run_dir} cannot be written: {existing} {why}; choose another hydra.run.dir")


# Lower bounds that types cannot say: key -> (least value, what the key is).
AT_LEAST = {
    "trainer.max_steps": (1, "the number of generator steps"),
    "train.batch_size": (1, "real images per D update, set by data.batch_size"),
    "train.d_steps": (1, "D updates per generator step, set by loss.d_steps"),
    "train.z_dim": (1, "the size of G's noise vector"),
    "ema.start": (0, "generator steps during which the EMA copy follows G"),
    "log.every": (1, "generator steps between logged scalars"),
    "log.sample_every": (1, "generator steps between sample grids"),
    "checkpoint.every": (1, "generator steps between periodic checkpoints"),
    "checkpoint.keep": (0, "periodic checkpoints kept besides last.ckpt; 0 keeps them all"),
}


def validate(cfg: DictConfig) -> DictConfig:
    """``cfg`` with its values converted to their types (gan/schema.py); a ConfigError names the first
    value that has the wrong type or lies out of range, and the fix."""
    cfg = conform(cfg, TrainConfig)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} has no value: give one, e.g. python train.py {missing[0]}=<value>")
    for key, (least, meaning) in AT_LEAST.items():
        if (value := OmegaConf.select(cfg, key)) < least:
            raise ConfigError(f"{key}={value}: it must be >= {least} ({meaning})")
    for network in ("g", "d"):
        lr = cfg.optim[network].lr
        if not lr > 0:  # NaN too
            raise ConfigError(f"optim.{network}.lr={lr}: a learning rate must be > 0")
    if not 0 <= cfg.ema.decay < 1:
        raise ConfigError(f"ema.decay={cfg.ema.decay}: it must be in [0, 1) (0.999 averages over about the "
                          "last 1,000 generator steps)")
    if not is_point_data(cfg.data.name) and (cfg.data.image_size < 1 or cfg.data.channels not in (1, 3)):
        raise ConfigError(f"data.image_size={cfg.data.image_size}, data.channels={cfg.data.channels}: images need a "
                          "size >= 1 (model=dcgan: >= 4) and 1 (grayscale) or 3 (RGB) channels")
    if cfg.trainer.strategy == "ddp":
        raise ConfigError("trainer.strategy=ddp wraps the whole module in one DistributedDataParallel, which fails "
                          "when a backward leaves parameters without gradients, as every GAN step does (fake.detach(), "
                          f"frozen D): use trainer=ddp ({strategy.NAME}: G and D wrapped separately) or "
                          "trainer=ddp_find_unused")
    if cfg.trainer.get("sync_batchnorm", False) and (cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available()):
        raise ConfigError("trainer.sync_batchnorm=true needs CUDA devices (torch's SyncBatchNorm does not run on "
                          "CPUs): leave it false here")
    if cfg.ckpt_path is not None and not Path(cfg.ckpt_path).is_file():
        raise ConfigError(f"ckpt_path={cfg.ckpt_path} does not exist: give the path of a .ckpt file, e.g. "
                          "<run>/checkpoints/last.ckpt")
    return cfg


class CheckBeforeWriting(Callback):
    """A Hydra callback (configs/train.yaml): train.py's checks of its config and run directory, made
    before Hydra writes ``<run>/.hydra/`` -- which, for a run refused because its directory holds
    another run, would overwrite that run's. :func:`train` makes them again, for callers without Hydra."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(config.hydra.run.dir)
        task = OmegaConf.to_container(config)
        del task["hydra"]
        task["paths"]["run_dir"] = str(run_dir)  # what ${hydra:runtime.output_dir} will be; not set yet
        with reported():  # Hydra turns an exception raised in a callback into a warning, and runs on
            cfg = validate(OmegaConf.create(task))
            check_run_dir(run_dir, cfg.ckpt_path)
            check_writable(run_dir)


def check_resumable(module: GANModule, ckpt_path: str) -> None:
    """Refuse a checkpoint that cannot resume ``module``: no checkpoint, an unsafe one, or one of other networks.

    The file is read here once more than Lightning reads it (weights_only, on the CPU): Lightning's
    own errors for such files are tracebacks, and for other networks a list of every tensor.
    """
    problems = mismatched(module.state_dict(), read_checkpoint(ckpt_path, "ckpt_path")["state_dict"])
    if problems:
        overrides = Path(ckpt_path).resolve().parent.parent / ".hydra" / "overrides.yaml"
        raise ConfigError(f"ckpt_path={ckpt_path} holds other networks than this config builds ({problems}): "
                          "resume with the overrides its run was trained with"
                          + (f" ({overrides})" if overrides.is_file() else ""))


def train(cfg: DictConfig, extra_callbacks: Sequence[L.Callback] = ()) -> GANModule:
    """Train the GAN described by ``cfg`` (composed from configs/train.yaml); returns the module.
    ``extra_callbacks`` run before the project's own (e.g. a benchmark's clock)."""
    cfg = validate(cfg)
    logging.getLogger(LIGHTNING_RANK_ZERO_LOGGER).addFilter(LIGHTNING_NOISE)
    run_dir = Path(cfg.paths.run_dir)
    check_run_dir(run_dir, cfg.ckpt_path)
    check_writable(run_dir)
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    container = OmegaConf.to_container(cfg, resolve=True)
    datamodule = GANDataModule(container["data"], cfg.train.batch_size, cfg.train.d_steps, cfg.seed)
    classes = num_classes(datamodule.dataset) if cfg.model.conditional else 0
    if cfg.model.conditional and classes == 0:
        raise ConfigError(f"model.conditional=true needs labelled data; data={cfg.data.name} has no labels")
    module = GANModule(container, data_shape(container["data"]), classes)
    if cfg.ckpt_path is not None:
        check_resumable(module, cfg.ckpt_path)

    points = is_point_data(cfg.data.name)
    checkpoints = GeneratorStepCheckpoint(run_dir / "checkpoints", cfg.checkpoint.every, cfg.checkpoint.keep)
    callbacks: list[L.Callback] = [
        *extra_callbacks,
        checkpoints,
        SampleLogger(cfg.log.sample_every, run_dir / "samples",
                     real_points_for_plot(datamodule.dataset) if points else None,
                     mixture_means(cfg.data.name) if points else None),
    ]
    if cfg.trainer.enable_progress_bar:
        callbacks.append(GeneratorStepProgressBar(cfg.trainer.max_steps))
    if cfg.audit:
        callbacks.append(AutogradAudit())
    if cfg.eval.every:
        callbacks.append(MetricsLogger(cfg.eval.every, EvalSettings.from_config(cfg.eval), cfg.seed))
    if cfg.timing.enabled:
        callbacks.append(StepTimer(cfg.log.every))  # last: it closes the step after the other callbacks

    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    g_steps = trainer_args.pop("max_steps")
    trainer = L.Trainer(
        # Lightning counts every optimizer step; each generator step makes d_steps + 1 of them.
        max_steps=g_steps * (cfg.train.d_steps + 1),
        logger=TensorBoardLogger(str(run_dir), name="tensorboard", version="", default_hp_metric=False),
        callbacks=callbacks,
        default_root_dir=str(run_dir),
        enable_checkpointing=False,  # GeneratorStepCheckpoint does it
        log_every_n_steps=1,  # the module decides when to log (log.every generator steps)
        use_distributed_sampler=False,  # StepBatchSampler shards the data per rank itself
        num_sanity_val_steps=0,
        plugins=[AtomicCheckpointIO()],
        **trainer_args,
    )
    with warnings.catch_warnings():
        # The endless, step-indexed sampler resumes its own position; Lightning cannot know that.
        warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before the epoch.*")
        # Lightning 2.6's own use of a torch API that torch 2.14 deprecates: nothing a user can act on.
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
    if trainer.is_global_zero:
        log_summary(trainer, module, run_dir, checkpoints.interrupted)
    if checkpoints.interrupted:
        last = run_dir / "checkpoints" / "last.ckpt"
        raise Interrupted(f"stopped by Ctrl-C at generator step {module.counters.g}, saved in {last}: resume with "
                          f"the same overrides and ckpt_path={last}")
    return module


def log_summary(trainer: L.Trainer, module: GANModule, run_dir: Path, interrupted: bool = False) -> None:
    """What the run did and where to look next: on the console and in the run's log file (train.log)."""
    step, every = module.counters.g, module.cfg["log"]["every"]
    losses = [f"{name} {float(trainer.callback_metrics[name]):.4g}" for name in ("loss/d", "loss/g")
              if name in trainer.callback_metrics]
    # The module logs losses every log.every generator steps: the last values are from the last such step.
    final = (f"final losses {', '.join(losses)} (generator step {step - step % every})" if losses
             else f"no losses logged (log.every={every})")
    log.info(f"Run {'stopped by Ctrl-C after' if interrupted else 'finished:'} {step} generator steps in {run_dir}; "
             f"{final}")
    log.info(f"  curves and samples: tensorboard --logdir {run_dir / 'tensorboard'}")
    log.info(f"  metrics:            python evaluate.py run_dir={run_dir}")
