"""Few-shot MNIST by fine-tuning: does freezing D's first blocks (FreezeD) beat fine-tuning everything, and both
beat training from scratch on the few images?

Usage: python benchmarks/finetune.py --data-root DIR [--split test] [--pretrain-steps 2000] [--steps 300]
                                     [--sizes 100 1000] [--freeze 1 2 3] [--seeds 0 1 2] [--threads 1]
                                     [--num-samples 5000] [--out DIR] [--reuse] [--write docs/results.md]

1. pretrains ``python train.py experiment=mnist data.classes=[0,1,2,3,4]`` (the unconditional MNIST recipe, on
   the digits 0-4 of the split) once, with seed 0;
2. for each size n (``data.limit``) of the digits 5-9 and each seed, trains ``data.classes=[5,6,7,8,9]
   data.limit=n`` for ``--steps`` generator steps: from scratch; from the pretrained run (``init_from=``),
   everything trained; and FreezeD, D's first k blocks frozen (``finetune.freeze_d=k``), for each k;
3. scores each run's EMA generator as ``python evaluate.py`` does: against all of the split's 5-9 images, in
   the feature space of the classifier of all ten digits (classifier-FID; ``confident``: the share of samples
   classified as one of 5-9 with probability >= 0.9; ``classes_present``: how many of the five classes
   appear), beside the floor of real 5-9 images (two halves);
4. counts the FLOPs of D's backward passes that each k saves (torch's FlopCounterMode, over four D updates,
   one of which carries the lazy R1 penalty), and prints the mean and spread over seeds of each row, with
   the wall time per run, writing them into ``--write``'s block ``finetune``.

Every run is a real ``train.py`` subprocess, one at a time (``--threads`` each), so its time is its own.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from images import evaluate, load, references  # noqa: E402

from gan.config.compose import compose  # noqa: E402
from gan.core.models import UNCONDITIONAL  # noqa: E402
from gan.data.datasets import build_dataset, data_shape  # noqa: E402
from gan.run.build import build_module  # noqa: E402
from gan.run.finetune import freeze_networks  # noqa: E402
from tools.blocks import recipe_inputs, write_block  # noqa: E402

INPUTS = ["gan", *recipe_inputs("mnist"), "benchmarks/finetune.py", "benchmarks/images.py"]  # a change: stale block

ROOT = Path(__file__).resolve().parents[1]
SOURCE, TARGET = "[0,1,2,3,4]", "[5,6,7,8,9]"


def train(run_dir: Path, overrides: list[str], reuse: bool) -> float | None:
    """``python train.py experiment=mnist <overrides>`` into ``run_dir``; its wall seconds, kept beside the run so
    that a reused run (``reuse``: trained by an earlier call, e.g. one of two calls on disjoint seeds) reports
    them too (None: a reused run trained before they were kept)."""
    record = run_dir / "train_seconds.txt"
    if reuse and (run_dir / "generator.pt").is_file():
        return float(record.read_text()) if record.is_file() else None
    command = [sys.executable, "train.py", "experiment=mnist", *overrides, f"hydra.run.dir={run_dir}",
               "trainer.enable_progress_bar=false"]
    print(" ".join(command[1:]), f"(load average {load()})", flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    record.write_text(f"{seconds:.1f}\n")
    print(f"  trained in {seconds:.0f} s", flush=True)
    return seconds


def backward_flops(data: list[str], freeze_d: int, seed: int = 0) -> int:
    """FLOPs of D's backward passes over four D updates of the recipe (update 0 adds the lazy R1 penalty), with
    D's first ``freeze_d`` blocks frozen."""
    cfg = OmegaConf.to_container(compose("experiment=mnist", *data), resolve=True)
    module = build_module(cfg, data_shape(cfg["data"]), UNCONDITIONAL)
    freeze_networks(module, {"freeze_d": freeze_d, "freeze_g": 0})
    real = build_dataset(cfg["data"], seed).tensors[0][: cfg["data"]["batch_size"]]
    fake = module.G(module.noise(len(real))).detach()
    total = 0
    for k in range(4):
        loss, _, _ = module.objective.d_loss(module.D, real, fake, None, k, None)
        with FlopCounterMode(display=False) as counter:
            loss.backward()
        total += counter.get_total_flops()
        module.D.zero_grad(set_to_none=True)
    return total


def mean_spread(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}g}"
    return f"{statistics.mean(values):.{digits}g} ± {statistics.stdev(values):.{digits - 1}g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="data.root of MNIST (its raw/*.gz files)")
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--pretrain-steps", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=300, help="generator steps of each adaptation run")
    parser.add_argument("--sizes", nargs="+", type=int, default=[100, 1000], help="images of 5-9 (data.limit)")
    parser.add_argument("--freeze", nargs="+", type=int, default=[1, 2, 3], help="FreezeD's k values")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--num-samples", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks" / "finetune")
    parser.add_argument("--reuse", action="store_true", help="keep runs already trained (and scored) under --out")
    parser.add_argument("--write", type=Path, default=ROOT / "docs" / "results.md")
    args = parser.parse_args()
    data = [f"data.root={args.data_root}", f"data.split={args.split}", f"train.threads={args.threads}"]

    pretrained = args.out / "pretrain-0to4"
    pre_seconds = train(pretrained, [*data, f"data.classes={SOURCE}", f"trainer.max_steps={args.pretrain_steps}",
                                     "seed=0"], args.reuse)
    # (name in run directories, row label, FreezeD's k, overrides)
    methods: list[tuple[str, str, int, list[str]]] = [("scratch", "from scratch", 0, []),
                                                      ("full", "fine-tune everything", 0, [f"init_from={pretrained}"])]
    methods += [(f"freezed{k}", f"FreezeD, D's first {k} block{'s' if k > 1 else ''} frozen", k,
                 [f"init_from={pretrained}", f"finetune.freeze_d={k}"]) for k in args.freeze]
    results: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    floor = None
    for size in args.sizes:
        for slug, label, k, extra in methods:
            for seed in args.seeds:
                run_dir = args.out / f"n{size}-{slug}-seed{seed}"
                seconds = train(run_dir, [*data, f"data.classes={TARGET}", f"data.limit={size}",
                                          f"trainer.max_steps={args.steps}", f"seed={seed}", *extra], args.reuse)
                result, settings = evaluate(run_dir, args.num_samples, reuse=args.reuse)
                result["seconds"] = seconds
                print(f"  n={size} {label} seed {seed}: fid {result['fid']:.3g}, confident {result['confident']:.3f}, "
                      f"classes {result['classes_present']}", flush=True)
                results.setdefault((size, label, k), []).append(result)
                if floor is None:
                    floor, _, half = references(run_dir, settings, untrained=False)

    full_flops = backward_flops([*data, f"data.classes={TARGET}"], 0)
    lines = [f"Pretrained on the digits 0-4 of MNIST's {args.split} split ({args.pretrain_steps:,} generator steps, "
             f"`experiment=mnist`, seed 0{f', {pre_seconds:.0f} s' if pre_seconds else ''}); each row then trains "
             f"{args.steps:,} generator steps on n images of the digits 5-9 (`data.limit=n`, drawn with the seed), "
             f"seeds {', '.join(map(str, args.seeds))} (mean ± standard deviation), {args.threads} thread(s) a run. "
             f"Scored with {args.num_samples:,} samples of the EMA generator against all of the split's 5-9 images "
             "(classifier-FID in the feature space of the classifier of all ten digits; `confident`: classified as "
             "one of 5-9 with probability >= 0.9; classes: how many of the five appear, each in at least a quarter "
             "of its share). D's backward FLOPs: four D updates of the recipe (one with the lazy R1 penalty), "
             "counted by torch's FlopCounterMode.", "",
             f"Real 5-9 images, two halves ({half:,} vs {half:,}): classifier-FID {floor['fid']:.3g}, "
             f"confident {floor['confident']:.3f}, classes {floor['classes_present']}.", "",
             "| n | start | classifier-FID | confident | classes (of 5) | D's backward FLOPs | s a run |",
             "|---|---|---|---|---|---|---|"]
    for (size, label, k), runs in results.items():
        flops = backward_flops([*data, f"data.classes={TARGET}"], k) if k else full_flops
        saved = f" ({1 - flops / full_flops:.0%} saved)" if k else ""
        seconds = [r["seconds"] for r in runs if r["seconds"] is not None]
        lines.append(f"| {size:,} | {label} | {mean_spread([r['fid'] for r in runs])} | "
                     f"{mean_spread([r['confident'] for r in runs], 2)} | "
                     f"{mean_spread([float(r['classes_present']) for r in runs], 2)} | "
                     f"{flops / 1e6:,.0f} M{saved} | {mean_spread(seconds, 2) if seconds else 'reused'} |")
    text = "\n".join(lines)
    print(text)
    command = "python benchmarks/finetune.py " + " ".join(sys.argv[1:])
    write_block(args.write, "finetune", text, command, INPUTS)
    print(f"wrote the table into {args.write}")


if __name__ == "__main__":
    torch.set_num_threads(1)  # the script's own scoring; each run sets its own train.threads
    main()
