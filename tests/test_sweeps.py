"""Sweeps and clusters: the launcher presets (joblib on one machine, SLURM through submitit), the value
train.py returns to a sweeper, and an Optuna search. Each plugin is an optional extra: its tests skip
where it is not installed."""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import CONFIGS, ROOT, compose_config, read_events, run_train
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gan.errors import RunError
from gan.training import host, loop


def hydra_config(*overrides: str):
    """train.yaml's ``hydra`` node as ``python train.py <overrides>`` composes it."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True).hydra


def jobs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.fixture
def importable_worktree(monkeypatch):
    """Launchers start fresh Python processes: they import this checkout's gan, not an installed copy."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def test_sweep_groups_leave_the_default_config_alone():
    cfg = OmegaConf.to_container(compose_config())
    assert cfg["metric"] is None and cfg["train"]["threads"] is None
    hydra = hydra_config()
    assert hydra.runtime.choices["launcher"] is None and hydra.runtime.choices["search"] is None
    assert hydra.launcher._target_.endswith("BasicLauncher") and hydra.sweeper._target_.endswith("BasicSweeper")


def test_the_joblib_preset_and_threads_per_job(monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    launcher = hydra_config("launcher=joblib").launcher
    assert launcher._target_.endswith("JoblibLauncher") and launcher.n_jobs == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    for n_jobs, threads in ((2, 8), (4, 4), (3, 5), (32, 1), (-1, 1), (-2, 1), (-9, 2)):
        monkeypatch.setattr(host, "launched_by", lambda node, n=n_jobs: OmegaConf.create(
            {"_target_": launcher._target_, "n_jobs": n}))
        assert host.torch_threads(None)[0] == threads, n_jobs
        assert host.torch_threads(3) == (3, "train.threads")  # an explicit setting wins
    monkeypatch.setattr(host, "launched_by", lambda node: OmegaConf.create({}))
    assert host.torch_threads(None) == (None, "torch's default")  # no launcher of parallel jobs


def test_a_two_job_joblib_multirun_shares_the_cores(tmp_path, importable_worktree):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    try:
        # train.threads=null: the ring recipe's own 1 would win over the launcher's share of the cores
        code = run_train(tmp_path / "unused", "-m", "launcher=joblib", "experiment=ring", "train.threads=null",
                         "seed=1,2", f"hydra.sweep.dir={sweep}")
    finally:
        from joblib.externals.loky import get_reusable_executor

        get_reusable_executor().shutdown(wait=True)  # its idle worker processes would outlive the test
    assert code == 0
    runs = jobs(sweep)
    assert [r.name.partition("_")[0] for r in runs] == ["0", "1"]
    cores = len(os.sched_getaffinity(0))
    for run in runs:
        assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "generator.pt").is_file()
        log = (run / "train.log").read_text()
        assert f"torch threads: {max(cores // 2, 1)} ({cores} cores shared by hydra.launcher.n_jobs=2 jobs)" in log
        assert "Run finished: 6 generator steps" in log


def test_the_slurm_preset_composes_for_submitit():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    hydra = hydra_config("launcher=submitit_slurm", "hydra.launcher.partition=gpu")
    launcher = hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.partition, launcher.gpus_per_node, launcher.tasks_per_node, launcher.timeout_min) == (
        "gpu", 1, 1, 240)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        assert compose("train", overrides=["launcher=submitit_slurm"]).trainer.accelerator == "gpu"


def test_submitit_s_local_executor_runs_a_two_job_multirun(tmp_path, importable_worktree):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    assert run_train(tmp_path / "unused", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
                     "experiment=ring", "seed=1,2", f"hydra.sweep.dir={sweep}") == 0
    runs = jobs(sweep)
    assert len(runs) == 2
    for run in runs:
        assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "generator.pt").is_file()
        assert "Run finished: 6 generator steps" in (run / "train.log").read_text()
    assert list((sweep / ".submitit").iterdir())  # submitit's own job folders: it ran them


def test_train_py_returns_the_metric_named_in_the_config(tmp_path):
    cfg = compose_config("experiment=ring", "debug=tiny", "trainer.enable_progress_bar=false", "eval.every=3",
                         "metric=metrics/reverse_kl", run_dir=tmp_path / "run")
    value = loop.train_task(cfg)
    logged = read_events(tmp_path / "run" / "tensorboard").Scalars("metrics/reverse_kl")
    assert [e.step for e in logged] == [3, 6] and value == pytest.approx(logged[-1].value)  # the last evaluation
    assert loop.train_task(compose_config("experiment=ring", "debug=tiny", "trainer.enable_progress_bar=false",
                                             run_dir=tmp_path / "plain")) is None
    module = SimpleNamespace(last_losses={"loss/d": 1.0, "loss/g": 0.5}, last_metrics={"metrics/modes": 8.0})
    assert loop.returned_metric(module, "loss/g") == 0.5
    with pytest.raises(RunError, match=r"metric=metrics/fid was not logged .*loss/d, loss/g, metrics/modes"):
        loop.returned_metric(module, "metrics/fid")


@pytest.mark.parametrize("overrides,expected", [
    (["metric=metrics/fid"], "metric=metrics/fid is measured only during training with eval.every=N"),
    (["metric=metrics/fid", "eval.every=8"], "metric=metrics/fid is measured every eval.every=8 generator steps and "
     "the run ends at trainer.max_steps=6, so it would never be logged: set eval.every=6"),
    (["metric=d/real"], "metric=d/real: train.py returns loss/d, loss/g or a metrics/<name>"),
    (["train.threads=0"], "train.threads=0: it must be >= 1"),
])
def test_what_a_sweep_reads_is_checked_before_the_run(tmp_path, capsys, overrides, expected):
    assert run_train(tmp_path / "run", *overrides) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_two_trial_optuna_search_minimises_what_the_runs_return(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "sweep"
    assert run_train(tmp_path / "unused", "-m", "search=ring", "hydra.sweeper.n_trials=2",
                     f"hydra.sweep.dir={sweep}") == 0
    runs = jobs(sweep)
    assert len(runs) == 2
    returned = {}
    for run in runs:
        cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        assert cfg["data"]["name"] == "ring" and cfg["metric"] == "metrics/reverse_kl"
        assert 2e-4 <= cfg["optim"]["g"]["lr"] <= 1e-2 and 0.1 <= cfg["reg"]["gamma"] <= 10.0
        # One evaluation, at the last step: eval.every=${trainer.max_steps}.
        (last,) = read_events(run / "tensorboard").Scalars("metrics/reverse_kl")
        assert last.step == 6
        returned[(cfg["optim"]["g"]["lr"], cfg["optim"]["d"]["lr"], cfg["reg"]["gamma"])] = last.value
    assert len(returned) == 2  # two trials, two points of the space
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    best = min(returned, key=returned.get)
    assert results["best_value"] == pytest.approx(returned[best], rel=1e-6)
    assert [results["best_params"][k] for k in ("optim.g.lr", "optim.d.lr", "reg.gamma")] == [
        pytest.approx(v) for v in best]
    assert math.isfinite(results["best_value"])


def test_optuna_without_a_metric_is_refused(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    assert run_train(tmp_path / "unused", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "seed=choice(0,1)",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}") == 2
    assert "hydra/sweeper=optuna optimises the number train.py returns: set metric=" in capsys.readouterr().err
