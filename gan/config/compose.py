"""The one way code composes this project's configs outside the entry points (the demonstrations,
the benchmarks, the tests): Hydra's compose API on configs/, as ``python train.py`` would see them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from gan.config.schema import RENAMED, moved
from gan.errors import ConfigError, unknown_key

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def compose(*overrides: str, config: str = "train", run_dir: str | Path | None = None) -> DictConfig:
    """``configs/<config>.yaml`` with ``overrides``; a train config gets ``paths.run_dir`` (``run_dir``, or
    "unused" for code that builds objects without writing a run), and ``data=X`` trains X's recipe
    (:func:`recipe_follows_data`), as on train.py's command line."""
    if config == "train":
        overrides = tuple(recipe_follows_data(overrides))
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        try:
            cfg = hydra_compose(config_name=config, overrides=list(overrides))
        except ConfigCompositionException as e:  # a key's old name: the line train.py prints, as gan.train's error
            if renamed_override(e):
                raise ConfigError(hydra_message(e)) from None
            raise
    if config == "train":
        with open_dict(cfg):
            cfg.paths.run_dir = str(run_dir or "unused")
    return cfg


def renamed_override(e: ConfigCompositionException) -> bool:
    """Did Hydra refuse an override of a key's old name (gan/config/schema.py's ``was``)?"""
    return isinstance(e.__cause__, OmegaConfBaseException) and str(getattr(e.__cause__, "full_key", "")) in RENAMED


def recipe_follows_data(overrides: Iterable[str]) -> list[str]:
    """train.py's overrides with ``data=X`` read as ``experiment=X``, X's recipe (configs/experiment/X.yaml,
    which chooses data=X itself), unless an override names the experiment: ``experiment=Y`` still
    wins and ``'~experiment'`` keeps the plain choices. A sweep ``data=ring,grid`` becomes the sweep
    ``experiment=ring,grid``; a value without a recipe is left to Hydra, which names the options.

    The defaults list cannot say this: Hydra refuses a default chosen by interpolation
    (``- experiment: ${data}``) whose config overrides other groups, and every recipe overrides
    model, reg and augment.
    """
    overrides = list(overrides)
    if any(o.lstrip("~+").partition("=")[0].partition("@")[0] == "experiment" for o in overrides):
        return overrides
    return [f"experiment={o.removeprefix('data=')}" if o.startswith("data=") and has_recipes(o) else o
            for o in overrides]


def has_recipes(override: str) -> bool:
    """Does every option that ``override`` (``data=...``, one value or a list of them) chooses have a recipe?"""
    try:
        value = OverridesParser.create().parse_override(override).value()
    except HydraException:  # malformed: Hydra reports it
        return False
    names = value.list if isinstance(value, ChoiceSweep) else [value]
    return bool(names) and all(isinstance(n, str) and (CONFIGS / "experiment" / f"{n}.yaml").is_file()
                               for n in names)


def hydra_message(e: Exception) -> str:
    """One line for an error Hydra raises while composing the config."""
    if isinstance(e, MissingConfigException) and e.options:  # data=foo: not a file in configs/data/
        group, _, name = e.missing_cfg_file.rpartition("/")
        return f"{group}={name} is not an option: use {group}={'|'.join(e.options)}"
    cause = e.__cause__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.parent_node is not None:
        if str(cause.full_key) in RENAMED:  # train.batch_size=32: a key's old name
            return moved(str(cause.full_key), overridden_value(e, str(cause.full_key)))
        return unknown_key(str(cause.full_key), cause.parent_node)  # trainer.max_stepz=3
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{e.override}: {text}" if isinstance(e, OverrideParseException) else text


def overridden_value(e: Exception, key: str) -> str:
    """The value Hydra could not set ``key`` to, as the override gave it: Hydra's message ends with the override
    ("To append to your config use +train.batch_size=32"), and holds it nowhere else."""
    return str(e).partition(f"+{key}=")[2].strip()
