"""How good is the MNIST (and Fashion-MNIST) preset? Train it at several seeds, score it, set it beside real data.

Usage: python benchmarks/images.py [--mnist-root DIR] [--fashion-root DIR] [--split train|test]
                                   [--mnist-recipe mnist|mnist_acgan] [--threads N]
                                   [--seeds 0 1 2] [--run-dir NAME=RUN ...] [--num-samples 10000]
                                   [--inception-weights FILE [--inception-sha256 HEX] [--inception-samples N]]
                                   [--write docs/results.md]

For each dataset whose files are found (``data.root`` as in configs/data/<name>.yaml: the IDX files
under ``<root>/MNIST/raw/`` or ``<root>/raw/``; absent files are reported and skipped):

1. trains ``python train.py experiment=<name> seed=<s> [train.threads=N]`` for each seed, one run at a
   time, in a fresh run directory (``<name>``: ``--mnist-recipe`` for MNIST, ``mnist`` by default, which is
   told no labels; ``mnist_acgan`` is told them; its wall and CPU time and the machine's load average are
   printed), or takes the runs named by ``--run-dir`` (repeat a name for several seeds);
2. scores each run's EMA generator as ``python evaluate.py run_dir=<run> num_samples=<N>`` does (the
   same function, writing ``<run>/eval/``), and reads the D/G balance back from its TensorBoard scalars;
3. the floor: the same metrics between two disjoint halves of the real images (their own ``class_kl``
   and ``confident`` are the second half's), and the untrained generator: the first run's networks as
   initialised with its seed, before step 1;
4. with ``--inception-weights``, scores the first seed's run and the floor again in the Inception space
   (``features=inception``, ``--inception-samples`` generated against as many real images);
5. prints markdown tables with the targets and whether each is met at each seed, and writes them into
   ``--write``'s generated block ``images`` (``images-<recipe>`` for another ``--mnist-recipe``, without
   Fashion-MNIST; tools/blocks.py: stamped with the command, the commit and the machine).

Targets: classifier-FID at most 10 times the real-data floor, ``class_kl`` <= 0.05 (the predicted
classes nearly uniform), ``confident`` >= 0.90 (nine samples in ten recognised with probability >= 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gan.config.compose import compose
from gan.config.eval_settings import EvalSettings
from gan.data.datasets import build_dataset, data_shape, population
from gan.errors import ConfigError
from gan.evaluation.app import evaluate_run, load_module, with_run_classifier_steps
from gan.evaluation.metrics import ImageMetrics, build_metrics, real_images
from gan.evaluation.sampling import sample_and_score
from gan.run.build import build_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.blocks import recipe_inputs, write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("fid", "kid", "precision", "recall", "class_kl", "confident")
INCEPTION_COLUMNS = COLUMNS[:4]  # Inception's pool features come without the dataset's classes
FID_FACTOR, MAX_CLASS_KL, MIN_CONFIDENT = 10.0, 0.05, 0.90
# Healthy balance: D's logit gap over the last tenth under 1, i.e. D's odds of a real image over a fake
# below e. A D that wins outright ends several logits apart (loss/d near 0); this recipe's, about 0.3.
MAX_END_GAP = 1.0
# Recipes that are given more than the images, so that no table shows them as the same thing as one that is not.
TOLD = {"mnist_acgan": "AC-GAN: told the labels", "fashion_mnist": "AC-GAN: told the labels"}
# D's and G's losses when D cannot tell real from fake (logits equal), per loss.
FIFTY_FIFTY = {"nonsaturating": "non-saturating loss: 1.386 and 0.693", "rpgan": "RpGAN loss: 0.693 and 0.693"}


def load() -> str:
    """The 1-, 5- and 15-minute load averages: how busy the (shared) machine was."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train_preset(name: str, root: str, split: str, seed: int, run_dir: Path,
                 threads: int | None = None) -> tuple[float, float]:
    """``python train.py experiment=<name> seed=<seed>`` into ``run_dir``, as a user runs it; returns its
    wall and CPU seconds (all threads)."""
    command = [sys.executable, "train.py", f"experiment={name}", f"data.root={root}", f"data.split={split}",
               f"seed={seed}", f"hydra.run.dir={run_dir}", "trainer.enable_progress_bar=false"]
    command += [f"train.threads={threads}"] if threads else []
    print(f"{name}: {' '.join(command[1:])} (load average {load()})", flush=True)
    start, cpu = time.perf_counter(), children_cpu_s()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    seconds, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    print(f"{name}: trained in {seconds:.0f} s, {cpu:.0f} s CPU (load average after: {load()})", flush=True)
    return seconds, cpu


def evaluate(run_dir: Path, num_samples: int, *overrides: str, reuse: bool = False) -> tuple[dict[str, Any],
                                                                                          EvalSettings]:
    """``python evaluate.py run_dir=<run> num_samples=<N> [overrides]``'s result, and the settings it used;
    ``reuse``: the run's ``eval/metrics.json`` where it holds a score of ``num_samples`` (what evaluate.py
    wrote, and would write again: its sampling is seeded)."""
    cfg = compose(f"run_dir={run_dir}", f"num_samples={num_samples}", *overrides, config="evaluate")
    run_cfg = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"))
    settings = EvalSettings.from_config(with_run_classifier_steps(cfg, run_cfg))
    saved = run_dir / "eval" / "metrics.json"
    if reuse and not overrides and saved.is_file():
        result = json.loads(saved.read_text())
        if result["num_samples"] == num_samples:
            return result, settings
    return evaluate_run(cfg), settings


def references(run_dir: Path, settings: EvalSettings,
               untrained: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
    """(real-data floor, untrained generator or None, images in each half), in evaluate.py's feature space.

    The floor compares the first half of a seeded shuffle of the real images with the second half
    (5,000 against 5,000 out of 10,000): the score a perfect generator would get from a sample of
    that size. The untrained generator is the run's module built as train.py builds it, from the
    run's config after seeding with the run's seed: the same weights the run started from.
    """
    module = load_module(run_dir / "checkpoints" / "last.ckpt")
    cfg = module.cfg
    dataset = population(cfg["data"], cfg["seed"])
    metrics = build_metrics(cfg["data"], dataset, settings)  # the feature network evaluate.py used (cached)
    images, labels = real_images(dataset, settings.num_real)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    first, second = order.tensor_split(2)
    halves = ImageMetrics(metrics.extractor, batch_size=settings.batch_size, classes=metrics.classes)
    halves.add_real(images[first], labels[first])
    floor = halves.score(images[second], seed=0)
    if not untrained:
        return floor, None, len(second)
    L.seed_everything(cfg["seed"], verbose=False)
    _, step0 = sample_and_score(build_module(cfg, data_shape(cfg["data"]), module.condition), metrics, settings,
                                seed=0)
    return floor, step0, len(second)


def balance(run_dir: Path) -> dict[str, float]:
    """The D/G balance as the run's TensorBoard scalars show it: ``loss/d`` and ``loss/g`` averaged over
    the last tenth of the logged steps, and D's logit gap ``d/real - d/fake`` over that tenth and over
    the tenth that ends a third of the way in. D winning outright shows as a gap that keeps growing."""
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    series = {tag: [s.value for s in events.Scalars(tag)] for tag in ("loss/d", "loss/g", "d/real", "d/fake")}
    n = len(series["loss/d"])
    tenth = max(1, n // 10)

    def mean(tag: str, end: int) -> float:
        values = series[tag][max(0, end - tenth):end]
        return sum(values) / len(values)

    return {"loss_d": mean("loss/d", n), "loss_g": mean("loss/g", n),
            "gap_third": mean("d/real", n // 3) - mean("d/fake", n // 3),
            "gap_end": mean("d/real", n) - mean("d/fake", n)}


def metrics_table(rows: dict[str, dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> list[str]:
    lines = ["| | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    return lines + [f"| {label} | " + " | ".join(f"{values[c]:.4g}" for c in columns) + " |"
                    for label, values in rows.items()]


def targets_table(trained: dict[int, dict[str, Any]], floor_fid: float) -> list[str]:
    """Each target against each seed's trained generator."""
    targets = [(f"classifier-FID <= {FID_FACTOR:g} x floor ({FID_FACTOR * floor_fid:.3g})", "fid",
                lambda v: v <= FID_FACTOR * floor_fid),
               (f"class_kl <= {MAX_CLASS_KL}", "class_kl", lambda v: v <= MAX_CLASS_KL),
               (f"confident >= {MIN_CONFIDENT}", "confident", lambda v: v >= MIN_CONFIDENT)]
    lines = ["| target | " + " | ".join(f"seed {s}" for s in trained) + " |", "|---" * (len(trained) + 1) + "|"]
    for name, column, ok in targets:
        cells = [f"{v[column]:.4g} {'met' if ok(v[column]) else '**missed**'}" for v in trained.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def balance_table(balances: dict[int, dict[str, float]]) -> list[str]:
    lines = ["| seed | loss/d, last tenth | loss/g, last tenth | D's logit gap, a third in | the gap, last tenth "
             f"| healthy (gap < {MAX_END_GAP:g} at the end) |", "|---|---|---|---|---|---|"]
    return lines + [f"| {s} | {b['loss_d']:.3f} | {b['loss_g']:.3f} | {b['gap_third']:.2f} | {b['gap_end']:.2f} "
                    f"| {'yes' if b['gap_end'] < MAX_END_GAP else '**no**'} |" for s, b in balances.items()]


def benchmark(name: str, root: str, split: str, seeds: list[int], run_dirs: list[Path], num_samples: int,
              inception: list[str], inception_samples: int, threads: int | None = None) -> str:
    """One dataset's markdown section; where its files are absent, one line saying so (nothing crashes)."""
    cfg = compose(f"experiment={name}", f"data.root={root}", f"data.split={split}")
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    try:
        build_dataset(data_cfg, cfg.seed)
    except ConfigError as e:
        print(f"{name}: skipped: {e}")
        return f"**{name}**: not measured ({e})."
    stamp = time.strftime('%Y%m%d-%H%M%S')
    # (seed to train, run directory): the runs given, else a fresh one per seed.
    plan = ([(None, run_dir) for run_dir in run_dirs]
            or [(s, ROOT / "outputs" / "benchmarks" / f"{name}-{split}-{stamp}-seed{s}") for s in seeds])
    trained, rows, balances = {}, {}, {}
    for train_seed, run_dir in plan:
        # Each seed trains alone and is scored before the next starts: its time is its own.
        timing = ""
        if train_seed is not None:
            wall, cpu = train_preset(name, root, split, train_seed, run_dir, threads)
            timing = f" (trained in {wall:.0f} s wall, {cpu:.0f} s CPU)"
        result, settings = evaluate(run_dir, num_samples)
        seed = int(OmegaConf.load(run_dir / ".hydra" / "config.yaml").seed)
        print(f"{name} seed {seed}: " + ", ".join(f"{c} {result[c]:.4g}" for c in COLUMNS), flush=True)
        trained[seed], balances[seed] = result, balance(run_dir)
        told = f" ({TOLD[name]})" if name in TOLD else ""
        rows[f"`experiment={name} seed={seed}`{told}, EMA generator, step {result['step']:,}{timing}"] = result
    run_dirs = [run_dir for _, run_dir in plan]
    floor, step0, half = references(run_dirs[0], settings)
    rows = {f"real data, two halves ({half:,} vs {half:,}): the floor": floor,
            "untrained generator (step 0)": step0, **rows}
    told = TOLD.get(name, "no labels: noise alone into G, images alone into D")
    fifty = FIFTY_FIFTY.get(cfg.loss.name, f"{cfg.loss.name} loss")
    lines = [f"**{name}** ({told}; {split} split), {num_samples:,} samples, sample seed 0, "
             f"`{result['features']}` features:",
             "", *metrics_table(rows), "", *targets_table(trained, floor["fid"]), "",
             f"D/G balance (TensorBoard scalars read back; {fifty} at D's 50/50):", "",
             *balance_table(balances)]
    if inception:  # the first seed's run only: Inception-v3 takes about 0.2 s an image on a 2-core CPU
        overrides = ["features=inception", *inception, f"num_real={inception_samples}"]
        result, settings = evaluate(run_dirs[0], inception_samples, *overrides)
        floor, _, half = references(run_dirs[0], settings, untrained=False)
        rows = {f"real data, two halves ({half:,} vs {half:,}): the floor": floor,
                f"seed {result['seed']}'s run, EMA generator, step {result['step']:,}": result}
        lines += ["", f"The first seed's run in the Inception space ({inception_samples:,} samples against as many "
                  f"real images; {' '.join(inception)}):", "", *metrics_table(rows, INCEPTION_COLUMNS)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist-root", default="data", help="data.root of MNIST (default: data)")
    parser.add_argument("--fashion-root", default="data", help="data.root of Fashion-MNIST (default: data)")
    parser.add_argument("--split", default="train", choices=("train", "test"))
    parser.add_argument("--mnist-recipe", default="mnist", choices=("mnist", "mnist_acgan"),
                        help="the recipe trained on the MNIST files (default: mnist, without labels)")
    parser.add_argument("--threads", type=int, help="train.threads of each run (default: the recipe's)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="training seeds (default: 0 1 2)")
    parser.add_argument("--run-dir", nargs="*", default=[], metavar="NAME=RUN",
                        help="score trained runs instead of training, e.g. mnist=outputs/a mnist=outputs/b")
    parser.add_argument("--num-samples", type=int, default=10000)
    parser.add_argument("--inception-weights", help="also score in the Inception space with this file")
    parser.add_argument("--inception-sha256", help="that file's sha256, where it is not a published one")
    parser.add_argument("--inception-samples", type=int, default=1000,
                        help="samples (and real images) of the Inception score (default: 1000)")
    parser.add_argument("--write", type=Path, default=ROOT / "docs" / "results.md")
    args = parser.parse_args()
    runs: dict[str, list[Path]] = {}
    for item in args.run_dir:
        name, run = item.split("=", 1)
        runs.setdefault(name, []).append(Path(run))
    inception = [f"inception_weights={args.inception_weights}"] if args.inception_weights else []
    inception += [f"inception_sha256={args.inception_sha256}"] if args.inception_sha256 and inception else []
    datasets = [(args.mnist_recipe, args.mnist_root)]
    # Fashion-MNIST's recipe is the AC-GAN's: it goes with the block of the default recipe only.
    datasets += [("fashion_mnist", args.fashion_root)] if args.mnist_recipe == "mnist" else []
    text = "\n\n".join(benchmark(name, root, args.split, args.seeds, runs.get(name, []), args.num_samples,
                                 inception, args.inception_samples, args.threads) for name, root in datasets)
    print(text)
    block = "images" if args.mnist_recipe == "mnist" else f"images-{args.mnist_recipe}"
    write_block(args.write, block, text, "python benchmarks/images.py " + " ".join(sys.argv[1:]),
                ["gan", *recipe_inputs(*(name for name, _ in datasets)), "benchmarks/images.py"])
    print(f"wrote the table into {args.write}")


if __name__ == "__main__":
    main()
