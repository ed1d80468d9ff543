"""Score a trained run: `python evaluate.py run_dir=<run> [ckpt=<file>] [num_samples=<N>] [seed=<S>]
[features=classifier|rotation|inception] [ema=true|false]`; writes <run>/eval/ and the run's TensorBoard."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from gan.errors import exit_on_config_error
from gan.evaluation import evaluate_run


# An absolute path: the configs are found however evaluate.py is run (as a script, or imported by the tests).
@hydra.main(version_base="1.3", config_path=str(Path(__file__).parent / "configs"), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    exit_on_config_error(evaluate_run, cfg)


if __name__ == "__main__":
    main()
