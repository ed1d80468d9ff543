"""The real batches of a training run: the dataset, and an endless loader that starts at any generator step."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gan.data.datasets import build_dataset
from gan.data.sampler import StepBatchSampler, TensorBatches
from gan.errors import ConfigError


class GANData:
    """Serves ``loss.d_steps`` real minibatches per generator step (one for each D update)."""

    def __init__(self, data_cfg: dict[str, Any], batch_size: int, d_steps: int, seed: int,
                 dataset: Dataset | None = None):
        """``dataset``: the one ``data_cfg`` and ``seed`` build, where it was built already (the run's checks)."""
        self.cfg, self.batch_size, self.d_steps, self.seed = data_cfg, batch_size, d_steps, seed
        self.dataset = dataset if dataset is not None else build_dataset(data_cfg, seed)
        if len(self.dataset) == 0:
            raise ConfigError(f"data={data_cfg['name']} is empty")

    @property
    def in_memory(self) -> bool:
        """Tensors already in memory (served on the training device), rather than files decoded per batch."""
        return isinstance(self.dataset, TensorDataset)

    def loader(self, step: int = 0, rank: int = 0, world_size: int = 1,
               device: torch.device | str = "cpu") -> DataLoader | TensorBatches:
        """Batches from generator step ``step`` on, this rank's share of each; in-memory tensors on ``device``."""
        sampler = StepBatchSampler(len(self.dataset), self.batch_size * self.d_steps, self.seed, step, rank,
                                   world_size, device if self.in_memory else "cpu")
        if self.in_memory:
            return TensorBatches(self.dataset.tensors, sampler)
        workers = int(self.cfg.get("num_workers", 0))
        # Files are decoded by worker processes into pinned (page-locked) memory on CUDA, from which the
        # loop copies each batch with non_blocking=True. An own generator: otherwise each new iterator
        # draws its base seed from the global RNG, and a resumed run would consume one more draw than
        # the uninterrupted one.
        return DataLoader(self.dataset, batch_sampler=sampler, num_workers=workers,
                          persistent_workers=workers > 0, pin_memory=torch.cuda.is_available(),
                          generator=torch.Generator().manual_seed(self.seed))
