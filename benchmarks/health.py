"""The health check proven on runs broken on purpose: each configuration below trains with train.py's defaults
for health (on, health.action=warn), then evaluate.py scores it; the table says which conditions fired, at which
generator step, and the final quality that confirms the failure -- or, for each recipe's own configuration, the
health.

Usage: python benchmarks/health.py [--out DIR] [--jobs N] [--only NAME ...] [--seeds 0 1 2] [--reuse]
                                   [--write docs/results.md] [--root MNIST_DIR [--split test]]

Each run is its own train.py process with one thread; ``--jobs`` of them run side by side (give each a core).
A run already in ``--out`` is read back, not trained again. The MNIST recipes need ``--root`` (a directory
holding MNIST's raw .gz files) and are left out without it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.blocks import recipe_inputs, write_block  # noqa: E402

# name -> (train.py overrides, the condition it should trip; None: a recipe as it is, which should trip none).
BROKEN = {
    "D much faster, saturating loss": (["experiment=digits", "loss=minimax", "reg=none", "augment=none",
                                        "loss.d_steps=5", "optim.d.lr=0.01"], "d_wins"),
    "no penalty where the recipe needs one": (["experiment=digits", "reg=none"], "d_wins"),
    "32 images, no augmentation": (["experiment=digits", "data.limit=32", "augment=none", "trainer.max_steps=6000"],
                                   "d_memorises"),
    "learning rates of 1": (["experiment=digits", "optim.g.lr=1", "optim.d.lr=1"], "collapse"),
    "G's learning rate far too high": (["experiment=ring", "optim.g.lr=0.05", "trainer.max_steps=8000"],
                                       "collapse"),
    # A critic with nothing to bound it, and a rate to grow fast: at D's recipe rate (1e-3) it did not blow up in
    # 3,000 steps at seed 0 (FID 2.5); at 0.01 it did at seed 100 (FID 6.9).
    "WGAN without its penalty, D's rate 0.01": (["experiment=digits", "loss=wgan_gp", "loss.gp_weight=0", "reg=none",
                                                 "augment=none", "optim.d.lr=0.01"], "divergence"),
    # G's steps overshoot, D wins at once, and under the saturating loss G's gradient vanishes (collapse follows).
    "G's learning rate far too high, images": (["experiment=digits", "optim.g.lr=0.05", "reg=none", "augment=none",
                                                "loss=minimax"], "d_wins"),
    # Weak G and D: D's loss stays near chance and the samples are spread, but they miss the data.
    "networks far too small for 25 modes": (["experiment=grid", "model.hidden=8", "model.layers=1",
                                             "model.d_fourier=0"], "off_data"),
    "networks far too narrow, images": (["experiment=digits", "model.width=2"], "partial_collapse"),
    # Blown up from its first checks: never a level to grow from.
    "learning rates of 0.3, ring": (["experiment=ring", "optim.g.lr=0.3", "optim.d.lr=0.3"], "divergence"),
    # G broken in code, as no config can break it: each class asked for reaches it as class 0 (IgnoreLabels).
    "G ignores its labels, conditional ring": (["experiment=ring", "model.conditional=true"], "labels_ignored"),
    # Listed among the healthy runs until it ran at seed 0, so its condition was named after that run: with the ring
    # recipe's rates and one critic update a G step, WGAN-GP spreads its samples along the whole circle, between the
    # modes (high_quality 0.11 at 16,000 steps, the recipe's 0.97).
    "WGAN-GP at the ring recipe's rates": (["experiment=ring", "loss=wgan_gp"], "off_data"),
}
# The broken runs drawn beside the healthy digits recipe (--picture): one per condition.
PICTURED = ("D much faster, saturating loss", "32 images, no augmentation", "learning rates of 1",
            "WGAN without its penalty, D's rate 0.01", "networks far too narrow, images")
# The run a fine-tuning row starts from (trained first: the digits recipe at seed 0).
FINE_TUNED_FROM = "recipe_digits_seed0"
# Healthy beside the recipes, at the first seed: each loss in the digits and ring recipes (but WGAN-GP on the ring,
# which fails there: above), augmentation on a few hundred images, the residual network, a short run, fine-tuning
# with D partly frozen, a conditional G.
HEALTHY = {
    **{f"digits, loss={loss}": ["experiment=digits", f"loss={loss}"]
       for loss in ("nonsaturating", "minimax", "hinge", "lsgan", "wgan_gp")},
    "digits, 300 images, augment=ada": ["experiment=digits", "data.limit=300", "augment=ada"],
    "digits, 300 images, augment=diff": ["experiment=digits", "data.limit=300", "augment=diff"],
    **{f"ring, loss={loss}": ["experiment=ring", f"loss={loss}"]
       for loss in ("nonsaturating", "minimax", "hinge", "lsgan")},
    "digits, model=resnet": ["experiment=digits", "model=resnet"],
    "digits, 600 steps": ["experiment=digits", "trainer.max_steps=600"],
    # Fine-tuning the digits recipe's seed-0 run on 100 images of five classes, D's first two blocks frozen.
    "digits, fine-tuned with D's first blocks frozen": ["experiment=digits", f"init_from={{out}}/{FINE_TUNED_FROM}",
                                                         "data.classes=[5,6,7,8,9]", "data.limit=100",
                                                         "finetune.freeze_d=2", "trainer.max_steps=1000"],
    "ring, conditional": ["experiment=ring", "model.conditional=true"],
    # The 2016 objective: every mode, at a narrower spread than the data's (coverage lower, not low).
    "ring, loss=nonsaturating, no penalty or Fourier features": ["experiment=ring", "loss=nonsaturating", "reg=none",
                                                                  "model.d_fourier=0"],
}
MNIST = ["data.root={root}", "data.split={split}"]
RECIPES = {"ring": [], "grid": [], "digits": [], "mnist_acgan": MNIST, "mnist": MNIST, "stacked_mnist": MNIST}
QUALITY = ("fid", "coverage", "modes", "high_quality", "kl", "class_accuracy")


def runs(seeds: list[int], root: str | None, split: str) -> list[tuple[str, list[str], str | None, int]]:
    """Every (name, overrides, expected condition, seed) to train."""
    out = [(name, overrides, expected, seed) for name, (overrides, expected) in BROKEN.items() for seed in seeds]
    out += [(name, overrides, None, seeds[0]) for name, overrides in HEALTHY.items()]
    for recipe, extra in RECIPES.items():
        if "{root}" in " ".join(extra) and root is None:
            continue
        overrides = [f"experiment={recipe}", *(e.format(root=root, split=split) for e in extra)]
        out += [(f"recipe {recipe}", overrides, None, seed) for seed in seeds]
    return out


def slug(name: str, seed: int) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_") + f"_seed{seed}"


def train_and_score(out: Path, name: str, overrides: list[str], seed: int) -> dict:
    """Train (unless ``out`` has the run), evaluate, and read back what the health check said."""
    run = out / slug(name, seed)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    trainer = [__file__, IGNORING_LABELS] if name == "G ignores its labels, conditional ring" else ["train.py"]
    if not (run / "eval" / "metrics.json").is_file():
        for command in ([*trainer, f"hydra.run.dir={run}", f"seed={seed}", "train.threads=1",
                         "trainer.enable_progress_bar=false", *overrides], ["evaluate.py", f"run_dir={run}"]):
            done = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    conditions, _, closest = judged(run)
    return {"conditions": conditions, "closest": closest, "metrics": metrics, "steps": metrics["step"],
            "figures": figures(run)}


def judged(run: Path) -> tuple[list[dict], list[tuple[int, float]]]:
    """The conditions met, as this code's judge (gan/core/health.py) reads the run's logged scalars at its health
    checks: what the run's own health.json says where its code judged alike, and what it would say now where the
    judge changed since the run trained (the figures it reads are the step's, which the judge does not touch).
    Also the blowup figure it computes at each check, and each condition's judged median nearest its threshold.

    A run trained before ``d_loss_ratio`` was logged gets, in its place, that figure's lower bound from the batch's
    logged mean outputs: D's loss is convex in its outputs, so its value at their means is at most its mean
    (Jensen); a run whose bound never trips would not have tripped on the figure itself."""
    import torch
    from omegaconf import OmegaConf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gan.core.health import CONDITIONS, HealthJudge, judging_start, loss_ratio, median
    from gan.core.losses import get_loss

    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    # The share of the run a stuck figure is judged from: this code's default, where the run did not set its own.
    given = run / ".hydra" / "overrides.yaml"
    overrides = OmegaConf.load(given) if given.is_file() else []
    share = (cfg.health.start if any(o.startswith("health.start=") for o in overrides)
             else OmegaConf.load(ROOT / "configs" / "train.yaml").health.start)
    judge = HealthJudge(judging_start(share, cfg.trainer.max_steps), cfg.health.patience)
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    by_step: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for e in events.Scalars(tag):
            if e.step % cfg.health.every == 0:
                by_step.setdefault(e.step, {})[tag] = e.value
    blowups, closest, loss, bounded = [], {}, get_loss(cfg.loss.name), False
    for step, numbers in sorted(by_step.items()):
        if "health/d_loss_ratio" not in numbers and loss.chance is not None and "d/real" in numbers:
            bounded = True
            means = (torch.tensor([numbers["d/real"]]), torch.tensor([numbers["d/fake"]]))
            numbers["health/d_loss_ratio"] = float(loss_ratio(loss, *means))
        numbers["health/blowup"] = judge.blowup(step, numbers)
        blowups.append((step, numbers["health/blowup"]))
        judge.judge(step, {k.removeprefix("health/"): v for k, v in numbers.items() if k.startswith("health/")})
        for i, condition in enumerate(CONDITIONS):  # the judged median nearest the threshold, over the judged checks
            recent = judge.history[i].tolist()
            if judge.judging[i] and not math.isnan(recent[0]):
                typical = median(recent)
                best = closest.get(condition.name, typical)
                closest[condition.name] = max(best, typical) if condition.above else min(best, typical)
    if bounded and "d_wins" in closest:
        closest["d_wins at least"] = closest.pop("d_wins")
    return [vars(e) for e in judge.events], blowups, closest


def figures(run: Path) -> dict[str, list[tuple[int, float]]]:
    """The run's health/* scalars, as TensorBoard holds them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
            if tag.startswith("health/")}


IGNORING_LABELS = "--train-ignoring-labels"  # this script's own entry: a run whose G never sees its labels


def train_ignoring_labels(overrides: list[str]) -> None:
    """train.py's run of ``overrides`` (``hydra.run.dir=`` among them), with every generator's labels replaced by
    zeros before they reach it; the config is saved where train.py's Hydra puts it, for :func:`judged`."""
    import torch
    from omegaconf import OmegaConf

    from gan.config.compose import compose
    from gan.training.loop import train
    from gan.training.observer import Observer

    class IgnoreLabels(Observer):
        def on_start(self, run: object) -> None:
            module = run.module
            for generator in {id(g): g for g in (module.G, module.sampling_generator)}.values():
                generator.register_forward_pre_hook(lambda _, args: (args[0], torch.zeros_like(args[1])))

    run_dir = Path(next(o for o in overrides if o.startswith("hydra.run.dir=")).split("=", 1)[1])
    cfg = compose(*(o for o in overrides if not o.startswith("hydra.")), run_dir=run_dir)
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    train(cfg, probes=[IgnoreLabels()])


def train_all(out: Path, todo: list[tuple[str, list[str], str | None, int]], jobs: int) -> list[dict]:
    """:func:`train_and_score` of each run in ``todo``, ``jobs`` side by side; a run that starts from another run of
    ``out`` (``{out}`` in its overrides) once the others are done."""
    later = ["{out}" in " ".join(overrides) for _, overrides, _, _ in todo]
    results: dict[int, dict] = {}
    for wave in (False, True):
        indices = [i for i, is_later in enumerate(later) if is_later == wave]
        with ThreadPoolExecutor(jobs) as pool:
            for i, result in zip(indices, pool.map(lambda i: train_and_score(out, todo[i][0], [
                    o.replace("{out}", str(out)) for o in todo[i][1]], todo[i][3]), indices)):
                results[i] = result
    return [results[i] for i in range(len(todo))]


def row(name: str, seed: int, expected: str | None, result: dict) -> str:
    fired = result["conditions"]
    steps = result["steps"]
    said = ", ".join(f"{e['condition']} @ {e['started']}" + (f"-{e['ended']}" if e["ended"] is not None else "")
                     for e in fired) or "none"
    if expected is None:
        nearest = ", ".join(f"{name} {value:.2f}" for name, value in result["closest"].items())
        on = [e for e in fired if e["ended"] is None]
        verdict = ("none fired" if not fired else "FLAGGED, on at the end" if on else
                   "FLAGGED for a stretch, over before the end")
        verdict += f" (judged medians nearest the thresholds: {nearest})"
    else:
        hit = [e for e in fired if e["condition"] == expected]
        verdict = (f"caught at {hit[0]['started'] / steps:.0%} of the run" if hit and hit[0]["started"] <= steps / 2
                   else "caught late" if hit else "MISSED")
    quality = ", ".join(f"{k} {result['metrics'][k]:.3g}" for k in QUALITY if isinstance(result["metrics"].get(k),
                                                                                          (int, float)))
    return f"| {name} | {seed} | {expected or '-'} | {said} | {verdict} | {steps} | {quality} |"


def by_condition(todo: list[tuple[str, list[str], str | None, int]], results: list[dict]) -> str:
    """Per condition: the broken runs that should trip it, caught before half their run, late or missed, with the
    share of the run each was caught at; and the healthy runs it fired on (false alarms)."""
    from gan.core.health import CONDITIONS

    healthy = [result for (_, _, expected, _), result in zip(todo, results) if expected is None]
    lines = ["| condition | broken runs | caught before half | late | missed | caught at (share of the run) | "
             f"false alarms (of {len(healthy)} healthy runs): on at the end, over before it |",
             "|---|---|---|---|---|---|---|"]
    for condition in CONDITIONS:
        shares, late, missed = [], 0, 0
        for (_, _, expected, _), result in zip(todo, results):
            if expected != condition.name:
                continue
            hit = [e["started"] for e in result["conditions"] if e["condition"] == condition.name]
            if not hit:
                missed += 1
            elif hit[0] > result["steps"] / 2:
                late += 1
            else:
                shares.append(hit[0] / result["steps"])
        met = [[e for e in result["conditions"] if e["condition"] == condition.name] for result in healthy]
        on = sum(any(e["ended"] is None for e in events) for events in met)
        over = sum(bool(events) and all(e["ended"] is not None for e in events) for events in met)
        at = ", ".join(f"{share:.0%}" for share in sorted(shares)) or "-"
        lines.append(f"| {condition.name} | {len(shares) + late + missed} | {len(shares)} | {late} | {missed} | {at} | "
                     f"{on}, {over} |")
    return "\n".join(lines)


def picture(healthy: Path, broken: Path, title: str, path: Path) -> None:
    """Two runs side by side, as TensorBoard shows them: each health figure over generator steps, its threshold
    dashed, the judging's start dotted, and the run's last sample grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from gan.core.health import CONDITIONS

    shown = [c for c in CONDITIONS if any(f"health/{c.figure}" in figures(run) for run in (healthy, broken))]
    fig, axes = plt.subplots(len(shown) + 1, 2, figsize=(10, 2.1 * len(shown) + 3.6), squeeze=False)
    for column, (run, name) in enumerate(((healthy, "the digits recipe (healthy)"), (broken, title))):
        (met, blowups, _), logged = judged(run), figures(run)
        logged["health/blowup"] = blowups
        for row, condition in enumerate(shown):
            ax = axes[row][column]
            series = logged.get(f"health/{condition.figure}", [])
            if series:
                ax.plot(*zip(*series), lw=1.2, color="tab:red" if any(
                    e["condition"] == condition.name for e in met) else "tab:blue")
                values = [v for _, v in series]
                if min(values) > 0 and max(values) > 100 * min(values):  # a fall by orders of magnitude: shown as one
                    ax.set_yscale("log")
            else:
                ax.text(0.5, 0.5, "not measured for this run", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([]), ax.set_yticks([])
            ax.axhline(condition.threshold, ls="--", color="gray", lw=0.8)
            for e in met:
                if e["condition"] == condition.name:
                    ax.axvline(e["started"], color="tab:red", lw=0.8)
            ax.set_ylabel(condition.figure, fontsize=8)
            ax.tick_params(labelsize=7)
            if row == 0:
                ax.set_title(name + ("\n" + ", ".join(f"{e['condition']} at {e['started']}" for e in met)
                                     if met else "\nno condition met"), fontsize=9)
        grid = sorted((run / "samples").glob("step_*.png"))[-1]
        axes[-1][column].imshow(Image.open(grid))
        axes[-1][column].set_axis_off()
        axes[-1][column].set_title(f"samples, {grid.stem.replace('_', ' ')}", fontsize=8)
    axes[-2][0].set_xlabel("generator step", fontsize=8)
    axes[-2][1].set_xlabel("generator step", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    if sys.argv[1:2] == [IGNORING_LABELS]:
        return train_ignoring_labels(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "health")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="names (or their start) to run")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--root", help="MNIST's directory, for the MNIST recipes")
    parser.add_argument("--split", default="train", help="the MNIST split they train on (default: train)")
    parser.add_argument("--reuse", action="store_true", help="train nothing: the table of the runs already in --out")
    parser.add_argument("--write", type=Path, help="put the table into this markdown file's block --block")
    parser.add_argument("--block", default="health", help="the block's name (default: health)")
    parser.add_argument("--picture", type=Path, help="draw the healthy digits recipe (seed 0) beside each broken run "
                        "of PICTURED read here, into PATH-<name>.png")
    args = parser.parse_args()
    todo = [r for r in runs(args.seeds, args.root, args.split)
            if not args.only or any(r[0].startswith(o) for o in args.only)]
    if args.reuse:
        todo = [r for r in todo if (args.out / slug(r[0], r[3]) / "eval" / "metrics.json").is_file()]
    results = train_all(args.out, todo, args.jobs)
    lines = ["| configuration | seed | should trip | fired (generator step) | verdict | steps | final quality |",
             "|---|---|---|---|---|---|---|"]
    lines += [row(name, seed, expected, result) for (name, _, expected, seed), result in zip(todo, results)]
    table = "\n".join(lines) + "\n\n" + by_condition(todo, results)
    print(table)
    (args.out / "summary.json").write_text(json.dumps([{"name": n, "seed": s, "overrides": o, "expected": e, **r}
                                                       for (n, o, e, s), r in zip(todo, results)], indent=1))
    if args.picture:
        healthy = args.out / slug("recipe digits", 0)
        for name in PICTURED:
            run, expected = args.out / slug(name, 0), BROKEN[name][1]
            if (run / "samples").is_dir():
                picture(healthy, run, f"{name} ({expected})", args.picture.with_name(
                    f"{args.picture.stem}-{slug(name, 0).removesuffix('_seed0').lower()}.png"))
    if args.write:
        recipes = sorted({o.split("=", 1)[1] for _, overrides, _, _ in todo for o in overrides
                          if o.startswith("experiment=")})
        command = "python " + shlex.join(["benchmarks/health.py", *sys.argv[1:]])  # as a shell takes it back
        write_block(args.write, args.block, table, command,
                    ["gan", *recipe_inputs(*recipes), "train.py", "evaluate.py", "benchmarks/health.py"])


if __name__ == "__main__":
    main()
