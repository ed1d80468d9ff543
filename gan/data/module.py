"""The LightningDataModule that feeds the GAN its real batches."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from gan.data.datasets import build_dataset
from gan.data.sampler import StepBatchSampler, TensorBatches
from gan.errors import ConfigError


class GANDataModule(L.LightningDataModule):
    """Serves ``train.d_steps`` real minibatches per generator step (one for each D update)."""

    def __init__(self, data_cfg: dict[str, Any], batch_size: int, d_steps: int, seed: int):
        super().__init__()
        self.cfg, self.batch_size, self.d_steps, self.seed = data_cfg, batch_size, d_steps, seed
        self.dataset = build_dataset(data_cfg, seed)
        if len(self.dataset) == 0:
            raise ConfigError(f"data={data_cfg['name']} is empty")

    def train_dataloader(self) -> DataLoader | TensorBatches:
        # Start where the (possibly restored) module left off; Lightning restores the checkpoint and
        # moves the module to its device before it asks for the dataloader.
        module = self.trainer.lightning_module if self.trainer else None
        tensors = isinstance(self.dataset, TensorDataset)
        sampler = StepBatchSampler(len(self.dataset), self.batch_size * self.d_steps, self.seed,
                                   module.counters.g if module else 0,
                                   self.trainer.global_rank if self.trainer else 0,
                                   self.trainer.world_size if self.trainer else 1,
                                   module.device if module and tensors else "cpu")
        if tensors:
            return TensorBatches(self.dataset.tensors, sampler)
        workers = int(self.cfg.get("num_workers", 0))
        # Files are decoded by worker processes into pinned (page-locked) memory on CUDA, from which
        # Lightning copies each batch with non_blocking=True. An own generator: otherwise each new
        # iterator draws its base seed from the global RNG, and a resumed run would consume one more
        # draw than the uninterrupted one.
        return DataLoader(self.dataset, batch_sampler=sampler, num_workers=workers,
                          persistent_workers=workers > 0, pin_memory=torch.cuda.is_available(),
                          generator=torch.Generator().manual_seed(self.seed))
