"""train.py plus a record of what each DDP rank saw and holds, for tests/test_ddp.py.

``python tests/ddp_ranks.py <train.py's overrides>`` trains exactly as train.py does (the same Hydra config,
the same gan.training.loop.train), with a probe: rank r writes ``<run dir>/ranks/rank<r>.pt``. Fabric's DDP
launcher starts the other ranks by running this same command again, as it does for train.py. With
``RANK0_FAILS_AT=<step>`` in the environment, rank 0 alone raises at the start of that generator step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig

from gan.training.loop import train
from gan.training.observer import Observer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class RankRecorder(Observer):
    """Per rank: the real batches, G's noise and D's outputs of every step (through forward hooks on G and D
    themselves, which run inside their DDP wrappers), the EMA generator's forwards (sampling), and the
    module's whole state_dict before and after training."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.record: dict[str, Any] = {"batches": [], "noise": [], "d_outputs": [], "ema_forwards": 0}

    def on_start(self, run: Any) -> None:
        record, module = self.record, run.module
        self.rank = run.fabric.global_rank
        record["rank"], record["world_size"] = self.rank, run.fabric.world_size
        # What the step runs for G and D: their DDP wrappers, (class, unused-parameter search, buffer broadcast).
        record["wrappers"] = {name: (type(m).__name__, getattr(m, "find_unused_parameters", None),
                                     getattr(m, "broadcast_buffers", None))
                              for name, m in (("G", run.G), ("D", run.D))}
        record["initial"] = {k: v.clone() for k, v in module.state_dict().items()}
        module.G.register_forward_pre_hook(lambda m, inputs: record["noise"].append(inputs[0].detach().clone()))
        module.D.register_forward_hook(lambda m, inputs, out: record["d_outputs"][-1].append(out.detach().clone()))
        if module.ema is not None:
            module.ema.generator.register_forward_hook(self.count_ema_forward)
        self.module = module

    def count_ema_forward(self, *args: Any) -> None:
        self.record["ema_forwards"] += 1

    def on_step_start(self, run: Any, batch: Any) -> None:
        if self.rank == 0 and str(run.module.counters.g + 1) == os.environ.get("RANK0_FAILS_AT"):
            raise RuntimeError("rank 0 fails alone (RANK0_FAILS_AT)")
        self.record["batches"].append(batch[0].clone())
        self.record["d_outputs"].append([])  # this step's D forwards, in order

    def on_end(self, run: Any) -> None:
        self.record["final"] = {k: v.clone() for k, v in self.module.state_dict().items()}
        self.directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.record, self.directory / f"rank{self.rank}.pt")


@hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name="train")
def main(cfg: DictConfig) -> None:
    train(cfg, probes=[RankRecorder(Path(cfg.paths.run_dir) / "ranks")])


if __name__ == "__main__":
    main()
