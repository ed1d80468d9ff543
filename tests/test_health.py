"""Training health (gan/core/health.py, gan/training/health.py): each condition fires on a constructed case and
stays silent on its healthy twin; the check changes nothing in training; its figures reach TensorBoard, the log,
health.json and evaluate.py's metrics.json; health.action=stop stops with a checkpoint that resumes exactly."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from conftest import TINY, compose_config, run_main, run_train
from test_resume import assert_identical

from gan.core.health import CONDITIONS, HealthJudge, loss_ratio, separation, spread
from gan.core.losses import LOSSES
from gan.errors import UNHEALTHY
from gan.training.health import FILE
from gan.training.loop import train


def test_separation_is_half_for_alike_scores_and_one_for_scores_apart():
    torch.manual_seed(0)
    a, b = torch.randn(500), torch.randn(500)
    assert abs(float(separation(a, b)) - 0.5) < 0.05  # the same distribution: a coin flip
    assert float(separation(a + 100, b)) == 1.0  # every score of a above every one of b
    assert float(separation(b, a + 100)) == 0.0
    assert float(separation(torch.ones(4), torch.ones(3))) == 0.5  # ties count half


@pytest.mark.parametrize("name", [n for n, loss in LOSSES.items() if loss.chance is not None])
def test_each_losss_chance_is_ds_loss_at_its_best_constant_output_and_the_ratio_falls_as_d_tells(name):
    loss = LOSSES[name]
    constants = torch.linspace(-3, 3, 601)  # D says the same of every input: it cannot tell real from fake
    at_constants = torch.stack([loss.d(c.expand(8), c.expand(8)) for c in constants])
    assert float(at_constants.min()) == pytest.approx(loss.chance, rel=1e-4)
    best = float(constants[at_constants <= at_constants.min() + 1e-6].mean())  # the middle of the best constants
    torch.manual_seed(0)
    real, fake = best + 0.01 * torch.randn(256), best + 0.01 * torch.randn(256)
    assert 0.9 < float(loss_ratio(loss, real, fake)) < 1.1  # unsure: about its value at chance
    assert float(loss_ratio(loss, real + 0.3, fake - 0.3)) < 0.9  # leaning the right way: lower
    # Telling them apart with confidence, on its own scale (a logit's, a hinge's margin, least squares' targets):
    margin = 0.5 if name == "lsgan" else 8.0
    assert float(loss_ratio(loss, real + margin, fake - margin)) < 0.01


def test_spread_is_zero_for_copies_and_scales_with_the_samples():
    torch.manual_seed(0)
    x = torch.randn(64, 1, 8, 8)
    assert float(spread(x[:1].expand(64, -1, -1, -1))) == 0.0
    assert float(spread(3 * x)) == pytest.approx(3 * float(spread(x)), rel=1e-5)


def healthy_figures() -> dict[str, float]:
    """A check of a run that trains well: D unsure, the same on training and held-out images, samples as
    spread as real ones, nothing growing."""
    return {"d_loss_ratio": 0.9, "d_memorisation": 0.52, "diversity": 0.95, "blowup": 0.3}


@pytest.mark.parametrize("condition", CONDITIONS, ids=lambda c: c.name)
def test_each_condition_starts_on_the_median_of_its_last_checks_and_ends_with_it(condition):
    bad_value = condition.threshold + (0.005 if condition.above else -0.05)
    judge, twin = HealthJudge(start=300, patience=3), HealthJudge(start=300, patience=3)
    # Bad until 1000, but for one good check at 500; a lone bad check at 1300.
    bad_at = {*range(100, 1000, 100), 1300} - {500}
    started, ended = [], []
    for step in range(100, 1600, 100):
        figures = healthy_figures() | ({condition.figure: bad_value} if step in bad_at else {})
        s, e = judge.judge(step, figures)
        started += [(x.condition, step) for x in s]
        ended += [(x.condition, step) for x in e]
        assert twin.judge(step, healthy_figures()) == ([], [])
    # Not before 300 (health.start) though bad since 100; the good check at 500 does not end it; two of the three
    # checks 1000, 1100 good end it at 1100; the lone bad check at 1300 starts nothing.
    assert started == [(condition.name, 300)]
    assert ended == [(condition.name, 1100)]
    assert twin.events == []


def test_a_non_finite_figure_starts_divergence_at_once():
    judge = HealthJudge(start=0, patience=5)
    started, _ = judge.judge(100, healthy_figures() | {"blowup": math.inf})
    assert [e.condition for e in started] == ["divergence"]


def test_blowup_counts_orders_of_magnitude_above_the_lowest_level_held_since_start():
    judge = HealthJudge(start=300, patience=3)
    scales = {"grad_norm/g": 0.2, "grad_norm/d": 5.0, "d/real_running": 1.0, "d/fake_running": -1.0,
              "train/skipped_d": 0.0, "train/skipped_g": 0.0}
    # Before start: not measured (a run's first gradients are no level to hold).
    assert judge.blowup(100, scales | {"grad_norm/d": 5e6}) == 0.0
    for step in (300, 400, 500):
        assert judge.blowup(step, scales) < 1e-9  # steady: nothing grows
    assert judge.blowup(600, scales | {"grad_norm/d": 5e3}) == pytest.approx(3.0)  # 5 held -> 5,000
    assert judge.blowup(700, scales | {"grad_norm/g": 50.0}) == pytest.approx(math.log10(50))  # above 1, not 0.2
    assert judge.blowup(800, scales | {"train/skipped_d": 1.0}) == math.inf  # an update skipped since the last check
    assert judge.blowup(900, scales | {"train/skipped_d": 1.0}) < 1e-9  # ... and no other since
    assert judge.blowup(1000, scales | {"loss/d": math.nan}) == math.inf


def test_the_judges_state_goes_through_a_checkpoint():
    judge = HealthJudge(start=0, patience=2)
    for step in (100, 200):
        judge.judge(step, healthy_figures() | {"diversity": 0.01})
    judge.blowup(300, {"grad_norm/g": 1.0})
    saved = torch.load(save(judge.state_dict()), weights_only=True)
    again = HealthJudge(start=0, patience=2)
    again.load_state_dict(saved)
    assert again.state_dict() == judge.state_dict()
    assert list(again.on) == ["collapse"]


def save(state, path=None):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


HEALTH_EVERY = ["health.every=2", "health.start=0", "health.patience=1", "log.every=1000", "log.sample_every=1000"]


def test_the_check_changes_nothing_in_training(tmp_path):
    """On, at every second step, or off: the same weights, buffers, optimizer state and random streams."""
    common = [*TINY, "augment=ada", "augment.interval=1", "trainer.max_steps=6", "checkpoint.every=1000"]
    on = compose_config(*common, *HEALTH_EVERY, "data.limit=40", run_dir=tmp_path / "on")
    off = compose_config(*common, "health.enabled=false", "data.limit=40", run_dir=tmp_path / "off")
    train(on), train(off)
    a, b = (torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=True) for name in ("on", "off"))
    for key in ("state_dict", "optimizer_states", "rng"):
        assert_identical(a[key], b[key], key)
    assert a["health"]["recent"]["d_wins"]  # the check really ran: it kept its figures
    assert b["health"] == {}


def test_the_figures_reach_tensorboard_the_summary_and_evaluate(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    # data.limit: images D never trains on exist, so D's memorisation is measured too.
    assert run_train(run, *HEALTH_EVERY, "trainer.max_steps=4", "data.limit=40") == 0
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    for figure in ("d_loss_ratio", "d_memorisation", "diversity", "blowup"):
        assert [e.step for e in events.Scalars(f"health/{figure}")] == [2, 4]
    assert "health/text_summary" in events.Tags()["tensors"]  # the conditions met, at the end
    # Each start and end as it happens: a tiny run's first checks, judged from step 0, look ill.
    assert "health/events/text_summary" in events.Tags()["tensors"]
    summary = json.loads((run / FILE).read_text())
    assert summary["memorisation_watched"] is True and summary["stopped_by"] is None
    assert run_main("evaluate", f"run_dir={run}", "num_samples=16", "num_real=16", "classifier_steps=1") == 0
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert metrics["health"] == summary["conditions"]


def test_d_wins_fires_on_a_d_trained_much_faster_and_not_on_the_healthy_twin(tmp_path):
    """Five D updates a step at a high rate under the saturating loss, no penalty: D's loss falls under 0.033 of
    chance at every check of ten steps, a third of the threshold and less; the twin, the recipe as it is, stays at
    0.51 and above (seeds 0-2, 1 and 2 threads, on an AMD EPYC)."""
    common = [*TINY, *HEALTH_EVERY, "trainer.max_steps=10", "audit=false"]
    train(compose_config(*common, "loss=minimax", "reg=none", "augment=none", "loss.d_steps=5", "optim.d.lr=0.01",
                         run_dir=tmp_path / "broken"))
    train(compose_config(*common, run_dir=tmp_path / "twin"))
    met = {run: [e["condition"] for e in json.loads((tmp_path / run / FILE).read_text())["conditions"]]
           for run in ("broken", "twin")}
    assert "d_wins" in met["broken"] and "d_wins" not in met["twin"]


def test_a_wasserstein_critic_is_not_judged_on_its_loss_and_the_log_says_so(tmp_path, caplog):
    """Its loss has no value at chance to fall from: d_wins is not watched, which the log says once."""
    with caplog.at_level(logging.INFO, logger="gan.training.health"):
        train(compose_config(*TINY, *HEALTH_EVERY, "loss=wgan_gp", "trainer.max_steps=2", run_dir=tmp_path / "run"))
    assert caplog.text.count("health: d_wins is not watched") == 1
    recent = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["health"]["recent"]
    assert recent["d_wins"] == [] and recent["collapse"]  # the other figures were checked


def test_divergence_fires_on_non_finite_updates_and_not_on_the_healthy_twin(tmp_path, caplog):
    """A learning rate far too high makes the updates non-finite; skipped, they are counted, and the check says
    so at its next check. The twin, at the recipe's rate, is silent."""
    common = [*TINY, *HEALTH_EVERY, "trainer.max_steps=6", "train.skip_nonfinite=true", "audit=false"]
    with caplog.at_level(logging.WARNING, logger="gan.training.health"):
        train(compose_config(*common, "optim.d.lr=1e30", "optim.g.lr=1e30", run_dir=tmp_path / "broken"))
    assert "health: divergence at generator step 2" in caplog.text
    train(compose_config(*common, run_dir=tmp_path / "twin"))
    # (A tiny run's first steps may well look like other conditions, which health.start leaves unjudged.)
    met = json.loads((tmp_path / "twin" / FILE).read_text())["conditions"]
    assert "divergence" not in [e["condition"] for e in met]


def test_the_stop_action_saves_a_checkpoint_that_resumes_exactly(tmp_path, capsys):
    # Judged from the first check, a tiny run's first samples are alike (an untrained G's are): collapse.
    broken = ["trainer.max_steps=8", "checkpoint.every=1000", *HEALTH_EVERY]
    assert run_train(tmp_path / "straight", *broken) == 0  # warn: trains on to the end
    assert run_train(tmp_path / "stopped", *broken, "health.action=stop") == UNHEALTHY
    error = capsys.readouterr().err.strip().splitlines()
    stopped_by = json.loads((tmp_path / "stopped" / FILE).read_text())["stopped_by"]
    assert len(error) == 1 and f"generator step 2: {stopped_by} since step 2" in error[0]
    assert "health.action=warn" in error[0]
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"] == 2
    # As the line advises: the same overrides, the checkpoint, health.action=warn.
    assert run_train(tmp_path / "stopped", *broken, f"ckpt_path={last}", "health.action=warn") == 0
    straight = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = torch.load(last, weights_only=True)
    for key in ("state_dict", "optimizer_states", "rng", "health"):
        assert_identical(straight[key], resumed[key], key)


def test_an_unknown_action_is_refused_in_one_line_and_its_advice_trains(tmp_path, capsys):
    assert run_train(tmp_path / "run", "health.action=halt") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "use health.action=warn (a line in the log) or health.action=stop" in error[0]
    assert not (tmp_path / "run").exists()
    assert run_train(tmp_path / "run", "health.action=stop") == 0  # as advised (a tiny run: no check is due)



def test_held_out_data_is_what_the_run_never_trains_on():
    from omegaconf import OmegaConf

    from gan.data.datasets import build_dataset, held_out

    def data(*overrides: str) -> dict:
        return OmegaConf.to_container(compose_config(*overrides).data, resolve=True)

    few = data("data.limit=40", "data.classes=[3,5]")
    trained, held = build_dataset(few, 0).tensors, held_out(few, 0).tensors
    both = build_dataset({**few, "limit": None}, 0).tensors  # every image of classes 3 and 5
    assert len(trained[0]) == 40 and len(trained[0]) + len(held[0]) == len(both[0])
    assert set(held[1].tolist()) == {3, 5}
    rows = {tuple(x.flatten().tolist()) for x in trained[0]}
    assert not any(tuple(x.flatten().tolist()) in rows for x in held[0])
    ring = data("data=ring")
    assert not torch.equal(build_dataset(ring, 0).tensors[0], held_out(ring, 0).tensors[0])  # a fresh draw
    assert held_out(data(), 0) is None  # every image of the digits trains


def test_the_other_split_is_held_out_where_its_files_are_there(tmp_path):
    from omegaconf import OmegaConf
    from test_data import make_mnist_split

    from gan.data.datasets import build_dataset, held_out

    raw = tmp_path / "MNIST" / "raw"
    make_mnist_split(raw, "train", 30, seed=1)
    cfg = OmegaConf.to_container(compose_config("data=mnist", f"data.root={tmp_path}").data, resolve=True)
    assert held_out(cfg, 0) is None  # the test split is not there, and nothing is downloaded for it
    test_images, _ = make_mnist_split(raw, "t10k", 20, seed=2)
    held = held_out(cfg, 0).tensors[0]
    assert len(held) == 20 and torch.equal(held, build_dataset({**cfg, "split": "test"}, 0).tensors[0])
    stacked = OmegaConf.to_container(compose_config("data=stacked_mnist", f"data.root={tmp_path}",
                                                    "data.num_stacks=50").data, resolve=True)
    assert len(held_out(stacked, 0)) == 50  # stacks of the test split's digits
