"""Sample quality on the 2D mixtures over many seeds, beside the published table (PacGAN, Table 1).

Usage: python benchmarks/toy.py [--presets ring grid] [--seeds 10] [--jobs 1] [--threads N] [--out outputs/toy]
                                [--reuse] [--write docs/results.md] [-- extra train.py overrides]

For each preset and seed: ``python train.py experiment=<preset> seed=<s>`` in its own process, timed by
the wall clock (Python start-up and data generation included: what a user waits for), then ``python
evaluate.py run_dir=<run>`` with its defaults (2,500 samples of the EMA generator, the protocol of
docs/protocols.md). ``--jobs N`` runs N seeds side by side, each limited to its share of the CPU cores
(OMP_NUM_THREADS), so a run's time is still that of a run on its own share; ``--threads`` sets that
number instead (``--jobs 1 --threads 1``: one single-threaded run at a time on a shared machine). The
table gives the mean and standard error over seeds of modes captured, the high-quality share and the
reverse KL, the spread around the modes, next to real data's scores, the published rows and this
project's targets; ``--write`` puts it between the
``toy`` markers of a markdown file and copies seed 0's scatter plots next to it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from step import machine  # benchmarks/step.py: the same machine line in every report

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.blocks import commit, recipe_inputs, write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# PacGAN (Lin et al., NeurIPS 2018), Table 1: means over 10 trials after 400 epochs over 100,000
# points: (modes, high-quality share, reverse KL), its five rows per mixture. VEEGAN's table scores these
# mixtures by a different protocol, so it is not quoted beside them.
PUBLISHED = {
    "ring": {"GAN": (6.3, 0.982, 0.45), "ALI": (6.6, 0.976, 0.36), "PacGAN2": (7.9, 0.956, 0.07),
             "PacGAN3": (7.8, 0.977, 0.10), "PacGAN4": (7.8, 0.959, 0.07)},
    "grid": {"GAN": (17.3, 0.948, 0.70), "ALI": (24.1, 0.957, 0.14), "PacGAN2": (23.8, 0.913, 0.13),
             "PacGAN3": (24.6, 0.942, 0.06), "PacGAN4": (24.8, 0.936, 0.04)},
}
# This project's targets: (modes at every seed, high quality at least and reverse KL at most over the
# mean of seeds), and the most seconds one run may take on the development machine (2 CPU cores).
TARGETS = {"ring": (8, 0.983, 0.002), "grid": (25, 0.958, 0.006)}
# The spread at every seed: the median mode's within SPREAD_MEDIAN, every mode's within SPREAD_EVERY
# (real data scores 0.974: its rms radius within 3 std, over std sqrt 2; docs/protocols.md).
SPREAD_MEDIAN, SPREAD_EVERY = (0.8, 1.25), (0.6, 1.5)
REAL_SPREAD, REAL_HIGH_QUALITY = 0.974, 0.989
SECONDS_PER_RUN = 180
# what the numbers depend on: a change to any, beyond comments, makes the block stale
INPUTS = ["gan", *recipe_inputs(*TARGETS), "benchmarks/toy.py"]


def run_once(preset: str, seed: int, run_dir: Path, extra: list[str], reuse: bool, threads: int) -> dict:
    """Train and score one seed; returns evaluate.py's metrics plus ``seconds`` (training wall time) and
    ``cpu_seconds`` (the training process's CPU time)."""
    record = run_dir / "benchmark.json"
    if reuse and record.exists():
        return json.loads(record.read_text())
    if run_dir.exists():
        shutil.rmtree(run_dir)  # this script's own output folder: a rerun replaces it
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    run_dir.mkdir(parents=True)
    cpu = run([sys.executable, "train.py", f"experiment={preset}", f"seed={seed}", f"hydra.run.dir={run_dir}",
               "trainer.enable_progress_bar=false", *extra], env, run_dir / "benchmark_train.log")
    seconds = time.perf_counter() - start
    run([sys.executable, "evaluate.py", f"run_dir={run_dir}"], env, run_dir / "benchmark_evaluate.log")
    result = {**json.loads((run_dir / "eval" / "metrics.json").read_text()), "seconds": seconds, "cpu_seconds": cpu}
    record.write_text(json.dumps(result, indent=2) + "\n")
    return result


def run(command: list[str], env: dict[str, str], log: Path) -> float:
    """Run a command in the project root, its output to ``log``; returns its CPU seconds (user + system,
    children included: what it would take on an idle core of its own). On failure, show the log's end
    and stop."""
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(command)} failed:\n{log.read_text()[-4000:]}")
    return usage.ru_utime + usage.ru_stime


def mean_and_error(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (sample standard deviation / sqrt(n); 0 for one value)."""
    error = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.mean(values), error


def table(preset: str, runs: list[dict]) -> list[str]:
    """Markdown rows: this project's mean +- standard error, the targets, real data's scores, the published
    rows (which report no spread)."""
    modes, hq, kl = (mean_and_error([r[key] for r in runs]) for key in ("modes", "high_quality", "reverse_kl"))
    spread = mean_and_error([r["spread"] for r in runs])
    lowest, highest = min(r["spread_min"] for r in runs), max(r["spread_max"] for r in runs)
    seconds, cpu = [r["seconds"] for r in runs], [r["cpu_seconds"] for r in runs]
    want_modes, want_hq, want_kl = TARGETS[preset]
    total = runs[0]["modes_total"]
    every_mode = all(r["modes"] >= want_modes for r in runs)
    spread_met = all(SPREAD_MEDIAN[0] <= r["spread"] <= SPREAD_MEDIAN[1] and SPREAD_EVERY[0] <= r["spread_min"]
                     and r["spread_max"] <= SPREAD_EVERY[1] for r in runs)
    rows = [f"| {preset} | modes (of {total}) | high quality | reverse KL | spread: median mode (lowest and "
            "highest mode, all seeds) | seconds per run (wall; CPU) |", "|---|---|---|---|---|---|",
            f"| `experiment={preset}` (no mode count), {len(runs)} seeds | **{modes[0]:.2f}** ± {modes[1]:.2f} | "
            f"**{hq[0]:.3f}** ± {hq[1]:.3f} | **{kl[0]:.4f}** ± {kl[1]:.4f} | **{spread[0]:.2f}** ± {spread[1]:.2f} "
            f"({lowest:.2f}-{highest:.2f}) | {statistics.mean(seconds):.0f}, max {max(seconds):.0f}; "
            f"{statistics.mean(cpu):.0f}, max {max(cpu):.0f} |",
            f"| target | {want_modes} at every seed: {verdict(every_mode)} | >= {want_hq}: {verdict(hq[0] >= want_hq)} "
            f"| <= {want_kl}: {verdict(kl[0] <= want_kl)} | {SPREAD_MEDIAN[0]}-{SPREAD_MEDIAN[1]} "
            f"({SPREAD_EVERY[0]}-{SPREAD_EVERY[1]}) at every seed: {verdict(spread_met)} | "
            f"<= {SECONDS_PER_RUN} CPU: {verdict(max(cpu) <= SECONDS_PER_RUN)} |",
            # a perfectly balanced sampler's reverse KL over 2,500 samples averages (K - 1) / (2 x 2,500)
            f"| real data (the mixture itself) | {total} | {REAL_HIGH_QUALITY} | {(total - 1) / 5000:.4f} (sampling) "
            f"| {REAL_SPREAD} | |"]
    for name, (m, q, k) in PUBLISHED[preset].items():
        rows.append(f"| {name} (PacGAN, Table 1) | {m} | {q:.3f} | {k:.2f} | not reported | |")
    per_seed = ", ".join(f"{r['seed_run']}: {r['modes']}/{r['high_quality']:.3f}/{r['reverse_kl']:.4f}/"
                         f"{r['spread']:.2f}" for r in runs)
    return [*rows, "", f"Per seed (modes/high quality/reverse KL/spread): {per_seed}."]


def verdict(met: bool) -> str:
    return "**met**" if met else "**missed**"




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 per preset")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained side by side")
    parser.add_argument("--threads", type=int, help="threads per run (default: the cores shared among --jobs)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "toy", help="where the runs go")
    parser.add_argument("--reuse", action="store_true", help="keep runs already scored in --out")
    parser.add_argument("--write", type=Path, help="put the table in this markdown file, between the toy markers")
    parser.add_argument("extra", nargs="*", help="train.py overrides for every run (after --)")
    args = parser.parse_args()
    if args.seeds < 1 or args.jobs < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--seeds, --jobs and --threads must be >= 1")
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)

    header = (f"`python benchmarks/toy.py {' '.join(sys.argv[1:])}` at commit {commit(INPUTS)}. Machine: "
              f"{machine(torch.device('cpu'))}; {args.jobs} run(s) at a time, {threads} thread(s) each.")
    print(header, flush=True)
    block = [header]
    for preset in args.presets:
        with ThreadPoolExecutor(args.jobs) as pool:  # threads only wait on the runs' processes
            results = pool.map(lambda seed, p=preset: run_once(p, seed, args.out / p / f"seed{seed}", args.extra,
                                                               args.reuse, threads), range(args.seeds))
            runs = []
            for seed, result in enumerate(results):
                runs.append({**result, "seed_run": seed})
                print(f"{preset} seed {seed}: {result['modes']}/{result['modes_total']} modes, high quality "
                      f"{result['high_quality']:.3f}, reverse KL {result['reverse_kl']:.4f}, spread "
                      f"{result['spread']:.2f} ({result['spread_min']:.2f}-{result['spread_max']:.2f}), "
                      f"{result['seconds']:.0f} s ({result['cpu_seconds']:.0f} s CPU)", flush=True)
        rows = table(preset, runs)
        print("\n".join(rows), flush=True)
        block += ["", *rows]
        if args.write:
            shutil.copy(args.out / preset / "seed0" / "eval" / "grid.png", args.write.parent / f"{preset}_samples.png")
    if args.write:
        write_block(args.write, "toy", "\n".join(block), "python benchmarks/toy.py " + " ".join(sys.argv[1:]),
                    INPUTS)
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
