"""Finding a run and loading it: the run directory train.py wrote, its checkpoint, and the module that
checkpoint's own config rebuilds (evaluate.py's way in; training resumes through gan/training/checks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gan.core.models import Condition
from gan.errors import ConfigError
from gan.run.build import build_module
from gan.run.checkpoint import mismatched, read_checkpoint
from gan.run.module import GANModule


def find_checkpoint(run_dir: Any, ckpt: str | None) -> tuple[Path, Path]:
    """(run directory, checkpoint file), or a ConfigError saying what is missing."""
    if run_dir is None:
        raise ConfigError("run_dir is required: python evaluate.py run_dir=<a train.py run directory>")
    run = Path(run_dir).expanduser()
    if not (run / ".hydra" / "config.yaml").is_file():
        what = "is not a directory" if not run.is_dir() else "is not a training run (no .hydra/config.yaml)"
        raise ConfigError(f"run_dir={run_dir} {what}: give the directory train.py wrote")
    path = Path(ckpt).expanduser() if ckpt else run / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist: pass ckpt=<file>, e.g. one of "
                          f"{run / 'checkpoints'}/*.ckpt")
    return run, path


def load_module(path: Path) -> GANModule:
    """The GANModule of a checkpoint, rebuilt from the plain-dict config stored inside it."""
    ckpt = read_checkpoint(path, "ckpt")
    hp = ckpt["hyper_parameters"]
    try:  # a checkpoint of an older version may lack a config key
        module = build_module(hp["cfg"], tuple(hp["data_shape"]), Condition.from_dict(hp["condition"]))
    except KeyError as e:
        raise ConfigError(f"cannot rebuild a GAN from {path}: its config has no {e}") from None
    problems = mismatched(module.state_dict(), ckpt["state_dict"])
    if problems:  # weights that do not fit the networks its own config builds: written by another version
        raise ConfigError(f"cannot rebuild a GAN from {path}: its weights do not fit its config ({problems})")
    module.load_state_dict(ckpt["state_dict"])
    if hp.get("init_from") is not None:  # a fine-tuning run's record of where it started
        module.hparams["init_from"] = hp["init_from"]
    return module
