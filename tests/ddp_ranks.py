"""train.py plus a record of what each DDP rank saw and holds, for tests/test_ddp.py.

``python tests/ddp_ranks.py <train.py's overrides>`` trains exactly as train.py does (the same Hydra config,
the same gan.training.train), with one more callback: rank r writes ``<run dir>/ranks/rank<r>.pt``. Lightning's
DDP launcher starts the other ranks by running this same command again, as it does for train.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import DictConfig

from gan.training.builder import train

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class RankRecorder(L.Callback):
    """Per rank: the real batches, G's noise and D's outputs of every step (through forward hooks on G and D
    themselves, which run inside their DDP wrappers), the EMA generator's forwards (sampling), and the
    module's whole state_dict before and after training."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.record: dict[str, Any] = {"batches": [], "noise": [], "d_outputs": [], "ema_forwards": 0}

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        record = self.record
        record["rank"], record["world_size"] = trainer.global_rank, trainer.world_size
        record["wrapped_module"] = type(trainer.strategy.model).__name__  # what Lightning itself wrapped
        record["wrappers"] = {name: (type(m).__name__, m.find_unused_parameters, m.forward_sync_buffers)
                              for name, m in pl_module.ddp.items()}
        record["initial"] = {k: v.clone() for k, v in pl_module.state_dict().items()}
        pl_module.G.register_forward_pre_hook(lambda m, inputs: record["noise"].append(inputs[0].detach().clone()))
        pl_module.D.register_forward_hook(lambda m, inputs, out: record["d_outputs"][-1].append(out.detach().clone()))
        if pl_module.ema is not None:
            pl_module.ema.generator.register_forward_hook(self.count_ema_forward)

    def count_ema_forward(self, *args: Any) -> None:
        self.record["ema_forwards"] += 1

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.record["batches"].append(batch[0].clone())
        self.record["d_outputs"].append([])  # this step's D forwards, in order

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.record["final"] = {k: v.clone() for k, v in pl_module.state_dict().items()}
        self.directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.record, self.directory / f"rank{trainer.global_rank}.pt")


@hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name="train")
def main(cfg: DictConfig) -> None:
    train(cfg, extra_callbacks=[RankRecorder(Path(cfg.paths.run_dir) / "ranks")])


if __name__ == "__main__":
    main()
