"""Builds the data, module, callbacks and Trainer from a composed config, fits, and says what it did."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig, OmegaConf

from gan.data.datasets import data_shape, is_point_data, mixture_means, num_classes
from gan.data.module import GANDataModule
from gan.errors import ConfigError, Interrupted
from gan.evaluation.pictures import real_points_for_plot
from gan.evaluation.settings import EvalSettings
from gan.training.audit import AutogradAudit
from gan.training.callbacks import GeneratorStepCheckpoint, GeneratorStepProgressBar, MetricsLogger, SampleLogger
from gan.training.checkpoint import AtomicCheckpointIO
from gan.training.checks import check_resumable, check_run_dir, check_writable, validate
from gan.training.module import GANModule
from gan.training.timing import StepTimer

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
