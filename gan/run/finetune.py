"""Starting a run from another run's networks (``init_from=``), and freezing some of their layers
(``finetune.freeze_g``, ``finetune.freeze_d``): fine-tuning. Unlike a resume (``ckpt_path=``), which continues
the same run, the new run takes only G's, D's and the EMA generator's weights (with their BatchNorm
statistics); its optimizers, schedules, step counters, the objective's running statistics and the random
streams start fresh, on data that may differ wherever the shapes fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gan.core.freezing import blocks, freeze
from gan.core.models import FourierFeatures
from gan.errors import ConfigError
from gan.run.checkpoint import read_checkpoint
from gan.run.module import GANModule

# The parts of a module whose weights a fine-tuning run starts from.
NETWORKS = ("G", "D", "ema")


def init_checkpoint(init_from: str) -> Path:
    """The checkpoint ``init_from`` names: a .ckpt file, or a run directory (its checkpoints/last.ckpt)."""
    path = Path(init_from).expanduser()
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise ConfigError(f"init_from={init_from}: {path} does not exist: give a train.py run directory or one of "
                          "its checkpoints/*.ckpt")
    return path


def initialise(module: GANModule, path: Path) -> dict[str, Any]:
    """Load G's, D's and the EMA generator's weights from the checkpoint at ``path`` into ``module``; returns
    what the run records of where it started (the file and its generator step). A ConfigError names the
    first layer whose shape does not fit, or D's Fourier features drawn at another scale, before anything is
    loaded. A source run without an EMA generator starts this one's EMA from G."""
    checkpoint = read_checkpoint(path, "init_from")
    source = checkpoint["state_dict"]
    wanted = {k: v for k, v in module.state_dict().items() if k.split(".")[0] in NETWORKS}
    has_ema = any(k.startswith("ema.") for k in source)
    for name, tensor in wanted.items():
        if name.startswith("ema.") and not has_ema:
            continue
        if name not in source:
            raise ConfigError(f"init_from={path}: that run has no layer {name}: its networks are not this config's "
                              "(train with the model settings it was trained with)")
        if source[name].shape != tensor.shape:
            raise ConfigError(f"init_from={path}: layer {name} is {list(source[name].shape)} there and "
                              f"{list(tensor.shape)} here: the data or model settings differ where the shapes must fit")
    check_fourier_scale(module, checkpoint, path)
    module.load_state_dict({**module.state_dict(), **{k: source[k] for k in wanted if k in source}})
    if module.ema is not None and not has_ema:
        module.ema.generator.load_state_dict(module.G.state_dict())
    step = int(source["counters.g_updates"]) if "counters.g_updates" in source else None
    return {"checkpoint": str(path.resolve()), "step": step}


def check_fourier_scale(module: GANModule, checkpoint: dict[str, Any], path: Path) -> None:
    """Refuse a source whose D drew its Fourier features (``model.d_fourier``) at another ``model.d_fourier_scale``:
    they come with D's weights, which learned on them, and the run's config would record a scale D does not use."""
    saved = checkpoint["hyper_parameters"].get("cfg")
    if not isinstance(saved, dict) or not any(isinstance(m, FourierFeatures) for m in module.D.modules()):
        return
    there, here = saved["model"].get("d_fourier_scale"), module.cfg["model"].get("d_fourier_scale")
    if there is not None and here is not None and float(there) != float(here):
        raise ConfigError(f"init_from={path}: D's Fourier features were drawn at model.d_fourier_scale={there} there "
                          f"and {here} here, and D's weights learned on them: fine-tune with "
                          f"model.d_fourier_scale={there}")


def start_from(module: GANModule, cfg: dict[str, Any]) -> list[str]:
    """Fine-tune ``module`` as the config ``cfg`` (a plain container) asks: its weights from ``init_from`` when it
    starts fresh (a resume, ``ckpt_path``, never reads ``init_from``, whose run may be gone: its checkpoint holds the
    weights and the record of where it started, which gan/training/state.py puts back); then the frozen blocks.
    Returns what to log."""
    lines = []
    if cfg.get("init_from") is not None and cfg.get("ckpt_path") is None:
        record = initialise(module, init_checkpoint(cfg["init_from"]))
        module.hparams["init_from"] = record
        lines.append(f"init_from: G, D and the EMA generator of {record['checkpoint']} (its generator step "
                     f"{record['step']}); optimizers, schedules, counters and random streams start fresh")
    finetune = cfg["finetune"]  # its defaults: configs/train.yaml
    if finetune["freeze_d"] or finetune["freeze_g"]:
        lines.append(f"finetune: {freeze_networks(module, finetune)}")
    return lines


def freeze_networks(module: GANModule, finetune: dict[str, Any]) -> str:
    """Freeze the blocks ``finetune`` (the config's section) names in G and D, once, before the optimizers are
    built; returns one line naming them (the loop's model summary counts the parameters that train)."""
    lines = []
    for name, network in (("G", module.G), ("D", module.D)):
        key = f"freeze_{name.lower()}"
        frozen = set(freeze(network, finetune[key], f"finetune.{key}"))
        every = blocks(network)
        names = [block for block, params in every.items() if params[0] in frozen]
        # the parameter counts are the model summary's (describe_networks)
        lines.append(f"{name} blocks {', '.join(names) or 'none'} frozen of {list(every)}")
    return "; ".join(lines)
