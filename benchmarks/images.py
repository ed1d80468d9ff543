"""How good is the MNIST (and Fashion-MNIST) preset? Train it, score it, and set it beside real data.

Usage: python benchmarks/images.py [--mnist-root DIR] [--fashion-root DIR] [--split train|test]
                                   [--run-dir RUN ...] [--num-samples 10000] [--write docs/results.md]

For each dataset whose files are found (``data.root`` as in configs/data/<name>.yaml: the IDX files
under ``<root>/MNIST/raw/`` or ``<root>/raw/``; absent files are reported and skipped):

1. trains ``python train.py experiment=<name>`` in a fresh run directory (its wall time and the machine's
   load average are printed), or takes ``--run-dir`` of a run already trained;
2. scores the run's EMA generator as ``python evaluate.py run_dir=<run> num_samples=<N>`` does (the
   same function, writing ``<run>/eval/``);
3. the floor: the same metrics between two disjoint halves of the real images (their own ``class_kl``
   and ``confident`` are the second half's), and the untrained generator: the run's networks as
   initialised with the run's seed, before step 1;
4. prints a markdown table with the targets and whether each is met, and writes it into ``--write``'s
   generated block ``images`` (tools/blocks.py: stamped with the command, the commit and the machine).

Targets: classifier-FID at most 10 times the real-data floor, ``class_kl`` <= 0.05 (the predicted
classes nearly uniform), ``confident`` >= 0.90 (nine samples in ten recognised with probability >= 0.9).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf

from gan.data.datasets import build_dataset, data_shape
from gan.errors import ConfigError
from gan.evaluation.app import evaluate_run, load_module, with_run_classifier_steps
from gan.evaluation.metrics import ImageMetrics, build_metrics, real_images
from gan.evaluation.sampling import sample_and_score
from gan.evaluation.settings import EvalSettings
from gan.training.compose import compose
from gan.training.module import GANModule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.blocks import write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("fid", "kid", "precision", "recall", "class_kl", "confident")
FID_FACTOR, MAX_CLASS_KL, MIN_CONFIDENT = 10.0, 0.05, 0.90


def load() -> str:
    """The 1-, 5- and 15-minute load averages: how busy the (shared) machine was."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def train_preset(name: str, root: str, split: str, run_dir: Path) -> float:
    """``python train.py experiment=<name>`` into ``run_dir``, as a user runs it; returns its wall time."""
    command = [sys.executable, "train.py", f"experiment={name}", f"data.root={root}", f"data.split={split}",
               f"hydra.run.dir={run_dir}", "trainer.enable_progress_bar=false"]
    print(f"{name}: {' '.join(command[1:])} (load average {load()})", flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    print(f"{name}: trained in {seconds:.0f} s (load average after: {load()})", flush=True)
    return seconds


def evaluate(run_dir: Path, num_samples: int) -> tuple[dict[str, Any], EvalSettings]:
    """``python evaluate.py run_dir=<run> num_samples=<N>``'s result, and the settings it used."""
    cfg = compose(f"run_dir={run_dir}", f"num_samples={num_samples}", config="evaluate")
    run_cfg = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"))
    return evaluate_run(cfg), EvalSettings.from_config(with_run_classifier_steps(cfg, run_cfg))


def references(run_dir: Path, settings: EvalSettings) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(real-data floor, untrained generator, images in each half), in evaluate.py's feature space for the run.

    The floor compares the first half of a seeded shuffle of the real images with the second half
    (5,000 against 5,000 out of 10,000): the score a perfect generator would get from a sample of
    that size. The untrained generator is the run's GANModule built as train.py builds it, from the
    run's config after seeding with the run's seed: the same weights the run started from.
    """
    module = load_module(run_dir / "checkpoints" / "last.ckpt")
    cfg = module.cfg
    dataset = build_dataset(cfg["data"], cfg["seed"])
    metrics = build_metrics(cfg["data"], dataset, settings)  # the classifier evaluate.py used (cached)
    images, labels = real_images(dataset, settings.num_real)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    first, second = order.tensor_split(2)
    halves = ImageMetrics(metrics.extractor, batch_size=settings.batch_size)
    halves.add_real(images[first], labels[first])
    floor = halves.score(images[second], seed=0)
    L.seed_everything(cfg["seed"], verbose=False)
    untrained = GANModule(cfg, data_shape(cfg["data"]), module.num_classes)
    _, step0 = sample_and_score(untrained, metrics, settings, seed=0)
    return floor, step0, len(second)


def table(rows: dict[str, dict[str, Any]], floor_fid: float) -> str:
    """The metrics side by side, then each target against the trained generator's value."""
    lines = ["| | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for label, values in rows.items():
        lines.append(f"| {label} | " + " | ".join(f"{values[c]:.4g}" for c in COLUMNS) + " |")
    trained = list(rows.values())[-1]
    targets = [(f"classifier-FID <= {FID_FACTOR:g} x floor ({FID_FACTOR * floor_fid:.3g})",
                trained["fid"], trained["fid"] <= FID_FACTOR * floor_fid),
               (f"class_kl <= {MAX_CLASS_KL}", trained["class_kl"], trained["class_kl"] <= MAX_CLASS_KL),
               (f"confident >= {MIN_CONFIDENT}", trained["confident"], trained["confident"] >= MIN_CONFIDENT)]
    lines += ["", "| target | trained generator | |", "|---|---|---|"]
    lines += [f"| {name} | {value:.4g} | {'met' if ok else '**missed**'} |" for name, value, ok in targets]
    return "\n".join(lines)


def benchmark(name: str, root: str, split: str, run_dir: Path | None, num_samples: int) -> str:
    """One dataset's markdown section; where its files are absent, one line saying so (nothing crashes)."""
    cfg = compose(f"experiment={name}", f"data.root={root}", f"data.split={split}")
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    try:
        build_dataset(data_cfg, cfg.seed)
    except ConfigError as e:
        print(f"{name}: skipped: {e}")
        return f"**{name}**: not measured ({e})."
    wall = None
    if run_dir is None:
        run_dir = ROOT / "outputs" / "benchmarks" / f"{name}-{split}-{time.strftime('%Y%m%d-%H%M%S')}"
        wall = train_preset(name, root, split, run_dir)
    trained, settings = evaluate(run_dir, num_samples)
    floor, step0, half = references(run_dir, settings)
    rows = {f"real data, two halves ({half:,} vs {half:,}): the floor": floor,
            "untrained generator (step 0)": step0,
            f"`experiment={name}`, EMA generator, step {trained['step']:,}": trained}
    header = (f"**{name}** ({split} split), {num_samples:,} samples, seed {trained['seed']}, "
              f"`{trained['features']}` features" + (f"; trained in {wall:.0f} s" if wall else "") + ":")
    return header + "\n\n" + table(rows, floor["fid"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist-root", default="data", help="data.root of MNIST (default: data)")
    parser.add_argument("--fashion-root", default="data", help="data.root of Fashion-MNIST (default: data)")
    parser.add_argument("--split", default="train", choices=("train", "test"))
    parser.add_argument("--run-dir", nargs="*", default=[], metavar="NAME=RUN",
                        help="score a trained run instead of training, e.g. mnist=outputs/mnist")
    parser.add_argument("--num-samples", type=int, default=10000)
    parser.add_argument("--write", type=Path, default=ROOT / "docs" / "results.md")
    args = parser.parse_args()
    runs = dict(item.split("=", 1) for item in args.run_dir)
    text = "\n\n".join(benchmark(name, root, args.split, Path(runs[name]) if name in runs else None,
                                   args.num_samples)
                         for name, root in (("mnist", args.mnist_root), ("fashion_mnist", args.fashion_root)))
    print(text)
    write_block(args.write, "images", text, "python benchmarks/images.py " + " ".join(sys.argv[1:]), ["gan", "configs"])
    print(f"wrote the table into {args.write}")


if __name__ == "__main__":
    main()
