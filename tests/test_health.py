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
from gan.training.observer import Observer


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
    return {"d_loss_ratio": 0.9, "d_memorisation": 0.52, "diversity": 0.95, "fit": 0.97, "coverage": 0.95,
            "labels_obeyed": 0.99, "blowup": 0.3}


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
    # Bad since 100, never healthy, its first median (300) no better at 400, so judged from there (health.start has
    # passed); divergence from its first median. The good check at 500 does not end it; two of the three checks
    # 1000, 1100 good end it at 1100; the lone bad check at 1300 starts nothing.
    assert started == [(condition.name, 300 if condition.name == "divergence" else 400)]
    assert ended == [(condition.name, 1100)]
    assert twin.events == []


@pytest.mark.parametrize("condition", CONDITIONS, ids=lambda c: c.name)
def test_a_figure_is_judged_once_healthy_or_from_health_start_and_divergence_from_the_first_checks(condition):
    """A figure stuck bad is not judged before health.start; one healthy and no longer improving is, from then on
    (a relapse); divergence always is: a run can be blown up from its first step."""
    bad = condition.threshold + (0.5 if condition.above else -0.5 * condition.threshold)
    good = healthy_figures()[condition.figure]

    def started(figures: list[float]) -> list[tuple[str, int]]:
        judge = HealthJudge(start=1500, patience=3)
        return [(e.condition, step) for step, value in zip(range(100, 2000, 100), figures)
                for e in judge.judge(step, healthy_figures() | {condition.figure: value})[0]]

    first = 300 if condition.name == "divergence" else 1500
    assert started([bad] * 19) == [(condition.name, first)]  # never healthy: from health.start
    # Healthy at 300 (the first median of three), bad from 700: the median of three is bad at 800.
    assert started([good] * 6 + [bad] * 13) == [(condition.name, 800)]


@pytest.mark.parametrize("condition", [c for c in CONDITIONS if c.name != "divergence"], ids=lambda c: c.name)
def test_a_figure_still_improving_is_not_judged_until_it_stops(condition):
    """A run still learning past health.start -- its figure bad, but better at every check -- is not judged; once
    its figure stops improving, bad, it is."""
    def toward(k: int) -> float:  # bad at every check k, and closer to the threshold at each
        return condition.threshold * (1 + 0.2 * (1 - k / 15) if condition.above else 0.1 + 0.05 * k)

    judge, started = HealthJudge(start=300, patience=3), []
    for k, step in enumerate(range(100, 2000, 100), start=1):
        figures = healthy_figures() | {condition.figure: toward(min(k, 15))}
        started += [(e.condition, step) for e in judge.judge(step, figures)[0]]
    # Medians better at every check through 1600 (the last of them the first whole window at toward(15)); at 1700
    # the median is the same as at 1600.
    assert started == [(condition.name, 1700)]


def test_a_non_finite_figure_starts_divergence_at_once():
    judge = HealthJudge(start=0, patience=5)
    started, _ = judge.judge(100, healthy_figures() | {"blowup": math.inf})
    assert [e.condition for e in started] == ["divergence"]


def test_blowup_counts_orders_of_magnitude_above_the_lowest_level_held_since_start():
    judge = HealthJudge(start=300, patience=3)
    scales = {"grad_norm/g": 0.2, "grad_norm/d": 5.0, "d/real_running": 1.0, "d/fake_running": -1.0,
              "train/skipped_d": 0.0, "train/skipped_g": 0.0}
    # Before start: no level held to grow from (a run's first gradients are none) ...
    assert judge.blowup(100, scales | {"grad_norm/d": 5e6}) == 0.0
    # ... but sizes no training run reaches count from the first check: D's loss at 10^9 times chance, D's outputs
    # at 10^7 (five orders past 100).
    assert judge.blowup(100, scales | {"health/d_loss_ratio": 1e9}) == pytest.approx(9.0)
    assert judge.blowup(200, scales | {"d/fake_running": -1e7}) == pytest.approx(5.0)
    for step in (300, 400, 500):
        assert judge.blowup(step, scales) < 1e-9  # steady: nothing grows
    assert judge.blowup(600, scales | {"grad_norm/d": 5e3}) == pytest.approx(3.0)  # 5 held -> 5,000
    assert judge.blowup(700, scales | {"grad_norm/g": 50.0}) == pytest.approx(math.log10(50))  # above 1, not 0.2
    assert judge.blowup(800, scales | {"train/skipped_d": 1.0}) == math.inf  # an update skipped since the last check
    assert judge.blowup(900, scales | {"train/skipped_d": 1.0}) < 1e-9  # ... and no other since
    assert judge.blowup(1000, scales | {"loss/d": math.nan}) == math.inf


def test_the_judges_state_lives_in_buffers_that_go_through_a_checkpoint():
    judge = HealthJudge(start=0, patience=2)
    for step in (100, 200, 300, 400):
        judge.judge(step, healthy_figures() | {"diversity": 0.01})
    judge.blowup(500, {"grad_norm/g": 1.0})
    assert {name for name, _ in judge.named_buffers()} == set(judge.state_dict())  # nothing kept beside them
    saved = torch.load(save(judge.state_dict()), weights_only=True)
    again = HealthJudge(start=0, patience=2)
    again.load_state_dict(saved)
    for name, value in judge.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], value, equal_nan=True, rtol=0, atol=0)
    assert list(again.on) == ["collapse"] and again.events == judge.events
    # A resume with a longer patience keeps each window's newest checks: the condition stays on, its figures too.
    longer = HealthJudge(start=0, patience=3)
    longer.load_state_dict(saved)
    assert list(longer.on) == ["collapse"]
    kept = longer.history[[c.name for c in CONDITIONS].index("collapse")].tolist()
    assert math.isnan(kept[0]) and kept[1:] == [0.01, 0.01]


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
    assert not a["health"]["history"].isnan().all()  # the check really ran: it kept its figures
    assert b["health"] == {}


def test_the_figures_reach_tensorboard_the_summary_and_evaluate(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    # data.limit: images D never trains on exist, so D's memorisation is measured too.
    assert run_train(run, *HEALTH_EVERY, "trainer.max_steps=4", "data.limit=40") == 0
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    for figure in ("d_loss_ratio", "d_memorisation", "diversity", "fit", "coverage", "blowup"):
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
    history = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["health"]["history"]
    names = [c.name for c in CONDITIONS]
    assert history[names.index("d_wins")].isnan().all()
    assert not history[names.index("collapse")].isnan().all()  # the other figures were checked


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
    # Judged once a figure stops improving, a tiny run's first samples are off the data (an untrained G's are).
    broken = ["trainer.max_steps=8", "checkpoint.every=1000", *HEALTH_EVERY]
    assert run_train(tmp_path / "straight", *broken) == 0  # warn: trains on to the end
    assert run_train(tmp_path / "stopped", *broken, "health.action=stop") == UNHEALTHY
    error = capsys.readouterr().err.strip().splitlines()
    said = json.loads((tmp_path / "stopped" / FILE).read_text())
    at = next(c["started"] for c in said["conditions"] if c["condition"] == said["stopped_by"])
    assert at < 8 and len(error) == 1 and f"generator step {at}: {said['stopped_by']} since step {at}" in error[0]
    assert "health.action=warn" in error[0]
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["state_dict"]["counters.g_updates"] == at  # the step it stopped at
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


def test_fit_and_coverage_score_real_data_as_its_floor_and_fall_off_the_data_and_with_missing_modes():
    """In the points' own space: a second draw of the mixture scores what the first does against the reference
    (the floor); samples on 5 of the 25 modes lose four fifths of the coverage but none of the fit; samples between
    the modes lose the fit."""
    from gan.data.datasets import mixture_dataset, mixture_means
    from gan.evaluation.metrics import knn_radii, precision_coverage

    reference = mixture_dataset("grid", 256, 0.05, seed=0).tensors[0]
    radii = knn_radii(reference.double(), 3)
    floor = precision_coverage(reference, radii, mixture_dataset("grid", 256, 0.05, seed=1).tensors[0])
    again = precision_coverage(reference, radii, mixture_dataset("grid", 256, 0.05, seed=2).tensors[0])
    assert [float(a / f) for a, f in zip(again, floor)] == pytest.approx([1, 1], abs=0.1)
    means = mixture_means("grid")
    five = means[torch.arange(256) % 5 * 5] + 0.05 * torch.randn(256, 2, generator=torch.Generator().manual_seed(3))
    fit, coverage = (float(a / f) for a, f in zip(precision_coverage(reference, radii, five), floor))
    assert fit > 0.9 and 0.1 < coverage < 0.3
    between = five + 1.0  # half-way between the modes, at the data's spread
    assert float(precision_coverage(reference, radii, between)[0]) == 0.0


GRID_CHECKS = ["health.every=20", "health.patience=3", "log.every=20", "log.sample_every=100000",
               "checkpoint.every=100000", "audit=false", "trainer.enable_progress_bar=false"]


def test_off_data_and_partial_collapse_fire_on_networks_far_too_small_for_the_grid(tmp_path):
    """G and D of 8 units each train calmly (D's loss near chance, nothing growing) while their samples miss the 25
    modes: the conditions on D's figures stay silent, fit and coverage do not."""
    train(compose_config("experiment=grid", "model.hidden=8", "model.layers=1", "model.d_fourier=0",
                         "trainer.max_steps=200", "health.start=0.5", *GRID_CHECKS, run_dir=tmp_path / "run"))
    met = {e["condition"]: e["started"] for e in json.loads((tmp_path / "run" / FILE).read_text())["conditions"]}
    assert met["off_data"] == met["partial_collapse"] == 100  # judged from health.start, half the run
    assert not {"d_wins", "d_memorises", "divergence"} & set(met)


class IgnoreLabels(Observer):
    """Makes G ignore its labels: every class asked for reaches it as class 0."""

    def on_start(self, run):
        for generator in {id(g): g for g in (run.module.G, run.module.sampling_generator)}.values():
            generator.register_forward_pre_hook(lambda _, args: (args[0], torch.zeros_like(args[1])))


def test_labels_ignored_fires_on_a_g_that_ignores_its_labels_and_not_on_the_healthy_twin(tmp_path):
    """A conditional ring: the twin's samples follow their labels by step 700 (about 3 in 4 by its nearest-mode
    classifier, against 1 in 8 for a G that ignores them), so that the condition is not on at the end."""
    common = ["experiment=ring", "model.conditional=true", "ema.enabled=false", "optim.decay=constant",
              "trainer.max_steps=800", "health.start=0.9", *GRID_CHECKS, "health.every=50", "log.every=50"]
    train(compose_config(*common, run_dir=tmp_path / "ignores"), probes=[IgnoreLabels()])
    train(compose_config(*common, run_dir=tmp_path / "twin"))
    on_at_end = {run: [e["condition"] for e in json.loads((tmp_path / run / FILE).read_text())["conditions"]
                       if e["ended"] is None] for run in ("ignores", "twin")}
    assert "labels_ignored" in on_at_end["ignores"] and "labels_ignored" not in on_at_end["twin"]


def test_divergence_fires_on_a_run_blown_up_from_its_first_checks(tmp_path, caplog):
    """Learning rates of 0.3 on the ring: D's outputs and loss are huge from the first checks on, with no lower level
    before them for a blow-up to be measured from; their size against chance and a bound is."""
    with caplog.at_level(logging.WARNING, logger="gan.training.health"):
        train(compose_config("experiment=ring", "optim.g.lr=0.3", "optim.d.lr=0.3", "trainer.max_steps=100",
                             *GRID_CHECKS, run_dir=tmp_path / "run"))
    assert "health: divergence at generator step 60" in caplog.text  # the third check: a median of three


def test_a_run_too_short_to_judge_says_so_in_its_log_and_health_json(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="gan.training.health"):
        train(compose_config(*TINY, "health.every=2", "health.patience=4", run_dir=tmp_path / "run"))
    assert caplog.text.count("health: this run is too short to judge") == 1
    assert json.loads((tmp_path / "run" / FILE).read_text())["judged"] is False


def test_a_checkpoint_of_the_judge_as_it_was_kept_before_buffers_resumes(tmp_path):
    """Its lists by condition name are set aside: the resumed run judges anew, and trains."""
    assert run_train(tmp_path / "run", "trainer.max_steps=4", *HEALTH_EVERY) == 0
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["health"] = {"recent": {"d_wins": [0.5]}, "events": [], "sizes": {}, "lowest": {}, "skipped": 0.0}
    torch.save(checkpoint, last)
    assert run_train(tmp_path / "run", "trainer.max_steps=6", *HEALTH_EVERY, f"ckpt_path={last}") == 0
    assert not torch.load(last, weights_only=True)["health"]["history"].isnan().all()
