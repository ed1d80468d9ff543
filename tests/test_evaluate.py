"""evaluate.py end to end on the session's tiny runs, and metrics logged during training."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS, ROOT, compose_config, eval_settings, read_events, run_main, run_train
from omegaconf import OmegaConf
from PIL import Image

from gan.config.compose import compose
from gan.config.eval_settings import EvalSettings
from gan.core.snapshot import load_generator
from gan.evaluation.sampling import slerp
from gan.run.checkpoint import read_checkpoint

IMAGE_KEYS = {"fid", "kid", "precision", "recall", "density", "coverage", "features"}
MIXTURE_KEYS = {"modes", "modes_total", "high_quality", "reverse_kl", "spread", "spread_min", "spread_max"}
STACKED_KEYS = {"stacked_modes", "stacked_kl", "stacked_modes_real", "stacked_kl_real"}


@pytest.fixture(scope="session")
def feature_cache(tmp_path_factory) -> Path:
    """The classifier cache test_metrics.py uses too: the digits classifier trains once per session."""
    return tmp_path_factory.getbasetemp() / "feature_cache"


@pytest.fixture(scope="session")
def conditional_digits_run(tmp_path_factory, feature_cache) -> Path:
    """A 6-step class-conditional digits run (EMA on) that also measures its metrics at step 6."""
    run_dir = tmp_path_factory.mktemp("runs") / "conditional_digits"
    assert run_train(run_dir, "model.conditional=true", "eval.every=6", "eval.num_samples=100",
                     f"eval.cache_dir={feature_cache}") == 0
    return run_dir


@pytest.fixture(scope="session")
def conditional_ring_run(tmp_path_factory) -> Path:
    """A 6-step class-conditional ring run (labels: mode indices) without an EMA generator."""
    run_dir = tmp_path_factory.mktemp("runs") / "conditional_ring"
    assert run_train(run_dir, "experiment=ring", "model.codes=0", "model.conditional=true", "ema.enabled=false") == 0
    return run_dir


def run_evaluate(*overrides: str) -> int:
    return run_main("evaluate", *overrides)


def copy_run(run: Path, tmp_path: Path) -> Path:
    """A private copy: evaluating writes into the run, and the session's runs are shared."""
    return Path(shutil.copytree(run, tmp_path / run.name))


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (None) under ``directory``."""
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
            for p in sorted(directory.rglob("*"))}


def test_one_file_holds_the_evaluation_defaults_of_train_py_and_evaluate_py():
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIGS / "eval" / "default.yaml"))
    fields = dataclasses.fields(EvalSettings)
    # EvalSettings has no defaults of its own to drift from the file, and the file sets every field.
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING for f in fields)
    assert set(defaults) == {f.name for f in fields}
    # num_samples=null: the protocol count of the data (2,500 unless the data has its own).
    resolved = EvalSettings(**defaults | {"num_samples": 2500})
    assert eval_settings() == EvalSettings.from_config(compose_config().eval) == resolved
    # Each command's own spelling of an override: top level for evaluate.py, under eval. for train.py.
    train_cfg = compose_config("eval.every=5", "eval.num_samples=100")
    assert train_cfg.eval.every == 5
    assert EvalSettings.from_config(train_cfg.eval) == eval_settings("num_samples=100")
    assert eval_settings("num_samples=100").num_samples == 100 != resolved.num_samples


def test_stacked_mnist_is_scored_on_its_protocols_26000_samples_unless_told_otherwise():
    evaluate_cfg = compose("classifier_steps=500", config="evaluate")  # (null: the run's)
    assert EvalSettings.from_config(evaluate_cfg, "stacked_mnist").num_samples == 26_000
    assert EvalSettings.from_config(evaluate_cfg, "mnist").num_samples == 2500
    assert EvalSettings.from_config(compose_config().eval, "stacked_mnist").num_samples == 26_000  # train.py's eval.*
    given = compose("classifier_steps=500", "num_samples=300", config="evaluate")
    assert EvalSettings.from_config(given, "stacked_mnist").num_samples == 300


def test_digits_run_evaluation_writes_files_tensorboard_and_repeats_exactly(digits_run, feature_cache, tmp_path):
    run = copy_run(digits_run, tmp_path)
    args = [f"run_dir={run}", "num_samples=200", f"cache_dir={feature_cache}"]
    assert run_evaluate(*args) == 0
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert IMAGE_KEYS <= set(metrics) and metrics["features"] == "classifier"
    assert metrics["step"] == 6 and metrics["num_samples"] == 200
    assert all(isinstance(metrics[k], float) for k in ("fid", "kid", "precision", "recall", "density", "coverage"))
    samples = np.load(run / "eval" / "samples.npz")["samples"]
    assert samples.dtype == np.uint8 and samples.shape == (200, 1, 16, 16)
    assert (run / "eval" / "grid.png").stat().st_size > 500
    # 8 interpolation paths of 10 steps: 16 px tiles with 2 px padding, upscaled 3x to reach 512 px wide.
    with Image.open(run / "eval" / "interpolation.png") as image:
        assert image.format == "PNG" and image.size == (3 * (10 * 18 + 2), 3 * (8 * 18 + 2))
        image.load()  # decodes every pixel: a truncated file fails here

    events = read_events(run / "tensorboard")
    assert [(e.step, e.value) for e in events.Scalars("metrics/fid")] == [(6, pytest.approx(metrics["fid"]))]
    assert [e.step for e in events.Images("eval/grid")] == [6]
    assert [e.step for e in events.Images("eval/interpolation")] == [6]

    first = (run / "eval" / "metrics.json").read_bytes()
    assert run_evaluate(*args) == 0
    assert (run / "eval" / "metrics.json").read_bytes() == first  # same seed, same numbers
    samples = np.load(run / "eval" / "samples.npz")["samples"]
    assert run_evaluate(*args, "seed=1") == 0  # another seed: other samples, other numbers
    assert not np.array_equal(np.load(run / "eval" / "samples.npz")["samples"], samples)
    assert json.loads((run / "eval" / "metrics.json").read_text()) != metrics


def test_ring_run_evaluation_by_the_mode_protocol(ring_run, tmp_path):
    run = copy_run(ring_run, tmp_path)
    assert run_evaluate(f"run_dir={run}", f"ckpt={run / 'checkpoints' / 'step_000003.ckpt'}") == 0
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert MIXTURE_KEYS <= set(metrics) and metrics["modes_total"] == 8 and metrics["step"] == 3
    assert "class_accuracy" not in metrics  # an unconditional G's samples have no mode to be checked against
    assert 0 <= metrics["modes"] <= 8 and 0.0 <= metrics["high_quality"] <= 1.0
    samples = np.load(run / "eval" / "samples.npz")["samples"]
    assert samples.dtype == np.float32 and samples.shape == (2500, 2)  # the protocol's count
    assert (run / "eval" / "grid.png").stat().st_size > 1000
    with Image.open(run / "eval" / "interpolation.png") as image:  # paths drawn over the ring: a 5 x 5 in figure
        assert image.format == "PNG" and image.size == (500, 500)
        image.load()
    assert [e.step for e in read_events(run / "tensorboard").Scalars("metrics/modes")] == [3]


def test_bad_input_exits_with_one_line_and_writes_nothing(digits_run, tmp_path, monkeypatch, capsys):
    run = copy_run(digits_run, tmp_path)
    monkeypatch.chdir(tmp_path)  # Hydra's own output would land here
    before = snapshot(tmp_path)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # no Inception weights, no download
    cases = {
        "run_dir is required": [],
        "is not a directory": [f"run_dir={tmp_path / 'missing'}"],
        "is not a training run": [f"run_dir={run / 'checkpoints'}"],
        "does not exist": [f"run_dir={run}", f"ckpt={run / 'checkpoints' / 'nope.ckpt'}"],
        "is not a readable checkpoint": [f"run_dir={run}", f"ckpt={run / '.hydra' / 'config.yaml'}"],
        "no Inception weights": [f"run_dir={run}", "features=inception"],
        # the bounds of what is measured, declared once for train.py's eval.* and these (gan/config/schema.py)
        "num_samples=2: it must be >= 4": [f"run_dir={run}", "num_samples=2"],
        "num_real=3: it must be >= 4": [f"run_dir={run}", "num_real=3"],
        "batch_size=0: it must be >= 1": [f"run_dir={run}", "batch_size=0"],
        "classifier_steps=0: it must be >= 1": [f"run_dir={run}", "classifier_steps=0"],
        "features=vgg: use classifier | rotation | inception": [f"run_dir={run}", "features=vgg"],
        "ema=maybe: Value 'maybe' is not a valid bool": [f"run_dir={run}", "ema=maybe"],
        "num_samples=many: Value 'many' of type 'str' could not be converted to Integer": [f"run_dir={run}",
                                                                                           "num_samples=many"],
    }
    for expected, args in cases.items():
        capsys.readouterr()
        assert run_evaluate(*args) == 2, expected
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert snapshot(tmp_path) == before


def test_cli_runs_as_a_script_and_leaves_no_clutter(ring_run, tmp_path):
    run = copy_run(ring_run, tmp_path / "runs")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), f"run_dir={run}", "num_samples=500"],
                         cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # The results are log lines, and evaluate.yaml sends logging to stdout: they reach the console.
    assert f"{run} at generator step 6 (ema): modes " in out.stdout and "wrote " in out.stdout
    assert (run / "eval" / "metrics.json").is_file()
    assert list(cwd.iterdir()) == []  # no outputs/, no .hydra/, no log file


def test_metrics_during_training_are_logged_and_do_not_change_training(digits_run, feature_cache, tmp_path):
    run = tmp_path / "digits_with_metrics"
    assert run_train(run, "eval.every=3", "eval.num_samples=64", f"eval.cache_dir={feature_cache}") == 0
    events = read_events(run / "tensorboard")
    for tag in ("metrics/fid", "metrics/kid", "metrics/precision", "metrics/recall", "metrics/density",
                "metrics/coverage"):
        assert [e.step for e in events.Scalars(tag)] == [3, 6], tag
    from tensorboard.plugins.hparams import plugin_data_pb2

    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment
    assert {"metrics/fid", "metrics/precision", "metrics/density", "metrics/coverage"} <= {
        m.name.tag for m in experiment.metric_infos}
    # Measuring draws its own seeded noise in a forked RNG and samples in eval mode: the run trains
    # exactly as the one without metrics did.
    with_metrics = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    without = torch.load(digits_run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert with_metrics.keys() == without.keys()
    assert all(torch.equal(with_metrics[k], without[k]) for k in without)


def test_ema_false_scores_the_raw_generator_of_the_same_checkpoint(digits_run, feature_cache, tmp_path):
    run = copy_run(digits_run, tmp_path)
    args = [f"run_dir={run}", "num_samples=200", f"cache_dir={feature_cache}"]
    results = {}
    for ema in ("true", "false"):
        assert run_evaluate(*args, f"ema={ema}") == 0
        results[ema] = json.loads((run / "eval" / "metrics.json").read_text())
    assert results["true"]["generator"] == "ema" and results["false"]["generator"] == "G"
    # Same seed, same noise: only the weights differ (after 6 steps the EMA copy is close to G, not equal).
    assert results["true"]["fid"] != results["false"]["fid"]
    # The raw G's numbers get tags of their own: metrics/* stays the EMA copy's curve.
    events = read_events(run / "tensorboard")
    assert [e.value for e in events.Scalars("metrics/fid")] == [pytest.approx(results["true"]["fid"])]
    assert [e.value for e in events.Scalars("metrics_G/fid")] == [pytest.approx(results["false"]["fid"])]
    assert [e.step for e in events.Images("eval/grid_G")] == [6]


def test_conditional_digits_run_is_scored_per_class(conditional_digits_run, feature_cache, tmp_path):
    run = copy_run(conditional_digits_run, tmp_path)
    # 500 balanced samples: 50 per digit, just enough for each class's FID (MIN_CLASS_SAMPLES).
    assert run_evaluate(f"run_dir={run}", "num_samples=500", f"cache_dir={feature_cache}") == 0
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert IMAGE_KEYS <= set(metrics) and metrics["generator"] == "ema"
    assert 0.0 <= metrics["class_accuracy"] <= 1.0
    per_class = metrics["per_class"]
    assert list(per_class) == [str(k) for k in range(10)]
    for entry in per_class.values():
        assert entry["num_samples"] == 50 and entry["num_real"] > 150  # digits: about 180 per class
        assert 0.0 <= entry["accuracy"] <= 1.0 and entry["fid"] > 0.0
    # Equal shares: the overall accuracy is the mean of the classes' accuracies.
    assert metrics["class_accuracy"] == pytest.approx(np.mean([e["accuracy"] for e in per_class.values()]))
    # One row of 8 samples per class: a grid 8 tiles wide and 10 tall (16 px tiles, 2 px padding).
    width, height = Image.open(run / "eval" / "grid.png").size
    assert height / width == pytest.approx((10 * 18 + 2) / (8 * 18 + 2))
    # The interpolation: one path per class, 10 steps each: 10 x 10 tiles, upscaled 3x.
    assert Image.open(run / "eval" / "interpolation.png").size == (3 * (10 * 18 + 2), 3 * (10 * 18 + 2))
    # A plain number on the metrics/* curves: logged during training (eval.every=6) and by evaluate.py.
    assert [e.step for e in read_events(run / "tensorboard").Scalars("metrics/class_accuracy")] == [6, 6]


def test_conditional_ring_run_reports_mode_accuracy_and_g_without_ema(conditional_ring_run, tmp_path):
    run = copy_run(conditional_ring_run, tmp_path)
    for ema in ("true", "false"):  # no EMA copy to sample: G either way
        assert run_evaluate(f"run_dir={run}", f"ema={ema}") == 0
        metrics = json.loads((run / "eval" / "metrics.json").read_text())
        assert MIXTURE_KEYS <= set(metrics) and metrics["generator"] == "G"
    assert 0.0 <= metrics["class_accuracy"] <= 1.0
    per_class = metrics["per_class"]
    assert list(per_class) == [str(k) for k in range(8)]
    # 2,500 samples over 8 modes: shares equal up to one sample; no FID for points.
    assert [e["num_samples"] for e in per_class.values()] == [313] * 4 + [312] * 4
    assert all(set(e) == {"num_samples", "accuracy"} and 0.0 <= e["accuracy"] <= 1.0 for e in per_class.values())
    assert [e.step for e in read_events(run / "tensorboard").Scalars("metrics/class_accuracy")] == [6, 6]


@pytest.fixture(scope="session")
def subset_run(tmp_path_factory, feature_cache) -> Path:
    """A 6-step class-conditional digits run on the classes 5 and 6 alone, measuring its metrics at step 6."""
    run_dir = tmp_path_factory.mktemp("runs") / "conditional_subset"
    assert run_train(run_dir, "model.conditional=true", "data.classes=[6,5]", "eval.every=6", "eval.num_samples=100",
                     f"eval.cache_dir={feature_cache}") == 0
    return run_dir


def test_a_conditional_run_on_some_classes_is_drawn_and_scored_on_those_classes_alone(subset_run, feature_cache,
                                                                                       tmp_path):
    """G's labels keep the data's values (one-hot rows of 7 for the largest, 6), but the classes 0 to 4, which it
    never saw, are neither drawn nor scored: they counted as failures of class accuracy (1/7 of its classes)."""
    run = copy_run(subset_run, tmp_path)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["condition"] == {"kind": "classes", "values": 7, "subset": [5, 6]}
    assert checkpoint["state_dict"]["sample_labels"].tolist() == [5, 6] * 8  # training's grids: a row per class
    assert load_generator(run / "generator.pt").condition.labels(4).tolist() == [5, 6, 5, 6]
    images = tmp_path / "pngs"
    assert run_evaluate(f"run_dir={run}", "num_samples=100", f"cache_dir={feature_cache}", f"images={images}") == 0
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    per_class = metrics["per_class"]
    assert list(per_class) == ["5", "6"] and [e["num_samples"] for e in per_class.values()] == [50, 50]
    assert all(e["num_real"] > 150 and e["fid"] > 0 for e in per_class.values())
    assert metrics["class_accuracy"] == pytest.approx(np.mean([e["accuracy"] for e in per_class.values()]))
    assert metrics["classes_present"] <= 2  # of data.classes (class_kl and confident: over them too)
    assert sorted(p.name for p in images.iterdir()) == ["5", "6"]
    assert [len(list((images / k).iterdir())) for k in ("5", "6")] == [50, 50]
    # The grid and the interpolation: a row per class trained on, 8 samples and 10 steps wide (16 px tiles).
    width, height = Image.open(run / "eval" / "grid.png").size
    assert height / width == pytest.approx((2 * 18 + 2) / (8 * 18 + 2))
    assert Image.open(run / "eval" / "interpolation.png").size == (3 * (10 * 18 + 2), 3 * (2 * 18 + 2))
    # During training (eval.every=6) the same classes were scored: the logged accuracy is theirs.
    logged = read_events(run / "tensorboard").Scalars("metrics/class_accuracy")
    assert [e.step for e in logged] == [6, 6] and logged[1].value == pytest.approx(metrics["class_accuracy"])


def test_a_conditional_subset_run_written_before_its_condition_named_the_classes(subset_run, feature_cache,
                                                                                  tmp_path):
    """Its checkpoint: no subset in its condition, and the grid's fixed noise drawn for each label 0 to 6. Read,
    it gets the subset and keeps the rows of classes 5 and 6: it evaluates on them, and resumes."""
    run = copy_run(subset_run, tmp_path)
    new = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    old = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    del old["hyper_parameters"]["condition"]["subset"]
    labels = torch.arange(7 * 8) % 7
    noise = torch.randn(len(labels), new["state_dict"]["sample_noise"].shape[1])
    noise[torch.isin(labels, torch.tensor([5, 6]))] = new["state_dict"]["sample_noise"]
    old["state_dict"]["sample_noise"], old["state_dict"]["sample_labels"] = noise, labels
    torch.save(old, tmp_path / "old.ckpt")
    read = read_checkpoint(tmp_path / "old.ckpt", "ckpt")
    assert read["hyper_parameters"]["condition"] == new["hyper_parameters"]["condition"]
    for name in ("sample_noise", "sample_labels"):
        assert torch.equal(read["state_dict"][name], new["state_dict"][name])
    assert run_evaluate(f"run_dir={run}", f"ckpt={tmp_path / 'old.ckpt'}", "num_samples=100",
                        f"cache_dir={feature_cache}") == 0
    assert list(json.loads((run / "eval" / "metrics.json").read_text())["per_class"]) == ["5", "6"]
    assert run_train(tmp_path / "resumed", "model.conditional=true", "data.classes=[6,5]", "eval.every=6",
                     "eval.num_samples=100", f"eval.cache_dir={feature_cache}", f"ckpt_path={tmp_path / 'old.ckpt'}",
                     "trainer.max_steps=7") == 0


def test_fewer_samples_than_a_conditional_runs_classes_are_refused_and_the_advice_evaluates(
        conditional_digits_run, feature_cache, tmp_path, capsys):
    run = copy_run(conditional_digits_run, tmp_path)
    capsys.readouterr()
    assert run_evaluate(f"run_dir={run}", "num_samples=5", f"cache_dir={feature_cache}") == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: num_samples=5: this run's G was trained on 10 classes, and each needs its samples: give "
        "num_samples >= 10"]
    assert not (run / "eval").exists()
    assert run_evaluate(f"run_dir={run}", "num_samples=10", f"cache_dir={feature_cache}") == 0
    assert len(json.loads((run / "eval" / "metrics.json").read_text())["per_class"]) == 10


def test_stacked_mnist_run_reports_its_mode_count_in_metrics_json_and_tensorboard(tmp_path):
    """A 6-step StackedMNIST run measured at its last step, then evaluate.py, on a split of IDX files the test
    writes (random pixels: this checks the wiring, not the numbers)."""
    from test_data import make_mnist_split

    make_mnist_split(tmp_path / "data" / "raw", "t10k", 100)
    run, cache = tmp_path / "run", tmp_path / "cache"
    measure = ["num_samples=100", "num_real=100", "classifier_steps=20", f"cache_dir={cache}"]
    assert run_train(run, "~experiment", "data=stacked_mnist", f"data.root={tmp_path / 'data'}", "data.split=test",
                     "eval.every=6", *(f"eval.{m}" for m in measure)) == 0
    assert run_evaluate(f"run_dir={run}", *measure) == 0
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert IMAGE_KEYS | STACKED_KEYS <= set(metrics) and metrics["num_samples"] == 100
    assert 1 <= metrics["stacked_modes"] <= 100 and 1 <= metrics["stacked_modes_real"] <= 100
    # 100 stacks fill at most 100 of the 1,000 modes: a KL of at least log(1000 / 100).
    assert min(metrics["stacked_kl"], metrics["stacked_kl_real"]) >= math.log(10) - 1e-9
    # The digits are recognised by data=mnist's classifier of the same split, size and steps: one cached network.
    assert [p.name for p in cache.glob("*.pt")] == ["classifier-mnist-test-1x32x32-20steps.pt"]
    events = read_events(run / "tensorboard")
    for key in STACKED_KEYS:  # measured during training (eval.every=6) and by evaluate.py
        assert [e.step for e in events.Scalars(f"metrics/{key}")] == [6, 6], key
        assert events.Scalars(f"metrics/{key}")[-1].value == pytest.approx(metrics[key])


def test_a_latent_code_is_drawn_from_its_prior_for_the_scored_samples():
    """Scored samples follow G's own distribution: codes drawn at random (seeded), not cycled as a conditional
    G's classes are, which would hand the mode shares an evenness that G's sampling does not have."""
    from gan.core.models import g_condition
    from gan.evaluation.sampling import generate_samples
    from gan.run.build import build_module

    cfg = OmegaConf.to_container(compose_config("experiment=ring", "model.hidden=16", "model.codes=8"), resolve=True)
    module = build_module(cfg, (2,), g_condition(cfg["model"], 8))
    given: list[torch.Tensor] = []
    module.sampling_generator.register_forward_pre_hook(lambda _, args: given.append(args[1]))
    draws = []
    for _ in range(2):
        given.clear()
        generate_samples(module, 2500, seed=0)
        draws.append(torch.cat(given))
    assert torch.equal(*draws)  # the same seed, the same codes
    counts = torch.bincount(draws[0], minlength=9)
    assert counts.sum() == 2500 and counts[8] == 0 and counts.min() < 312 and counts.max() > 313


def test_slerp_runs_from_end_to_end_on_the_sphere_the_noise_lies_on():
    a, b = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    paths = slerp(a, b, torch.linspace(0, 1, 11))
    assert paths.shape == (5, 11, 64)
    assert torch.allclose(paths[:, 0], a, atol=1e-5) and torch.allclose(paths[:, -1], b, atol=1e-5)
    # Halfway, the norm stays that of a typical draw (about 8 = sqrt(64)); a straight line's midpoint
    # falls to about sqrt(64 / 2), where G saw no noise in training.
    midway = paths[:, 5].norm(dim=1)
    assert torch.allclose(midway, (a.norm(dim=1) + b.norm(dim=1)) / 2, rtol=1e-4)
    assert ((a + b) / 2).norm(dim=1).max() < midway.min()
