"""What a resume (``ckpt_path=...``) may change: the config saved in the checkpoint
(``hyper_parameters["cfg"]``) against the one composed now, key by key, each change as gan/config/schema.py
declares its key (:func:`gan.config.schema.resume_policy`; that module's docstring says what each policy means).
Here: the changes found (:func:`changes`) and refused in one line (:func:`check_changes`), before anything is
written; gan/training/state.py logs the others as it restores the run and sets them on its restored state.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gan.config.schema import DECLARED, resume_policy
from gan.errors import ConfigError

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
    them has come last. Both are in the current layout (gan/run/legacy.py's ``upgrade_config``: a checkpoint's as
    it is read, the composed one by the checks), so a key added to the configs since an older run counts at the
    value that run trained with."""
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


def check_steps_left(checkpoint: dict[str, Any], cfg: DictConfig) -> None:
    """Refuse a resume with no generator step left to train: ``trainer.max_steps`` at or below the checkpoint's step
    would train nothing and rewrite the run's last.ckpt with a config that stops earlier than its weights."""
    step = checkpoint["state_dict"].get("counters.g_updates")
    if step is None or int(step) < cfg.trainer.max_steps:
        return
    step, run = int(step), Path(cfg.ckpt_path).resolve().parent.parent
    where = "the end of its run" if step == cfg.trainer.max_steps else f"past trainer.max_steps={cfg.trainer.max_steps}"
    raise ConfigError(f"ckpt_path={cfg.ckpt_path} is at generator step {step}, {where}: a resume trains up to "
                      f"trainer.max_steps, so give more (trainer.max_steps={2 * step}), or score it as it is with "
                      f"python evaluate.py run_dir={run}")
