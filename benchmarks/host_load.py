"""The default run quiet and beside a busy process, under each way of setting torch's threads.

Usage: python benchmarks/host_load.py [--policies two-threads passive one-thread default] [--rounds 1]
                                      [--write docs/benchmarks.md] [-- extra train.py overrides]

A laptop always has neighbours: a browser, a second run, the test suite. On 2 cores, one busy neighbour
shares a core with one of torch's two threads, and every parallel operation waits at its barrier for the
thread that is not running. Each policy runs ``python train.py`` (the default run, or the overrides after
``--``) once on a quiet machine and once beside ``python -c "while True: pass"``, in turn, in this one
process's run; the table gives each policy's wall times, loaded over quiet, and quiet over the first
policy's quiet time (two threads that spin while idle: what every run had before the run chose its count).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.blocks import machine, recipe_inputs, write_block  # noqa: E402

# The environment and overrides of each policy. torch's OpenMP on Linux (libgomp) spins a few ms before an idle
# thread sleeps; OMP_WAIT_POLICY=PASSIVE sleeps at once. "default" is what `python train.py` does: every core
# when they are free at the start, the free ones when other work keeps some busy (gan/training/host.py).
POLICIES = {
    "two-threads": ({}, ["train.threads=2"]),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, ["train.threads=2"]),
    "one-thread": ({}, ["train.threads=1"]),
    "default": ({}, []),
}
BUSY = [sys.executable, "-c", "while True: pass"]


def run(policy: str, loaded: bool, extra: list[str], out: Path) -> float:
    variables, overrides = POLICIES[policy]
    env = {key: value for key, value in os.environ.items()
           if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    run_dir = out / f"{policy}-{'loaded' if loaded else 'quiet'}-{time.monotonic_ns()}"
    busy = subprocess.Popen(BUSY) if loaded else None
    try:
        start = time.perf_counter()
        subprocess.run([sys.executable, "train.py", *overrides, *extra, "trainer.enable_progress_bar=false",
                        f"hydra.run.dir={run_dir}"], cwd=ROOT, env={**env, **variables}, check=True,
                       capture_output=True)
        return time.perf_counter() - start
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--write", help="a markdown file to put the table in (block host-load)")
    parser.add_argument("extra", nargs="*", help="train.py overrides, after --")
    args = parser.parse_args()
    seconds: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(args.rounds):
            for policy in args.policies:
                for loaded in (False, True):
                    took = run(policy, loaded, args.extra, Path(out))
                    seconds.setdefault((policy, loaded), []).append(took)
                    print(f"{policy} {'loaded' if loaded else 'quiet'}: {took:.1f} s", flush=True)
    first = statistics.median(seconds[(args.policies[0], False)])
    lines = [f"`python train.py {' '.join(args.extra)}`".replace(" `", "`") + f", wall seconds (median of "
             f"{args.rounds} round{'s' * (args.rounds > 1)}), quiet and beside one busy single-threaded process.",
             "", f"| policy | quiet s | loaded s | loaded / quiet | quiet / {args.policies[0]}'s quiet |",
             "|---|---|---|---|---|"]
    for policy in args.policies:
        quiet, loaded = (statistics.median(seconds[(policy, flag)]) for flag in (False, True))
        lines.append(f"| {policy} | {quiet:.1f} | {loaded:.1f} | {loaded / quiet:.2f} | {quiet / first:.2f} |")
    body = "\n".join(lines)
    print(f"\n{machine()}\n{body}")
    if args.write:
        command = "python benchmarks/host_load.py " + " ".join(sys.argv[1:])
        write_block(args.write, "host-load", body, command,
                    ["gan", *recipe_inputs("digits"), "train.py", "benchmarks/host_load.py"])


if __name__ == "__main__":
    main()
