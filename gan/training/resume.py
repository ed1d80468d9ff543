"""What a resume (``ckpt_path=...``) may change: the config saved in the checkpoint
(``hyper_parameters["cfg"]``) against the one composed now, key by key, each change as gan/config/schema.py
declares its key (:func:`gan.config.schema.resume_policy`; that module's docstring says what each policy means).
Here: the changes found (:func:`changes`), refused in one line (:func:`check_changes`) or logged
(:func:`log_changes`), and set on the restored optimizers (:func:`apply_on_resume`) and state (:func:`restore`).
"""

from __future__ import annotations

import copy
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from gan.config.schema import DECLARED, resume_policy
from gan.core.models import FourierFeatures
from gan.errors import ConfigError
from gan.run.checkpoint import mismatched
from gan.run.legacy import upgrade_config

log = logging.getLogger(__name__)

# Option groups chosen by name (configs/<group>/<name>.yaml): a changed name is undone by choosing the old option.
GROUPS = ("data", "model", "loss", "reg", "augment")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
UNSET = object()


@dataclass(frozen=True)
class Change:
    """``key`` was ``before`` in the checkpoint's run and is ``after`` now (:data:`UNSET`: no such key)."""

    key: str
    before: Any
    after: Any
    fixed_here: bool = False  # fixed by the composed config: the key declares fixed_if, and that key is true

    @property
    def kind(self) -> str:
        """``applied``, ``refused``, ``fixed`` or ``free``: as gan/config/schema.py declares the key (see the module's
        docstring)."""
        return "fixed" if self.fixed_here else resume_policy(self.key)

    @property
    def why(self) -> str:
        """Why a resume cannot change a ``fixed`` key (its declaration's)."""
        return DECLARED[self.key]["why"]

    def describe(self) -> str:
        return f"{self.key}={shown(self.before)} there, {shown(self.after)} here"


def shown(value: Any) -> str:
    return "unset" if value is UNSET else override_value(value)


def override_value(value: Any) -> str:
    """``value`` as Hydra's override grammar writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    return str(value)


def flatten(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to values; lists are values."""
    flat = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def changes_from(checkpoint: dict[str, Any], composed: dict[str, Any]) -> list[Change]:
    """What ``composed`` changes of the config saved in ``checkpoint`` (none for a checkpoint without one)."""
    saved = checkpoint["hyper_parameters"].get("cfg")
    return changes(saved, composed) if isinstance(saved, dict) else []


def changes(saved: dict[str, Any], composed: dict[str, Any]) -> list[Change]:
    """Every key whose value differs between the checkpoint's config ``saved`` and the ``composed`` one
    (plain containers, interpolations resolved), in the composed config's order; keys that only one of
    them has come last. Keys added to the configs since an older run (gan/run/legacy.py) count at
    the value that run trained with."""
    saved, composed = copy.deepcopy(saved), copy.deepcopy(composed)
    for cfg in (saved, composed):
        upgrade_config(cfg)
    before, after = flatten(saved), flatten(composed)
    keys = [*after, *(k for k in before if k not in after)]
    return [Change(k, before.get(k, UNSET), after.get(k, UNSET), after.get(DECLARED.get(k, {}).get("fixed_if")) is True)
            for k in keys if resume_policy(k) != "ignored" and not same(before.get(k, UNSET), after.get(k, UNSET))]


def same(a: Any, b: Any) -> bool:
    """Equal values (a saved list and a composed list alike), where True is no 1."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def interpolated(cfg: DictConfig) -> set[str]:
    """The dotted keys of ``cfg`` whose value is an interpolation (``eval.every: ${trainer.max_steps}``)."""
    return {key for key, value in flatten(OmegaConf.to_container(cfg, resolve=False)).items()
            if isinstance(value, str) and "${" in value}


def as_trained(refused: list[Change], follow: set[str]) -> list[str]:
    """The overrides that undo ``refused``: the old option of a group whose name changed (which brings
    that option's keys), and the old value of any other key but those in ``follow``, set by interpolation,
    which follow what they name."""
    groups = {c.key.split(".")[0] for c in refused if c.key.endswith(".name") and c.key.count(".") == 1
              and c.key.split(".")[0] in GROUPS and isinstance(c.before, str)
              and (CONFIGS / c.key.split(".")[0] / f"{c.before}.yaml").is_file()}
    overrides = []
    for c in refused:
        group = c.key.split(".")[0]
        if group in groups:
            if c.key == f"{group}.name":
                overrides.append(f"{group}={c.before}")
        elif c.before is not UNSET and c.key not in follow:
            overrides.append(f"{c.key}={override_value(c.before)}")
    return [shlex.quote(o) for o in overrides]


def check_changes(found: list[Change], cfg: DictConfig, listed: int = 4) -> None:
    """Refuse the changes a resume (``cfg.ckpt_path``) may not make: the fixed ones always, the refused ones unless
    ``cfg.resume.allow_changes``; one line naming them and the overrides that undo them."""
    check_fixed([c for c in found if c.kind == "fixed"], cfg)
    refused = [c for c in found if c.kind == "refused"]
    if not refused or cfg.resume.allow_changes:
        return
    ckpt_path = cfg.ckpt_path
    more = f"; {len(refused) - listed} more" if len(refused) > listed else ""
    listing = "; ".join(c.describe() for c in refused[:listed]) + more
    undo = as_trained(refused, interpolated(cfg))
    overrides = Path(ckpt_path).resolve().parent.parent / ".hydra" / "overrides.yaml"
    trained = (f"resume with {' '.join(undo)} to go on as trained" if undo else "resume with the overrides it was "
               "trained with") + (f" (the run's overrides: {overrides})" if overrides.is_file() else "")
    raise ConfigError(f"ckpt_path={ckpt_path} was trained with other networks, objective or data ({listing}): "
                      f"{trained}, or add resume.allow_changes=true to go on with these on purpose")


def check_fixed(fixed: list[Change], cfg: DictConfig) -> None:
    """Refuse ``fixed`` changes whatever ``resume.allow_changes`` says: one line naming them and why, the overrides
    that resume as trained, and the new run from the checkpoint's weights that makes them."""
    if not fixed:
        return
    why = "; ".join(dict.fromkeys(c.why for c in fixed))  # each reason once
    undo = " ".join(as_trained(fixed, interpolated(cfg))) or "the overrides it was trained with"
    # a new run from this checkpoint's weights makes every change but one of init_from, which it sets itself
    start = shlex.quote(f"init_from={cfg.ckpt_path}")
    fresh = (f", or start a new run from these weights: the same overrides with {start} in place of ckpt_path (and of "
             "any init_from), in a new hydra.run.dir" if any(c.key != "init_from" for c in fixed) else "")
    raise ConfigError(f"ckpt_path={cfg.ckpt_path}: {'; '.join(c.describe() for c in fixed)}: {why}, so a resume "
                      f"cannot change {'it' if len(fixed) == 1 else 'them'}, not even with resume.allow_changes=true: "
                      f"resume with {undo}{fresh}")


def log_changes(found: list[Change]) -> None:
    """One line per change a resume makes."""
    for c in found:
        if c.kind == "refused":
            log.warning(f"resume: {c.describe()}: the run goes on with it (resume.allow_changes=true)")
        elif c.kind == "applied":
            log.info(f"resume: {c.describe()}: applied")
        else:
            log.info(f"resume: {c.describe()}: takes effect")


def apply_on_resume(optim: dict[str, Any], optimizers: list[Optimizer], schedules: list[LambdaLR]) -> None:
    """Set the learning rates, betas and ``fused`` of ``optim`` (the composed config's ``optim`` section) on G's and
    D's ``optimizers`` and the base learning rates of their ``schedules`` (none, or one each), once both are
    restored from the checkpoint, whose parameter groups hold the options it was trained with. A schedule's current
    rate is its factor at the restored step times the new base rate: optim.decay=linear goes on along the new line."""
    for k, (optimizer, settings) in enumerate(zip(optimizers, [optim["g"], optim["d"]])):
        schedule = schedules[k] if schedules else None
        lr = float(settings["lr"])
        state = optimizer.state_dict()
        if schedule is not None:
            schedule.base_lrs = [lr] * len(state["param_groups"])
        for i, group in enumerate(state["param_groups"]):
            if "initial_lr" in group:  # set by a schedule: the rate it started from
                group["initial_lr"] = lr
            group["lr"] = lr if schedule is None else schedule.base_lrs[i] * schedule.lr_lambdas[i](schedule.last_epoch)
            if "betas" in group and "betas" in settings:
                group["betas"] = tuple(float(b) for b in settings["betas"])
            if "fused" in group and "fused" in settings:
                group["fused"] = bool(settings["fused"])
        optimizer.load_state_dict(state)  # torch keeps each state as its group's options need (fused: on the device)
        if schedule is not None:
            schedule._last_lr = [group["lr"] for group in optimizer.param_groups]  # what get_last_lr() returns


@torch.no_grad()
def restore(module: torch.nn.Module, checkpoint: dict[str, Any], ckpt_path: str, composed: dict[str, Any],
            found: list[Change]) -> None:
    """Load the state of ``checkpoint`` (read from ``ckpt_path``) into ``module`` (a GANModule built from the
    ``composed`` config, a plain container), after logging what the resume changes (``found``); then set on it what
    the config says of that state where a resume changes it on purpose (resume.allow_changes=true), which the
    checkpoint's buffers would otherwise bring back: DiffAugment's p, the scale of D's Fourier features, the classes
    of the grids' rows. A ConfigError for a checkpoint of other networks: torch's own error for such a state is a
    list of every tensor."""
    problems = mismatched(module.state_dict(), checkpoint["state_dict"])
    if problems:
        overrides = Path(ckpt_path).resolve().parent.parent / ".hydra" / "overrides.yaml"
        raise ConfigError(f"ckpt_path={ckpt_path} holds other networks than this config builds ({problems}): "
                          "resume with the overrides its run was trained with"
                          + (f" ({overrides})" if overrides.is_file() else ""))
    log_changes(found)
    fourier = [m for m in module.D.modules() if isinstance(m, FourierFeatures)]
    drawn = [m.frequencies.clone() for m in fourier]  # this config's, drawn at its scale from its seed
    labels = module.sample_labels.clone()  # a function of the config: a row per class trained on
    module.load_state_dict(checkpoint["state_dict"])
    changed = {c.key: c for c in found}
    augment = module.objective.augment
    if augment is not None and not augment.adaptive:  # DiffAugment's p is its setting (ADA's: fixed, schema.py)
        augment.p.fill_(float(composed["augment"]["p"]))
    if "model.d_fourier_scale" in changed:
        before, after = (float(getattr(changed["model.d_fourier_scale"], end)) for end in ("before", "after"))
        for features, fresh in zip(fourier, drawn):  # the same directions at the new scale; from 0, this config's
            features.frequencies.copy_(features.frequencies * (after / before) if before else fresh)
    if "data.classes" in changed:
        module.sample_labels.copy_(labels)
