"""trainer=ddp on two CPU processes (gloo): G and D wrapped as two DDP modules, every rank's state equal.

Each run is tests/ddp_ranks.py -- train.py with a callback that saves what each rank saw and holds -- started
as a user starts train.py, so Fabric's launcher starts rank 1 by running the same command again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, compose_config, read_events
from filelock import FileLock

from gan.core.augment import Augment
from gan.core.state import RunningMean
from gan.errors import ConfigError
from gan.training.checks import validate

BATCH, STEPS, RANKS = 16, 6, 2  # debug=tiny's batch and steps
# ADA adjusts p at step 4 (by 32 images x 4 steps / 640 = 0.2) and is halfway to its next adjustment at the
# end, so its sign accumulators are not empty; R1 differentiates D twice under DDP; metrics and health checks at
# steps 3 and 6.
OVERRIDES = [*TINY, "trainer.accelerator=cpu", f"trainer.devices={RANKS}", "reg=r1", "augment=ada", "augment.p=0.5",
             "augment.interval=4", "augment.speed_images=640", "eval.every=3", "eval.num_samples=64",
             "eval.classifier_steps=5", "health.every=3", "health.start=0"]


def train_on_two_ranks(run_dir: Path, trainer: str) -> list[dict]:
    """tests/ddp_ranks.py with ``trainer=<trainer>``; returns each rank's record, rank 0 first, and keeps what the
    command printed in ``<run_dir>/stdout.txt``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's gan package in both ranks
    out = subprocess.run([sys.executable, "tests/ddp_ranks.py", f"trainer={trainer}", *OVERRIDES,
                          f"hydra.run.dir={run_dir}", f"eval.cache_dir={run_dir.parent / 'feature_cache'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir / "stdout.txt").write_text(out.stdout)
    return records(run_dir)


def records(run_dir: Path) -> list[dict]:
    return [torch.load(run_dir / "ranks" / f"rank{r}.pt", weights_only=False) for r in range(RANKS)]


@pytest.fixture(scope="session")
def separate_ddp(tmp_path_factory, worker_id) -> tuple[Path, list[dict]]:
    """One two-rank run for the whole session: the first pytest-xdist worker to need it trains it, in the session's
    shared temporary directory, and the other reads it. (pytest-xdist's --dist loadgroup would keep these tests in
    one worker, but it groups nothing under pytest 9.2: pytest-dev/pytest-xdist#1386.)"""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker_id != "master" else base  # a worker's basetemp sits in the session's
    run_dir = shared / "ddp" / "separate"
    with FileLock(str(shared / "ddp.lock")):
        if (run_dir / "stdout.txt").is_file():
            return run_dir, records(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        return run_dir, train_on_two_ranks(run_dir, "ddp")


def test_separate_ddp_keeps_every_rank_equal(separate_ddp):
    run_dir, ranks = separate_ddp
    rank0, rank1 = ranks
    # G and D each in their own DistributedDataParallel, without the unused-parameter search or a buffer
    # broadcast at every forward.
    for record in ranks:
        assert record["wrappers"] == {"G": ("DistributedDataParallel", False, False),
                                      "D": ("DistributedDataParallel", False, False)}

    # Each rank trains on its own real batches and its own noise ...
    for step in range(STEPS):
        assert not torch.equal(rank0["batches"][step], rank1["batches"][step])
        assert not torch.equal(rank0["noise"][step], rank1["noise"][step])
    # ... yet ends with the same state, bit for bit: G's, D's and the EMA's weights and buffers (BatchNorm's
    # running statistics among them), the running means, ADA's p and sign sums, the counters.
    final = rank0["final"]
    assert final.keys() == rank1["final"].keys()
    assert [k for k in final if not torch.equal(final[k], rank1["final"][k])] == []
    trained = [k for k in final if k.startswith(("G.", "D.")) and not torch.equal(final[k], rank0["initial"][k])]
    assert any(".running_mean" in k for k in trained) and any(k.endswith(".weight") for k in trained)
    assert int(final["counters.g_updates"]) == int(final["counters.d_updates"]) == STEPS
    assert int(final["counters.images_seen"]) == STEPS * BATCH * RANKS  # each rank its share of a global batch
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert [k for k in final if not torch.equal(final[k], saved[k])] == []  # rank 0 saved what every rank holds
    assert (run_dir / "stdout.txt").read_text().count(f"Run finished: {STEPS} generator steps") == 1  # rank 0 alone

    # The statistics follow the outputs of D on every rank's batch: each step's D forwards are on real
    # images, then on the detached fakes (the D update), then on the fakes again (the G update).
    real = [torch.cat([record["d_outputs"][step][0] for record in ranks]) for step in range(STEPS)]
    fake = [torch.cat([record["d_outputs"][step][1] for record in ranks]) for step in range(STEPS)]
    real_mean, fake_mean = RunningMean(), RunningMean()
    ada = Augment(["translation"], p=0.5, adaptive=True, interval=4, speed_images=640)
    for step in range(STEPS):
        real_mean.update(real[step].mean())
        fake_mean.update(fake[step].mean())
        ada.accumulate(real[step])
        if (step + 1) % ada.interval == 0:
            ada.adjust(BATCH * RANKS)
    assert torch.allclose(final["objective.d_real_mean.value"], real_mean.value)
    assert torch.allclose(final["objective.d_fake_mean.value"], fake_mean.value)
    assert final["objective.augment.p"] == ada.p != 0.5
    assert final["objective.augment.sign_sum"] == ada.sign_sum
    assert final["objective.augment.sign_count"] == ada.sign_count == 2 * BATCH * RANKS  # steps 5 and 6, both ranks


def test_find_unused_fallback_trains_bit_identically(request, tmp_path):
    """trainer=ddp_find_unused: each network's DDP searches for unused parameters after every forward and
    broadcasts rank 0's buffers at each; the same run ends in exactly the same state."""
    ranks = train_on_two_ranks(tmp_path / "find_unused", "ddp_find_unused")
    for record in ranks:
        assert record["wrappers"] == {"G": ("DistributedDataParallel", True, True),
                                      "D": ("DistributedDataParallel", True, True)}
    # Asked for only now: while this run trained, the other worker may have been training separate_ddp.
    separate = request.getfixturevalue("separate_ddp")[1][0]["final"]
    assert [k for k in separate if not torch.equal(separate[k], ranks[0]["final"][k])] == []


def test_a_rank_that_fails_alone_ends_the_ranks_it_started(tmp_path):
    """Rank 0 raises at its second step while rank 1 waits for it in that step's first collective: rank 0 kills
    the process Fabric's launcher started for rank 1, rather than leave it waiting out the collective's timeout
    (gloo's: 30 minutes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK0_FAILS_AT": "2"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "tests/ddp_ranks.py", "trainer=ddp", *TINY, "trainer.accelerator=cpu",
                          f"trainer.devices={RANKS}", "eval.every=0", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode != 0 and "rank 0 fails alone" in out.stderr
    assert time.monotonic() - started < 120
    left = subprocess.run(["pgrep", "-f", f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True)
    assert left.stdout.split() == []  # no rank left behind


def test_rank_0s_health_check_stops_every_rank_at_the_same_step(tmp_path):
    """health.action=stop under DDP: rank 0 alone judges (here, early: a tiny run's first samples are off the data,
    judged once they stop improving); the ranks agree at the check's step, both save nothing but rank 0's last.ckpt
    of that step, and the command ends with the health check's exit code and its one line."""
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "train.py", "trainer=ddp", *TINY, "trainer.accelerator=cpu",
                          f"trainer.devices={RANKS}", "eval.every=0", "trainer.max_steps=6", "health.action=stop",
                          "health.every=2", "health.start=0", "health.patience=1", f"hydra.run.dir={run}"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 3, out.stderr[-2000:]
    stopped = re.search(r"stopped by its health check at generator step (\d+)", out.stderr)
    assert stopped and int(stopped[1]) < 6  # before the run's end
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert int(saved["state_dict"]["counters.g_updates"]) == int(stopped[1])  # the step the ranks agreed on
    left = subprocess.run(["pgrep", "-f", f"hydra.run.dir={run}"], capture_output=True, text=True)
    assert left.stdout.split() == []  # no rank left behind


# After the tests that train their own runs: under pytest-xdist, a test dealt to the other worker while the first
# trains separate_ddp would wait for it, idle.
def test_samples_and_metrics_are_made_once(separate_ddp):
    run_dir, (rank0, rank1) = separate_ddp
    # The EMA generator samples on rank 0 only: a grid, a metrics evaluation (64 samples, one forward) and the
    # health check's samples at steps 3 and 6.
    assert (rank0["ema_forwards"], rank1["ema_forwards"]) == (6, 0)
    events = read_events(run_dir / "tensorboard")
    assert [e.step for e in events.Scalars("health/diversity")] == [3, 6]
    assert (run_dir / "health.json").is_file()
    assert [e.step for e in events.Images("samples/grid")] == [3, 6]
    assert [e.step for e in events.Scalars("metrics/fid")] == [3, 6]
    assert [e.step for e in events.Scalars("loss/g")] == list(range(1, STEPS + 1))
    assert sorted(p.name for p in (run_dir / "samples").iterdir()) == ["step_000003.png", "step_000006.png"]


def test_plain_ddp_and_cpu_sync_batchnorm_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="use trainer=ddp .*ddp_separate.* or trainer=ddp_find_unused"):
        validate(compose_config("trainer.strategy=ddp"))
    with pytest.raises(ConfigError, match="trainer.sync_batchnorm=true needs CUDA"):
        validate(compose_config("trainer=ddp", "trainer.accelerator=cpu", "trainer.sync_batchnorm=true"))
