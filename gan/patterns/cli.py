"""``python -m gan.patterns``: every demonstration's result as one row of a markdown table (``--only NAME`` for one
row, ``--device cuda`` on a GPU); ``python -m gan.patterns graph [--out DIR]`` draws the autograd graphs of one
training step instead (gan/patterns/graph.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from gan.core.devices import resolve_device
from gan.errors import ConfigError
from gan.patterns import graph
from gan.patterns.claims import DEMOS, Result


def markdown_table(results: Iterable[Result]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| claim | what was run | what was measured | verdict |", "|---|---|---|---|"]
    rows += [f"| `{r.name}`: {cell(r.claim)} | {cell(r.ran)} | {cell(r.measured)} | {r.verdict} |"
             for r in results]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gan.patterns",
                                     description="Measured demonstrations of the autograd patterns of this project.")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--only", metavar="NAME", help=f"run one demonstration: {', '.join(DEMOS)}")
    commands = parser.add_subparsers(dest="command", metavar="graph")
    draw = commands.add_parser("graph", help="draw the autograd graphs of one training step (gan/core/graphs.py)")
    draw.add_argument("--out", type=Path, default=Path("outputs/graphs"),
                       help="where the SVG and PNG pictures go (default: outputs/graphs)")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
        if args.only is not None and args.only not in DEMOS:
            raise ConfigError(f"unknown demonstration '{args.only}': choose one of {', '.join(DEMOS)}")
        if args.only is not None and args.command == "graph":
            raise ConfigError("--only picks a row of the table; `graph` draws pictures instead: use one of them")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command == "graph":
        return graph.main(args.out, device)
    names = [args.only] if args.only else list(DEMOS)
    results = [DEMOS[name](device) for name in names]
    print(markdown_table(results))
    return 0 if all(r.ok is not False for r in results) else 1
