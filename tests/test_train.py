"""train.py end to end: real Hydra, the real training loop on Fabric, real files and TensorBoard events."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TINY, compose_config, read_events, run_main, run_train

from gan.training.loop import train

EXPECTED_SCALARS = {"loss/d", "loss/g", "d/real", "d/fake", "grad_norm/g", "grad_norm/d"}


def test_run_directory_layout(digits_run):
    assert (digits_run / ".hydra" / "config.yaml").is_file()
    assert list((digits_run / "tensorboard").glob("events.out.tfevents.*"))
    assert (digits_run / "checkpoints" / "last.ckpt").is_file()
    assert {p.name for p in (digits_run / "checkpoints").glob("step_*.ckpt")} == {
        "step_000003.ckpt", "step_000006.ckpt"}
    grids = sorted(p.name for p in (digits_run / "samples").glob("*.png"))
    assert grids == ["step_000003.png", "step_000006.png"]
    # The closing summary is in the run's log file, not only on a console that may be gone.
    assert f"Run finished: 6 generator steps in {digits_run}" in (digits_run / "train.log").read_text()


def test_tensorboard_scalars_are_logged_at_generator_steps(digits_run):
    events = read_events(digits_run / "tensorboard")
    assert EXPECTED_SCALARS <= set(events.Tags()["scalars"])
    # debug=tiny logs every generator step: 6 G steps (each with one D step) -> steps 1..6, not 1..12.
    assert [e.step for e in events.Scalars("loss/g")] == [1, 2, 3, 4, 5, 6]
    assert all(torch.isfinite(torch.tensor(e.value)) for e in events.Scalars("loss/d"))


def test_tensorboard_images_layout_and_hparams(digits_run):
    events = read_events(digits_run / "tensorboard")
    assert [e.step for e in events.Images("samples/grid")] == [3, 6]
    tensor_tags = set(events.Tags()["tensors"])
    assert "custom_scalars__config__" in tensor_tags
    from tensorboard.plugins.custom_scalar import layout_pb2

    layout = layout_pb2.Layout()
    layout.ParseFromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    charts = {c.title: list(c.multiline.tag) for cat in layout.category for c in cat.chart}
    assert charts["losses"] == ["loss/d", "loss/g"]
    assert charts["D output on real and fake"][:2] == ["d/real", "d/fake"]
    assert (digits_run / "tensorboard" / "hparams.yaml").is_file()
    hparams = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hparams
    from tensorboard.plugins.hparams import plugin_data_pb2

    start = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["loss/name"].string_value == "rpgan"
    assert start.session_start_info.hparams["data/batch_size"].number_value == 16


def test_checkpoint_loads_weights_only_with_counters_and_buffers(digits_run):
    ckpt = torch.load(digits_run / "checkpoints" / "last.ckpt", weights_only=True)
    state = ckpt["state_dict"]
    assert int(state["counters.g_updates"]) == 6
    assert int(state["counters.d_updates"]) == 6
    assert int(state["counters.images_seen"]) == 6 * 16
    assert state["sample_noise"].shape == (16, 64)
    assert any(k.startswith("ema.generator.") for k in state)
    assert len(ckpt["optimizer_states"]) == 2
    assert set(ckpt["rng"]) == {"torch", "cuda", "numpy", "python"}
    assert ckpt["hyper_parameters"]["cfg"]["data"]["name"] == "digits"
    # The training state and nothing else: no loop or callback state of a framework (the health check's figures so
    # far and the conditions met are the run's: a resumed run goes on judging where it stopped).
    assert set(ckpt) == {"state_dict", "optimizer_states", "lr_schedulers", "hyper_parameters", "precision", "rng",
                         "health"}


def test_resume_continues_from_saved_step(digits_run, tmp_path):
    resumed = tmp_path / "resumed"
    code = run_train(resumed, f"ckpt_path={digits_run / 'checkpoints' / 'step_000003.ckpt'}",
                     "trainer.max_steps=8")
    assert code == 0
    ckpt = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert int(ckpt["state_dict"]["counters.g_updates"]) == 8
    assert int(ckpt["state_dict"]["counters.d_updates"]) == 8
    steps = [e.step for e in read_events(resumed / "tensorboard").Scalars("loss/g")]
    assert steps == [4, 5, 6, 7, 8]
    # The fixed sample noise is restored from the checkpoint, not redrawn.
    original = torch.load(digits_run / "checkpoints" / "last.ckpt", weights_only=True)
    assert torch.equal(ckpt["state_dict"]["sample_noise"], original["state_dict"]["sample_noise"])


def test_ring_run_writes_scatter_plots(ring_run):
    events = read_events(ring_run / "tensorboard")
    assert [e.step for e in events.Images("samples/scatter")] == [3, 6]
    # log.every=2: one point every second generator step, each written once.
    assert [e.step for e in events.Scalars("loss/d")] == [2, 4, 6]
    assert (ring_run / "samples" / "step_000006.png").stat().st_size > 1000
    ckpt = torch.load(ring_run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["state_dict"]["sample_noise"].shape == (2500, 2)  # log.num_points of the ring recipe's 2D noise
    assert ckpt["hyper_parameters"]["cfg"]["loss"]["name"] == "hinge"


def test_the_last_step_logs_its_scalars_and_grid_though_log_every_does_not_divide_the_run(tmp_path):
    """The ring recipe logs every 50 steps: a run of 20 logged no scalar before the last step logged too."""
    run = tmp_path / "ring"
    assert run_train(run, "experiment=ring", "log.every=50", "log.sample_every=50", "trainer.max_steps=20") == 0
    events = read_events(run / "tensorboard")
    for tag in ("loss/d", "loss/g", "d/real", "grad_norm/g", "time/step_ms", "perf/g_steps_per_s"):
        assert [e.step for e in events.Scalars(tag)] == [20], tag
    assert [e.step for e in events.Images("samples/scatter")] == [20]
    assert "final losses loss/d " in (run / "train.log").read_text()
    # Logged every log.every steps, and at the last
    run = tmp_path / "digits"
    assert run_train(run, "log.every=4", "log.sample_every=4", "trainer.max_steps=6") == 0
    events = read_events(run / "tensorboard")
    assert [e.step for e in events.Scalars("loss/g")] == [e.step for e in events.Scalars("time/data_ms")] == [4, 6]
    assert [e.step for e in events.Images("samples/grid")] == [4, 6]
    assert "(generator step 6)" in (run / "train.log").read_text()


def test_wgan_gp_makes_five_d_steps_per_g_step(tmp_path):
    run_dir = tmp_path / "wgan"
    assert run_train(run_dir, "loss=wgan_gp", "trainer.max_steps=2") == 0
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert int(ckpt["state_dict"]["counters.g_updates"]) == 2
    assert int(ckpt["state_dict"]["counters.d_updates"]) == 10
    # The preset turns D's BatchNorm off: the gradient penalty is per sample.
    assert ckpt["hyper_parameters"]["cfg"]["model"]["d_batchnorm"] is False
    assert not any("running_mean" in k for k in ckpt["state_dict"] if k.startswith("D."))
    assert [e.step for e in read_events(run_dir / "tensorboard").Scalars("loss/d")] == [1, 2]


def test_bad_input_exits_with_one_line_and_no_damage(digits_run, tmp_path):
    before = (digits_run / "checkpoints" / "last.ckpt").read_bytes()
    # Reusing a finished run's directory without resuming it is refused.
    assert run_train(digits_run) == 2
    assert (digits_run / "checkpoints" / "last.ckpt").read_bytes() == before
    assert run_train(tmp_path / "x", "ckpt_path=/nonexistent.ckpt") == 2
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_checkpoint_keep_must_be_a_count(tmp_path, capsys):
    for keep in ("-1", "two"):
        capsys.readouterr()
        assert run_train(tmp_path / "x", f"checkpoint.keep={keep}") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: checkpoint.keep={keep}:"), err
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_a_finished_run_keeps_its_newest_checkpoints_and_says_what_it_did(tmp_path):
    """What a newcomer sees at the end of `python train.py`: the run's summary, and only the newest periodic
    checkpoints."""
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "train.py", *TINY, f"hydra.run.dir={run_dir}", "checkpoint.every=1",
                          "checkpoint.keep=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # Every periodic checkpoint was written (step 1 to 6); each older one went once a newer one existed.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "last.ckpt", "step_000005.ckpt", "step_000006.ckpt"]
    assert int(torch.load(run_dir / "checkpoints" / "step_000005.ckpt", weights_only=True)
               ["state_dict"]["counters.g_updates"]) == 5

    console = out.stdout + out.stderr
    assert "Tip:" not in console and "litlogger" not in console and "litmodels" not in console
    summary = [f"Run finished: 6 generator steps in {run_dir}; final losses loss/d ",
               f"tensorboard --logdir {run_dir / 'tensorboard'}", f"python evaluate.py run_dir={run_dir}"]
    log_file = (run_dir / "train.log").read_text()
    for line in summary:
        assert line in out.stdout and line in log_file, line


def test_cli_prints_composed_config_and_one_line_errors(tmp_path, capsys):
    """train.py's main, in this process (test_bad_input.py runs it as a script)."""
    assert run_main("train", "--cfg", "job", "data=ring", "model=mlp") == 0
    out = capsys.readouterr().out
    assert "name: ring" in out and "d_steps: 1" in out
    assert run_main("train", f"hydra.run.dir={tmp_path}/r", "trainer.max_steps=0") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: trainer.max_steps=0")
    assert not (tmp_path / "r").exists()


def test_multirun_gives_one_run_directory_each(tmp_path):
    code = run_train(tmp_path / "unused", "-m", "loss=nonsaturating,hinge", "seed=1",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", "trainer.max_steps=2")
    assert code == 0
    runs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert len(runs) == 2  # named <job number>_<the job's overrides>
    assert runs[0].startswith("0_") and "loss=nonsaturating" in runs[0] and "seed=1" in runs[0]
    assert runs[1].startswith("1_") and "loss=hinge" in runs[1]
    for run in runs:
        assert (tmp_path / "sweep" / run / "checkpoints" / "last.ckpt").is_file()
        assert "loss/d" in read_events(tmp_path / "sweep" / run / "tensorboard").Tags()["scalars"]


@pytest.mark.parametrize("precision,warned", [("bf16-mixed", True), ("32-true", False)])
def test_bf16_on_a_cpu_without_bf16_units_warns_and_names_the_fix(tmp_path, monkeypatch, caplog, precision, warned):
    # This machine's CPU has AMX: a CPU without bf16 units cannot exist here, so torch's checks say it is one.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    cfg = compose_config("debug=tiny", "trainer.max_steps=1", "trainer.enable_progress_bar=false",
                         f"trainer.precision={precision}", run_dir=tmp_path)
    with caplog.at_level("WARNING", logger="gan.training.assemble"):
        train(cfg)
    lines = [r.getMessage() for r in caplog.records if "bf16" in r.getMessage()]
    # following the advice (32-true) trains without the warning
    assert lines == ([f"trainer.precision={precision} on a CPU without AVX512-BF16 or AMX instructions: bf16 "
                      "convolutions may run several times slower than float32 here; add trainer.precision=32-true "
                      "to train in float32"] if warned else [])


def test_bf16_on_this_cpu_with_bf16_units_trains_without_the_warning(tmp_path, caplog):
    if not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        pytest.skip("this CPU has no bf16 units")
    cfg = compose_config("debug=tiny", "trainer.max_steps=1", "trainer.enable_progress_bar=false",
                         "trainer.precision=bf16-mixed", run_dir=tmp_path)
    with caplog.at_level("WARNING", logger="gan.training.assemble"):
        train(cfg)
    assert not [r for r in caplog.records if "bf16" in r.getMessage()]
