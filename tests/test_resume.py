"""Exact resume, and surviving SIGKILL: real runs, real checkpoints, real processes."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, LearningRates, compose_config, run_main, run_train
from omegaconf import OmegaConf
from test_bad_input import one_line

from gan.core.models import UNCONDITIONAL
from gan.errors import ConfigError
from gan.run.checkpoint import save_checkpoint
from gan.run.legacy import upgrade_config
from gan.run.load import load_module
from gan.training.checkpoints import Checkpoints
from gan.training.loop import train
from gan.training.observer import Observer
from gan.training.resume import changes

# Default model with EMA, ADA (adjusting every step so p really moves) and LeCam on; a constant learning rate,
# so that a run of 3 steps and one of 6 follow the same rates (the linear decay ends at trainer.max_steps).
FULL = ["augment=ada", "augment.interval=1", "augment.speed_images=64", "reg=lecam", "optim.decay=constant",
        "log.sample_every=2"]


def assert_identical(a, b, path="checkpoint"):
    """Recursively: tensors bit-identical (nan where the other has nan: the health check's empty windows), everything
    else equal."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) or a.is_floating_point() and torch.equal(a.isnan(), b.isnan()) and torch.equal(
            a.nan_to_num(), b.nan_to_num()), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_identical(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


class FilesLoaded:
    """torch.load, counting the files it reads (by path) while a test runs."""

    def __init__(self, monkeypatch):
        self.paths: list[Path] = []
        load = torch.load

        def counting(f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)):
                self.paths.append(Path(f).resolve())
            return load(f, *args, **kwargs)

        monkeypatch.setattr(torch, "load", counting)

    def count(self, path: Path) -> int:
        return self.paths.count(path.resolve())


def test_n_plus_resume_plus_n_equals_2n(tmp_path, monkeypatch):
    assert run_train(tmp_path / "straight", *FULL, "trainer.max_steps=6") == 0
    assert run_train(tmp_path / "first", *FULL, "trainer.max_steps=3") == 0
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    loaded = FilesLoaded(monkeypatch)
    assert run_train(tmp_path / "second", *FULL, "trainer.max_steps=6", f"ckpt_path={last}") == 0
    # train.py's Hydra callback reads the checkpoint to check the resume before .hydra/ is written, and keeps
    # nothing; the loop's checks, as the run starts, read it for the run.
    assert loaded.count(last) == 2
    straight = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = torch.load(tmp_path / "second" / "checkpoints" / "last.ckpt", weights_only=True)
    # The run really exercised what it claims to: p moved, EMA and LeCam anchors are live.
    assert straight["state_dict"]["objective.augment.p"] > 0
    assert "ema.num_updates" not in straight["state_dict"]  # the EMA weight follows the step count
    for key in ("state_dict", "optimizer_states", "rng"):
        assert_identical(straight[key], resumed[key], key)


def test_linear_decay_reaches_zero_and_resumes_exactly(tmp_path):
    # Resumed from the straight run's own step-3 checkpoint, so both runs share trainer.max_steps=6.
    decay = [*FULL, "optim.decay=linear", "optim.g.lr=1e-3", "optim.d.lr=2e-3", "trainer.max_steps=6"]
    assert run_train(tmp_path / "straight", *decay) == 0
    middle = torch.load(tmp_path / "straight" / "checkpoints" / "step_000003.ckpt", weights_only=True)
    assert [g["lr"] for s in middle["optimizer_states"] for g in s["param_groups"]] == pytest.approx(
        [1e-3 * (1 - 3 / 6), 2e-3 * (1 - 3 / 6)])
    assert run_train(tmp_path / "resumed", *decay,
                     f"ckpt_path={tmp_path / 'straight' / 'checkpoints' / 'step_000003.ckpt'}") == 0
    straight = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert [g["lr"] for s in straight["optimizer_states"] for g in s["param_groups"]] == [0.0, 0.0]
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "rng"):
        assert_identical(straight[key], resumed[key], key)
    # Other learning rates on resume: the schedules go on along the new lines, from the restored step.
    rates = LearningRates()
    train(compose_config(*TINY, *decay, "optim.g.lr=4e-3", "optim.d.lr=1e-3",
                         f"ckpt_path={tmp_path / 'straight' / 'checkpoints' / 'step_000003.ckpt'}",
                         run_dir=tmp_path / "faster"), probes=[rates])
    assert [lr for step in rates.seen for lr in step] == pytest.approx(
        [lr * (1 - s / 6) for s in (3, 4, 5) for lr in (4e-3, 1e-3)])


def test_atomic_write_leaves_the_old_file_when_saving_fails(tmp_path):
    path = tmp_path / "last.ckpt"
    save_checkpoint({"step": torch.tensor(1)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("crash in the middle of a write")

    with pytest.raises(RuntimeError, match="middle of a write"):
        save_checkpoint({"step": torch.tensor(2), "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary left behind


def test_pruning_spares_other_files_and_the_checkpoints_of_a_run_resumed_from(tmp_path):
    """A run resumed from step 3 in its own directory, where the first run went on to step 9: pruning
    after the new step 5 keeps the newest two up to step 5 and leaves step 9 to be overwritten later."""
    names = ["step_000001.ckpt", "step_000003.ckpt", "step_000004.ckpt", "step_000005.ckpt", "step_000009.ckpt",
             "last.ckpt", "step_notes.ckpt", "notes.txt"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    Checkpoints(tmp_path, every=1, keep=2, write=lambda path: None, is_global_zero=True).prune(5)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["step_000004.ckpt", "step_000005.ckpt", "step_000009.ckpt", "last.ckpt", "step_notes.ckpt", "notes.txt"])


WRITER = """
import sys, torch
from gan.run.checkpoint import save_checkpoint
from gan.training.resume import UNSET, changes
i = 0
while True:
    i += 1
    save_checkpoint({"i": torch.tensor(i), "payload": torch.full((4_000_000,), float(i))}, sys.argv[1])
    print(i, flush=True)
"""


@pytest.mark.parametrize("delay", [0.3, 0.45, 0.6])
def test_sigkill_during_writes_never_corrupts_the_checkpoint(tmp_path, delay):
    path = tmp_path / "last.ckpt"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "1"  # at least one complete write
    time.sleep(delay)  # 16 MB per write: the kill lands mid-write most of the time
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpt = torch.load(path, weights_only=True)
    assert torch.equal(ckpt["payload"], torch.full((4_000_000,), float(ckpt["i"])))


def test_killed_training_run_resumes_from_its_last_checkpoint(tmp_path):
    run_dir = tmp_path / "killed"
    command = [sys.executable, "train.py", *TINY, f"hydra.run.dir={run_dir}", "trainer.max_steps=100000",
               "checkpoint.every=4", "log.sample_every=1000"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    last = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.time() + 120
    while not (run_dir / "checkpoints" / "step_000016.ckpt").exists():
        assert proc.poll() is None and time.time() < deadline, "training did not reach step 16"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    saved = int(torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"])
    periodic = sorted(int(p.stem.split("_")[1]) for p in last.parent.glob("step_*.ckpt"))
    # last.ckpt is a complete checkpoint of a periodic step; the kill may have landed between writing
    # step_N.ckpt and last.ckpt, so at most one interval (4 steps) is lost.
    assert saved in periodic and saved >= 12 and periodic[-1] - saved <= 4
    assert run_train(run_dir, f"ckpt_path={last}", f"trainer.max_steps={saved + 2}", "checkpoint.every=4") == 0
    resumed = torch.load(last, weights_only=True)
    assert int(resumed["state_dict"]["counters.g_updates"]) == saved + 2


def test_a_checkpoint_from_before_the_skip_counters_resumes_and_evaluates(ring_run, tmp_path):
    """Checkpoints written before counters.skipped_d / skipped_g existed: read as having skipped nothing."""
    old = torch.load(ring_run / "checkpoints" / "last.ckpt", weights_only=True)
    for name in ("counters.skipped_g", "counters.skipped_d"):
        del old["state_dict"][name]
    torch.save(old, tmp_path / "old.ckpt")
    assert run_train(tmp_path / "resumed", "experiment=ring", "loss=hinge", "log.every=2",
                     f"ckpt_path={tmp_path / 'old.ckpt'}", "trainer.max_steps=8") == 0
    resumed = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert int(resumed["counters.g_updates"]) == 8 and int(resumed["counters.skipped_d"]) == 0
    assert run_main("evaluate", f"run_dir={tmp_path / 'resumed'}", f"ckpt={tmp_path / 'old.ckpt'}",
                    "num_samples=100") == 0


@pytest.mark.parametrize("max_steps", [6, 4], ids=["at-the-end", "below-the-step"])
def test_a_resume_with_no_step_left_is_refused_in_one_line_and_the_advice_trains_on(digits_run, tmp_path, capsys,
                                                                                     max_steps):
    """The digits run ends at step 6: resuming it with trainer.max_steps 6 or 4 would train nothing and rewrite its
    last.ckpt with the lower count; refused before anything is written, and the advised count trains on."""
    last = digits_run / "checkpoints" / "last.ckpt"
    files = {p: p.read_bytes() for p in digits_run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run_train(digits_run, f"ckpt_path={last}", f"trainer.max_steps={max_steps}") == 2
    where = "the end of its run" if max_steps == 6 else "past trainer.max_steps=4"
    assert one_line(capsys) == (f"error: ckpt_path={last} is at generator step 6, {where}: a resume trains up to "
                                "trainer.max_steps, so give more (trainer.max_steps=12), or score it as it is with "
                                f"python evaluate.py run_dir={digits_run}")
    assert {p: p.read_bytes() for p in digits_run.rglob("*") if p.is_file()} == files
    run = tmp_path / "more"
    assert run_train(run, f"ckpt_path={last}", "trainer.max_steps=12") == 0  # the advice, followed
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert int(state["counters.g_updates"]) == 12


def test_a_resume_with_another_loss_is_refused_in_one_line_unless_asked_for(digits_run, tmp_path, capsys):
    last = digits_run / "checkpoints" / "last.ckpt"
    hydra_dir = {p.name: p.read_bytes() for p in (digits_run / ".hydra").iterdir()}
    capsys.readouterr()
    assert run_train(digits_run, f"ckpt_path={last}", "loss=hinge", "trainer.max_steps=8") == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: ckpt_path={last} was trained with other networks, objective or data (loss.name=rpgan there, "
        f"hinge here): resume with loss=rpgan to go on as trained (the run's overrides: "
        f"{digits_run / '.hydra' / 'overrides.yaml'}), or add resume.allow_changes=true to go on with these on purpose"]
    # Refused before Hydra wrote the run's .hydra/: the overrides the line points to are still the run's.
    assert {p.name: p.read_bytes() for p in (digits_run / ".hydra").iterdir()} == hydra_dir

    run = tmp_path / "hinge"
    assert run_train(run, f"ckpt_path={last}", "loss=hinge", "trainer.max_steps=8", "resume.allow_changes=true") == 0
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["hyper_parameters"]["cfg"]["loss"]["name"] == "hinge"
    assert int(saved["state_dict"]["counters.g_updates"]) == 8
    log = (run / "train.log").read_text()
    assert log.count("resume: loss.name=rpgan there, hinge here: the run goes on with it "
                     "(resume.allow_changes=true)") == 1


def test_what_a_resume_may_change():
    saved = compose_config(*TINY)
    now = compose_config(*TINY, "loss=wgan_gp", "optim.d.lr=5e-4", "optim.g.fused=false", "eval.every=5",
                         "data.num_workers=2", "trainer.precision=bf16-mixed", "ckpt_path=x.ckpt",
                         "resume.allow_changes=true")
    found = {c.key: (c.before, c.after, c.kind) for c in changes(*(current(OmegaConf.to_container(c, resolve=True))
                                                                  for c in (saved, now)))}
    assert found == {
        "loss.name": ("rpgan", "wgan_gp", "refused"), "loss.d_steps": (1, 5, "refused"),
        "loss.gp_weight": (0.0, 10.0, "refused"),  # an old run's value of a key added since (gan/run/legacy.py)
        "model.d_batchnorm": (True, False, "refused"), "optim.g.fused": (True, False, "free"),  # the same math
        "optim.d.lr": (1e-3, 5e-4, "applied"), "eval.every": (0, 5, "applied"),
        "data.num_workers": (0, 2, "free"), "trainer.precision": ("32-true", "bf16-mixed", "free")}


def current(cfg: dict) -> dict:
    """``cfg`` in the current layout, as a resume compares them (a checkpoint's as it is read, the composed one by
    the checks)."""
    cfg = copy.deepcopy(cfg)
    upgrade_config(cfg)
    return cfg


def renamed_back(composed: dict) -> dict:
    """``composed`` as runs from before the renames saved it (gan/config/schema.py's was=): the batch size, D steps and
    layout read from train.* (which may differ from data.batch_size: the old name's value is what trained), and
    loss=wgan_gp's loss.batchnorm_in_d, which chose model.d_batchnorm."""
    saved = copy.deepcopy(composed)
    train, data, loss, model = (saved[name] for name in ("train", "data", "loss", "model"))
    train.update(batch_size=data["batch_size"], d_steps=loss.pop("d_steps"), channels_last=data.pop("channels_last"))
    data["batch_size"] = 64
    if loss["name"] == "wgan_gp":
        loss["batchnorm_in_d"] = False
        if model["name"] == "mlp":  # no BatchNorm: the old wgan_gp set nothing in it
            del model["d_batchnorm"]
    return saved


@pytest.mark.parametrize("overrides", [(), ("loss=wgan_gp",), ("loss=wgan_gp", "model.d_batchnorm=true"),
                                       ("experiment=ring", "loss=wgan_gp"), ("experiment=mnist",)])
def test_an_old_run_resumed_with_its_settings_under_the_new_names_changes_nothing(overrides):
    now = OmegaConf.to_container(compose_config(*TINY, *overrides), resolve=True)
    saved = renamed_back(now)
    assert changes(current(saved), current(now)) == []
    changed = renamed_back(now)
    changed["train"]["batch_size"] = 8  # the old name's value is the one the run trained with
    assert [(c.key, c.before, c.after) for c in changes(current(changed), current(now))] == [("data.batch_size", 8, 16)]


@pytest.mark.parametrize("change", ["optim.d._target_=torch.optim.AdamW", "optim.decay=constant", "log.num_samples=8",
                                    "seed=1"])
def test_what_the_checkpoint_restores_is_refused_even_on_purpose_and_the_advice_starts_a_new_run(
        digits_run, tmp_path, capsys, change):
    """The optimizer's class and schedules, the grids' fixed noise, the random streams: the resume would restore the
    old ones."""
    last = digits_run / "checkpoints" / "last.ckpt"
    key, _, value = change.partition("=")
    capsys.readouterr()
    assert run_train(tmp_path / "resumed", f"ckpt_path={last}", change, "resume.allow_changes=true") == 2
    line = one_line(capsys)
    assert re.search(rf"{re.escape(key)}=\S+ there, {re.escape(value)} here: .+, so a resume cannot change it, not "
                     rf"even with resume.allow_changes=true: resume with {re.escape(key)}=", line), line
    assert not (tmp_path / "resumed").exists()
    start = re.search(r"the same overrides with (init_from=\S+) in place of ckpt_path", line).group(1)
    assert run_train(tmp_path / "new", start, change) == 0
    saved = torch.load(tmp_path / "new" / "checkpoints" / "last.ckpt", weights_only=True)
    assert str(OmegaConf.select(OmegaConf.create(saved["hyper_parameters"]["cfg"]), key)) == value
    assert saved["hyper_parameters"]["init_from"] == {"checkpoint": str(last.resolve()), "step": 6}


class OptimizerOptions(Observer):
    """Whether G's and D's optimizers step fused, at the start of every generator step."""

    def __init__(self):
        self.seen: list[list[bool]] = []

    def on_step_start(self, run, batch):
        self.seen.append([group["fused"] for optimizer in run.optimizers for group in optimizer.param_groups])


def test_a_resume_sets_fused_on_the_optimizers_it_restores(digits_run, tmp_path):
    """optim.*.fused takes effect as given: the parameter groups restored from the checkpoint hold the old one."""
    options = OptimizerOptions()
    cfg = compose_config(*TINY, f"ckpt_path={digits_run / 'checkpoints' / 'step_000003.ckpt'}", "optim.d.fused=false",
                         run_dir=tmp_path / "run")
    train(cfg, probes=[options])
    assert options.seen == [[True, False]] * 3


# A checkpoint of step 3 of `python train.py debug=tiny` written by the release trained by Lightning's Trainer
# (1d5e325): its loop and callback state beside the training state.
TRAINER_RELEASE = ROOT / "tests" / "data" / "trainer_release_digits_step3.ckpt"
# The digits recipe of that release, as a resume under today's recipe names it when it refuses, less the lazy
# interval today's recipe gives its regularizer (LeCam has none).
RELEASE_RECIPE = ["reg=lecam", "augment=diff", "loss=nonsaturating", "optim.decay=constant", "ema.decay=0.999",
                  "~reg.every"]


def test_a_checkpoint_of_the_trainer_release_resumes_as_the_same_state_saved_by_this_loop(tmp_path):
    old = torch.load(TRAINER_RELEASE, weights_only=True)
    assert {"loops", "callbacks", "global_step", "pytorch-lightning_version"} <= old.keys()
    # Written before G's condition was one record: its labels' count alone, 0 for this digits run
    assert old["hyper_parameters"]["num_classes"] == 0 and "condition" not in old["hyper_parameters"]
    assert load_module(TRAINER_RELEASE).condition == UNCONDITIONAL
    ours = {key: old[key] for key in ("state_dict", "optimizer_states", "lr_schedulers", "hyper_parameters", "rng")}
    torch.save(ours, tmp_path / "ours.ckpt")
    finals = []
    for name, path in (("old", TRAINER_RELEASE), ("ours", tmp_path / "ours.ckpt")):
        assert run_train(tmp_path / name, *RELEASE_RECIPE, f"ckpt_path={path}") == 0
        finals.append(torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"])
    assert int(finals[0]["counters.g_updates"]) == 6
    assert [k for k in finals[0] if not torch.equal(finals[0][k], finals[1][k])] == []


def saved_state(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def test_a_changed_diffaugment_p_is_set_on_the_state_a_resume_restores(tmp_path):
    """DiffAugment's p is a setting held in a buffer, which the checkpoint would bring back: allowed, it is set."""
    assert run_train(tmp_path / "first", "augment=diff", "augment.p=0.5", "trainer.max_steps=3") == 0
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    assert run_train(tmp_path / "second", "augment=diff", "augment.p=0.25", f"ckpt_path={last}",
                     "resume.allow_changes=true") == 0
    assert float(saved_state(tmp_path / "second")["objective.augment.p"]) == 0.25
    assert "resume: augment.p=0.5 there, 0.25 here: the run goes on with it" in (tmp_path / "second" /
                                                                                "train.log").read_text()


def test_where_ada_started_is_refused_even_on_purpose_and_the_advice_starts_a_new_run(tmp_path, capsys):
    """ADA's p moves with the run: the checkpoint holds where it got to; augment.p was only where it started."""
    ada = ["augment=ada", "augment.interval=1", "augment.speed_images=64", "trainer.max_steps=3"]
    assert run_train(tmp_path / "first", *ada) == 0
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    assert run_train(tmp_path / "resumed", *ada, "augment.p=0.5", f"ckpt_path={last}", "trainer.max_steps=4",
                     "resume.allow_changes=true") == 2
    line = one_line(capsys)
    assert re.search(r"augment.p=0.0 there, 0.5 here: under ADA \(augment.adaptive=true\) p moves with the run.+ not "
                     r"even with resume.allow_changes=true: resume with augment.p=0.0, or start a new run", line), line
    assert not (tmp_path / "resumed").exists()
    start = re.search(r"the same overrides with (init_from=\S+) in place of ckpt_path", line).group(1)
    assert run_train(tmp_path / "new", *ada, "augment.p=0.5", start, "trainer.max_steps=1") == 0
    assert float(saved_state(tmp_path / "new")["objective.augment.p"]) == pytest.approx(0.5, abs=16 / 64)


def test_a_changed_fourier_scale_rescales_the_frequencies_a_resume_restores(ring_run, tmp_path):
    """D's Fourier features are drawn once at model.d_fourier_scale and held in a buffer: allowed, a resume keeps
    their directions at the new scale, as its config records."""
    last = ring_run / "checkpoints" / "last.ckpt"
    ring = ["experiment=ring", "loss=hinge", "log.every=2", "trainer.max_steps=7"]
    assert run_train(tmp_path / "resumed", *ring, "model.d_fourier_scale=30", f"ckpt_path={last}",
                     "resume.allow_changes=true") == 0
    before = torch.load(last, weights_only=True)["state_dict"]["D.net.1.frequencies"]
    assert torch.allclose(saved_state(tmp_path / "resumed")["D.net.1.frequencies"], before * 2)


def test_the_classes_of_a_resumed_grid_are_those_it_trains_on(tmp_path):
    conditional = ["model.conditional=true", "log.samples_per_class=2", "trainer.max_steps=3"]
    assert run_train(tmp_path / "first", *conditional, "data.classes=[0,2]") == 0
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    assert saved_state(tmp_path / "first")["sample_labels"].tolist() == [0, 2, 0, 2]
    assert run_train(tmp_path / "second", *conditional, "data.classes=[1,2]", f"ckpt_path={last}",
                     "trainer.max_steps=4", "resume.allow_changes=true") == 0
    assert saved_state(tmp_path / "second")["sample_labels"].tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize("resumed", [False, True])
def test_a_precision_that_holds_the_weights_in_another_type_is_refused_in_one_line(digits_run, tmp_path, capsys,
                                                                                   resumed):
    resume = [f"ckpt_path={digits_run / 'checkpoints' / 'step_000003.ckpt'}"] if resumed else []
    capsys.readouterr()
    assert run_train(tmp_path / "run", "trainer.precision=bf16-true", *resume) == 2
    assert one_line(capsys).startswith("error: trainer.precision=bf16-true: the loop trains float32 weights, in "
                                       "float32 or under autocast")
    assert not (tmp_path / "run").exists()


def test_the_loop_called_directly_refuses_a_resume_with_train_pys_line(digits_run, tmp_path, capsys):
    """gan.training.loop.train(cfg) checks what the resume changes before it compares the networks, whose grid noise
    (log.num_samples) differs too: the same line as train.py's, not 'holds other networks'."""
    last = digits_run / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    assert run_train(tmp_path / "script", f"ckpt_path={last}", "log.num_samples=8") == 2
    printed = one_line(capsys)
    with pytest.raises(ConfigError) as refused:
        train(compose_config(*TINY, f"ckpt_path={last}", "log.num_samples=8", run_dir=tmp_path / "direct"))
    assert printed == f"error: {refused.value}"
    assert "log.num_samples=16 there, 8 here" in printed
    assert not (tmp_path / "direct" / "checkpoints").exists()


@pytest.mark.parametrize("caller", ["gan.train", "the loop"])
def test_a_resume_reads_its_checkpoint_once(digits_run, tmp_path, monkeypatch, caller):
    """gan.train checks the resume before it writes the run's .hydra/, as train.py's callback does, and hands the
    loop what the checks read; the loop called directly makes them itself. Either way the file is read once."""
    import gan

    last = digits_run / "checkpoints" / "last.ckpt"
    loaded = FilesLoaded(monkeypatch)
    if caller == "gan.train":
        gan.train(*TINY, f"ckpt_path={last}", "trainer.max_steps=7", run_dir=tmp_path / "api")
    else:
        train(compose_config(*TINY, f"ckpt_path={last}", "trainer.max_steps=7", run_dir=tmp_path / "direct"))
    assert loaded.count(last) == 1
