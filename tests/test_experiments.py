"""The recipes of configs/experiment/: each composes into a module, and the ring recipe still covers
the ring after a short real run (a floor that catches a broken recipe; the 10-seed figures come from
benchmarks/toy.py, not from here)."""

from __future__ import annotations

import json

import pytest
from conftest import CONFIGS, compose_config, run_main
from omegaconf import OmegaConf

from gan.module import GANModule

PRESETS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


def test_default_run_is_the_digits_recipe():
    assert OmegaConf.to_container(compose_config()) == OmegaConf.to_container(compose_config("experiment=digits"))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_recipe_composes_and_names_its_data(preset):
    cfg = compose_config(f"experiment={preset}")
    assert cfg.data.name == preset and cfg.trainer.max_steps >= 1 and cfg.ema.enabled


@pytest.mark.parametrize("preset", ["ring", "grid"])
def test_2d_recipes_build_their_module(preset):
    cfg = compose_config(f"experiment={preset}")
    module = GANModule(OmegaConf.to_container(cfg, resolve=True), (2,))
    assert cfg.data.name == preset and cfg.model.name == "mlp" and cfg.reg.name == "r1"
    assert len(module.configure_optimizers()[1]) == 2  # optim.decay=linear: one schedule per optimizer


def test_points_with_an_image_recipe_get_one_line_naming_the_recipes(tmp_path, capsys):
    # The default recipe (digits) augments images; 2D points must name their own recipe.
    assert run_main("train", "data=ring", f"hydra.run.dir={tmp_path / 'run'}") == 2
    assert "(experiment=ring or experiment=grid)" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_ring_recipe_covers_the_ring_after_600_steps(tmp_path):
    run_dir = tmp_path / "ring"
    assert run_main("train", "experiment=ring", "trainer.max_steps=600", "ema.decay=0.99", "log.sample_every=600",
                    "checkpoint.every=600", "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}") == 0
    assert run_main("evaluate", f"run_dir={run_dir}") == 0
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    # Seed 0 covers 8 of 8 modes at this step (reverse KL 0.003); the floor leaves room for other CPUs.
    assert metrics["modes"] >= 7 and metrics["reverse_kl"] < 0.05
