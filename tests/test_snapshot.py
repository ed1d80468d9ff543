"""The generator outside training: <run>/generator.pt, its loader, PNGs for external FID tools, and the
torch.export and ONNX exports, each checked against the eager generator on the same noise."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, run_main, run_train
from PIL import Image

from gan.core import snapshot
from gan.core.models import UNCONDITIONAL, Condition, DCGANGenerator, MLPGenerator
from gan.errors import RunError
from gan.evaluation.app import load_module

SNAPSHOT_KEYS = {"format", "generator", "step", "data", "model", "z_dim", "data_shape", "condition", "state_dict"}


@pytest.fixture(scope="session")
def feature_cache(tmp_path_factory) -> Path:
    """The classifier cache test_evaluate.py uses too: the digits classifier trains once per session."""
    return tmp_path_factory.getbasetemp() / "feature_cache"


@pytest.fixture(scope="session")
def conditional_points_run(tmp_path_factory) -> Path:
    """A 6-step class-conditional ring run without an EMA generator."""
    run_dir = tmp_path_factory.mktemp("runs") / "conditional_ring_g"
    assert run_train(run_dir, "experiment=ring", "model.codes=0", "model.conditional=true", "ema.enabled=false") == 0
    return run_dir


def copy_run(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / run.name))


def test_training_writes_the_ema_generator_which_loads_weights_only_and_samples_as_training_does(digits_run):
    saved = torch.load(digits_run / "generator.pt", weights_only=True)
    assert set(saved) == SNAPSHOT_KEYS
    assert saved["generator"] == "ema" and saved["step"] == 6 and saved["data"] == "digits"
    assert saved["data_shape"] == [1, 16, 16] and saved["condition"] == {"kind": "none", "values": 0}
    assert saved["model"]["name"] == "dcgan"
    ckpt = torch.load(digits_run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    # The EMA copy's weights, not G's: after 6 steps they differ.
    for name, tensor in saved["state_dict"].items():
        assert torch.equal(tensor, ckpt[f"ema.generator.{name}"]), name
    assert any(not torch.equal(t, ckpt[f"G.{n}"]) for n, t in saved["state_dict"].items())

    G = snapshot.load_generator(digits_run / "generator.pt")
    assert not G.training and not any(p.requires_grad for p in G.parameters())
    assert (G.z_dim, G.condition, G.data_shape) == (64, UNCONDITIONAL, (1, 16, 16))
    z = torch.randn(5, G.z_dim, generator=torch.Generator().manual_seed(3))
    module = load_module(digits_run / "checkpoints" / "last.ckpt")
    assert torch.equal(G(z), module.generate(z))


def test_a_run_without_ema_keeps_g_and_a_conditional_one_takes_labels(conditional_points_run):
    saved = snapshot.read_snapshot(conditional_points_run / "generator.pt")
    # The ring's 8 modes are its classes: G is asked for one
    assert saved["generator"] == "G" and saved["condition"] == {"kind": "classes", "values": 8}
    assert saved["data_shape"] == [2]
    checkpoint = torch.load(conditional_points_run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["condition"] == saved["condition"]  # the run's one record, in both files
    ckpt = checkpoint["state_dict"]
    assert all(torch.equal(t, ckpt[f"G.{n}"]) for n, t in saved["state_dict"].items())
    G = snapshot.load_generator(saved)
    assert G.condition.labels(16).tolist() == [i % 8 for i in range(16)]  # every class in turn
    points = G(torch.randn(16, G.z_dim), G.condition.labels(16))
    assert points.shape == (16, 2) and points.grad_fn is None


def test_a_generator_pt_of_format_1_is_read_with_its_condition_from_its_config(conditional_points_run, tmp_path):
    """Format 1 kept the labels' count (``num_classes``) and left the config to say what they were."""
    saved = torch.load(conditional_points_run / "generator.pt", weights_only=True)
    old = {**{k: v for k, v in saved.items() if k != "condition"}, "format": 1, "num_classes": 8}
    torch.save(old, tmp_path / "generator.pt")
    read = snapshot.read_snapshot(tmp_path / "generator.pt")
    assert read["format"] == snapshot.FORMAT and read["condition"] == {"kind": "classes", "values": 8}
    # The same count under a config with a latent code of 8 values: G's labels are that code
    torch.save({**old, "model": {**old["model"], "conditional": False, "codes": 8}}, tmp_path / "code.pt")
    assert snapshot.load_generator(tmp_path / "code.pt").condition == Condition("code", 8)


def test_the_loader_needs_no_lightning_or_hydra(digits_run):
    code = (f"import sys, torch\nfrom gan.core.snapshot import load_generator\n"
            f"G = load_generator({str(digits_run / 'generator.pt')!r})\n"
            "print(tuple(G(torch.randn(2, G.z_dim)).shape))\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'hydra', 'omegaconf'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["(2, 1, 16, 16)", "[]"]


def test_evaluate_writes_a_snapshot_from_any_checkpoint(digits_run, feature_cache, tmp_path):
    run = copy_run(digits_run, tmp_path)
    (run / "generator.pt").unlink()
    ckpt = run / "checkpoints" / "step_000003.ckpt"
    assert run_main("evaluate", f"run_dir={run}", f"ckpt={ckpt}", "ema=false", "snapshot=true", "num_samples=20",
                    f"cache_dir={feature_cache}") == 0
    saved = torch.load(run / "generator.pt", weights_only=True)
    assert saved["generator"] == "G" and saved["step"] == 3 and saved["checkpoint"] == str(ckpt.resolve())
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    assert all(torch.equal(t, state[f"G.{n}"]) for n, t in saved["state_dict"].items())


def test_evaluate_writes_the_scored_samples_as_pngs_one_folder_per_class(tmp_path, feature_cache):
    run = tmp_path / "conditional_digits"
    assert run_train(run, "model.conditional=true") == 0
    images = tmp_path / "pngs"
    assert run_main("evaluate", f"run_dir={run}", f"images={images}", "num_samples=30",
                    f"cache_dir={feature_cache}") == 0
    assert sorted(p.name for p in images.iterdir()) == [str(k) for k in range(10)]
    stored = np.load(run / "eval" / "samples.npz")["samples"]  # the scored samples, uint8 (30, 1, 16, 16)
    for k in range(10):
        files = sorted((images / str(k)).iterdir())
        assert [f.name for f in files] == [f"{i:06d}.png" for i in range(k, 30, 10)]  # labels cycle 0..9
        for f in files:
            with Image.open(f) as png:
                assert png.mode == "L" and png.size == (16, 16)
                assert np.array_equal(np.asarray(png), stored[int(f.stem), 0])
    assert not list(tmp_path.glob(".pngs.*"))  # the staging directory is gone


def test_evaluate_refuses_images_it_cannot_write_well_before_writing_anything(digits_run, ring_run, tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.png").write_bytes(b"")
    cases = {"is not empty": [f"run_dir={digits_run}", f"images={full}"],
             "makes 2D points": [f"run_dir={ring_run}", f"images={tmp_path / 'new'}"],
             "export=keras: use torch | onnx": [f"run_dir={ring_run}", "export=keras"]}
    for expected, args in cases.items():
        capsys.readouterr()
        assert run_main("evaluate", *args) == 2, expected
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err
    assert not (ring_run / "eval").exists() and not (tmp_path / "new").exists()


@pytest.mark.parametrize("conditional", [False, True], ids=["plain", "conditional"])
def test_torch_export_gives_the_eager_generator_s_samples_at_any_batch_size(tmp_path, conditional):
    torch.manual_seed(0)
    G = DCGANGenerator(16, 1, 8, 4, num_classes=3 if conditional else 0)
    G.z_dim, G.condition = 16, Condition("classes", 3) if conditional else UNCONDITIONAL
    G.eval().requires_grad_(False)
    path = tmp_path / "g.pt2"
    assert snapshot.export(G, "torch", path) <= snapshot.TOLERANCE
    program = torch.export.load(path).module()
    inputs = snapshot.example_inputs(G, 11, seed=5)  # neither the traced batch size nor its noise
    assert torch.allclose(program(*inputs), G(*inputs), atol=1e-6)


def test_an_export_that_disagrees_with_the_eager_generator_is_refused(tmp_path, monkeypatch):
    G = MLPGenerator(8, (2,), 16, 2).eval().requires_grad_(False)
    G.z_dim, G.condition = 8, UNCONDITIONAL
    monkeypatch.setattr(snapshot, "max_difference", lambda generator, run: 0.5)
    with pytest.raises(RunError, match="up to 0.5 away from the eager"):
        snapshot.export(G, "torch", tmp_path / "g.pt2")


def test_evaluate_exports_torch_and_onnx_which_match_the_snapshot(ring_run, tmp_path):
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name)
    run = copy_run(ring_run, tmp_path)
    assert run_main("evaluate", f"run_dir={run}", "num_samples=100", "export=[torch,onnx]") == 0
    G = snapshot.load_generator(run / "generator.pt")  # training's snapshot: the same generator as last.ckpt's EMA
    z = torch.randn(9, G.z_dim, generator=torch.Generator().manual_seed(7))
    expected = G(z)
    assert torch.allclose(torch.export.load(run / "generator.pt2").module()(z), expected, atol=1e-6)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(run / "generator.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["z"]
    assert np.allclose(session.run(None, {"z": z.numpy()})[0], expected.numpy(), atol=1e-5)
    assert json.loads((run / "eval" / "metrics.json").read_text())["num_samples"] == 100
