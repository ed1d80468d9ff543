"""Train a GAN: `python train.py [hydra overrides]`, e.g. `python train.py experiment=ring seed=3`."""

from pathlib import Path

from gan.cli import entry_point
from gan.training.builder import train

# Hydra composes configs/train.yaml with the command line's overrides and calls train(cfg); bad input
# ends with one line on stderr. An absolute path: the configs are found however train.py is run.
main = entry_point(train, config_path=str(Path(__file__).parent / "configs"), config_name="train")

if __name__ == "__main__":
    main()
