"""The margins of the suite's training tests: each test that trains a recipe (tests/test_experiments.py's
TRAINING_CASES) run as the test runs it, at several seeds and thread counts, with the figures it asserts.

Usage: python benchmarks/suite_margins.py [--cases ring grid mnist stacked_mnist] [--seeds 0 1 2 3 4]
                                          [--threads 1 2] [--out outputs/suite_margins] [--reuse]
                                          [--write docs/results.md]

A test's floor must hold wherever the suite runs: on any CPU (their rounding differs, so a run's path does),
with 1 or 2 threads. Each run is ``python train.py`` and ``python evaluate.py`` in processes of their own,
with the test's overrides plus ``seed=`` and ``train.threads=``; the table gives each figure's minimum,
median and maximum over the runs beside the test's floor, so the margin is read off one line; ``--write`` puts
each case's table in a block of its own (``suite-margins-<case>``). ``--reuse`` reads a run's eval/metrics.json back
where ``--out`` holds it (the runs are seeded: the same case, seed and threads train the same run on one machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from test_experiments import TRAINING_CASES  # noqa: E402

from tools.blocks import machine, write_block  # noqa: E402


def run_case(name: str, seed: int, threads: int, out: Path, reuse: bool) -> dict[str, float]:
    case = TRAINING_CASES[name]
    run_dir = out / f"{name}-seed{seed}-threads{threads}"
    scored = run_dir / "eval" / "metrics.json"
    if reuse and scored.is_file():
        return {key: json.loads(scored.read_text())[key] for key in case.floors}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    shutil.rmtree(run_dir, ignore_errors=True)
    subprocess.run([sys.executable, "train.py", *case.train, f"seed={seed}", f"train.threads={threads}",
                    f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "evaluate.py", f"run_dir={run_dir}", *case.evaluate(out / "feature_cache")],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    metrics = json.loads(scored.read_text())
    return {key: metrics[key] for key in case.floors}


def table(name: str, rows: list[dict[str, float]], runs: str) -> str:
    lines = [f"`{name}`: its figures over {runs}, beside the floor the test asserts.", "",
             "| figure | floor | min | median | max |", "|---|---|---|---|---|"]
    for key, (op, bound) in TRAINING_CASES[name].floors.items():
        values = [row[key] for row in rows]
        lines.append(f"| {key} | {op} {bound:g} | {min(values):.4g} | {statistics.median(values):.4g} | "
                     f"{max(values):.4g} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(TRAINING_CASES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "suite_margins")
    parser.add_argument("--reuse", action="store_true", help="read back the runs --out already holds")
    parser.add_argument("--write", help="a markdown file to put each case's table in (blocks suite-margins-<case>)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    for name in args.cases:
        for threads in args.threads:
            for seed in args.seeds:
                row = run_case(name, seed, threads, args.out, args.reuse)
                print(name, f"seed={seed}", f"threads={threads}", json.dumps(row), flush=True)
                results.setdefault(name, []).append(row)
    runs = f"seeds {' '.join(map(str, args.seeds))} x threads {' '.join(map(str, args.threads))}"
    print(machine())
    for name, rows in results.items():
        body = table(name, rows, runs)
        print(f"\n{body}")
        if args.write:
            command = f"python benchmarks/suite_margins.py --cases {name} " + " ".join(
                arg for arg in sys.argv[1:] if arg not in args.cases and arg != "--cases")
            write_block(args.write, f"suite-margins-{name}", body, command,
                        ["gan", "configs", "tests/test_experiments.py", "benchmarks/suite_margins.py"])


if __name__ == "__main__":
    main()
