"""GANModule: the Lightning side of the GAN step (gan/core/step.py), which it runs once per batch.

Per generator step: ``train.d_steps`` D updates, the last on ``D(real)`` and ``D(fake.detach())``, then
a G update through the undetached ``D(fake)`` with D frozen. Two optimizers stepped by hand (Lightning's
manual optimization); gradients cleared with ``set_to_none=True``. Everything is built by
:func:`gan.training.builder.build_module` from the config and handed in; the non-finite guard, the RNG
state and the audit are callbacks (gan/training/guard.py, rng.py, audit.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from gan.core import step
from gan.core.contexts import evaluating
from gan.core.distributed import broadcast_buffers
from gan.core.objective import Objective
from gan.core.phases import PhaseTimer
from gan.core.snapshot import make_snapshot
from gan.core.state import EMAGenerator, StepCounters
from gan.training import audit, legacy

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]


class GANModule(L.LightningModule):
    def __init__(self, G: nn.Module, D: nn.Module, objective: Objective, *, ema: EMAGenerator | None,
                 optimizers: tuple[OptimizerFactory, OptimizerFactory], lr_decay: str, max_steps: int,
                 z_dim: int, d_steps: int, batch_size: int, log_every: int, sample_noise: Tensor,
                 sample_labels: Tensor, data_shape: tuple[int, ...], num_classes: int = 0, codes: bool = False,
                 channels_last: bool = False,
                 audit: bool = False, timer: PhaseTimer | None = None, hparams: dict[str, Any] | None = None):
        super().__init__()
        # Plain containers only: an OmegaConf DictConfig in the checkpoint would make it unloadable
        # with torch.load(weights_only=True) ("Unsupported global").
        self.save_hyperparameters(hparams or {})
        self.cfg = (hparams or {}).get("cfg", {})  # what callbacks log and measure by
        self.automatic_optimization = False  # two optimizers, stepped explicitly in training_step
        self.G, self.D, self.objective, self.ema = G, D, objective, ema
        self.make_optimizers, self.lr_decay, self.max_steps = optimizers, lr_decay, max_steps
        self.z_dim, self.d_steps, self.batch_size, self.log_every = z_dim, d_steps, batch_size, log_every
        self.data_shape, self.num_classes = tuple(data_shape), num_classes  # (2,) points, (C, H, W) images
        self.codes = codes  # G's labels are a latent code (num_classes values) drawn here, not the data's labels
        self.channels_last, self.audit = channels_last, audit
        self.counters = StepCounters()
        self.before_logging: list[Callable[[], None]] = []  # e.g. the non-finite guard's read of its verdict
        self.last_losses: dict[str, float] = {}  # the last logged loss/d and loss/g
        self.last_metrics: dict[str, float] = {}  # the last evaluation's metrics/* (eval.every), as logged
        self.timer = timer or PhaseTimer(enabled=False)  # the step's phase hook: which update runs, and its time
        # trainer=ddp: G's and D's own DistributedDataParallel wrappers (gan/training/strategy.py), which the
        # step runs (self.replica). A dict, so not submodules: the state_dict, optimizers, EMA and sampling
        # see G and D alone, under their own names.
        self.ddp: dict[str, nn.Module] = {}
        # Fixed noise (and labels) for sample grids: persistent buffers, so grids stay comparable across resume.
        self.register_buffer("sample_noise", sample_noise)
        self.register_buffer("sample_labels", sample_labels)

    # --- the training step -----------------------------------------------------------------------

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        opt_g, opt_d = self.optimizers()
        images = batch[0].contiguous(memory_format=torch.channels_last) if self.channels_last else batch[0]
        reals = images.chunk(self.d_steps)
        labels = ([self.latent_code(len(real)) for real in reals] if self.codes else
                  batch[1].chunk(self.d_steps) if self.num_classes else [None] * self.d_steps)
        # One (noise, real, labels) per D update; the last batch's G forward also serves G's update.
        batches = [step.Batch(self.noise(len(real)), real, y) for real, y in zip(reals, labels)]
        first_d_update = self.counters.d

        def d_loss(D: nn.Module, real: Tensor, fake: Tensor, y: Tensor | None, k: int) -> tuple[Tensor, ...]:
            scale = self.loss_scale() if self.objective.needs_loss_scale(first_d_update + k) else None
            return self.objective.d_loss(D, real, fake, y, first_d_update + k, scale)

        self.timer.begin_step()
        result = step.generator_step(self.replica("G"), self.replica("D"), opt_g, opt_d, batches, d_loss,
                                     self.objective.g_loss, self.manual_backward, self.timer.phase)
        with self.timer.phase("statistics"):
            self.update_statistics(result, len(images) * self.trainer.world_size)
        self.timer.start("callbacks")  # logging here, then the callbacks; closed by gan.training.timing.StepTimer
        if self.counters.g % self.log_every == 0:
            self.log_step(result)

    @torch.no_grad()
    def update_statistics(self, result: step.StepResult, images: int) -> None:
        """Counters (``images``: the real images this step used, over all processes), learning rates, the
        objective's statistics, the EMA generator and the augmentation probability, after a generator step."""
        for d in result.d:
            self.counters.count_d_step()
            self.objective.observe(d)
        self.counters.count_g_step(images)
        for schedule in self.lr_schedulers() or []:  # optim.decay=linear: one schedule per optimizer
            schedule.step()
        broadcast_buffers(self.G, self.D)  # DDP: rank 0's BatchNorm statistics on every rank, before EMA copies G's
        if self.ema is not None:
            self.ema.update(self.G, self.counters.g)
        augment = self.objective.augment
        if augment is not None and self.counters.g % augment.interval == 0:
            augment.adjust(self.images_per_step)

    def log_step(self, result: step.StepResult) -> None:
        """The step's scalars to the loggers, read from the device in one transfer: one host-device sync
        per logging step, plain floats to the loggers, and no tensor that could keep a graph alive."""
        for check in self.before_logging:
            check()
        d, objective = result.d[-1], self.objective
        values = {
            "loss/d": d.loss, "loss/g": result.g_loss,
            "d/real": d.real_logits.mean(), "d/fake": d.fake_logits.mean(),
            "d/real_running": objective.d_real_mean.value, "d/fake_running": objective.d_fake_mean.value,
            "grad_norm/g": grad_norm(self.G), "grad_norm/d": grad_norm(self.D),
        }
        if objective.augment is not None:
            values["augment/p"] = objective.augment.p
        values.update({f"train/skipped_{n}": getattr(self.counters, f"skipped_{n}") for n in "dg"})
        numbers = dict(zip(values, torch.stack([v.float() for v in values.values()]).tolist()))
        self.log_scalars(numbers)

    def log_scalars(self, values: dict[str, float]) -> None:
        """Plain numbers to the loggers at the current generator step (TensorBoard's x axis is G steps).

        Straight to ``logger.log_metrics`` rather than ``self.log``: Lightning's step would count
        batches from 0, and a value logged once would be written again at every later step.
        """
        if self.audit:
            audit.check_plain_numbers(values)
        for logger in self.loggers:
            logger.log_metrics(values, step=self.counters.g)
        # For the progress bar and the run's summary: plain floats kept here, not self.log, which would turn
        # each into a device tensor and read it back.
        self.last_losses = {k: v for k, v in values.items() if k.startswith("loss/")}

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """float16 mixed precision (``trainer.precision=16-mixed``, GPUs): Lightning's GradScaler, which
        scales both optimizers' losses and steps them; None otherwise."""
        scaler = getattr(self._trainer.precision_plugin, "scaler", None) if self._trainer else None
        return scaler if scaler is not None and scaler.is_enabled() else None

    def loss_scale(self) -> Tensor | None:
        """The GradScaler's loss scale as a device tensor (no sync), for the penalties' inner backward."""
        scaler = self.grad_scaler()
        return None if scaler is None else scaler.scale(torch.ones((), device=self.device))

    def replica(self, name: str) -> nn.Module:
        """``G`` or ``D`` as the step runs it: its DDP wrapper under trainer=ddp, the network itself otherwise."""
        return self.ddp.get(name, getattr(self, name))

    @property
    def images_per_step(self) -> int:
        """Real images one generator step consumes, over all processes."""
        return self.batch_size * self.trainer.world_size

    def noise(self, n: int) -> Tensor:
        return torch.randn(n, self.z_dim, device=self.device)

    def latent_code(self, n: int) -> Tensor:
        """G's categorical code for ``n`` samples, uniform over its ``num_classes`` values (model.codes)."""
        return torch.randint(self.num_classes, (n,), device=self.device)

    # --- sampling --------------------------------------------------------------------------------

    @property
    def sampling_generator(self) -> nn.Module:
        """The generator used for samples and metrics: the EMA copy when enabled."""
        return self.ema.generator if self.ema is not None else self.G

    def generate(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """Samples through the one evaluation context (eval mode, no_grad, state restored)."""
        generator = self.sampling_generator
        labels = labels if self.num_classes else None

        def sample() -> Tensor:
            with evaluating(generator):
                return generator(z, labels)

        return audit.checked_sampling(generator, sample) if self.audit else sample()

    def snapshot(self, **info: Any) -> dict[str, Any]:
        """The sampling generator as ``generator.pt`` holds it (gan/core/snapshot.py): the EMA copy's weights
        where there is one, else G's; ``info``: more plain values to keep with them."""
        return make_snapshot(self.sampling_generator, model=self.cfg["model"], z_dim=self.z_dim,
                             data_shape=tuple(self.hparams["data_shape"]), num_classes=self.num_classes,
                             generator="G" if self.ema is None else "ema", step=self.counters.g,
                             data=self.cfg["data"]["name"], **info)

    # --- optimizers and checkpoints --------------------------------------------------------------

    def configure_optimizers(self) -> Any:
        """One optimizer each for G and D; with ``optim.decay=linear`` each learning rate falls linearly to
        0 at the last generator step, stepped once per generator step by :meth:`update_statistics`.

        torch's LambdaLR with the factor a function of the step alone, ``1 - step / max_steps``: Lightning
        saves and restores the step with the optimizers, so a resumed run continues on the line of its
        own ``trainer.max_steps`` (LinearLR would multiply its way there step by step instead).
        """
        optimizers = [self.make_optimizers[0](self.G.parameters()), self.make_optimizers[1](self.D.parameters())]
        if self.lr_decay == "constant":
            return optimizers
        return optimizers, [LambdaLR(o, lambda s: max(0.0, 1.0 - s / self.max_steps)) for o in optimizers]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        legacy.upgrade(checkpoint)  # Lightning loads the state dict after this hook


def grad_norm(module: nn.Module) -> Tensor:
    """L2 norm of all gradients of ``module``, on their device (0 where none exist)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=next(module.parameters()).device)
