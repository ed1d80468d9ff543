"""``python -m gan.patterns``: every claim's result as one row of a markdown table (``--only NAME`` for one
row, ``--device cuda`` on a GPU); ``python -m gan.patterns graph [--out DIR]`` draws the autograd graphs of one
training step instead (gan/patterns/graph.py). ``benchmarks/patterns.py`` writes the table into
docs/patterns.md."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from gan.core.devices import resolve_device
from gan.errors import ConfigError
from gan.patterns import cuda, evaluation, gan_step, graph, tensors
from gan.patterns.measure import Result

# Every claim, in the order of the table.
DEMOS: dict[str, Callable[[torch.device], Result]] = {
    demo.__name__: demo
    for demo in (tensors.to_device, tensors.requires_grad, gan_step.freeze, evaluation.volatile, tensors.detach,
                 gan_step.gan_d_step, gan_step.reuse_d_fake, gan_step.conditional, cuda.timing, evaluation.no_grad,
                 cuda.non_blocking, tensors.leaf, tensors.backward_needs_grad, tensors.optimizer_leaf,
                 tensors.parameter_buffer)
}

HEADER = "| claim | subject | what was run | what was measured | verdict |"


def markdown_table(results: Iterable[Result]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = [HEADER, "|---|---|---|---|---|"]
    rows += [f"| `{r.name}`: {cell(r.claim)} | {r.subject} | {cell(r.ran)} | {cell(r.measured)} | {r.verdict} |"
             for r in results]
    return "\n".join(rows)


def run(device: torch.device, names: Iterable[str] = DEMOS) -> list[Result]:
    return [DEMOS[name](device) for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gan.patterns",
                                     description="Measured demonstrations of the autograd patterns of this project.")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--only", metavar="NAME", help=f"run one demonstration: {', '.join(DEMOS)}")
    commands = parser.add_subparsers(dest="command", metavar="graph")
    draw = commands.add_parser("graph", help="draw the autograd graphs of one training step (gan/evaluation/graphs.py)")
    draw.add_argument("--out", type=Path, default=Path("outputs/graphs"),
                       help="where the SVG and PNG pictures go (default: outputs/graphs)")
    draw.add_argument("--model", default="dcgan", choices=("dcgan", "resnet"),
                      help="the networks of the step: model=dcgan (default) or model=resnet, small")
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
        return graph.main(args.out, device, args.model)
    results = run(device, [args.only] if args.only else DEMOS)
    print(markdown_table(results))
    return 0 if all(r.ok is not False for r in results) else 1
