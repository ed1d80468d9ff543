"""Score a trained run: `python evaluate.py run_dir=<run> [ckpt=<file>] [num_samples=<N>] [seed=<S>]
[features=classifier|rotation|inception] [ema=true|false] [images=<dir>] [snapshot=true] [export=torch|onnx]`;
writes <run>/eval/ and the run's TensorBoard (and the PNGs, <run>/generator.pt and exports asked for)."""

from pathlib import Path

from gan.cli import entry_point
from gan.evaluation.app import evaluate_run

# Hydra composes configs/evaluate.yaml with the command line's overrides and calls evaluate_run(cfg); bad
# input ends with one line on stderr. An absolute path: the configs are found however evaluate.py is run.
main = entry_point(evaluate_run, config_path=str(Path(__file__).parent / "configs"), config_name="evaluate")

if __name__ == "__main__":
    main()
