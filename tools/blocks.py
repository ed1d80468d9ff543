"""Generated blocks in docs/: measured numbers live only between markers that say how they were made.

    <!-- begin NAME | command: python benchmarks/x.py --write | commit: 1a2b3c4 | machine: ... | inputs: gan configs -->
    ...the generated text...
    <!-- end NAME -->

The benchmark scripts write their blocks with :func:`write_block`; ``python tools/blocks.py`` lists every
block of README.md and docs/*.md and says which are stale: their inputs changed (``git diff``) since the
commit that made them, so the numbers may describe older code. Exit code 1 when any is stale. A block that
trains recipes names the shared configs and its own recipes (:func:`recipe_inputs`), not all of configs/.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- begin (?P<name>[\w-]+) \| (?P<fields>.*?) -->\n(?P<body>.*?)<!-- end (?P=name) -->",
                   re.DOTALL)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def commit(inputs: list[str]) -> str:
    """The current commit, short, with ``+dirty`` when tracked files among ``inputs`` differ from it (the
    block's own file and pictures, which the script is writing, do not count)."""
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *inputs], cwd=ROOT).returncode != 0
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def machine() -> str:
    """One line: processor, cores, Python and torch versions (and the GPU, where there is one)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
        cpu = model
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"
    return f"{cpu}, {os.cpu_count()} cores{gpu}; Python {platform.python_version()}, torch {torch.__version__}"


def recipe_inputs(*recipes: str) -> list[str]:
    """The configs a block's numbers depend on when it trains ``recipes`` (configs/experiment/<name>.yaml):
    every shared config and those recipes alone, so that tuning one recipe leaves other recipes' blocks fresh."""
    shared = sorted(f"configs/{path.name}" for path in (ROOT / "configs").iterdir() if path.name != "experiment")
    own = [f"configs/experiment/{name}.yaml" for name in recipes]
    if missing := [path for path in own if not (ROOT / path).is_file()]:  # a renamed recipe would never go stale
        raise FileNotFoundError(f"no such recipe: {', '.join(missing)}")
    return [*shared, *own]


def write_block(path: str | Path, name: str, body: str, command: str, inputs: list[str]) -> None:
    """Put ``body`` between the markers of block ``name`` in ``path`` (appended when absent), stamped with
    ``command``, the commit, this machine and the ``inputs`` (paths whose change makes the numbers stale)."""
    path = Path(path)
    stamp = (f"<!-- begin {name} | command: {command} | commit: {commit(inputs)} | machine: {machine()} | "
             f"inputs: {' '.join(inputs)} -->")
    block = f"{stamp}\n{body.rstrip()}\n<!-- end {name} -->"
    text = path.read_text() if path.exists() else ""
    found = [m for m in BLOCK.finditer(text) if m["name"] == name]
    if found:
        text = text[:found[0].start()] + block + text[found[0].end():]
    else:
        text = text.rstrip() + ("\n\n" if text else "") + block + "\n"
    path.write_text(text)


def blocks(path: Path) -> list[dict[str, str]]:
    out = []
    for m in BLOCK.finditer(path.read_text()):
        fields = dict(part.split(": ", 1) for part in m["fields"].split(" | ") if ": " in part)
        out.append({"file": str(path.relative_to(ROOT)), "name": m["name"], **fields})
    return out


def stale(block: dict[str, str]) -> str | None:
    """Why ``block`` may describe older code (None when its inputs are unchanged since its commit)."""
    made = block.get("commit", "").removesuffix("+dirty")
    inputs = block.get("inputs", "").split()
    if not made:
        return "no commit recorded"
    try:
        changed = [path for path in git("diff", "--name-only", made, "HEAD", "--", *inputs).splitlines()
                   if not comments_only(made, path)]
    except subprocess.CalledProcessError:
        return f"commit {made} is not in this repository"
    return f"changed since {made}: {', '.join(changed[:5])}" if changed else None


def comments_only(made: str, path: str) -> bool:
    """Whether ``path`` changed since ``made`` in comment lines alone (``#``, in Python and YAML alike),
    which change no number a block holds."""
    diff = ["git", "diff", "--quiet", "-I", r"^\s*#", made, "HEAD", "--", path]
    return subprocess.run(diff, cwd=ROOT).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="List the generated blocks of README.md and docs/*.md and the "
                                                 "stale ones.")
    parser.parse_args(argv)
    any_stale = False
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in blocks(path):
            why = stale(block)
            any_stale |= why is not None
            print(f"{'STALE' if why else 'ok   '} {block['file']}#{block['name']} ({block.get('commit', '?')})"
                  + (f": {why}" if why else ""))
    return 1 if any_stale else 0


if __name__ == "__main__":
    sys.exit(main())
