"""The logger config group (configs/logger/): each option a Lightning logger built from the config;
scalars reach every logger, pictures and the dashboard layout the TensorBoard one."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import compose_config, read_events, run_train
from omegaconf import OmegaConf

from gan.training import loggers


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def logged(path: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` in a CSVLogger's metrics.csv."""
    return [(int(r["step"]), float(r[tag])) for r in rows(path) if r.get(tag)]


def test_the_default_is_tensorboard_and_the_group_changes_nothing_else():
    default = OmegaConf.to_container(compose_config())
    assert list(default["logger"]) == ["tensorboard"]
    assert default["logger"]["tensorboard"] == {
        "_target_": "lightning.pytorch.loggers.TensorBoardLogger", "save_dir": "${paths.run_dir}",
        "name": "tensorboard", "version": "", "default_hp_metric": False, "max_queue": 100}
    for option, names in {"csv": ["csv"], "many": ["tensorboard", "csv"], "[csv,mlflow]": ["csv", "mlflow"],
                          "wandb": ["wandb"]}.items():
        other = OmegaConf.to_container(compose_config(f"logger={option}"))
        assert list(other.pop("logger")) == names, option
        assert other == {k: v for k, v in default.items() if k != "logger"}, option


def test_every_scalar_of_a_logging_step_fits_in_tensorboards_queue(digits_run):
    """More than TensorBoard's default queue of 10 events, fewer than the configured one: the loop hands a
    logging step's scalars to TensorBoard's writer thread without waiting for it to write them."""
    events = read_events(digits_run / "tensorboard")
    per_step: dict[int, int] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            per_step[event.step] = per_step.get(event.step, 0) + 1
    assert 10 < max(per_step.values()) < compose_config().logger.tensorboard.max_queue


def test_a_csv_run_writes_its_metrics_file_and_no_tensorboard(tmp_path):
    run = tmp_path / "csv"
    assert run_train(run, "experiment=ring", "logger=csv", "eval.every=3") == 0
    metrics = run / "csv" / "metrics.csv"
    assert [step for step, _ in logged(metrics, "loss/d")] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in logged(metrics, "metrics/modes")] == [3, 6]  # the evaluations, too
    assert logged(metrics, "time/step_ms")  # and the step timer's
    assert (run / "csv" / "hparams.yaml").is_file()
    assert not (run / "tensorboard").exists()
    # What only TensorBoard takes is skipped; the files beside it are still written.
    assert (run / "samples" / "step_000006.png").is_file() and (run / "generator.pt").is_file()


def test_many_gives_tensorboard_its_pictures_and_both_the_same_scalars(tmp_path):
    run = tmp_path / "many"
    assert run_train(run, "logger=many") == 0
    events = read_events(run / "tensorboard")
    assert [e.step for e in events.Images("samples/grid")] == [3, 6]
    assert "custom_scalars__config__" in events.Tags()["tensors"]
    board = [(e.step, e.value) for e in events.Scalars("loss/g")]
    assert [(s, pytest.approx(v)) for s, v in logged(run / "csv" / "metrics.csv", "loss/g")] == board


def test_a_logger_whose_package_is_missing_stops_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loggers, "installed", lambda package: False)
    for name in ("wandb", "mlflow"):
        capsys.readouterr()
        assert run_train(tmp_path / name, f"logger={name}") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f'error: logger={name} needs the {name} package: pip install -e ".[{name}]", or choose '
                       "logger=tensorboard|csv|many"]
        assert not (tmp_path / name).exists()


def test_wandb_offline_keeps_the_run_on_disk(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))  # nothing written to ~/.config
    run = tmp_path / "wandb_run"
    assert run_train(run, "experiment=ring", "logger=wandb") == 0
    (offline,) = (run / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb"))


def test_mlflow_local_store_holds_the_scalars_at_generator_steps_and_the_hyperparameters(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # anything MLflow would write beside the run lands here, checked below
    run = tmp_path / "mlflow_run"
    assert run_train(run, "experiment=ring", "logger=mlflow") == 0
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("gan-patterns").experiment_id])
    assert [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "loss/d")] == [1, 2, 3, 4, 5, 6]
    assert mlflow_run.data.params["cfg/data/name"] == "ring"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow_run"]
