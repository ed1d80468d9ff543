"""Builds the data, module, callbacks and Trainer from a composed config, fits, and says what it did."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig, OmegaConf

from gan import strategy  # registers trainer=ddp's strategy with Lightning
from gan.audit import AutogradAudit
from gan.callbacks import GeneratorStepCheckpoint, GeneratorStepProgressBar, MetricsLogger, SampleLogger
from gan.checkpoint import AtomicCheckpointIO
from gan.data import GANDataModule, data_shape, is_point_data, mixture_means, num_classes
from gan.errors import ConfigError
from gan.metrics import EvalSettings
from gan.module import GANModule
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


def validate(cfg: DictConfig) -> None:
    if cfg.trainer.max_steps < 1:
        raise ConfigError(f"trainer.max_steps={cfg.trainer.max_steps}: it must be a positive number of "
                          "generator steps")
    if cfg.train.d_steps < 1 or cfg.train.batch_size < 1:
        raise ConfigError("train.d_steps and train.batch_size must be >= 1")
    for key in ("every", "sample_every"):
        if cfg.log[key] < 1:
            raise ConfigError(f"log.{key}={cfg.log[key]}: it must be >= 1")
    if cfg.checkpoint.every < 1:
        raise ConfigError(f"checkpoint.every={cfg.checkpoint.every}: it must be >= 1")
    keep = cfg.checkpoint.keep
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise ConfigError(f"checkpoint.keep={keep}: the number of periodic checkpoints to keep besides last.ckpt, "
                          "a whole number >= 0 (0 keeps them all)")
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


def train(cfg: DictConfig, extra_callbacks: Sequence[L.Callback] = ()) -> GANModule:
    """Train the GAN described by ``cfg`` (composed from configs/train.yaml); returns the module.
    ``extra_callbacks`` run before the project's own (e.g. a benchmark's clock)."""
    validate(cfg)
    logging.getLogger(LIGHTNING_RANK_ZERO_LOGGER).addFilter(LIGHTNING_NOISE)
    run_dir = Path(cfg.paths.run_dir)
    check_run_dir(run_dir, cfg.ckpt_path)
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    container = OmegaConf.to_container(cfg, resolve=True)
    datamodule = GANDataModule(container["data"], cfg.train.batch_size, cfg.train.d_steps, cfg.seed)
    classes = num_classes(datamodule.dataset) if cfg.model.conditional else 0
    if cfg.model.conditional and classes == 0:
        raise ConfigError(f"model.conditional=true needs labelled data; data={cfg.data.name} has no labels")
    module = GANModule(container, data_shape(container["data"]), classes)

    points = is_point_data(cfg.data.name)
    callbacks: list[L.Callback] = [
        *extra_callbacks,
        GeneratorStepCheckpoint(run_dir / "checkpoints", cfg.checkpoint.every, cfg.checkpoint.keep),
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
        log_summary(trainer, module, run_dir)
    return module


def log_summary(trainer: L.Trainer, module: GANModule, run_dir: Path) -> None:
    """What the run did and where to look next: on the console and in the run's log file (train.log)."""
    step, every = module.counters.g, module.cfg["log"]["every"]
    losses = [f"{name} {float(trainer.callback_metrics[name]):.4g}" for name in ("loss/d", "loss/g")
              if name in trainer.callback_metrics]
    # The module logs losses every log.every generator steps: the last values are from the last such step.
    final = (f"final losses {', '.join(losses)} (generator step {step - step % every})" if losses
             else f"no losses logged (log.every={every})")
    log.info(f"Run finished: {step} generator steps in {run_dir}; {final}")
    log.info(f"  curves and samples: tensorboard --logdir {run_dir / 'tensorboard'}")
    log.info(f"  metrics:            python evaluate.py run_dir={run_dir}")
