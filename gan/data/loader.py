"""The real batches of a training run: its dataset (gan/data/datasets.py), the data it is measured against, and
batches as a function of (seed, step): an endless, step-indexed sampler, so a resumed run sees exactly the data an
uninterrupted run would have seen."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from gan.data.datasets import held_out, population
from gan.errors import ConfigError


class GANData:
    """Serves ``loss.d_steps`` real minibatches per generator step (one for each D update)."""

    def __init__(self, data_cfg: dict[str, Any], dataset: Dataset, d_steps: int, seed: int):
        """``data_cfg``: the config's ``data`` section, as plain values; ``dataset``: the one it and ``seed`` build
        (gan/data/datasets.py's ``build_dataset``)."""
        self.cfg, self.batch_size, self.d_steps, self.seed = data_cfg, data_cfg["batch_size"], d_steps, seed
        self.dataset = dataset
        if len(self.dataset) == 0:
            raise ConfigError(f"data={data_cfg['name']} is empty")

    @property
    def in_memory(self) -> bool:
        """Tensors already in memory (served on the training device), rather than files decoded per batch."""
        return isinstance(self.dataset, TensorDataset)

    def population(self) -> Dataset:
        """The images the run is measured against: its dataset, or all of ``data.classes`` where ``data.limit`` drew
        a few of them (gan/data/datasets.py's ``population``)."""
        return self.dataset if self.cfg.get("limit") is None else population(self.cfg, self.seed)

    def held_out(self) -> Dataset | None:
        """Real data of the run's distribution that it never trains on (gan/data/datasets.py's ``held_out``)."""
        return held_out(self.cfg, self.seed)

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


class StepBatchSampler(Sampler[list[int]]):
    """Yields the batches for generator steps ``start_step, start_step + 1, ...`` without end.

    Batch ``s`` is a pure function of ``(seed, s)``: epochs are seeded permutations of the dataset laid
    end to end, and step ``s`` takes its slice of them. Resuming at step ``s`` therefore continues the
    exact data order, which a plain shuffled DataLoader cannot do (it restarts the epoch).
    Under DDP each rank takes its own share of one global batch.
    """

    def __init__(self, dataset_size: int, batch_size: int, seed: int, start_step: int = 0,
                 rank: int = 0, world_size: int = 1, device: torch.device | str = "cpu"):
        self.n, self.batch_size, self.seed, self.start_step = dataset_size, batch_size, seed, start_step
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self._epoch, self._permutation = -1, torch.empty(0, dtype=torch.long)

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:  # consecutive steps share an epoch: draw (and move) its permutation once
            self._epoch = epoch
            permutation = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch))
            if self.device.type == "cuda":  # from page-locked memory the copy does not block the host
                permutation = permutation.pin_memory().to(self.device, non_blocking=True)
            self._permutation = permutation
        return self._permutation

    def indices(self, step: int) -> torch.Tensor:
        """The dataset indices of step ``step``'s batch (this rank's share), on ``device``."""
        first = step * self.batch_size * self.world_size + self.rank * self.batch_size
        pieces, taken = [], 0
        while taken < self.batch_size:
            epoch, offset = divmod(first + taken, self.n)
            pieces.append(self.permutation(epoch)[offset: offset + self.batch_size - taken])
            taken += len(pieces[-1])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def indices_for_step(self, step: int) -> list[int]:
        return self.indices(step).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        # Endless: the loop stops at trainer.max_steps, and no epoch boundary ever restarts the order.
        for step in itertools.count(self.start_step):
            yield self.indices_for_step(step)


class TensorBatches:
    """The batches of a :class:`StepBatchSampler` from tensors held whole on one device.

    For datasets that are tensors already (the mixtures, digits, MNIST, CIFAR-10): each step indexes
    the tensors once with the step's indices, instead of a DataLoader fetching items one by one and
    collating them, and on a GPU nothing crosses from host to device per step: the data is copied
    once, each epoch's permutation once per epoch.
    """

    def __init__(self, tensors: tuple[torch.Tensor, ...], sampler: StepBatchSampler):
        self.tensors, self.sampler = tuple(t.to(sampler.device) for t in tensors), sampler

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for step in itertools.count(self.sampler.start_step):
            index = self.sampler.indices(step)
            yield tuple(t[index] for t in self.tensors)
