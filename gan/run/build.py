"""The one builder: the module (networks, objective, EMA) and the optimizers a composed config describes, as
training (gan/training/assemble.py) builds it and evaluation rebuilds it from a checkpoint. Everything below
it is built from plain arguments."""

from __future__ import annotations

from typing import Any

import torch
from hydra.utils import instantiate
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from gan.core.augment import build_augment
from gan.core.losses import get_loss
from gan.core.models import Condition, build_models, d_classifies
from gan.core.objective import Objective
from gan.core.regularizers import R1, build_regularizer
from gan.core.state import EMAGenerator
from gan.data.datasets import is_points
from gan.run.module import GANModule


def build_module(cfg: dict[str, Any], shape: tuple[int, ...], condition: Condition) -> GANModule:
    """The GANModule a plain-container config describes, for samples of ``shape`` ((2,) for points, (C, H, W)
    for images) and G's ``condition`` (:func:`gan.core.models.g_condition`). Also how evaluate.py rebuilds a run."""
    z_dim = cfg["train"]["z_dim"]
    G, D = build_models(cfg["model"], z_dim, shape, condition.values)  # one-hot labels as wide as their values
    gp_weight = penalty_weight(cfg["loss"])
    objective = Objective(get_loss(cfg["loss"]["name"]), build_regularizer(cfg["reg"]),
                          build_augment(cfg["augment"], shape), gp_weight, condition, shape, d_classifies(cfg["model"]))
    ema = EMAGenerator(G, cfg["ema"]["decay"], cfg["ema"]["start"]) if cfg["ema"]["enabled"] else None
    images = not is_points(shape)
    channels_last = bool(cfg["data"]["channels_last"]) and images
    if channels_last:  # NHWC weights (and batches), which oneDNN's and cuDNN's convolutions prefer
        G.to(memory_format=torch.channels_last)
        D.to(memory_format=torch.channels_last)
    if cfg["train"]["compile"]:  # in place (Module.compile): the state_dict keys stay; the EMA copy stays eager
        G.compile()
        if not (gp_weight or isinstance(objective.regularizer, R1)):  # compiled graphs have no double backward
            D.compile()
    # Fixed noise (and labels) behind the sample grids; conditional grids get one row per class trained on (or code).
    rows = len(condition.seen)
    n = (cfg["log"]["num_points"] if not images else
         rows * cfg["log"]["samples_per_class"] if rows else cfg["log"]["num_samples"])
    module = GANModule(
        G, D, objective, ema=ema, z_dim=z_dim, data_shape=shape, condition=condition,
        sample_noise=torch.randn(n, z_dim, generator=torch.Generator().manual_seed(cfg["seed"])),
        sample_labels=condition.cycle(n),
        hparams={"cfg": cfg, "data_shape": list(shape), "condition": condition.as_dict()})
    module.channels_last, module.audit = channels_last, bool(cfg["audit"])
    return module


def build_optimizers(module: GANModule, optim: dict[str, Any], max_steps: int) -> tuple[list[Optimizer],
                                                                                        list[LambdaLR]]:
    """One optimizer each for ``module``'s G and D from the config's ``optim`` section, in that order; with
    ``optim.decay=linear`` a schedule each, whose learning rate falls linearly to 0 at generator step
    ``max_steps``, stepped once per generator step.

    torch's LambdaLR with the factor a function of the step alone, ``1 - step / max_steps``: the checkpoint holds
    the step, so a resumed run continues on the line of its own ``trainer.max_steps`` (LinearLR would multiply its
    way there step by step instead).
    """
    # Frozen parameters (finetune.freeze_*) are left out: an optimizer holding them would keep state for them.
    optimizers = [instantiate(optim[name])([p for p in network.parameters() if p.requires_grad])
                  for name, network in (("g", module.G), ("d", module.D))]
    if optim["decay"] == "constant":
        return optimizers, []
    return optimizers, [LambdaLR(o, lambda s: max(0.0, 1.0 - s / max_steps)) for o in optimizers]


def penalty_weight(loss: dict[str, Any]) -> float:
    """The weight of D's gradient penalty: ``loss.gp_weight``, which loss=wgan_gp alone has (its default:
    configs/loss/wgan_gp.yaml); the other losses have none, 0."""
    return float(loss.get("gp_weight", 0.0))
