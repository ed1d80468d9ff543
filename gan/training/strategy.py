"""``trainer=ddp``: data-parallel training with G and D wrapped as two DistributedDataParallel modules.

Lightning's own ``ddp`` wraps the whole LightningModule in one DistributedDataParallel. Each of its
reducer's backwards expects a gradient for every parameter, and a GAN step has two backwards that by
design leave parameters without one: D's, which stops at ``fake.detach()`` (nothing for G), and G's,
through a frozen D (nothing for D). So plain ``ddp`` fails, and ``ddp_find_unused_parameters_true``
works by searching the autograd graph at every backward for the parameters it will not reach.

Here G and D get a wrapper each, as StyleGAN2-ADA and StudioGAN do in their own loops: G's backward
all-reduces G's gradients, D's backward D's, each reducer sees every one of its parameters used, and no
search is needed. The training step runs G and D through these wrappers (``GANModule.replica``); D's
forward in the G update runs under ``D.no_sync()`` (gan/core/step.py). The LightningModule itself stays
unwrapped: its state_dict, optimizers, EMA and sampling see G and D under their own names.

Buffers: the wrappers broadcast none at each forward (``forward_sync_buffers=False``; they are still
broadcast from rank 0 once, when the wrappers are built). The step makes them equal on every rank
itself, once per generator step (:func:`gan.core.distributed.broadcast_buffers`).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

NAME = "ddp_separate"


class SeparateDDPStrategy(DDPStrategy):
    """Lightning's DDPStrategy (process launch, ranks, checkpoints, SyncBatchNorm), except that G and D are
    wrapped in one DistributedDataParallel each instead of the LightningModule as a whole."""

    def __init__(self, **kwargs: Any) -> None:
        # Rank 0's buffers are copied to the others once per step (gan.core.distributed.broadcast_buffers), not at
        # each of the step's four forwards.
        super().__init__(forward_sync_buffers=False, **kwargs)

    def configure_ddp(self) -> None:
        # Called by DDPStrategy.setup once the module is on its device (and its BatchNorm layers converted
        # to SyncBatchNorm, with trainer.sync_batchnorm=true), before the optimizers are built.
        module = self.lightning_module
        # _setup_model: DDPStrategy's own construction of one wrapper (device ids, CUDA side stream,
        # the strategy's DDP arguments).
        module.ddp = {name: self._setup_model(getattr(module, name)) for name in ("G", "D")}

    def teardown(self) -> None:
        if self.lightning_module is not None:
            self.lightning_module.ddp = {}  # after fit the module runs G and D themselves again
        super().teardown()


# trainer.strategy=ddp_separate (configs/trainer/ddp.yaml) names it to lightning.Trainer. override=True: the
# same registration again if this module is imported anew (importlib.reload).
StrategyRegistry.register(NAME, SeparateDDPStrategy, description="DDP with G and D wrapped separately",
                          override=True)
