"""Every config key of configs/train.yaml, declared once: its type, and where they apply its bounds or the values
it takes, whether a resume may change it, the value runs from before the key existed trained with, and the names
it had before. The YAML files hold every default (an option's keys differ from option to option); what else a key
is, is declared here, and read by :func:`conform` (types, bounds, values, old names), the resume policy
(gan/training/resume.py), old runs' configs (gan/run/legacy.py), the command line's errors (gan/cli.py) and
docs/usage.md's table of keys (tools/keys.py). Also the schema of configs/evaluate.yaml.

:func:`conform` merges a composed config into its schema with OmegaConf, which refuses a key the
schema does not list and a value it cannot convert to the key's type (``trainer.max_steps=abc``), and
converts what it can (``ema.decay=1`` becomes 1.0). Every section is closed: a new key in a YAML file needs
its line here.

The option groups (data, model, loss, reg, augment) hold different keys for each option (``data=ring``
has ``num_points``, ``data=digits`` has ``image_size``): each schema lists the keys of all options,
and :func:`conform` keeps only the keys the chosen option has.

What a resume (``ckpt_path=``) may change, per key or for a whole section (a key without its own
``resume`` follows its section's): ``applied`` (set on the restored run: learning rates, steps, logging),
``refused`` (what defines the networks, the objective or the data, unless ``resume.allow_changes=true``),
``fixed`` (what the checkpoint's state holds and a resume restores -- which parameters the optimizers hold,
their class and schedule, where the run started, the sample noise: refused even with
``resume.allow_changes=true``, for the reason its ``why`` declares; ``fixed_if``: only where that key is true in
the composed config), ``free`` (how the run executes or reads its data: takes effect as given; the default) and
``ignored`` (where the run is and resumes from). A refused key whose value the checkpoint's state holds
(``augment.p``, ``model.d_fourier_scale``, ``data.classes``: the grids' rows) is set on the restored state when
allowed (gan/training/state.py).

A key may also declare the ``values`` it takes (``trainer.precision``) or a ``pattern`` its value matches:
:func:`conform` refuses any other, with its ``meaning``; and bounds (``least``, ``above``, ``most``, ``below``):
:func:`conform` refuses a number outside them, in a line generated from them and the key's ``meaning``.

An optimizer's keys are checked as torch builds them (:func:`check_optimizer`: Adam's two betas, each in [0, 1)).

A key renamed declares its old names (``was``): a run's saved config holds them, and gan/run/legacy.py moves their
values to the new name; on the command line they are refused in one line naming the new one (:func:`moved`).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from gan.config.eval_settings import FEATURES, EvalSettings
from gan.errors import ConfigError, unknown_key

RESUME_POLICIES = ("applied", "refused", "fixed", "free", "ignored")
# optim.decay: the learning rates over a run (gan/run/build.py build_optimizers).
LR_DECAYS = ("constant", "linear")


BOUNDS = ("least", "above", "most", "below")


def key(*, least: float | None = None, above: float | None = None, most: float | None = None,
        below: float | None = None, also: tuple[Any, ...] = (), values: tuple[Any, ...] = (), pattern: str = "",
        meaning: str = "", resume: str | None = None, fixed_if: str = "", why: str = "", before: Any = NO_DEFAULT,
        was: tuple[str, ...] = (), was_choice: bool = False) -> Any:
    """A config key's declaration. Its bounds: ``least`` <= value (or ``above`` <), value <= ``most`` (or < ``below``;
    ``below=math.inf``: finite), ``also`` values outside them that mean something; or the only ``values`` it takes, or
    a ``pattern`` its value matches. ``meaning``: what the key is, for a bound's error, or the error's reason and
    advice for ``values`` and ``pattern`` (``{key}`` in it: the key's dotted name). ``resume``: what a resume may do
    with it (``why``: for ``fixed``, why not even resume.allow_changes=true may change it; ``fixed_if``: a key of the
    composed config, where it is true this key is ``fixed`` for that reason). ``before``: the value runs from before
    the key existed trained with. ``was``: its old names; ``was_choice``: the old name only chose this key's value
    (where a run's config has both, this key's is what it trained with; otherwise the old name's is)."""
    assert resume is None or resume in RESUME_POLICIES, resume
    assert (resume == "fixed" or bool(fixed_if)) == bool(why), why
    given = {"least": least, "above": above, "most": most, "below": below, "also": also, "values": values,
             "pattern": pattern, "meaning": meaning, "resume": resume, "fixed_if": fixed_if, "why": why, "was": was,
             "was_choice": was_choice}
    declared = {name: value for name, value in given.items()
                if value is not None and value is not False and value != "" and value != ()}  # 0 is a bound
    if before is not NO_DEFAULT:
        declared["before"] = before
    return field(default=MISSING, metadata=declared)


def section(schema: type, *, resume: str | None = None) -> Any:
    """A section of the config, and what a resume may do with its keys that declare nothing of their own."""
    return field(default_factory=schema, metadata={"resume": resume} if resume else {})


@dataclass
class Data:
    name: str = MISSING
    batch_size: int = key(least=1, meaning="real images per D update", was=("train.batch_size",))
    num_workers: int = key(resume="free")  # how the data is read, not what it is
    num_points: int = MISSING  # ring, grid
    std: float = MISSING
    image_size: int = key(least=1, meaning="the images' height and width in pixels; model=dcgan and model=resnet: "
                          ">= 4")  # images
    channels: int = key(values=(1, 3), meaning="images have 1 (grayscale) or 3 (RGB) channels: use data.channels=1 "
                        "or data.channels=3")
    channels_last: bool = key(meaning="NHWC layout for G, D and the real batches of images (docs/benchmarks.md)",
                              resume="free", was=("train.channels_last",), before=False)
    root: str = key(resume="free")  # mnist, fashion_mnist, stacked_mnist, cifar10
    download: bool = key(resume="free")
    split: str = key(values=("train", "test"), meaning="use data.split=train or data.split=test")
    num_stacks: int = key(least=1, meaning="data=stacked_mnist's images, each three MNIST digits")  # stacked_mnist
    path: str = MISSING  # folder
    preload: Any = key(values=("auto", True, False), meaning="use data.preload=auto, true or false", resume="free")
    classes: list[int] | None = key(before=None)  # labelled images
    limit: int | None = key(least=1, meaning="images kept of the data (null: all)", before=None)


@dataclass
class Model:
    name: str = MISSING
    spectral_norm: bool = MISSING
    conditional: bool = MISSING
    d_condition: str = key(values=("input", "classifier"), meaning="use model.d_condition=input (labels beside D's "
                           "input) or model.d_condition=classifier (D predicts them, AC-GAN)", before="input")
    codes: int = key(least=0, meaning="values of G's latent code; 0: none, e.g. model.codes=8", before=0)
    # dcgan, resnet
    width: int = key(least=1, meaning="model=dcgan's and model=resnet's channels at their highest resolution")
    blocks: int = key(least=1, meaning="model=resnet's residual blocks per resolution")  # resnet
    cardinality: int = key(least=1, meaning="model=resnet's groups in each block's 3x3 convolution")
    expansion: int = key(least=1, meaning="model=resnet's widening inside each block")
    d_batchnorm: bool = key(meaning="BatchNorm in D's inner layers (model=dcgan); loss=wgan_gp sets it false",
                            was=("loss.batchnorm_in_d",), was_choice=True)
    hidden: int = key(least=1, meaning="model=mlp's units per hidden layer")  # mlp
    layers: int = key(least=0, meaning="model=mlp's hidden layers")
    d_fourier: int = key(least=0, meaning="model=mlp's Fourier features of D's input (0: none)", before=0)
    d_fourier_scale: float = key(before=1.0)


@dataclass
class Loss:
    name: str = MISSING
    d_steps: int = key(least=1, meaning="D updates per generator step", was=("train.d_steps",))
    gp_weight: float = key(before=0.0)  # wgan_gp


@dataclass
class Reg:
    name: str = MISSING
    weight: float = MISSING  # lecam
    gamma: float = MISSING  # r1
    # r1, r1r2: lazy regularization (a D update's index modulo every)
    every: int = key(least=1, meaning="D updates between the gradient penalties of reg=r1 and reg=r1r2, each "
                     "weighted by it; 1: every D update")


@dataclass
class Augment:
    name: str = MISSING
    policy: list[str] = MISSING
    # DiffAugment's p is a setting, set on the restored state; ADA's is the run's state, which augment.p only started
    p: float = key(fixed_if="augment.adaptive", why="under ADA (augment.adaptive=true) p moves with the run, and the "
                   "checkpoint holds where it got to, which a resume restores: augment.p is only where it started")
    adaptive: bool = MISSING
    target: float = MISSING  # ada
    interval: int = key(least=1, meaning="generator steps between ADA's adjustments of augment.p")
    speed_images: int = key(least=1, meaning="real images over which ADA's augment.p may move by 1.0")


@dataclass
class Optimizer:
    _target_: str = key(resume="fixed", why="the checkpoint holds the state of the optimizer it trained with, which a "
                                            "resume restores")
    _partial_: bool = MISSING
    lr: float = key(above=0, below=math.inf, meaning="a learning rate, e.g. {key}=2e-4", resume="applied")
    betas: list[float] = key(resume="applied")
    fused: bool = key(resume="free")  # the same math (older runs stepped Adam unfused)


@dataclass
class Optim:
    g: Optimizer = section(Optimizer)
    d: Optimizer = section(Optimizer)
    decay: str = key(values=LR_DECAYS, meaning="use optim.decay=constant (the same learning rates throughout) or "
                     "optim.decay=linear (each falls linearly to 0 at the last generator step)", resume="fixed",
                     why="the checkpoint holds the learning-rate schedules it trained with (none for constant), which "
                     "a resume restores", before="constant")


# trainer.precision: Lightning's precisions in which the loop trains (float32 weights), and their aliases.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "32", "bf16", "16")


@dataclass
class Trainer:
    max_steps: int = key(least=1, meaning="the number of generator steps", resume="applied")
    accelerator: str = MISSING
    # a count, auto, or a list of device indices; -1: all of them (Lightning's)
    devices: Any = key(least=1, meaning="devices per node; -1: all of them; or auto, or a list of device indices",
                       also=(-1,))
    num_nodes: int = key(least=1, meaning="machines the run spans")
    strategy: str = MISSING
    precision: str = key(values=PRECISIONS, meaning="the loop trains float32 weights, in float32 or under autocast "
                         "(a *-true precision but 32-true would hold the weights themselves in that type): use "
                         "trainer.precision=32-true, bf16-mixed (bfloat16 autocast) or 16-mixed (float16 autocast)")
    enable_progress_bar: bool = MISSING
    profiler: str | None = key(values=("simple", "advanced", "pytorch"), meaning="choose simple, advanced, pytorch or "
                               "null")
    sync_batchnorm: bool = MISSING  # trainer=ddp


@dataclass
class Train:
    z_dim: int = key(least=1, meaning="the size of G's noise vector", resume="refused")
    compile: bool = key(before=False)
    skip_nonfinite: bool = key(resume="applied", before=False)
    threads: int | None = key(least=1, meaning="torch's intra-op threads for this run; null: OMP_NUM_THREADS, "
                              "else the cores other work leaves free at the start")


@dataclass
class EMA:
    enabled: bool = MISSING
    decay: float = key(least=0, below=1, meaning="how slowly the EMA copy follows G: 0.999 averages over about "
                       "the last 1,000 generator steps")
    start: int = key(least=0, meaning="generator steps during which the EMA copy follows G")


# Why a resume may not change how many samples the grids show (log.num_samples, num_points, samples_per_class).
FIXED_NOISE = ("the sample grids' fixed noise, of that many samples, is restored from the checkpoint so that grids "
               "stay comparable")


@dataclass
class Log:
    every: int = key(least=1, meaning="generator steps between logged scalars")
    sample_every: int = key(least=1, meaning="generator steps between sample grids")
    num_samples: int = key(least=1, meaning="images in the sample grid of an unconditional run", resume="fixed",
                           why=FIXED_NOISE)
    num_points: int = key(least=1, meaning="generated points in the scatter plots of 2D data", resume="fixed",
                          why=FIXED_NOISE)
    samples_per_class: int = key(least=1, meaning="images per row of a conditional run's grid, a row per class or code",
                                 resume="fixed", why=FIXED_NOISE)


@dataclass
class Timing:
    enabled: bool = key(before=True)
    sync: bool = key(before=False)


@dataclass
class Checkpoint:
    every: int = key(least=1, meaning="generator steps between periodic checkpoints")
    keep: int = key(least=0, meaning="periodic checkpoints kept besides last.ckpt; 0 keeps them all")


# health.action: what a run does when a health condition starts (gan/training/health.py).
HEALTH_ACTIONS = ("warn", "stop")


@dataclass
class Health:
    enabled: bool = key(meaning="the health check while the run trains (docs/usage.md#training-health)", before=False)
    action: str = key(values=HEALTH_ACTIONS, meaning="use health.action=warn (a line in the log) or health.action=stop "
                      "(the run stops, with its checkpoint)", before="warn")
    every: int = key(least=1, meaning="generator steps between health checks", before=100)
    start: float = key(least=0, below=1, meaning="the share of trainer.max_steps from which a health condition whose "
                       "figure stopped improving short of healthy is judged", before=0.0)
    patience: int = key(least=1, meaning="health checks whose median figure starts or ends a condition", before=1)
    examples: int = key(least=2, meaning="images in each fixed set of the health check", before=2)


# What the metrics measure (EvalSettings' fields): train.yaml's eval.*, evaluate.yaml's top level.
NEAREST = "; precision/recall looks at each sample's 3 nearest neighbours"
MEASURED = {
    "num_samples": key(least=4, meaning="generated samples per evaluation" + NEAREST),
    "num_real": key(least=4, meaning="real images behind the image metrics" + NEAREST),
    "features": key(values=FEATURES, meaning=f"use {' | '.join(FEATURES)}, or null (classifier where the data has "
                    "labels, else rotation)"),
    "inception_sha256": key(pattern="[0-9a-fA-F]{64}", meaning="give the file's 64 hex digits, as sha256sum prints "
                            "them, or null for the published file's"),
    "classifier_steps": key(least=1, meaning="training steps of a feature classifier"),
    "batch_size": key(least=1, meaning="samples per forward pass"),
}


def measuring(name: str, *extra: tuple[Any, ...]) -> type:
    """A schema with the fields of gan.config.eval_settings.EvalSettings, which types what the metrics measure once
    (train.yaml's ``eval`` section, evaluate.yaml's top level), declared in :data:`MEASURED`, and the ``extra`` ones
    (which may retype one of them, keeping its declaration): each (name, type), or (name, type, its :func:`key`
    declaration)."""
    hints = get_type_hints(EvalSettings)
    keys = {f.name: (f.name, hints[f.name], MEASURED.get(f.name)) for f in fields(EvalSettings)}
    keys |= {spec[0]: (*spec[:2], spec[2] if len(spec) > 2 else keys.get(spec[0], (None,) * 3)[2]) for spec in extra}
    return make_dataclass(name, [(key, annotation, declared or field(default=MISSING))
                                 for key, annotation, declared in keys.values()])


# num_samples may be null: the data's protocol count (gan.config.eval_settings).
Eval = measuring("Eval", ("every", int, key(least=0, meaning="generator steps between evaluations; 0: none")),
                 ("num_samples", int | None))


# Why a resume may not change which blocks are frozen (finetune.freeze_d, freeze_g).
FROZEN = "the checkpoint's optimizers hold the parameters that trained and their state, which a resume restores"


@dataclass
class Finetune:
    freeze_d: Any = key(resume="fixed", why=FROZEN, before=0)  # a number of blocks, or a list of block names
    freeze_g: Any = key(resume="fixed", why=FROZEN, before=0)


@dataclass
class Resume:
    allow_changes: bool = MISSING


@dataclass
class Paths:
    run_dir: str = MISSING


@dataclass
class TrainConfig:
    """configs/train.yaml."""

    seed: int = key(resume="fixed", why="the checkpoint holds the random streams drawn from it and the sample grids' "
                    "noise, which a resume restores")
    ckpt_path: str | None = key(resume="ignored")
    # what a fine-tuning run started from
    init_from: str | None = key(resume="fixed", why="a resume takes the weights from ckpt_path, and init_from is only "
                                "the record of where the run started", before=None)
    finetune: Finetune = section(Finetune)
    audit: bool = key(resume="applied", before=False)
    resume: Resume = section(Resume, resume="ignored")
    metric: str | None = key(pattern="loss/d|loss/g|metrics/.+", meaning="train.py returns loss/d, loss/g or a "
                             "metrics/<name> of eval.every")
    data: Data = section(Data, resume="refused")
    model: Model = section(Model, resume="refused")
    loss: Loss = section(Loss, resume="refused")
    reg: Reg = section(Reg, resume="refused")
    augment: Augment = section(Augment, resume="refused")
    optim: Optim = section(Optim, resume="refused")
    trainer: Trainer = section(Trainer)
    train: Train = section(Train)
    ema: EMA = section(EMA, resume="refused")
    log: Log = section(Log, resume="applied")
    timing: Timing = section(Timing, resume="applied")
    checkpoint: Checkpoint = section(Checkpoint, resume="applied")
    health: Health = section(Health, resume="applied")
    eval: Eval = section(Eval, resume="applied")
    paths: Paths = section(Paths, resume="ignored")
    # configs/logger/: name -> a Lightning logger's _target_ and arguments (gan/training/loggers.py)
    logger: dict[str, Any] = field(default_factory=dict)


def declarations(schema: type = TrainConfig, prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every key and section of ``schema`` by its dotted name, with what :func:`key` or :func:`section` declared."""
    declared = {}
    for f in fields(schema):
        name = f"{prefix}{f.name}"
        declared[name] = dict(f.metadata)
        if f.default_factory is not NO_DEFAULT and is_dataclass(f.default_factory):
            declared.update(declarations(f.default_factory, name + "."))
    return declared


DECLARED = declarations()


def resume_policy(dotted: str) -> str:
    """What a resume may do with the key ``dotted``: its own declaration's, else its nearest section's, else free."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        policy = DECLARED.get(".".join(parts[:end]), {}).get("resume")
        if policy is not None:
            return policy
    return "free"


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
    structure = structure_of(schema)
    try:
        typed = OmegaConf.merge(structure, cfg)
    except ConfigKeyError as e:  # a key the schema does not have: a typo in a YAML file, or a +key override
        full_key = str(e.full_key)
        if full_key in RENAMED:
            raise ConfigError(moved(full_key, OmegaConf.select(cfg, full_key))) from None
        section = full_key.rpartition(".")[0]
        raise ConfigError(unknown_key(full_key, OmegaConf.select(structure, section) if section else structure)
                          + ", and a new key needs its type in gan/config/schema.py") from None
    except ValidationError as e:  # a value of the wrong type
        raise ConfigError(f"{e.full_key}={e.value}: {e.msg.splitlines()[0]}") from None
    # Only the keys cfg has: the schema of an option group also lists the keys of the other options.
    conformed = OmegaConf.create(chosen(OmegaConf.to_container(typed), OmegaConf.to_container(cfg)))
    for name, declared in declarations(schema).items():
        value = OmegaConf.select(conformed, name, default=None, throw_on_resolution_failure=False)
        if value is not None and value not in declared.get("also", ()) and not allowed(value, declared):
            raise ConfigError(refusal(name, value, declared))
    return conformed


@functools.cache
def structure_of(schema: type) -> DictConfig:
    """``schema`` as OmegaConf's structured config, built once: a run conforms its config twice (its Hydra callback's
    checks, then the loop's), and the merge copies it rather than change it."""
    return OmegaConf.structured(schema)


def allowed(value: Any, declared: dict[str, Any]) -> bool:
    """Does ``value`` lie within what its key declares (its bounds apply to numbers only: trainer.devices=auto)?"""
    if "values" in declared:
        return value in declared["values"]
    if "pattern" in declared:
        return re.fullmatch(declared["pattern"], str(value)) is not None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return True
    lower = value >= declared["least"] if "least" in declared else value > declared.get("above", -math.inf)
    upper = value <= declared["most"] if "most" in declared else value < declared.get("below", math.inf)
    return lower and upper  # False for NaN


def refusal(name: str, value: Any, declared: dict[str, Any]) -> str:
    """The error line for ``name=value`` outside its declaration: the values' or pattern's advice, or the bounds
    and what the key is."""
    meaning = declared.get("meaning", "").replace("{key}", name)
    if "values" in declared or "pattern" in declared:
        return f"{name}={value}: {meaning}"
    return f"{name}={value}: it must be {bounds(declared)} ({meaning})"


def bounds(declared: dict[str, Any]) -> str:
    """A key's bounds as the error line and docs/usage.md say them: ``>= 1``, ``in [0, 1)``, ``> 0 and finite``."""
    lower = next((bound for bound in ("least", "above") if bound in declared), None)
    upper = next((bound for bound in ("most", "below") if bound in declared), None)
    if lower and upper == "below" and declared["below"] == math.inf:
        return f"{SIGNS[lower]} {declared[lower]} and finite"
    if lower and upper:  # an interval: [ and ] include the end, ( and ) do not
        opening, closing = "[" if lower == "least" else "(", "]" if upper == "most" else ")"
        return f"in {opening}{declared[lower]}, {declared[upper]}{closing}"
    end = lower or upper
    return f"{SIGNS[end]} {declared[end]}" if end else ""


SIGNS = {"least": ">=", "above": ">", "most": "<=", "below": "<"}


def check_optimizer(name: str, optimizer: DictConfig) -> None:
    """Refuse an optimizer (``optim.g``, ``optim.d``, conformed) whose betas lie out of range (a rule on a list's
    length and each of its numbers, which the bounds declared above, on one number each, do not say), or that torch
    cannot build from its keys: torch would refuse it with a traceback once the run directory is written, or not at
    all (three betas fail only at the first step)."""
    import torch  # here alone: the config layer loads neither torch nor Hydra's instantiate otherwise
    from hydra.utils import instantiate

    betas = optimizer.get("betas")
    if betas is not None and (len(betas) != 2 or not all(0 <= beta < 1 for beta in betas)):
        raise ConfigError(f"{name}.betas={list(betas)}: Adam's betas are two numbers in [0, 1), the decay rates of "
                          f"its running gradient mean and square: e.g. {name}.betas=[0.5,0.999]")
    if not optimizer._partial_:
        raise ConfigError(f"{name}._partial_=false: the run passes each network's parameters to its "
                          f"optimizer: set {name}._partial_=true")
    try:  # on one parameter: what torch refuses of any optimizer's keys, as the run would build it
        instantiate(optimizer)([torch.zeros(1, requires_grad=True)])
    except Exception as e:  # a class that is no optimizer, or does not take these keys
        keys = ", ".join(k for k in optimizer if not k.startswith("_"))
        raise ConfigError(f"{name}._target_={optimizer._target_} cannot be built with {keys} "
                          f"({type(e).__name__}: {str(e).splitlines()[0]}): give a torch.optim optimizer that "
                          f"takes them, e.g. {name}._target_=torch.optim.Adam") from None


# Every old name of a key (its declaration's ``was``), and the key it is now.
RENAMED = {old: name for name, declared in DECLARED.items() for old in declared.get("was", ())}


def moved(old: str, value: Any) -> str:
    """The error for the old name ``old`` given ``value`` (a string as the override spelled it, or the value)."""
    shown = str(value).lower() if isinstance(value, bool) else value
    return f"{old} is now {RENAMED[old]}: use {RENAMED[old]}={shown}"


def chosen(typed: Any, given: Any) -> Any:
    """The values of ``typed`` at the keys of ``given`` (nested dictionaries)."""
    if not isinstance(given, dict):
        return typed
    return {key: chosen(typed[key], value) for key, value in given.items()}


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# The option groups whose keys differ from option to option: a run needs the keys of the option it chose.
CHOSEN_BY_NAME = ("data", "model", "loss", "reg", "augment")
# Groups every option of which builds on one file: a run needs that file's keys.
SHARED_BASE = {"trainer": "default", "optim": "adam", "eval": "default"}


def option_keys(group: str, option: str) -> list[str]:
    """The dotted keys configs/<group>/<option>.yaml sets (under ``group``, or as they are for ``_global_``)."""
    path = CONFIGS / group / f"{option}.yaml"
    if not path.is_file():
        return []
    global_package, flat = keys_of(path, path.stat().st_mtime_ns)
    return list(flat) if global_package else [f"{group}.{k}" for k in flat]


@functools.cache
def keys_of(path: Path, version: int) -> tuple[bool, tuple[str, ...]]:
    """Whether the YAML file at ``path`` is in the ``_global_`` package, and the dotted keys it sets (its defaults
    list aside); read once for each ``version`` (its modification time: a notebook's user may edit it between runs)."""
    text = path.read_text()
    loaded = OmegaConf.to_container(OmegaConf.create(text))
    return "# @package _global_" in text, tuple(dotted({k: v for k, v in loaded.items() if k != "defaults"}))


def dotted(tree: dict[str, Any], prefix: str = "") -> list[str]:
    return [k for key, value in tree.items()
            for k in (dotted(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [f"{prefix}{key}"])]


def deleted_keys(cfg: DictConfig) -> list[str]:
    """The keys a run of ``cfg``'s options needs that it lacks (a ``~key`` override deleted them): those
    configs/train.yaml sets itself, those of the shared files of trainer, optim and eval, and those of the option
    chosen in each of data, model, loss, reg and augment."""
    own = CONFIGS / "train.yaml"
    needed = [k for k in keys_of(own, own.stat().st_mtime_ns)[1] if k.split(".")[0] not in ("hydra", "paths")]
    needed += [k for group, base in SHARED_BASE.items() for k in option_keys(group, base)]
    for group in CHOSEN_BY_NAME:
        name = OmegaConf.select(cfg, f"{group}.name", default=None)
        needed += option_keys(group, str(name)) if name is not None else [f"{group}.name"]
    return [k for k in dict.fromkeys(needed) if not has_key(cfg, k)]


def has_key(cfg: DictConfig, dotted_key: str) -> bool:
    """Whether ``cfg`` holds ``dotted_key``, with a value or none yet (``???``)."""
    parent, _, name = dotted_key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None, throw_on_missing=False) if parent else cfg
    return isinstance(node, DictConfig) and name in node.keys()
