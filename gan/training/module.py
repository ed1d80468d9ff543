"""GANModule: the training step, the heart of the project.

Per generator step: one G forward; a D update on ``D(real)`` and ``D(fake.detach())``; a G update
through the undetached ``D(fake)`` with D frozen. Two optimizers stepped by hand (Lightning's manual
optimization), gradients cleared with ``set_to_none=True``.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from gan.core import step
from gan.core.augment import build_augment
from gan.core.contexts import evaluating
from gan.core.distributed import broadcast_buffers
from gan.core.losses import get_loss, gradient_penalty
from gan.core.models import balanced_labels, build_models, condition_input
from gan.core.phases import PhaseTimer
from gan.core.regularizers import R1, build_regularizer
from gan.core.state import EMAGenerator, RunningMean, StepCounters
from gan.data.datasets import is_point_data
from gan.errors import ConfigError, RunError
from gan.training import audit
from gan.training.legacy import upgrade

log = logging.getLogger(__name__)


class GANModule(L.LightningModule):
    def __init__(self, cfg: dict[str, Any], data_shape: tuple[int, ...], num_classes: int = 0):
        super().__init__()
        # Plain containers only: an OmegaConf DictConfig in the checkpoint would make it unloadable
        # with torch.load(weights_only=True) ("Unsupported global").
        self.save_hyperparameters({"cfg": cfg, "data_shape": list(data_shape), "num_classes": num_classes})
        self.automatic_optimization = False  # two optimizers, stepped explicitly in training_step
        self.cfg, self.data_shape, self.num_classes = cfg, tuple(data_shape), num_classes
        self.z_dim, self.d_steps = cfg["train"]["z_dim"], cfg["train"]["d_steps"]
        self.audit = bool(cfg.get("audit", False))
        self.skip_nonfinite = bool(cfg["train"].get("skip_nonfinite", False))  # absent from older runs' configs
        self.loss = get_loss(cfg["loss"]["name"])
        self.gp_weight = float(cfg["loss"].get("gp_weight", 0.0))

        self.G, self.D = build_models(cfg["model"], self.z_dim, self.data_shape, num_classes)
        # trainer=ddp: G's and D's own DistributedDataParallel wrappers (gan/training/strategy.py), which the training
        # step runs them through (self.replica). A dict, so not submodules: the state_dict, optimizers, EMA
        # and sampling see G and D alone, under their own names.
        self.ddp: dict[str, nn.Module] = {}
        self.augment = build_augment(cfg["augment"], self.data_shape)
        ema = cfg["ema"]
        self.ema = EMAGenerator(self.G, ema["decay"], ema["start"]) if ema["enabled"] else None
        self.counters = StepCounters()
        timing = cfg.get("timing", {})  # absent from the configs of runs older than gan/training/timing.py
        self.timer = PhaseTimer(timing.get("enabled", True), timing.get("sync", False))
        # Running means of D's outputs: logged, and the anchors of the LeCam regularizer.
        self.d_real_mean, self.d_fake_mean = RunningMean(), RunningMean()
        self.reg = build_regularizer(cfg["reg"], self.d_real_mean, self.d_fake_mean)
        self.apply_speed_options(cfg["train"])
        # Fixed noise (and labels) for sample grids: persistent buffers, so grids stay comparable
        # across resume. Conditional grids get one row per class.
        if is_point_data(cfg["data"]["name"]):
            n = cfg["log"]["num_points"]
        elif num_classes:
            n = num_classes * cfg["log"]["samples_per_class"]
        else:
            n = cfg["log"]["num_samples"]
        generator = torch.Generator().manual_seed(cfg["seed"])
        self.register_buffer("sample_noise", torch.randn(n, self.z_dim, generator=generator))
        self.register_buffer("sample_labels", balanced_labels(n, num_classes))
        self._pending_rng: dict[str, Any] | None = None

    def apply_speed_options(self, train_cfg: dict[str, Any]) -> None:
        """``train.channels_last``: G's and D's 4-D weights (and each batch of real images) in NHWC
        layout, which oneDNN and cuDNN convolutions prefer. ``train.compile``: ``torch.compile`` G and
        D in place (``Module.compile``, so the state_dict keys stay as they are). D is left eager when
        its loss differentiates D twice (R1, gradient penalty): compiled graphs have no double
        backward. Applied after the EMA copy was taken, which stays eager (it samples rarely)."""
        self.channels_last = bool(train_cfg.get("channels_last", False)) and not is_point_data(self.cfg["data"]["name"])
        if self.channels_last:
            self.G.to(memory_format=torch.channels_last)
            self.D.to(memory_format=torch.channels_last)
        if train_cfg.get("compile", False):
            self.G.compile()
            if not (self.gp_weight or isinstance(self.reg, R1)):
                self.D.compile()

    # --- the training step -----------------------------------------------------------------------

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        opt_g, opt_d = self.optimizers()
        images = batch[0].contiguous(memory_format=torch.channels_last) if self.channels_last else batch[0]
        reals, labels = images.chunk(self.d_steps), batch[1].chunk(self.d_steps)

        # Extra D updates (d_steps > 1, e.g. wgan_gp) come first. Only D learns from them, so their
        # fakes are made under no_grad: no graph through G is built just to be cut off again.
        for real, y in zip(reals[:-1], labels[:-1]):
            with torch.no_grad(), self.timer.phase("g_forward"):
                extra_fake = self.G(self.noise(len(real)), y)
            step.d_update(opt_d, self.d_loss, real, extra_fake, y, self.manual_backward, self.timer.phase)
            self.counters.count_d_step()

        # The GAN step (gan/core/step.py): one G forward; D learns from D(real) and D(fake.detach()); G
        # learns through the undetached D(fake) while D is frozen.
        d, g_loss = step.generator_step(self.replica("G"), self.replica("D"), opt_g, opt_d,
                                        self.noise(len(reals[-1])), reals[-1], labels[-1], self.d_loss,
                                        self.g_loss, self.manual_backward, self.timer.phase)
        self.counters.count_d_step()

        with self.timer.phase("statistics"):
            self.update_statistics(batch[0].shape[0], d.real_logits)
        self.timer.start("callbacks")  # logging here, then the callbacks; closed by gan.training.timing.StepTimer
        if self.counters.g % self.cfg["log"]["every"] == 0:
            # .item() here and only here: one device sync per logging step, plain floats to the
            # loggers, and no tensor that could keep a graph alive.
            self.log_scalars({
                "loss/d": d.loss.item(), "loss/g": g_loss.item(),
                "d/real": d.real_logits.mean().item(), "d/fake": d.fake_logits.mean().item(),
                "d/real_running": self.d_real_mean.value.item(), "d/fake_running": self.d_fake_mean.value.item(),
                "grad_norm/g": grad_norm(self.G), "grad_norm/d": grad_norm(self.D),
                **({"augment/p": self.augment.p.item()} if self.augment is not None else {}),
                **({f"train/skipped_{n}": getattr(self.counters, f"skipped_{n}").item() for n in "dg"}
                   if self.skip_nonfinite else {}),
            })

    def d_loss(self, real: Tensor, fake: Tensor, y: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """What D minimises: the adversarial loss, plus the gradient penalty (wgan_gp) and the
        regularizer. ``fake`` arrives detached (or made under no_grad). Returns (loss, logits on real,
        logits on fake)."""
        d_step = self.counters.d
        input_grad = self.reg.needs_input_grad(d_step)
        if input_grad:
            real = real.detach().requires_grad_(True)  # R1 differentiates D with respect to its input
        real_logits, fake_logits = self.critic(real, y), self.critic(fake, y)
        self.d_real_mean.update(real_logits)
        self.d_fake_mean.update(fake_logits)
        loss = self.loss.d(real_logits, fake_logits)
        # Only a penalty with an inner backward (gradient penalty, R1) needs the loss scale.
        scale = self.loss_scale() if self.gp_weight or input_grad else None
        if self.gp_weight:
            loss = loss + self.gp_weight * gradient_penalty(lambda x: self.critic(x, y), real, fake, scale)
        penalty = self.reg.penalty(d_step, real, real_logits, fake_logits, scale)
        return (loss if penalty is None else loss + penalty), real_logits, fake_logits

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """float16 mixed precision (``trainer.precision=16-mixed``, GPUs): Lightning's GradScaler, which
        scales both optimizers' losses and steps them; None otherwise."""
        scaler = getattr(self._trainer.precision_plugin, "scaler", None) if self._trainer else None
        return scaler if scaler is not None and scaler.is_enabled() else None

    def loss_scale(self) -> Tensor | None:
        """The GradScaler's current loss scale as a device tensor, for the penalties' inner backward; None
        without one."""
        scaler = self.grad_scaler()
        return None if scaler is None else scaler.scale(torch.ones((), device=self.device))  # on the device: no sync

    def g_loss(self, fake: Tensor, y: Tensor | None) -> Tensor:
        """What G minimises: the adversarial loss on D's verdict about ``fake`` (D is frozen by the step)."""
        return self.loss.g(self.critic(fake, y))

    def critic(self, x: Tensor, y: Tensor | None) -> Tensor:
        """What D says about ``x``: augmented (when configured), then, for a conditional D,
        ``torch.cat((condition, x), dim=1)``."""
        if self.augment is not None:
            x = self.augment(x)
        if self.num_classes:
            x = torch.cat((condition_input(y, self.num_classes, self.data_shape), x), dim=1)
        return self.replica("D")(x)

    def replica(self, name: str) -> nn.Module:
        """``G`` or ``D`` as the training step runs it: through its DDP wrapper under trainer=ddp, whose
        backward all-reduces the network's gradients; the network itself otherwise."""
        return self.ddp.get(name, getattr(self, name))

    @torch.no_grad()
    def update_statistics(self, batch_size: int, real_logits: Tensor) -> None:
        """Counters, learning rates, the EMA generator and the augmentation probability, after a
        generator step."""
        self.counters.count_g_step(batch_size * self.trainer.world_size)
        g_steps = self.counters.g
        for schedule in self.lr_schedulers() or []:  # optim.decay=linear: one schedule per optimizer
            schedule.step()
        broadcast_buffers(self.G, self.D)  # DDP: rank 0's BatchNorm statistics on every rank, before EMA copies G's
        if self.ema is not None:
            self.ema.update(self.G, g_steps)
        if self.augment is not None:
            self.augment.accumulate(real_logits)
            if g_steps % self.augment.interval == 0:
                self.augment.adjust(self.images_per_step)

    @property
    def images_per_step(self) -> int:
        """Real images one generator step consumes, over all processes."""
        return self.cfg["train"]["batch_size"] * self.trainer.world_size

    def noise(self, n: int) -> Tensor:
        return torch.randn(n, self.z_dim, device=self.device)

    # --- non-finite losses and gradients ---------------------------------------------------------

    def on_before_backward(self, loss: Tensor) -> None:
        self.backward_loss = loss.detach()  # judged with the gradients it gives, before the optimizer steps

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """A non-finite loss or gradient never reaches the weights. Checked here, after each backward and
        before its optimizer step (Lightning calls this hook in between): the run stops with a RunError
        that names the generator step, the network and the phase (forward: the loss; backward: the
        gradients), and the last checkpoint stays the last good state. With ``train.skip_nonfinite``
        the update is skipped instead, and counted (``counters.skipped_d``, ``counters.skipped_g``)."""
        finite = torch.isfinite(self.backward_loss)
        scaler = self.grad_scaler()
        # The gradients too: a finite loss can still give non-finite ones (an overflow in the backward,
        # R1's inner backward), and under DDP they are all-reduced, the same on every rank, so every rank
        # decides alike. Their norms in one fused call (as clip_grad_norm_ computes them): a non-finite
        # element makes its tensor's norm non-finite. Not under float16's GradScaler: non-finite
        # gradients are how it learns that its scale is too high, and it skips such a step itself.
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads and scaler is None:
            finite = finite & torch.stack(torch._foreach_norm(grads)).isfinite().all()
        # The check's one host-device sync (none on a CPU, where ops finish as they return): the host
        # must know before the optimizer steps, as GradScaler must (it syncs once per step too).
        ok = bool(finite.item())
        if scaler is not None:  # each rank judged its own loss: all must agree (DDP; nothing on one device)
            ok = self.trainer.strategy.reduce_boolean_decision(ok, all=True)
        if ok:
            return
        network = "G" if optimizer is self.trainer.optimizers[0] else "D"  # configure_optimizers' order
        step, update = self.counters.g + 1, self.counters.d - self.counters.g * self.d_steps + 1
        where = f"generator step {step}, {network} update" + (f" {update} of {self.d_steps}" if network == "D"
                                                                and self.d_steps > 1 else "")
        loss = self.backward_loss.item()
        what = (f"the loss is {loss} (forward)" if not math.isfinite(loss)
                else f"the gradients are not finite, the loss is {loss:.4g} (backward)")
        if not self.skip_nonfinite:
            raise RunError(f"{where}: {what}; stopped before that update, so the last checkpoint holds the last "
                           "good state: resume from it with lower learning rates (optim.d.lr, optim.g.lr) or a "
                           "regularizer (e.g. reg=r1), or set train.skip_nonfinite=true to skip such updates")
        optimizer.zero_grad(set_to_none=True)  # torch's optimizers step no parameter that has no gradient
        self.counters.count_skipped(network)
        log.warning(f"skipped {where}: {what} (train.skip_nonfinite)")

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

    # --- logging ---------------------------------------------------------------------------------

    def log_scalars(self, values: dict[str, float]) -> None:
        """Plain numbers to the loggers at the current generator step (TensorBoard's x axis is G steps).

        Straight to ``logger.log_metrics`` rather than ``self.log``: Lightning's step would count
        batches from 0, and a value logged once would be written again at every later step.
        """
        if self.audit:
            audit.check_plain_numbers(values)
        for logger in self.loggers:
            logger.log_metrics(values, step=self.counters.g)
        self.log_dict({k: v for k, v in values.items() if k.startswith("loss/")}, prog_bar=True, logger=False)

    # --- optimizers and checkpoints --------------------------------------------------------------

    def configure_optimizers(self) -> Any:
        """Adam for G and for D; with ``optim.decay=linear`` each learning rate falls linearly to 0 at
        the last generator step, stepped once per generator step by :meth:`update_statistics`.

        torch's LambdaLR with the factor written as a function of the step alone, ``1 - step /
        max_steps``: Lightning saves and restores the step with the optimizers, so a resumed run
        continues on the line of its own ``trainer.max_steps`` (LinearLR would instead multiply its
        way there step by step, and stay at 0 once a shorter run had ended).
        """
        from hydra.utils import instantiate

        optim = self.cfg["optim"]
        optimizers = [instantiate(optim["g"])(self.G.parameters()), instantiate(optim["d"])(self.D.parameters())]
        decay = optim.get("decay", "constant")  # absent from the configs of older runs
        if decay == "constant":
            return optimizers
        if decay != "linear":
            raise ConfigError(f"optim.decay={decay}: use constant or linear")
        steps = self.cfg["trainer"]["max_steps"]
        return optimizers, [LambdaLR(o, lambda step: max(0.0, 1.0 - step / steps)) for o in optimizers]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every random stream, so a resumed run draws the same noise as an uninterrupted one.
        # (The data order needs none: it is a function of the seed and the restored step counter.)
        checkpoint["rng"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": numpy_state_to_plain(np.random.get_state()),
            "python": random.getstate(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        upgrade(checkpoint)  # Lightning loads the state dict after this hook
        # Applied at the first batch, not now: Lightning draws random numbers while it sets up.
        self._pending_rng = checkpoint.get("rng")

    def on_train_start(self) -> None:
        self.separate_rank_streams()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._pending_rng is not None:
            state, self._pending_rng = self._pending_rng, None
            torch.set_rng_state(state["torch"])
            if state["cuda"] and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(state["cuda"])
            np.random.set_state(plain_to_numpy_state(state["numpy"]))
            random.setstate(state["python"])
            self.separate_rank_streams()  # the checkpoint holds rank 0's streams only

    def separate_rank_streams(self) -> None:
        """Under DDP every rank starts from the same seed (and a resume restores rank 0's state on all
        of them); reseed ranks > 0 so the global batch of fakes is not world_size copies of one.
        Rank 0 keeps its stream: a single-process run is unaffected."""
        if self.global_rank > 0:
            torch.manual_seed(int(torch.randint(2**62, ())) + self.global_rank)


def grad_norm(module: nn.Module) -> float:
    """L2 norm of all gradients of ``module`` (0.0 where none exist)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads).item() if grads else 0.0


def numpy_state_to_plain(state: tuple) -> tuple:
    # weights_only loading accepts tensors and builtins, not numpy arrays.
    return (state[0], torch.from_numpy(state[1].astype(np.int64)), *state[2:])


def plain_to_numpy_state(state: tuple) -> tuple:
    return (state[0], state[1].numpy().astype(np.uint32), *state[2:])
