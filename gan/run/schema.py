"""The type of every config key: the schemas of configs/train.yaml and configs/evaluate.yaml.

:func:`conform` merges a composed config into its schema with OmegaConf, which refuses a key the
schema does not list and a value it cannot convert to the key's type (``trainer.max_steps=abc``), and
converts what it can (``ema.decay=1`` becomes 1.0). The YAML files hold every default; the schemas
hold none, only types. Every section is closed: a new key in a YAML file needs its line here.

The option groups (data, model, loss, reg, augment) hold different keys for each option (``data=ring``
has ``num_points``, ``data=digits`` has ``image_size``): each schema lists the keys of all options,
and :func:`conform` keeps only the keys the chosen option has.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, get_type_hints

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from gan.errors import ConfigError, unknown_key
from gan.run.settings import EvalSettings


@dataclass
class Data:
    name: str = MISSING
    batch_size: int = MISSING
    num_workers: int = MISSING
    num_points: int = MISSING  # ring, grid
    std: float = MISSING
    image_size: int = MISSING  # images
    channels: int = MISSING
    channels_last: bool = MISSING
    root: str = MISSING  # mnist, fashion_mnist, stacked_mnist, cifar10
    download: bool = MISSING
    split: str = MISSING
    num_stacks: int = MISSING  # stacked_mnist
    path: str = MISSING  # folder
    preload: Any = MISSING  # auto, true or false
    classes: list[int] | None = MISSING  # labelled images
    limit: int | None = MISSING


@dataclass
class Model:
    name: str = MISSING
    spectral_norm: bool = MISSING
    conditional: bool = MISSING
    d_condition: str = MISSING
    codes: int = MISSING
    width: int = MISSING  # dcgan
    d_batchnorm: bool = MISSING
    hidden: int = MISSING  # mlp
    layers: int = MISSING


@dataclass
class Loss:
    name: str = MISSING
    d_steps: int = MISSING
    gp_weight: float = MISSING  # wgan_gp
    batchnorm_in_d: bool = MISSING


@dataclass
class Reg:
    name: str = MISSING
    weight: float = MISSING  # lecam
    gamma: float = MISSING  # r1
    every: int = MISSING


@dataclass
class Augment:
    name: str = MISSING
    policy: list[str] = MISSING
    p: float = MISSING
    adaptive: bool = MISSING
    target: float = MISSING  # ada
    interval: int = MISSING
    speed_images: int = MISSING


@dataclass
class Optimizer:
    _target_: str = MISSING
    _partial_: bool = MISSING
    lr: float = MISSING
    betas: list[float] = MISSING
    fused: bool = MISSING


@dataclass
class Optim:
    g: Optimizer = field(default_factory=Optimizer)
    d: Optimizer = field(default_factory=Optimizer)
    decay: str = MISSING  # constant or linear


@dataclass
class Trainer:
    max_steps: int = MISSING
    accelerator: str = MISSING
    devices: Any = MISSING  # a count, auto, or a list of device indices
    num_nodes: int = MISSING
    strategy: str = MISSING
    precision: str = MISSING
    enable_progress_bar: bool = MISSING
    profiler: str | None = MISSING
    sync_batchnorm: bool = MISSING  # trainer=ddp


@dataclass
class Train:
    batch_size: int = MISSING
    z_dim: int = MISSING
    d_steps: int = MISSING
    channels_last: bool = MISSING
    compile: bool = MISSING
    skip_nonfinite: bool = MISSING
    threads: int | None = MISSING


@dataclass
class EMA:
    enabled: bool = MISSING
    decay: float = MISSING
    start: int = MISSING


@dataclass
class Log:
    every: int = MISSING
    sample_every: int = MISSING
    num_samples: int = MISSING
    num_points: int = MISSING
    samples_per_class: int = MISSING


@dataclass
class Timing:
    enabled: bool = MISSING
    sync: bool = MISSING


@dataclass
class Checkpoint:
    every: int = MISSING
    keep: int = MISSING


def measuring(name: str, *extra: tuple[str, type]) -> type:
    """A schema with the fields of gan.run.settings.EvalSettings, which types what the metrics measure once
    (train.yaml's ``eval`` section, evaluate.yaml's top level), and the ``extra`` ones (which may retype
    one of them)."""
    hints = get_type_hints(EvalSettings)
    keys = {**{f.name: hints[f.name] for f in fields(EvalSettings)}, **dict(extra)}
    return make_dataclass(name, [(key, kind, field(default=MISSING)) for key, kind in keys.items()])


# num_samples may be null: the data's protocol count (gan.run.settings).
Eval = measuring("Eval", ("every", int), ("num_samples", int | None))


@dataclass
class Finetune:
    freeze_d: Any = MISSING  # a number of blocks, or a list of block names
    freeze_g: Any = MISSING


@dataclass
class Resume:
    allow_changes: bool = MISSING


@dataclass
class Paths:
    run_dir: str = MISSING


@dataclass
class TrainConfig:
    """configs/train.yaml."""

    seed: int = MISSING
    ckpt_path: str | None = MISSING
    init_from: str | None = MISSING
    finetune: Finetune = field(default_factory=Finetune)
    audit: bool = MISSING
    resume: Resume = field(default_factory=Resume)
    metric: str | None = MISSING
    data: Data = field(default_factory=Data)
    model: Model = field(default_factory=Model)
    loss: Loss = field(default_factory=Loss)
    reg: Reg = field(default_factory=Reg)
    augment: Augment = field(default_factory=Augment)
    optim: Optim = field(default_factory=Optim)
    trainer: Trainer = field(default_factory=Trainer)
    train: Train = field(default_factory=Train)
    ema: EMA = field(default_factory=EMA)
    log: Log = field(default_factory=Log)
    timing: Timing = field(default_factory=Timing)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    eval: Eval = field(default_factory=Eval)
    paths: Paths = field(default_factory=Paths)
    # configs/logger/: name -> a Lightning logger's _target_ and arguments (gan/training/loggers.py)
    logger: dict[str, Any] = field(default_factory=dict)


# configs/evaluate.yaml: what to measure, at the top level, and which run.
# classifier_steps may be null there: the run's own eval.classifier_steps (gan.evaluation.app); num_samples too:
# the protocol count of the run's data.
EvaluateConfig = measuring("EvaluateConfig", ("run_dir", str), ("ckpt", str | None), ("seed", int), ("ema", bool),
                           ("device", str), ("num_samples", int | None), ("classifier_steps", int | None),
                           ("images", str | None),
                           ("snapshot", bool), ("export", Any))  # export: a kind, or a list of them


def conform(cfg: DictConfig, schema: type) -> DictConfig:
    """``cfg`` with every value converted to its type in ``schema``; a ConfigError names the first key
    that is not in the schema, or whose value has no such conversion. Interpolations stay as they are
    (their targets are typed where they are defined)."""
    structure = OmegaConf.structured(schema)
    try:
        typed = OmegaConf.merge(structure, cfg)
    except ConfigKeyError as e:  # a key the schema does not have: a typo in a YAML file, or a +key override
        section = str(e.full_key).rpartition(".")[0]
        raise ConfigError(unknown_key(str(e.full_key), OmegaConf.select(structure, section) if section else structure)
                          + ", and a new key needs its type in gan/run/schema.py") from None
    except ValidationError as e:  # a value of the wrong type
        raise ConfigError(f"{e.full_key}={e.value}: {e.msg.splitlines()[0]}") from None
    # Only the keys cfg has: the schema of an option group also lists the keys of the other options.
    return OmegaConf.create(chosen(OmegaConf.to_container(typed), OmegaConf.to_container(cfg)))


def chosen(typed: Any, given: Any) -> Any:
    """The values of ``typed`` at the keys of ``given`` (nested dictionaries)."""
    if not isinstance(given, dict):
        return typed
    return {key: chosen(typed[key], value) for key, value in given.items()}
