"""docs/layout.svg: the house and one step in one picture, drawn from the code so that it cannot drift from it.

On the left, the package: a box per folder of gan/ with a node per module, and gan/'s own modules (api, cli,
errors, files) on their own. Every import of one gan module by another is read with ``ast`` from the source
(``import gan.x.y``, ``from gan.x import y``, ``from gan.x.y import z``, inside functions too). An import within
a folder is an arrow between its two modules; the imports between two folders are one arrow between the folders,
numbered with how many module-to-module imports it stands for and coloured by the folder imported (drawn
module by module they made a hairball); arrows into gan/'s own modules are pale. An arrow points from the
importer to what it imports, so the layers read bottom-up: core (pure PyTorch) at the bottom, the API at the
top. ``__init__`` and ``__main__`` files are not drawn.

On the right, one generator step: :data:`gan.core.phases.PHASES` in the order a step runs them, each with the
network whose update it is part of. The D phases run ``loss.d_steps`` times a generator step. Who opens a phase
is read from its network: the step (gan/core/step.py) opens those of an update (network D or G), the loop
(gan/training/loop.py) those with no network, around them.

    python tools/layout.py   # writes docs/layout.dot and renders docs/layout.svg with Graphviz's dot
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gan.core.phases import PHASES, Phase  # noqa: E402

PACKAGE = ROOT / "gan"
DOT = ROOT / "docs" / "layout.dot"
SVG = ROOT / "docs" / "layout.svg"
SKIPPED = ("__init__", "__main__")
LOOP, STEP = "the loop", "the step"
COLOURS = {"D": "#dbe8f7", "G": "#f7e3cf", None: "#eeeeee"}  # a phase's fill, by its network
INKS = ("#1f5fa8", "#b5561b", "#2e8540", "#8a3fa0", "#a8323e", "#0f7f86", "#7a6a12")  # an arrow's, by what it imports
PALE = "#bbbbbb"  # arrows into gan's own modules


def name_of(path: Path) -> str:
    """``gan/core/step.py`` -> ``gan.core.step``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module and package of gan/, by dotted name."""
    return {name_of(p): p for p in sorted(PACKAGE.rglob("*.py")) if p.stem != "__main__"}


def imports() -> set[tuple[str, str]]:
    """(importer, imported) for every import of one drawn gan module by another, anywhere in the importer."""
    known = modules()
    found = set()
    for importer, path in known.items():
        if path.stem in SKIPPED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from gan.x import y`: the module gan.x.y where there is one, else something of gan.x
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                         for a in node.names]
            else:
                continue
            found.update((importer, name) for name in names if name in known and name not in ("gan", importer))
    return found


def unit(module: str) -> str:
    """What ``module`` is drawn in: its folder (``core``) or, for gan/'s own modules, itself (``gan.api``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (PACKAGE / parts[1]).is_dir() else module


def quoted(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


def layout() -> list[str]:
    """The package: clusters, modules, the imports within a folder and the counted ones between folders."""
    drawn = sorted(m for m, p in modules().items() if p.stem not in SKIPPED)
    edges = imports()
    folders = sorted({unit(m) for m in drawn if unit(m) != m})
    within = sorted((a, b) for a, b in edges if unit(a) == unit(b) and unit(a) in folders and b in drawn)
    between = Counter((unit(a), unit(b)) for a, b in edges if unit(a) != unit(b))

    def members(folder: str) -> list[str]:
        return [m for m in drawn if unit(m) == folder]

    def depth(module: str, down: bool) -> int:
        """The longest chain of imports within its folder below ``module`` (``down``) or above it."""
        nexts = [b if down else a for a, b in within if (a if down else b) == module]
        return max((1 + depth(n, down) for n in nexts), default=0)

    # A folder's arrow leaves from its lowest module and lands on the highest of the folder it imports, so that
    # the whole importing folder is drawn above the whole imported one.
    def bottom(folder: str) -> str:
        return max(members(folder), key=lambda m: (depth(m, down=False), -drawn.index(m)))

    def top(folder: str) -> str:
        return max(members(folder), key=lambda m: (depth(m, down=True), -drawn.index(m)))

    lines = ['  subgraph cluster_gan {', '    label="gan/"; fontsize=16; style="rounded"; color="#888888";']
    for folder in folders:
        lines += [f'    subgraph cluster_{folder} {{',
                  f'      label="{folder}/"; style="rounded,filled"; fillcolor="#f6f6f6"; color="#aaaaaa";']
        lines += [f'      {quoted(m)} [label="{m.rsplit(".", 1)[1]}"];' for m in members(folder)]
        lines.append('    }')
    lines += [f'    {quoted(m)} [label="{m.rsplit(".", 1)[1]}.py", fillcolor="#fff8d8"];'
              for m in drawn if unit(m) == m]
    lines.append('  }')
    # A module importing many of its folder's leaves (the loop) has them on two rows, not one long one.
    leaves = {b for _, b in within if depth(b, down=True) == 0}
    for a in sorted({a for a, _ in within}):
        fan = [b for x, b in within if x == a and b in leaves]
        lines += [f'  {quoted(a)} -> {quoted(b)}' + (" [minlen=2];" if len(fan) > 4 and k % 2 else ";")
                  for k, b in enumerate(fan)]
        lines += [f'  {quoted(a)} -> {quoted(b)};' for x, b in within if x == a and b not in leaves]
    for (a, b), count in sorted(between.items()):
        tail, head = (bottom(a) if a in folders else a), (top(b) if b in folders else b)
        clips = [f'ltail="cluster_{a}"'] * (a in folders) + [f'lhead="cluster_{b}"'] * (b in folders)
        ink = INKS[folders.index(b) % len(INKS)] if b in folders else PALE
        looks = [f"xlabel={count}", f"penwidth={1 + count / 6:.1f}", f'color="{ink}"', f'fontcolor="{ink}"']
        lines.append(f'  {quoted(tail)} -> {quoted(head)} [{", ".join([*clips, *looks])}];')
    return lines


def step() -> list[str]:
    """One generator step: PHASES in order, the D phases boxed as repeated, and who opens each."""
    ids = [f"phase_{i}" for i in range(len(PHASES))]
    d_ids = [i for i, phase in zip(ids, PHASES) if phase.network == "D"]

    def node(i: str, phase: Phase) -> str:
        opener = LOOP if phase.network is None else STEP
        network = f"{phase.network}, " if phase.network else ""
        return (f'{i} [label="{phase.name}\\n{network}opened by {opener}", '
                f'fillcolor="{COLOURS[phase.network]}", width=2.2];')

    lines = ['  subgraph cluster_step {',
             '    label="one generator step: gan.core.phases.PHASES, in order"; fontsize=16; style="rounded";'
             ' color="#888888";']
    for i, phase in zip(ids, PHASES):
        if i == d_ids[0]:
            lines += ['    subgraph cluster_d {',
                      '      label="× loss.d_steps"; labelloc=t; labeljust=l; fontsize=13;'
                      ' style="dashed"; color="#4a78b0";']
        lines.append(("      " if i in d_ids else "    ") + node(i, phase))
        if i == d_ids[-1]:
            lines += ['      d_note [shape=plaintext, style="", fontsize=10, label="R1 (reg=r1, r1r2): in\\l'
                      'd_forward_backward of every\\lreg.every-th D update of the run;\\l'
                      'an extra D update makes its fake\\lin g_forward, under no_grad\\l"];',
                      f'      {{rank=same; {i}; d_note;}}', '    }']
    lines.append('  }')
    lines += [f'  {a} -> {b};' for a, b in zip(ids, ids[1:])]
    lines.append(f'  {d_ids[-1]}:w -> {d_ids[0]}:w [style=dashed, constraint=false];  // the next D update')
    return lines


def dot() -> str:
    """The whole picture as Graphviz DOT, deterministic: the same code gives the same text."""
    return "\n".join([
        "// generated by python tools/layout.py: do not edit",
        "digraph layout {",
        '  graph [compound=true, fontname="Helvetica", nodesep=0.15, ranksep=0.45, labelloc=b, fontsize=12,'
        ' label="an arrow: imports (between folders: how many module imports, coloured by the folder imported;'
        ' pale: into a module of gan/ itself); the step reads top to bottom"];',
        '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="Helvetica", fontsize=11, height=0.3];',
        '  edge [color="#666666", arrowsize=0.6, fontname="Helvetica", fontsize=10];',
        *layout(),
        *step(),
        "}",
        "",
    ])


def main() -> None:
    DOT.write_text(dot(), encoding="utf-8")
    print(f"wrote {DOT.relative_to(ROOT)}")
    if shutil.which("dot") is None:
        print(f"Graphviz's dot is not installed: {SVG.relative_to(ROOT)} was not rendered")
        return
    subprocess.run(["dot", "-Tsvg", str(DOT), "-o", str(SVG)], check=True)
    print(f"rendered {SVG.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
