"""The default run as a new user makes it: `python train.py`, then `python evaluate.py run_dir=<run>`, each its
own process, timed (wall and CPU seconds), with the metrics evaluate.py writes and the real data's own floor
(two halves of the real images scored against each other, as benchmarks/images.py does): a FID below it is a
warning about what FID can tell at these sample counts, and the README's sentence says so.

Usage: python benchmarks/default_run.py [--write docs/results.md] [--samples docs/digits_samples.png]
                                        [--readme README.md] [--inception-weights FILE [--inception-sha256 HEX]
                                        [--inception-samples N]] [-- extra train.py overrides]

``--inception-weights`` scores the same run once more in the Inception space (``features=inception``,
N samples against N real images: Inception-v3 takes a fraction of a second an image on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INCEPTION_NAMES = ("fid", "kid", "precision", "recall", "density", "coverage")
sys.path.insert(0, str(ROOT))
from images import evaluate, references  # noqa: E402  (benchmarks/images.py: the real-data floor)

from tools.blocks import recipe_inputs, write_block  # noqa: E402

# `python train.py` trains the digits recipe; a change to any of these makes the blocks stale
INPUTS = ["gan", *recipe_inputs("digits"), "train.py", "evaluate.py", "benchmarks/default_run.py"]


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of ``command`` run from the repository root."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="put the table into this markdown file's default-run block")
    parser.add_argument("--samples", type=Path, help="copy the run's last sample grid (PNG) here")
    parser.add_argument("--readme", type=Path, help="put the time and the FID in one sentence into this file's block")
    parser.add_argument("--inception-weights", help="also score the run in the Inception space with this file")
    parser.add_argument("--inception-sha256", help="that file's sha256, where it is not a published one")
    parser.add_argument("--inception-samples", type=int, default=1000,
                        help="generated (and real) images scored in the Inception space (default: 1000)")
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides")
    args = parser.parse_args()
    inception = [f"inception_weights={args.inception_weights}"] if args.inception_weights else []
    inception += [f"inception_sha256={args.inception_sha256}"] if args.inception_sha256 and inception else []
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        train_wall, train_cpu = timed([sys.executable, "train.py", f"hydra.run.dir={run}",
                                       "trainer.enable_progress_bar=false", *args.overrides])
        eval_wall, eval_cpu = timed([sys.executable, "evaluate.py", f"run_dir={run}"])
        metrics = json.loads((run / "eval" / "metrics.json").read_text())
        _, settings = evaluate(run, metrics["num_samples"], reuse=True)  # evaluate.py's settings, not run again
        floor, _, half = references(run, settings, untrained=False)
        grid = sorted((run / "samples").glob("step_*.png"))[-1].read_bytes()
        if inception:
            n = args.inception_samples
            inception_wall, _ = timed([sys.executable, "evaluate.py", f"run_dir={run}", "features=inception",
                                       *inception, f"num_samples={n}", f"num_real={n}"])
            inception_metrics = json.loads((run / "eval" / "metrics.json").read_text())
    names = [k for k in ("fid", "kid", "precision", "recall", "density", "coverage", "class_kl", "confident")
             if k in metrics]
    rows = ["| | `python train.py` wall | CPU | `python evaluate.py` wall | " + " | ".join(names) + " |",
            "|---" * (4 + len(names)) + "|",
            f"| the run | {train_wall:.0f} s | {train_cpu:.0f} s | {eval_wall:.0f} s | "
            + " | ".join(f"{metrics[k]:.4g}" for k in names) + " |",
            f"| real data, two halves ({half:,} vs {half:,}): the floor | | | | "
            + " | ".join(f"{floor[k]:.4g}" if k in floor else "" for k in names) + " |"]
    if inception:
        rows += ["", f"The same run in the Inception space ({n:,} samples against {n:,} real images; "
                 f"{' '.join(inception)}; {inception_wall:.0f} s):", "",
                 "| " + " | ".join(INCEPTION_NAMES) + " |", "|---" * len(INCEPTION_NAMES) + "|",
                 "| " + " | ".join(f"{inception_metrics[k]:.4g}" for k in INCEPTION_NAMES) + " |"]
    table = "\n".join(rows)
    print(table)
    if args.write:
        command = "python benchmarks/default_run.py " + " ".join(sys.argv[1:])
        write_block(args.write, "default-run", table, command, INPUTS)
        print(f"wrote {args.write}")
    if args.readme:  # the front page says how long the default run takes, from this measurement alone
        below = metrics["fid"] < floor["fid"]
        sentence = (f"On a 2-core CPU, `python train.py` took **{train_wall / 60:.1f} minutes** ({train_cpu:.0f} s "
                    f"of CPU time) and scored a classifier-FID of {metrics['fid']:.2f}, against {floor['fid']:.2f} "
                    f"between two halves of the real digits"
                    + (": below the data's own floor, which at these sample counts is a warning about what FID can "
                       "tell, not a sign that G beats the data" if below else "")
                    + " ([docs/results.md](docs/results.md#default-run-python-trainpy)).")
        write_block(args.readme, "default-run-time", sentence, "python benchmarks/default_run.py " +
                    " ".join(sys.argv[1:]), INPUTS)
    if args.samples:  # after the block: the stamp's commit describes the code, not this output
        args.samples.write_bytes(grid)


if __name__ == "__main__":
    main()
