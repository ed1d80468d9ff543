"""The Python API (gan/api.py): the README's notebook cell, run for real with the tiny settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, read_events

import gan.api
from gan.errors import ConfigError

NOTEBOOK = re.compile(r"<!-- notebook:begin -->\s*```python\n(.*?)```\s*<!-- notebook:end -->", re.DOTALL)


def test_the_readme_notebook_cell_trains_and_evaluates(tmp_path, monkeypatch):
    cell = NOTEBOOK.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert cell, "README.md has no ```python block between <!-- notebook:begin --> and <!-- notebook:end -->"
    assert len(cell.group(1).strip().splitlines()) <= 5
    runs = []
    real_train = gan.api.train

    def tiny_train(*overrides, **kwargs):  # the cell's own overrides, then the tiny settings' (later ones win)
        run = real_train(*overrides, *TINY, "trainer.max_steps=6", **kwargs)
        runs.append(run)
        return run

    monkeypatch.setattr(gan.api, "train", tiny_train)  # `from gan import train` reads gan.api.train
    monkeypatch.chdir(tmp_path)  # train's default run directory is outputs/<date>/<time> under the current one
    exec(compile(cell.group(1), "README.md", "exec"), {})

    (run,) = runs
    assert run.dir.parent.parent == Path("outputs") and (tmp_path / run.dir).is_dir()
    run_dir = tmp_path / run.dir
    # The same run directory as python train.py writes: evaluate.py finds the config it looks for.
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert "Run finished: 6 generator steps" in (run_dir / "train.log").read_text()
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["cfg"]["data"]["name"] == "ring"  # data=ring trained the ring's recipe
    # The returned losses are the last ones logged (debug=tiny logs every step).
    events = read_events(run_dir / "tensorboard")
    for tag in ("loss/d", "loss/g"):
        assert run.metrics[tag] == pytest.approx(events.Scalars(tag)[-1].value)
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert metrics["modes_total"] == 8 and metrics["step"] == 6
    G = run.generator()  # <run>/generator.pt; the ring's recipe gives G noise alone
    assert G.condition.kind == "none" and G(torch.randn(3, G.z_dim)).shape == (3, 2)


def test_evaluate_returns_metrics_json_and_train_returns_the_last_evaluation(tmp_path):
    from gan import Run, evaluate, train

    run = train("experiment=ring", *TINY, "eval.every=3", run_dir=tmp_path / "ring")
    assert run.dir == tmp_path / "ring"
    assert {"loss/d", "loss/g", "metrics/modes", "metrics/reverse_kl"} <= set(run.metrics)
    logged = read_events(run.dir / "tensorboard").Scalars("metrics/reverse_kl")
    assert [e.step for e in logged] == [3, 6] and run.metrics["metrics/reverse_kl"] == pytest.approx(logged[-1].value)
    scores = evaluate(str(run.dir), "num_samples=500", "seed=1")
    assert isinstance(scores, Run) and scores.dir == run.dir
    assert scores.metrics == json.loads((run.dir / "eval" / "metrics.json").read_text())
    assert scores.metrics["num_samples"] == 500 and scores.metrics["seed"] == 1


def test_bad_input_raises_and_writes_nothing(tmp_path):
    from gan import evaluate, train

    with pytest.raises(ConfigError, match="trainer.max_steps=0"):
        train(*TINY, "trainer.max_steps=0", run_dir=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    for old, line in (("train.batch_size=32", "train.batch_size is now data.batch_size: use data.batch_size=32"),
                      ("+train.batch_size=32", "train.batch_size is now data.batch_size: use data.batch_size=32"),
                      ("loss.batchnorm_in_d=false", "loss.batchnorm_in_d is now model.d_batchnorm: use "
                                                    "model.d_batchnorm=false")):
        with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):  # the line train.py prints
            train(*TINY, old, run_dir=tmp_path / "bad")
        assert not (tmp_path / "bad").exists()
    with pytest.raises(ConfigError, match="is not a directory"):
        evaluate(tmp_path / "missing")


def test_importing_gan_loads_no_framework():
    import subprocess
    import sys

    code = "import sys, gan, gan.core.step; print('gan.api' in sys.modules, 'lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
