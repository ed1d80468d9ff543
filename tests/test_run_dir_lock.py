"""One run, one directory (gan/run/hold.py): a running train.py holds its run directory; a second train.py or the
Python API that would write there is refused in one line naming the holder, and writes nothing; an evaluation scores
a live run's checkpoint, writing its eval/ alone; a run killed outright (SIGKILL) holds nothing, and a finished one
releases its hold. Real processes, real locks."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, TINY, run_main, run_train
from omegaconf import OmegaConf

import gan
from gan.errors import ConfigError
from gan.run.hold import FILE, HELD, holding

# A run that trains until it is killed, with a checkpoint every 2 generator steps.
ENDLESS = [*TINY, "trainer.max_steps=100000", "checkpoint.every=2", "log.sample_every=1000"]


def held_by(pid: int, doing: str) -> str:
    """The start of the refusal's line for a run held by process ``pid``."""
    return f" is in use: pid {pid} on {socket.gethostname()} has been {doing} there since "


def wait_for(path, process: subprocess.Popen, why: str) -> None:
    """Until ``path`` exists, while ``process`` runs (at most two minutes); else fail with ``why``."""
    deadline = time.time() + 120
    while not path.exists():
        assert process.poll() is None and time.time() < deadline, why
        time.sleep(0.02)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_running_run_refuses_another_writer_and_a_killed_one_holds_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.ckpt"
    first = subprocess.Popen([sys.executable, "train.py", *ENDLESS, f"hydra.run.dir={run}"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(run / FILE, first, "train.py did not hold its run")
        wait_for(last, first, "training did not reach step 2")
        holder = json.loads((run / FILE).read_text())
        assert (holder["pid"], holder["doing"]) == (first.pid, "training")
        config = (run / ".hydra" / "config.yaml").read_bytes()
        # A second train.py into the same directory, with another seed: refused before Hydra writes .hydra/.
        assert run_train(run, "seed=1") == 2
        line = one_line(capsys.readouterr().err)
        assert re.fullmatch(rf"error: {re.escape(str(run) + held_by(first.pid, 'training'))}\S+ \S+ "
                            r"\(python train\.py debug=tiny .*\); "
                            r"wait until it ends, or train into another hydra\.run\.dir", line), line
        # Meanwhile, in this process: the Python API's training is refused the same way.
        with pytest.raises(ConfigError, match=re.escape(held_by(first.pid, "training"))):
            gan.train(*TINY, "seed=1", run_dir=run)
        assert (run / ".hydra" / "config.yaml").read_bytes() == config  # the first run's, seed 0
        assert OmegaConf.load(run / ".hydra" / "config.yaml").seed == 0
        # evaluate.py scores the live run's checkpoint, holding its eval/ alone; a snapshot, which would sit beside the
        # generator.pt the run writes at its end, is refused in one line, before anything is written.
        assert run_main("evaluate", f"run_dir={run}", "snapshot=true") == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith(f"error: snapshot=true: {run} is still training (pid {first.pid} on ")
        assert line.endswith("drop snapshot=true to score its checkpoint now, or ask again once the run has ended")
        assert not (run / "eval").exists() and not (run / "generator.pt").exists()
        cache = f"cache_dir={run.parent / 'cache'}"
        assert run_main("evaluate", f"run_dir={run}", "num_samples=64", cache) == 0
        scored = json.loads((run / "eval" / "metrics.json").read_text())
        assert scored["checkpoint"] == str(last.resolve()) and scored["step"] >= 2
        assert gan.evaluate(run, "num_samples=64", cache).metrics["checkpoint"] == str(last.resolve())
        assert json.loads((run / FILE).read_text())["pid"] == first.pid  # the run's hold, as it was
        assert not (run / "eval" / FILE).exists() and not (run / "generator.pt").exists()
        assert first.poll() is None  # still training
    finally:
        first.kill()  # SIGKILL: no handler runs, the lock file stays behind, the OS drops the lock
        first.communicate()

    # The killed run's lock file is there, but its lock went with its process: the resume takes the run.
    assert json.loads((run / FILE).read_text())["pid"] == first.pid
    step = int(torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"])
    assert run_train(run, "checkpoint.every=2", "log.sample_every=1000", f"ckpt_path={last}",
                     f"trainer.max_steps={step + 1}") == 0
    assert int(torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"]) == step + 1
    # A finished run releases its hold, and removes its lock file.
    assert not (run / FILE).exists() and not HELD


def test_ranks_a_launcher_starts_do_not_hold_the_run_their_rank_0_holds(tmp_path):
    """Lightning's DDP launcher runs train.py again for ranks 1.., with LOCAL_RANK set (torchrun: RANK; SLURM:
    SLURM_PROCID): those hold nothing; a process of rank 0 is refused like any other."""
    run = tmp_path / "run"
    take = ("import sys; from pathlib import Path; from gan.run.hold import take; "
            "print(take(Path(sys.argv[1]), 'training', 'wait') is not None)")
    with holding(run, "training", "wait"):
        env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID")}
        for variables, held in [({"LOCAL_RANK": "1", "NODE_RANK": "0"}, "False"), ({"RANK": "3"}, "False"),
                                ({"LOCAL_RANK": "0", "NODE_RANK": "0"}, None), ({}, None)]:
            out = subprocess.run([sys.executable, "-c", take, str(run)], cwd=ROOT, env={**env, **variables},
                                 capture_output=True, text=True, timeout=60)
            if held is None:
                assert out.returncode == 1 and f"{held_by(os.getpid(), 'training')}" in out.stderr, variables
            else:
                assert out.returncode == 0 and out.stdout.strip() == held, (variables, out.stderr)
        assert (run / FILE).exists()
    assert not (run / FILE).exists() and not HELD
    # After this process released it, a process of its own takes it.
    out = subprocess.run([sys.executable, "-c", take, str(run)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_a_refused_run_leaves_no_directory_behind(tmp_path, capsys):
    """The hold is taken before the config's checks: a run they refuse removes the directories it made for it."""
    run = tmp_path / "new" / "run"
    assert run_train(run, "ema.decay=2") == 2
    assert "ema.decay=2" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() and not HELD


def test_an_evaluation_holds_the_run_while_it_scores_it(tmp_path, capsys):
    """evaluate.py holds the run it writes eval/ into: a resume into it meanwhile is refused; a run directory that
    is not there is not made. The evaluation trains a feature classifier for far longer than the test needs, so the
    resume meets it holding the run however fast the machine is, and is then killed."""
    with pytest.raises(ConfigError, match="is not a directory"):
        gan.evaluate(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.ckpt"
    assert run_train(run) == 0
    scoring = subprocess.Popen([sys.executable, "evaluate.py", f"run_dir={run}", "num_samples=64",
                                "classifier_steps=1000000", f"cache_dir={tmp_path / 'cache'}"], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(run / FILE, scoring, "evaluate.py ended without holding the run")
        assert run_train(run, f"ckpt_path={last}", "trainer.max_steps=7") == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith(f"error: {run}{held_by(scoring.pid, 'evaluating')}") and "python evaluate.py" in line
        assert scoring.poll() is None  # still scoring: the refusal met its hold, not a finished evaluation
    finally:
        scoring.kill()
        scoring.wait()
    assert int(torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"]) == 6  # not resumed
    assert run_train(run, f"ckpt_path={last}", "trainer.max_steps=7") == 0  # the killed evaluation holds nothing
