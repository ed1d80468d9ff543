"""Train a GAN: `python train.py [hydra overrides]`, e.g. `python train.py data=ring model=mlp`."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from gan.errors import exit_on_config_error
from gan.training import train


# An absolute path: the configs are found however train.py is run (as a script, or imported by the tests).
@hydra.main(version_base="1.3", config_path=str(Path(__file__).parent / "configs"), config_name="train")
def main(cfg: DictConfig) -> None:
    exit_on_config_error(train, cfg)


if __name__ == "__main__":
    main()
