"""Per-phase step timing (gan/training/timing.py): the phases of real training steps, in order, adding up to
the step; their TensorBoard tags; the CUDA paths where a GPU exists. No timing is asserted against a
number: these check what is measured, not how fast."""

from __future__ import annotations

import sys
import time

import pytest
import torch
from conftest import ROOT, compose_config, read_events

from gan.core.phases import NAMES, PhaseTimer, StepPhases
from gan.training.loop import train
from gan.training.observer import Observer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (CUDA events, sync debug mode, pinned memory)")
# One generator step's phases in the order the step runs them (d_steps = 1): G(z) comes first, and the
# G loss's forward through D is timed as g_forward too.
ONE_STEP = ["data", "g_forward", "d_forward_backward", "d_optimizer", "g_forward", "g_backward", "g_optimizer",
            "statistics", "callbacks"]


def test_phase_timer_accumulates_and_collect_clears():
    timer = PhaseTimer()
    phases = StepPhases(timer)
    for _ in range(2):
        with phases.phase("g_forward"):
            assert (phases.current.name, phases.network) == ("g_forward", "G")  # the record, as the guard reads it
            time.sleep(0.002)
    assert phases.current is None
    totals = timer.collect()
    assert set(totals) == {"g_forward"} and totals["g_forward"] >= 4.0
    assert timer.collect() == {}


class Keep(Observer):
    """Keeps the run a probe is given, to be read after training."""

    def on_start(self, run):
        self.run = run


class Intervals(Observer):
    """The step timer's intervals as each generator step starts: those of every step before it, until collected."""

    def on_step_start(self, run, batch):
        self.intervals = list(run.timer.intervals)


def test_phases_of_real_steps_come_in_order_and_add_up_to_the_step(tmp_path):
    # log.every beyond the run: the timer collects only at the last step, which logs, so every interval of the
    # steps before it is still there as the last one starts.
    cfg = compose_config("debug=tiny", "trainer.enable_progress_bar=false", "log.every=1000", "model.width=32",
                         "data.batch_size=64", run_dir=tmp_path)
    probe = Intervals()
    train(cfg, probes=[probe])
    names = [name for name, _, _ in probe.intervals]
    steps = cfg.trainer.max_steps - 1
    assert names == ONE_STEP * steps
    assert set(names) == set(NAMES)
    for k in range(steps):
        intervals = probe.intervals[k * len(ONE_STEP):(k + 1) * len(ONE_STEP)]
        # In order, none overlapping the next ...
        assert all(end <= next_start for (_, _, end), (_, next_start, _) in zip(intervals, intervals[1:]))
        # ... and together they cover the step, from the wait for its data to the end of its callbacks.
        step_time = intervals[-1][2] - intervals[0][1]
        phases_time = sum(end - start for _, start, end in intervals)
        assert phases_time == pytest.approx(step_time, rel=0.10)


def test_timing_scalars_and_dashboard_reach_tensorboard(digits_run):
    events = read_events(digits_run / "tensorboard")
    tags = set(events.Tags()["scalars"])
    expected = {f"time/{phase}_ms" for phase in NAMES} | {"time/step_ms", "perf/g_steps_per_s",
                                                           "perf/images_per_s", "perf/peak_memory_mb"}
    assert expected <= tags
    steps = [e.step for e in events.Scalars("time/step_ms")]
    assert steps == [e.step for e in events.Scalars("loss/d")]  # logged with the losses, every log.every
    step_ms = [e.value for e in events.Scalars("time/step_ms")]
    per_phase = [sum(events.Scalars(f"time/{p}_ms")[i].value for p in NAMES) for i in range(len(steps))]
    assert all(0 < phases <= total * 1.10 for phases, total in zip(per_phase, step_ms))
    images = [e.value for e in events.Scalars("perf/images_per_s")]
    g_steps = [e.value for e in events.Scalars("perf/g_steps_per_s")]
    assert images == pytest.approx([16 * s for s in g_steps], rel=1e-5)  # debug=tiny: batch 16


def test_timing_can_be_switched_off(tmp_path):
    cfg = compose_config("debug=tiny", "trainer.enable_progress_bar=false", "timing.enabled=false",
                         "trainer.max_steps=2", run_dir=tmp_path)
    keep = Keep()
    train(cfg, probes=[keep])
    assert keep.run.timer.intervals == []
    assert not any(t.startswith(("time/", "perf/")) for t in read_events(tmp_path / "tensorboard").Tags()["scalars"])


# --- CUDA: events, sync mode, no sync in the hot path, device-ready data ---------------------------------------

@needs_cuda
def test_cuda_events_agree_with_synchronized_timing():
    x = torch.randn(2048, 2048, device="cuda")
    totals = {}
    for sync in (False, True):
        timer = PhaseTimer(sync=sync, device="cuda")
        for _ in range(3):
            with StepPhases(timer).phase("g_forward"):
                for _ in range(10):
                    x @ x
        totals[sync] = timer.collect()["g_forward"]
    assert totals[False] == pytest.approx(totals[True], rel=0.25)


def fit_on_gpu(tmp_path, steps: int, probes: list, *overrides: str):
    """The real loop on one GPU, with no logging, sampling or checkpoint step inside the run (phases timed
    with CUDA events)."""
    cfg = compose_config("debug=tiny", "audit=false", "log.every=1000", "log.sample_every=1000",
                         "checkpoint.every=1000", "trainer.accelerator=gpu", "trainer.enable_progress_bar=false",
                         f"trainer.max_steps={steps}", *overrides, run_dir=tmp_path)
    return train(cfg, probes=probes).module


@needs_cuda
@pytest.mark.parametrize("overrides", [(), ("augment=ada",), ("experiment=ring",), ("loss=wgan_gp",)])
def test_a_training_step_on_cuda_never_waits_for_the_device(tmp_path, overrides):
    """No step of a run that does not log makes the host wait for the GPU, the non-finite guard included
    (it skips bad updates on the device and is read at logging steps only). While the debug mode is "warn",
    torch warns of every sync; augmentation, R1 and the gradient penalty included. (The same property is
    counted on any machine by tests/test_host_reads.py.)"""
    import warnings

    class SyncDebug(Observer):
        def on_step_start(self, *args):
            torch.cuda.set_sync_debug_mode("warn")

        def on_step_end(self, *args):
            torch.cuda.set_sync_debug_mode("default")

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = fit_on_gpu(tmp_path, 4, [SyncDebug()], *overrides)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
    assert module.counters.g == 4 and syncs == []


@needs_cuda
def test_tensor_datasets_are_indexed_on_the_gpu(tmp_path):
    devices = []

    class Devices(Observer):
        def on_step_start(self, run, batch):
            devices.append(batch[0].device.type)

    fit_on_gpu(tmp_path, 2, [Devices()], "experiment=ring")
    assert devices == ["cuda", "cuda"]


def test_under_the_pytorch_profiler_each_phase_is_a_labelled_range(tmp_path):
    phases = StepPhases(PhaseTimer())
    phases.profiled = True
    with torch.profiler.profile() as profile, phases.phase("d_optimizer"):
        torch.ones(3).sum()
    assert "gan/d_optimizer" in {event.name for event in profile.events()}
    cfg = compose_config("debug=tiny", "trainer.enable_progress_bar=false", "trainer.profiler=pytorch",
                         "trainer.max_steps=2", run_dir=tmp_path)
    train(cfg)
    trace = (tmp_path / "profile" / "rank0" / "trace.json").read_text()
    assert all(f'"gan/{phase}"' in trace for phase in NAMES if phase not in ("data", "callbacks"))
    assert "gan_step" not in trace and (tmp_path / "profile" / "rank0" / "operators.txt").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the claim is about machines without a GPU")
def test_the_prepared_gpu_checks_stop_at_once_without_a_gpu(tmp_path):
    """benchmarks/cuda_checks.sh, the one command a lent GPU runs, says there is no GPU, exits 3 and runs nothing."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(root / "benchmarks" / "cuda_checks.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "need a GPU" in done.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_the_step_benchmark_alternates_blocks_of_the_run_and_the_bare_loop(tmp_path):
    """benchmarks/step.py (a): after the run's warm-up steps, each block of its generator steps is followed by as
    many bare steps, so that each pair is measured within the same second of a shared machine."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import step as bench

    order: list[str] = []

    class Steps(Observer):
        def on_step_end(self, run):
            order.append("run")

    probe = bench.Interleaved(lambda: order.append("bare"), 3, torch.device("cpu"))
    cfg = bench.compose_train("debug=tiny", "experiment=ring", f"trainer.max_steps={bench.WARMUP + 2 * 3}",
                              run_dir=tmp_path / "run")
    train(cfg, [Steps(), probe])
    warmup = ["run"] * bench.WARMUP + ["bare"] * 3  # the first bare block is not counted either
    assert order == warmup + (["run"] * 3 + ["bare"] * 3) * 2
    assert len(probe.framework) == len(probe.bare) == 2 and min(probe.framework + probe.bare) > 0
