"""StackedMNIST's 1,000 modes over several seeds, beside the published table and real data's floor.

Usage: python benchmarks/stacked.py --data-root DIR [--split test] [--seeds 3] [--jobs 1] [--threads N]
                                    [--out outputs/stacked] [--reuse] [--write docs/results.md]

For each seed: ``python train.py experiment=stacked_mnist seed=<s> data.root=DIR data.split=<split>`` in its
own process, then ``python evaluate.py run_dir=<run>`` with its defaults: 26,000 samples of the EMA
generator, each channel read by the MNIST classifier, ``stacked_modes`` hit of 1,000 and ``stacked_kl``
from the uniform, beside the same two figures for 26,000 real stacks (docs/protocols.md). The runner and
its timing are benchmarks/toy.py's. ``--write`` puts the table between the ``stacked`` markers of a
markdown file and copies seed 0's sample grid next to it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from step import machine
from toy import mean_and_error, run_once, verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.blocks import commit, recipe_inputs, write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# 26,000 samples, as collected in R3GAN's paper (Huang et al., NeurIPS 2024, its StackedMNIST table).
PUBLISHED = {"VEEGAN": (762, 2.17), "PacGAN": (992, 0.28), "StyleGAN2": (940, 0.42), "DDGAN": (1000, 0.071),
             "R3GAN": (1000, 0.029)}
MODES, MAX_KL, SECONDS_PER_RUN = 1000, 0.03, 1800  # at every seed; a run's CPU seconds on 2 cores
INPUTS = ["gan", *recipe_inputs("stacked_mnist"), "benchmarks/stacked.py", "benchmarks/toy.py"]


def table(runs: list[dict]) -> list[str]:
    modes, kl = (mean_and_error([r[key] for r in runs]) for key in ("stacked_modes", "stacked_kl"))
    cpu, seconds = [r["cpu_seconds"] for r in runs], [r["seconds"] for r in runs]
    every_mode = all(r["stacked_modes"] >= MODES for r in runs)
    kl_met = all(r["stacked_kl"] <= MAX_KL for r in runs)
    real = runs[0]
    rows = ["| StackedMNIST, 26,000 samples | modes (of 1,000) | KL to uniform | FID (per-channel classifier) | "
            "seconds per run (wall; CPU) |", "|---|---|---|---|---|",
            f"| `experiment=stacked_mnist`, {len(runs)} seeds | **{modes[0]:.1f}** ± {modes[1]:.1f} | "
            f"**{kl[0]:.4f}** ± {kl[1]:.4f} | {statistics.mean(r.get('fid', float('nan')) for r in runs):.2f} | "
            f"{statistics.mean(seconds):.0f}, max {max(seconds):.0f}; {statistics.mean(cpu):.0f}, max {max(cpu):.0f} |",
            f"| target | {MODES} at every seed: {verdict(every_mode)} | <= {MAX_KL} at every seed: {verdict(kl_met)} | "
            f"| <= {SECONDS_PER_RUN} CPU: {verdict(max(cpu) <= SECONDS_PER_RUN)} |",
            f"| 26,000 real stacks (the floor) | {real['stacked_modes_real']} | {real['stacked_kl_real']:.4f} | | |"]
    rows += [f"| {name} (R3GAN's table) | {m} | {k} | | |" for name, (m, k) in PUBLISHED.items()]
    per_seed = ", ".join(f"{r['seed_run']}: {r['stacked_modes']}/{r['stacked_kl']:.4f}" for r in runs)
    return [*rows, "", f"Per seed (modes/KL): {per_seed}."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", required=True, help="the folder holding MNIST's IDX files (data.root)")
    parser.add_argument("--split", default="test", choices=["train", "test"])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained side by side")
    parser.add_argument("--threads", type=int, help="threads per run (default: the cores shared among --jobs)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "stacked", help="where the runs go")
    parser.add_argument("--reuse", action="store_true", help="keep runs already scored in --out")
    parser.add_argument("--write", type=Path, help="put the table in this markdown file, between the stacked markers")
    args = parser.parse_args()
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    extra = [f"data.root={args.data_root}", f"data.split={args.split}"]
    header = (f"`python benchmarks/stacked.py {' '.join(sys.argv[1:])}` at commit {commit(INPUTS)}. Machine: "
              f"{machine(torch.device('cpu'))}; {args.jobs} run(s) at a time, {threads} thread(s) each.")
    print(header, flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:  # threads only wait on the runs' processes
        results = pool.map(lambda seed: run_once("stacked_mnist", seed, args.out / f"seed{seed}", extra, args.reuse,
                                                 threads), range(args.seeds))
        runs = []
        for seed, result in enumerate(results):
            runs.append({**result, "seed_run": seed})
            print(f"seed {seed}: {result['stacked_modes']} modes, KL {result['stacked_kl']:.4f} (real "
                  f"{result['stacked_kl_real']:.4f}), {result['seconds']:.0f} s ({result['cpu_seconds']:.0f} s CPU)",
                  flush=True)
    rows = table(runs)
    print("\n".join(rows), flush=True)
    if args.write:
        shutil.copy(args.out / "seed0" / "eval" / "grid.png", args.write.parent / "stacked_mnist_samples.png")
        write_block(args.write, "stacked", "\n".join([header, "", *rows]),
                    "python benchmarks/stacked.py " + " ".join(sys.argv[1:]), INPUTS)
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
