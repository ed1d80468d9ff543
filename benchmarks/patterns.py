"""The table of ``python -m gan.patterns``, written into a doc as its generated block ``patterns``.

Usage: OMP_NUM_THREADS=1 python benchmarks/patterns.py [--device cpu|cuda] [--write docs/patterns.md]

Runs every claim (gan/patterns/claims.py) and prints the table; with ``--write PATH`` it also puts the table
between PATH's ``patterns`` markers, stamped with this command, the commit, the machine and the inputs
whose change makes it stale (tools/blocks.py; ``python tools/blocks.py`` lists stale blocks). The writing
lives here, not in gan/patterns: tools/ is a repository helper, not part of the installed package.
Exit code 1 when a claim does not hold (the table is written all the same, verdicts included).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools/ is not installed; and the table must measure this checkout's gan/

from gan.core.devices import resolve_device  # noqa: E402
from gan.errors import ConfigError  # noqa: E402
from gan.patterns.claims import markdown_table, run  # noqa: E402
from tools.blocks import write_block  # noqa: E402

INPUTS = ["gan/core", "gan/patterns"]  # the step and the claims: a change to either may change a row


def command(argv: list[str]) -> str:
    threads = os.environ.get("OMP_NUM_THREADS")
    return (f"OMP_NUM_THREADS={threads} " if threads else "") + " ".join(["python benchmarks/patterns.py", *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Run every claim of gan.patterns; write the table into a doc.")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--write", type=Path, metavar="PATH", help="put the table in PATH's block `patterns`")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except ConfigError as e:
        parser.error(str(e))
    start = time.perf_counter()
    results = run(device)
    seconds = time.perf_counter() - start
    counts = {"hold": sum(r.ok is True for r in results), "do not hold": sum(r.ok is False for r in results),
              "skipped (they need CUDA)": sum(r.ok is None for r in results)}
    summary = (f"{len(results)} claims: " + ", ".join(f"{n} {what}" for what, n in counts.items() if n)
               + f"; the run took {seconds:.0f} s on {device}.")
    body = f"{markdown_table(results)}\n\n{summary}"
    print(body)
    if args.write:
        write_block(args.write, "patterns", body, command(argv), INPUTS)
        print(f"wrote the block `patterns` of {args.write}")
    return 0 if all(r.ok is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
