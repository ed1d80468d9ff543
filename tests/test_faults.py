"""Divergence and faults: a non-finite loss or gradient, Ctrl-C and other signals, a full disk. Real runs, real
checkpoints, real processes; the full disk is the one thing simulated. (SIGKILL at any moment: tests/test_resume.py.)"""

from __future__ import annotations

import math
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, LearningRates, compose_config, read_events, run_train

from gan.core.state import StepCounters
from gan.errors import Interrupted, RunError, StoppedAtOnce
from gan.training.guard import NonFiniteGuard
from gan.training.loop import train
from gan.training.observer import Observer

# The sigmoid loss with LeCam, whose squared distances of D's outputs overflow once D's weights have moved
# far; a constant learning rate, so that runs of different lengths here follow the same rates.
LECAM = ["loss=nonsaturating", "reg=lecam", "optim.decay=constant"]
# Adam moves every weight of D by about lr in its first step: D's next outputs, and its loss, overflow.
DIVERGING = [*LECAM, "optim.d.lr=1e10", "checkpoint.every=1"]
NONFINITE = re.compile(r"error: generator step (\d+), (D|G) update: the loss is not finite \(forward\); the update was "
                       r"skipped and no checkpoint written after it: resume from the last checkpoint with lower "
                       r"learning rates \(optim\.d\.lr, optim\.g\.lr\) or a regularizer \(e\.g\. reg=r1 "
                       r"resume\.allow_changes=true\), or set train\.skip_nonfinite=true to skip such updates")


def finite_weights(state: dict[str, torch.Tensor]) -> bool:
    """G's and D's weights are finite. (Not every buffer: D's BatchNorm variance overflows as D's weights grow,
    while its loss, computed with the batch's own statistics, is still finite.)"""
    return all(torch.isfinite(t).all() for k, t in state.items() if k.endswith((".weight", ".bias")))


def test_a_nonfinite_loss_stops_the_run_within_its_step_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_train(run, *DIVERGING) == 1
    error = NONFINITE.fullmatch(capsys.readouterr().err.strip().splitlines()[-1])
    assert error, "not the one line expected"
    step = int(error[1])
    assert step > 1  # a checkpoint was written before
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert int(last["counters.g_updates"]) == step - 1 and finite_weights(last)
    assert not (run / "checkpoints" / f"step_{step:06d}.ckpt").exists()


def test_a_diverged_run_resumes_from_its_last_checkpoint_with_the_lower_learning_rates_it_is_told(tmp_path, capsys):
    """The message's advice, followed. (From scratch, DIVERGING's first D update already throws D's weights
    1e10 off, so its only checkpoint, of step 1, cannot be rescued: here a healthy run diverges on resume.)"""
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.ckpt"
    assert run_train(run, *LECAM, "trainer.max_steps=3") == 0
    # D's learning rate raised on resume: the next D update throws D's weights off, and the loss overflows.
    assert run_train(run, *LECAM, f"ckpt_path={last}", "optim.d.lr=1e10") == 1
    error = NONFINITE.fullmatch(capsys.readouterr().err.strip().splitlines()[-1])
    assert error and int(error[1]) > 4
    assert int(torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"]) == 3  # the last good state

    rates = LearningRates()
    cfg = compose_config(*TINY, *LECAM, f"ckpt_path={last}", "optim.d.lr=1e-4", "optim.g.lr=5e-5", run_dir=run)
    module = train(cfg, probes=[rates]).module
    assert module.counters.g == 6 and rates.seen == [[5e-5, 1e-4]] * 3  # every step of the resumed run
    saved = torch.load(last, weights_only=True)
    assert [g["lr"] for s in saved["optimizer_states"] for g in s["param_groups"]] == [5e-5, 1e-4]
    assert finite_weights(saved["state_dict"]) and int(saved["state_dict"]["counters.g_updates"]) == 6
    # One line per change, against the checkpoint's own config (the diverged resume wrote no checkpoint).
    out = capsys.readouterr().out
    for change in ("optim.g.lr=0.002 there, 5e-05 here", "optim.d.lr=0.001 there, 0.0001 here",
                   "trainer.max_steps=3 there, 6 here"):
        assert out.count(f"resume: {change}: applied") == 1, change


class NonfiniteGradient(Observer):
    """Puts inf into one of G's gradients at generator step 2, as G's backward accumulates it (before the
    guard's check, at the optimizer's step): the loss stays finite."""

    def on_step_start(self, run, batch):
        if run.module.counters.g == 1:
            weight = next(run.module.G.parameters())
            # Its first element, in any memory layout (the digits recipe's convolutions are channels_last).
            self.hook = weight.register_post_accumulate_grad_hook(
                lambda p: p.grad.__setitem__((0,) * p.grad.dim(), math.inf))

    def on_step_end(self, run):
        if run.module.counters.g == 2:
            self.hook.remove()


def test_nonfinite_gradients_with_a_finite_loss_name_the_backward(tmp_path):
    cfg = compose_config(*TINY, "checkpoint.every=1", run_dir=tmp_path / "run")
    with pytest.raises(RunError, match=r"^generator step 2, G update: the loss is finite but its gradients are not "
                                       r"\(backward\); the update was skipped"):
        train(cfg, probes=[NonfiniteGradient()])
    assert int(torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
               ["state_dict"]["counters.g_updates"]) == 1
    # Skipped instead: that G update only. (The audit refuses the infinite gradient norm logged at that step.)
    cfg = compose_config(*TINY, "train.skip_nonfinite=true", "audit=false", run_dir=tmp_path / "skipping")
    module = train(cfg, probes=[NonfiniteGradient()]).module
    assert (int(module.counters.skipped_g), int(module.counters.skipped_d), module.counters.g) == (1, 0, 6)


def judged_window(bad: dict[tuple[int, str, int], str], skip: bool) -> tuple[NonFiniteGuard, StepCounters, list]:
    """Four generator steps of two D updates and one G update each, judged by a real guard before real fused
    Adam steps and read once at the end, as a window of log.every=4 is. ``bad``: (step, network, update) ->
    "loss" (a NaN loss) or "grads" (a finite loss, an inf gradient). Returns D's weights before each update."""
    torch.manual_seed(0)
    counters = StepCounters()
    guard = NonFiniteGuard(skip, counters, d_steps=2)
    nets = {"D": torch.nn.Linear(3, 1), "G": torch.nn.Linear(3, 1)}
    opts = {n: torch.optim.Adam(net.parameters(), lr=0.1, fused=True) for n, net in nets.items()}
    before = []
    for step in range(1, 5):
        for network, update in (("D", 0), ("D", 1), ("G", 1)):  # G's update comes after D's last, as it says
            kind = bad.get((step, network, update))
            loss = nets[network](torch.randn(4, 3)).mean() * (math.nan if kind == "loss" else 1.0)
            opts[network].zero_grad()
            loss.backward()
            if kind == "grads":
                nets[network].weight.grad[0, 0] = math.inf
            before.append((step, network, update, nets[network].weight.detach().clone()))
            guard.before_backward(loss, network)
            guard.judge(opts[network], network, update)
            opts[network].step()
            counters.count_d_step() if network == "D" else None
        counters.count_g_step(4)
    return guard, counters, before


def test_the_guard_names_the_first_bad_update_of_a_window_and_counts_every_skipped_one(caplog):
    bad = {(3, "D", 1): "grads", (3, "G", 1): "loss", (4, "D", 0): "loss"}
    guard, counters, before = judged_window(bad, skip=True)
    with caplog.at_level("WARNING", logger="gan.training.guard"):
        guard.read()
    assert [r.getMessage() for r in caplog.records] == [
        "skipped generator step 3, D update 2 of 2: the loss is finite but its gradients are not (backward) "
        "(train.skip_nonfinite)"]
    assert (int(counters.skipped_d), int(counters.skipped_g)) == (2, 1)
    # a bad update moved nothing, a good one moved its network: compare the weights before its next update
    weights = {(s, n, u): w for s, n, u, w in before}
    order = list(weights)
    for i, update in enumerate(order):
        following = next((later for later in order[i + 1:] if later[1] == update[1]), None)
        if following is not None:
            assert torch.equal(weights[update], weights[following]) == (update in bad), update
    guard.read()  # a new window: nothing more to count
    assert (int(counters.skipped_d), int(counters.skipped_g)) == (2, 1)


def test_the_guard_stops_at_the_first_bad_update_whichever_network_it_was():
    guard, _, _ = judged_window({(2, "G", 1): "loss", (3, "D", 0): "grads"}, skip=False)
    with pytest.raises(RunError, match=r"^generator step 2, G update: the loss is not finite \(forward\); "):
        guard.read()
    guard, _, _ = judged_window({(2, "G", 1): "grads", (2, "D", 1): "loss"}, skip=False)
    with pytest.raises(RunError, match=r"^generator step 2, D update 2 of 2: the loss is not finite \(forward\); "):
        guard.read()


def test_skipped_updates_are_counted_per_network_and_survive_resume(tmp_path):
    # The audit refuses a non-finite logged value, which a skipped update's loss is.
    skip = [*DIVERGING, "train.skip_nonfinite=true", "checkpoint.every=3", "audit=false"]
    assert run_train(tmp_path / "straight", *skip) == 0
    assert run_train(tmp_path / "first", *skip, "trainer.max_steps=3") == 0
    assert run_train(tmp_path / "second", *skip, f"ckpt_path={tmp_path / 'first' / 'checkpoints' / 'last.ckpt'}") == 0
    counts = {}
    for run in ("straight", "first", "second"):
        state = torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        counts[run] = int(state["counters.skipped_d"]), int(state["counters.skipped_g"])
        assert finite_weights(state)  # no skipped update reached the weights
    assert counts["first"][0] > 0  # updates were skipped before the checkpoint the second run resumed from
    assert counts["second"] == counts["straight"]  # and counted on from there
    logged = read_events(tmp_path / "second" / "tensorboard").Scalars("train/skipped_d")
    assert [e.step for e in logged] == [4, 5, 6] and logged[-1].value == counts["straight"][0]


# What SLURM sets in a job step's environment (srun), as far as Lightning's SLURMEnvironment reads it.
SLURM = {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "4242",
         "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}


@pytest.mark.parametrize("signum,name,code,env", [
    (signal.SIGINT, "Ctrl-C", 130, {}),
    (signal.SIGTERM, "SIGTERM", 143, {}),  # what kill, systemd, Kubernetes and SLURM's time limit send
    (signal.SIGUSR1, "SIGUSR1", 138, SLURM),  # SLURM's warning before the time limit (sbatch --signal=USR1@90)
])
def test_a_signal_saves_the_step_it_lands_in_and_the_run_resumes_from_it(tmp_path, signum, name, code, env):
    run = tmp_path / "run"
    command = [sys.executable, "train.py", *TINY, f"hydra.run.dir={run}", "trainer.max_steps=100000",
               "checkpoint.every=4", "log.sample_every=1000"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    try:
        deadline = time.time() + 120
        while not (run / "checkpoints" / "step_000004.ckpt").exists():
            assert proc.poll() is None and time.time() < deadline, "training did not reach step 4"
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a run that did not stop: not left behind
            proc.kill()
            proc.wait()
    assert proc.returncode == code
    last = run / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)["state_dict"]
    step = int(saved["counters.g_updates"])
    assert step >= 4 and int(saved["counters.d_updates"]) == step  # a whole generator step: D's update and G's
    assert err.strip().splitlines()[-1] == (f"stopped by {name} at generator step {step}, saved in {last}: resume "
                                            f"with the same overrides and ckpt_path={last}")
    # Under SLURM, Lightning's Trainer's auto-requeue saved <run>/hpc_ckpt_1.ckpt mid-step and trained on: none here.
    assert not list(run.glob("hpc_ckpt_*"))
    assert run_train(run, f"ckpt_path={last}", f"trainer.max_steps={step + 2}", "checkpoint.every=4") == 0
    assert int(torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"]) == step + 2


class Signal(Observer):
    """Sends this process ``signum`` as generator step 2 starts and again, ``twice``, before its G update."""

    def __init__(self, signum: int, twice: bool):
        self.signum, self.twice = signum, twice

    def on_start(self, run):
        if self.twice:
            run.optimizers[0].register_step_pre_hook(self.again)  # G's optimizer

    def on_step_start(self, run, batch):
        self.step = run.module.counters.g
        if self.step == 1:
            os.kill(os.getpid(), self.signum)

    def again(self, optimizer, args, kwargs):
        if self.step == 1:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_stops_at_once_without_a_checkpoint_of_its_step(tmp_path, signum, code):
    handler = signal.getsignal(signum)
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.ckpt"
    with pytest.raises(StoppedAtOnce) as stopped:
        train(compose_config(*TINY, "checkpoint.every=1", run_dir=run), probes=[Signal(signum, twice=True)])
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    assert stopped.value.code == code and stopped.value.message == (
        f"stopped at once by a second {name}: resume from the last checkpoint with the same overrides and "
        f"ckpt_path={last}")
    assert int(torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"]) == 1  # step 2 never finished
    assert signal.getsignal(signum) is handler
    # Once: the step ends, is saved, and the run stops.
    with pytest.raises(Interrupted, match=f"^stopped by {name} at generator step 2, saved in ") as stopped:
        train(compose_config(*TINY, "checkpoint.every=4", run_dir=tmp_path / "once"),
              probes=[Signal(signum, twice=False)])
    assert stopped.value.code == code


def train_py_with_file_size_limit(limit: int, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`python train.py` (the tiny run, without its health check, whose feature network the cache would get) with
    every file it writes limited to ``limit`` bytes: RLIMIT_FSIZE, which the kernel enforces on every write as it
    does a full disk (the failed write returns an error rather than a signal)."""
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # a .pyc over the limit would be written cut short
    return subprocess.run([sys.executable, "train.py", *TINY, f"hydra.run.dir={run_dir}", "health.enabled=false",
                           *overrides], cwd=ROOT, preexec_fn=limited, capture_output=True, text=True, timeout=120,
                          env=env)


def cannot_write(path: Path) -> list[str]:
    """What train.py prints on stderr where writing ``path`` met a full disk (gan/files.py's atomic_write)."""
    return [f"error: cannot write {path} (File too large): free disk space or choose a writable directory; the "
            f"previous {path.name}, if there was one, is unchanged"]


def test_a_full_disk_while_a_checkpoint_is_written_ends_in_one_line_and_leaves_no_partial_file(tmp_path):
    """torch.save's writer fails with a RuntimeError of its own, which the run reports as the failed write it is.
    The limit (300 kB) is under the tiny run's first checkpoint, over its TensorBoard events and samples by then."""
    run_dir = tmp_path / "run"
    out = train_py_with_file_size_limit(300_000, run_dir)
    checkpoint = run_dir / "checkpoints" / "step_000003.ckpt"
    assert out.returncode == 1 and out.stderr.strip().splitlines() == cannot_write(checkpoint)
    assert list(checkpoint.parent.iterdir()) == []  # no partial checkpoint, no temporary file


def test_a_full_disk_while_a_sample_grid_is_written_ends_in_one_line_and_leaves_no_partial_picture(tmp_path):
    """The samples' pictures are written whole or not at all, as checkpoints are. The limit (8 kB) is under the first
    grid (64 samples: about 12 kB), over the run's config files (Hydra's: 4 kB) and its CSV log (no TensorBoard: its
    events would reach the limit first), and the grid comes before the first checkpoint."""
    run_dir = tmp_path / "run"
    out = train_py_with_file_size_limit(8_000, run_dir, "logger=csv", "log.num_samples=64", "checkpoint.every=100")
    grid = run_dir / "samples" / "step_000003.png"
    assert out.returncode == 1 and out.stderr.strip().splitlines() == cannot_write(grid)
    assert list(grid.parent.iterdir()) == []  # no partial picture, no temporary file


class DiskFillsAtTheEnd(Observer):
    """The disk fills once the run's last checkpoint is written (a probe is told of the end after the run's own
    outputs): a file size limit of 1 kB from there, which the kernel enforces on every write as it does a full disk."""

    def on_end(self, run):
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_a_full_disk_while_the_generator_is_saved_says_so_and_keeps_the_last_checkpoint(tmp_path):
    """generator.pt, written after last.ckpt, fails with the same one line as a checkpoint (train.py prints the
    RunError's message), leaves no partial file, and the checkpoint before it resumes: nothing is lost."""
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        with pytest.raises(RunError) as failed:
            # logger=csv: TensorBoard's writer thread would meet the limit too, on its own clock (the test of a full
            # disk under TensorBoard is below).
            train(compose_config(*TINY, "health.enabled=false", "logger=csv", run_dir=tmp_path),
                  probes=[DiskFillsAtTheEnd()])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    snapshot = tmp_path / "generator.pt"
    assert [f"error: {failed.value}"] == cannot_write(snapshot)  # the line train.py prints
    assert not snapshot.exists() and not list(tmp_path.glob(".generator.pt.*"))
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert int(last["state_dict"]["counters.g_updates"]) == 6  # debug=tiny's every step, whole


def test_a_full_disk_while_tensorboard_writes_ends_in_one_line_without_a_threads_traceback(tmp_path):
    """TensorBoard's events are written by a thread of their own, whose failed write printed that thread's traceback
    before the run's own error, and Lightning's logger raises it again at its next write as a ValueError of its own;
    the run ends in one line that names the full disk behind it, not in the error the loggers meet again as the run
    closes. The limit (20 kB) is under the first sample grid and checkpoint, over the run's config files."""
    out = train_py_with_file_size_limit(20_000, tmp_path / "run")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: cannot write to the run directory (File too large): free disk space or choose a writable directory; "
        "a checkpoint is written whole or not at all: a run resumes from its last"]
