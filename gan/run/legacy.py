"""Checkpoints and saved configs written by earlier versions of this project, brought to the current layout
in one place. :func:`upgrade` runs on every checkpoint read (gan/run/checkpoint.py's ``read_checkpoint``: for a
resume, ``init_from=`` and evaluate.py); :func:`upgrade_config` also runs on a composed config before a resume
compares it with the checkpoint's (gan/training/checks.py, for gan/training/resume.py). The top-level keys the
loop reads (``state_dict``, ``optimizer_states``, ``lr_schedulers``, ``hyper_parameters``, ``rng``) are those of
every version's checkpoints, Lightning Trainer's included, so they need no upgrade."""

from __future__ import annotations

from typing import Any

import torch

from gan.config.schema import DECLARED, RENAMED
from gan.core.models import g_condition

# Config keys added after the first runs, with the value those runs trained with (declared with each key).
CONFIG_DEFAULTS: dict[str, Any] = {name: declared["before"] for name, declared in DECLARED.items()
                                   if "before" in declared}

# State moved since: the running means of D's outputs and the augmentation state now live in the
# objective (gan/core/objective.py).
RENAMED_PREFIXES = {"d_real_mean.": "objective.d_real_mean.", "d_fake_mean.": "objective.d_fake_mean.",
                    "augment.": "objective.augment.",
                    # "d_steps" also named the D updates per generator step (loss.d_steps): now "updates" here
                    "counters.g_steps": "counters.g_updates", "counters.d_steps": "counters.d_updates"}
# State no longer kept: the EMA's update count is the generator step count (gan/core/state.py).
DROPPED = ("ema.num_updates",)


def upgrade(checkpoint: dict[str, Any]) -> None:
    """Bring a checkpoint of any earlier version to the current layout, in place (idempotent)."""
    state = checkpoint["state_dict"]
    # Written before the skipped-update counters existed: it skipped no update.
    for name in ("counters.skipped_g", "counters.skipped_d"):
        state.setdefault(name, torch.zeros((), dtype=torch.long))
    for old, new in RENAMED_PREFIXES.items():
        for key in [k for k in state if k.startswith(old)]:
            state[new + key[len(old):]] = state.pop(key)
    for key in DROPPED:
        state.pop(key, None)
    # The health check's state before it lived in buffers (lists by condition name): a resume judges anew from it.
    if "recent" in checkpoint.get("health", {}):
        checkpoint["health"] = {}
    hparams = checkpoint.get("hyper_parameters", {})
    cfg = hparams.get("cfg")
    if isinstance(cfg, dict):
        upgrade_config(cfg)
        # Written before G's condition was one record: the data's classes, with the latent code in the config.
        if "num_classes" in hparams and "condition" not in hparams:
            hparams["condition"] = g_condition(cfg["model"], hparams.pop("num_classes")).as_dict()
        upgrade_subset(hparams.get("condition"), cfg["data"].get("classes"), state)


def upgrade_subset(condition: dict[str, Any] | None, classes: list[int] | None, state: dict[str, Any]) -> None:
    """A conditional run on some classes (``data.classes``) written before its condition named them: it was
    sampled and scored over every label up to the largest, and its grid's fixed noise was drawn for each. The
    condition gets the subset, and the grid keeps the rows of the subset's classes, as such a run now draws them
    (:meth:`gan.core.models.Condition.cycle`)."""
    if condition is None or condition["kind"] != "classes" or "subset" in condition or classes is None:
        return
    condition["subset"] = sorted(set(classes))
    keep = torch.isin(state["sample_labels"], torch.tensor(condition["subset"]))
    state["sample_noise"], state["sample_labels"] = state["sample_noise"][keep], state["sample_labels"][keep]


def upgrade_config(cfg: dict[str, Any]) -> None:
    """A saved config (a plain dict) with its keys' old names renamed (gan/config/schema.py's ``was``) and the keys
    added since at the values older runs trained with, in place. Also applied to a composed config before it is
    compared with a checkpoint's (gan/training/checks.py): a key one side lacks and the other holds at its old
    value is no change."""
    for old, new in RENAMED.items():
        *sections, key = old.split(".")
        node = section_of(cfg, sections)
        if key not in node:
            continue
        value = node.pop(key)
        *sections, key = new.split(".")
        node = section_of(cfg, sections)
        # the old name's value is what the run read (train.batch_size could be set apart from data.batch_size),
        # but where it only chose the new key's value, which the run read (loss.batchnorm_in_d), the new key's
        if not DECLARED[new].get("was_choice") or key not in node:
            node[key] = value
    for dotted, value in CONFIG_DEFAULTS.items():
        *sections, key = dotted.split(".")
        section_of(cfg, sections).setdefault(key, value)


def section_of(cfg: dict[str, Any], sections: list[str]) -> dict[str, Any]:
    """The section of ``cfg`` at the path ``sections``, made where it is missing."""
    node = cfg
    for section in sections:
        node = node.setdefault(section, {})
    return node
