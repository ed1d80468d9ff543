"""The one builder: reads the composed config, builds the data, the module (networks, objective, EMA,
optimizers) and the callbacks and Trainer from it, fits, and says what it did. Everything below it is
built from plain arguments."""

from __future__ import annotations

import logging
import os
import re
import shlex
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.model_summary import ModelSummary
from omegaconf import DictConfig, OmegaConf

from gan.core import snapshot
from gan.core.augment import build_augment
from gan.core.losses import get_loss
from gan.core.models import balanced_labels, build_models, d_classifies, latent_codes
from gan.core.objective import Objective
from gan.core.phases import PhaseTimer
from gan.core.regularizers import R1, build_regularizer
from gan.core.state import EMAGenerator
from gan.data.datasets import data_shape, is_points, mixture_means, num_classes
from gan.data.module import GANDataModule
from gan.errors import ConfigError, Interrupted, RunError
from gan.evaluation.pictures import real_points_for_plot
from gan.evaluation.settings import EvalSettings
from gan.training.audit import AutogradAudit
from gan.training.callbacks import (
    GeneratorStepCheckpoint,
    GeneratorStepProgressBar,
    MetricsLogger,
    SampleLogger,
)
from gan.training.checkpoint import AtomicCheckpointIO
from gan.training.checks import check_resumable, check_run_dir, check_writable, validate
from gan.training.guard import NonFiniteGuard
from gan.training.loggers import build_loggers
from gan.training.module import GANModule
from gan.training.resume import ApplyOnResume, log_changes
from gan.training.rng import RNGState
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














def build_module(cfg: dict[str, Any], shape: tuple[int, ...], classes: int = 0) -> GANModule:
    """The GANModule a plain-container config describes, for samples of ``shape`` ((2,) for points, (C, H, W)
    for images) and ``classes`` labels (0: unconditional). Also how evaluate.py rebuilds a run."""
    train, z_dim = cfg["train"], cfg["train"]["z_dim"]
    codes = latent_codes(cfg["model"])
    labels = classes or codes  # the values G's labels take: the data's classes, or its latent code's
    G, D = build_models(cfg["model"], z_dim, shape, labels)
    gp_weight = float(cfg["loss"].get("gp_weight", 0.0))  # wgan_gp's key
    objective = Objective(get_loss(cfg["loss"]["name"]), build_regularizer(cfg["reg"]),
                          build_augment(cfg["augment"], shape), gp_weight, labels, shape, d_classifies(cfg["model"]),
                          codes=codes > 0)
    ema = EMAGenerator(G, cfg["ema"]["decay"], cfg["ema"]["start"]) if cfg["ema"]["enabled"] else None
    images = not is_points(shape)
    channels_last = bool(train["channels_last"]) and images
    if channels_last:  # NHWC weights (and batches), which oneDNN's and cuDNN's convolutions prefer
        G.to(memory_format=torch.channels_last)
        D.to(memory_format=torch.channels_last)
    if train["compile"]:  # in place (Module.compile): the state_dict keys stay; the EMA copy stays eager
        G.compile()
        if not (gp_weight or isinstance(objective.regularizer, R1)):  # compiled graphs have no double backward
            D.compile()
    # Fixed noise (and labels) behind the sample grids; conditional grids get one row per class (or code).
    n = (cfg["log"]["num_points"] if not images else
         labels * cfg["log"]["samples_per_class"] if labels else cfg["log"]["num_samples"])
    timing = cfg["timing"]
    return GANModule(
        G, D, objective, ema=ema,
        optimizers=(instantiate(cfg["optim"]["g"]), instantiate(cfg["optim"]["d"])),
        lr_decay=cfg["optim"]["decay"], max_steps=cfg["trainer"]["max_steps"],
        z_dim=z_dim, d_steps=train["d_steps"], batch_size=train["batch_size"], log_every=cfg["log"]["every"],
        sample_noise=torch.randn(n, z_dim, generator=torch.Generator().manual_seed(cfg["seed"])),
        sample_labels=balanced_labels(n, labels), data_shape=shape, num_classes=labels, codes=codes > 0,
        channels_last=channels_last,
        audit=bool(cfg["audit"]), timer=PhaseTimer(timing["enabled"], timing["sync"]),
        hparams={"cfg": cfg, "data_shape": list(shape), "num_classes": classes})


def train_task(cfg: DictConfig) -> float | None:
    """train.py's task: :func:`train`, returning to Hydra the last logged value of ``cfg.metric`` (None when
    unset), which a sweeper such as Optuna's optimises."""
    if cfg.get("metric") is None and "optuna" in str(launched_by("sweeper").get("_target_", "")):
        raise ConfigError("hydra/sweeper=optuna optimises the number train.py returns: set metric=<a logged scalar>, "
                          "e.g. metric=metrics/fid eval.every=<trainer.max_steps>, or use a preset: search=ring")
    module = train(cfg)
    if cfg.get("metric") is None or module.global_rank != 0:  # DDP: rank 0 alone measures, and reports
        return None
    return returned_metric(module, cfg.metric)


def returned_metric(module: GANModule, name: str) -> float:
    """The last logged value of ``name`` (``loss/d``, ``loss/g`` or ``metrics/<name>``); a RunError if the run
    never logged it."""
    logged = {**module.last_losses, **module.last_metrics}
    if name not in logged:
        names = ", ".join(sorted(logged)) or "nothing"
        raise RunError(f"metric={name} was not logged by this run (it logged {names}): choose one of those")
    return logged[name]


def launched_by(node: str) -> DictConfig:
    """Hydra's ``hydra.<node>`` config (``launcher``, ``sweeper``) of the job running now; empty outside Hydra
    (the Python API, tests that compose)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get()[node] if HydraConfig.initialized() else OmegaConf.create({})


def no_gpu_probe_per_step() -> None:
    """Without a GPU, drop the PYTORCH_NVML_BASED_CUDA_CHECK=1 that importing Lightning sets.

    Lightning sets it so that counting GPUs does not initialise CUDA before a fork. But Adam's step asks
    ``torch.cuda.is_available()`` at every call, and until CUDA is initialised, which never happens on a
    CPU run, that variable makes each answer try to load NVML again: about 0.3 ms, twice a generator
    step, with a CUDA build of torch (pip's default on Linux). With no GPU there is no CUDA state a fork
    could inherit, and the plain check costs microseconds (docs/benchmarks.md).
    """
    if os.environ.get(NVML_CHECK) == "1" and torch.cuda.device_count() == 0:
        del os.environ[NVML_CHECK]


NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def torch_threads(threads: int | None) -> tuple[int | None, str]:
    """The intra-op threads this run sets (None: torch's default), and why. ``train.threads`` when given; under
    Hydra's joblib launcher, whose jobs run side by side in processes of their own, the cores this process
    may use shared evenly among ``hydra.launcher.n_jobs`` of them (-1: one per core, -2 all but one, as
    joblib counts), so that jobs x threads = cores."""
    if threads is not None:
        return threads, "train.threads"
    launcher = launched_by("launcher")
    if "joblib" not in str(launcher.get("_target_", "")):
        return None, "torch's default"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    jobs = int(launcher.get("n_jobs", -1))
    jobs = max(cores + 1 + jobs, 1) if jobs < 0 else jobs
    return max(cores // jobs, 1), f"{cores} cores shared by hydra.launcher.n_jobs={jobs} jobs"


def train(cfg: DictConfig, extra_callbacks: Sequence[L.Callback] = ()) -> GANModule:
    """Train the GAN described by ``cfg`` (composed from configs/train.yaml); returns the module.
    ``extra_callbacks`` run before the project's own (e.g. a benchmark's clock)."""
    cfg = validate(cfg)
    logging.getLogger(LIGHTNING_RANK_ZERO_LOGGER).addFilter(LIGHTNING_NOISE)
    run_dir = Path(cfg.paths.run_dir)
    check_run_dir(run_dir, cfg.ckpt_path)
    check_writable(run_dir)
    no_gpu_probe_per_step()
    threads, why = torch_threads(cfg.train.threads)
    if threads is not None:
        torch.set_num_threads(threads)
        log.info(f"torch threads: {threads} ({why})")
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    container = OmegaConf.to_container(cfg, resolve=True)
    datamodule = GANDataModule(container["data"], cfg.train.batch_size, cfg.train.d_steps, cfg.seed)
    classes = num_classes(datamodule.dataset) if cfg.model.conditional else 0
    if cfg.model.conditional and classes == 0:
        raise ConfigError(f"model.conditional=true needs labelled data; data={cfg.data.name} has no labels")
    module = build_module(container, data_shape(container["data"]), classes)
    resuming = cfg.ckpt_path is not None
    if resuming:
        log_changes(check_resumable(module, cfg))

    points = is_points(module.data_shape)
    guard = NonFiniteGuard(cfg.train.skip_nonfinite)
    module.before_logging.append(lambda: guard.read(module))  # a bad update stops the run before it is logged
    checkpoints = GeneratorStepCheckpoint(run_dir / "checkpoints", cfg.checkpoint.every, cfg.checkpoint.keep,
                                          run_dir / snapshot.FILE,
                                          before_save=lambda: guard.read(module))  # no checkpoint after a bad update
    callbacks: list[L.Callback] = [
        *extra_callbacks,
        *([ApplyOnResume(container["optim"])] if resuming else []),  # this config's rates, not the checkpoint's
        RNGState(),
        guard,
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
        callbacks.append(MetricsLogger(cfg.eval.every, EvalSettings.from_config(cfg.eval, cfg.data.name), cfg.seed))
    if cfg.timing.enabled:
        callbacks.append(StepTimer(cfg.log.every))  # last: it closes the step after the other callbacks

    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    g_steps = trainer_args.pop("max_steps")
    trainer = L.Trainer(
        # Lightning counts every optimizer step; each generator step makes d_steps + 1 of them.
        max_steps=g_steps * (cfg.train.d_steps + 1),
        logger=build_loggers(container.get("logger") or {}) or False,  # logger=tensorboard|csv|wandb|mlflow|many
        callbacks=callbacks,
        default_root_dir=str(run_dir),
        enable_checkpointing=False,  # GeneratorStepCheckpoint does it
        # Printed once below instead: Lightning's ModelSummary callback would be visited at every hook of every step.
        enable_model_summary=False,
        log_every_n_steps=1,  # the module decides when to log (log.every generator steps)
        use_distributed_sampler=False,  # StepBatchSampler shards the data per rank itself
        num_sanity_val_steps=0,
        plugins=[AtomicCheckpointIO(), *slurm_without_requeue()],
        **trainer_args,
    )
    if trainer.is_global_zero:
        log.info(f"networks:\n{ModelSummary(module, max_depth=1)}")
    with warnings.catch_warnings():
        # The endless, step-indexed sampler resumes its own position; Lightning cannot know that.
        warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before the epoch.*")
        # Lightning 2.6's own use of a torch API that torch 2.14 deprecates: nothing a user can act on.
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
    if trainer.is_global_zero:
        log_summary(trainer, module, run_dir, checkpoints.stopped_by)
    if checkpoints.stopped_by:
        last = run_dir / "checkpoints" / "last.ckpt"
        raise Interrupted(f"stopped by {checkpoints.stopped_by} at generator step {module.counters.g}, saved in "
                          f"{last}: resume with the same overrides and {shlex.quote(f'ckpt_path={last}')}",
                          checkpoints.exit_code)
    return module


def slurm_without_requeue() -> list[SLURMEnvironment]:
    """Under SLURM, Lightning's SLURMEnvironment with its auto-requeue off: on SIGUSR1 it would save
    ``<run>/hpc_ckpt_N.ckpt`` wherever the signal lands (between D's update and G's: no exact resume), run
    ``scontrol requeue`` and train on, and a requeued job would resume from that file with none of the
    resume's checks. SIGUSR1 stops the run at the end of its step instead, with ``last.ckpt``, as
    SIGTERM does (GeneratorStepCheckpoint); requeueing is the job script's (docs/usage.md)."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def log_summary(trainer: L.Trainer, module: GANModule, run_dir: Path, stopped_by: str | None = None) -> None:
    """What the run did and where to look next: on the console and in the run's log file (train.log)."""
    step, every = module.counters.g, module.cfg["log"]["every"]
    losses = [f"{name} {value:.4g}" for name, value in module.last_losses.items()]
    # The module logs losses every log.every generator steps: the last values are from the last such step.
    final = (f"final losses {', '.join(losses)} (generator step {step - step % every})" if losses
             else f"no losses logged (log.every={every})")
    how = f"stopped by {stopped_by} after" if stopped_by else "finished:"
    log.info(f"Run {how} {step} generator steps in {run_dir}; {final}")
    # Quoted for a shell (a run directory may hold spaces): each line can be pasted as it is.
    log.info(f"  curves and samples: tensorboard --logdir {shlex.quote(str(run_dir / 'tensorboard'))}")
    log.info(f"  metrics:            python evaluate.py {shlex.quote(f'run_dir={run_dir}')}")
    log.info(f"  the generator:      {shlex.quote(str(run_dir / snapshot.FILE))} (gan.core.snapshot.load_generator)")
