"""Train a GAN: `python train.py [hydra overrides]`, e.g. `python train.py data=ring seed=3` (the ring's recipe)."""

from pathlib import Path

from gan.cli import entry_point
from gan.config.compose import recipe_follows_data
from gan.training.loop import train_task

# Hydra composes configs/train.yaml with the command line's overrides and calls train_task(cfg), which trains and
# returns the value of metric= to a sweeper; bad input ends with one line on stderr. An absolute path: the
# configs are found however train.py is run.
# data=X alone trains X's recipe (experiment=X): recipe_follows_data says why that is not in the config.
main = entry_point(train_task, config_path=str(Path(__file__).parent / "configs"), config_name="train",
                   overrides=recipe_follows_data)

if __name__ == "__main__":
    main()
