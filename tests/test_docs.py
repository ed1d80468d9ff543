"""The docs cannot drift from the code: the README's excerpt of the GAN step is lines of gan/core/step.py, in
order, and every relative link in README.md and docs/*.md points to a file (and a heading) that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXCERPT = re.compile(r"<!-- step:begin -->\s*```python\n(.*?)```\s*<!-- step:end -->", re.DOTALL)
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)


def stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_readme_step_excerpt_is_lines_of_gan_core_step_py_in_order():
    match = EXCERPT.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert match, "README.md has no ```python block between <!-- step:begin --> and <!-- step:end -->"
    excerpt = stripped_lines(match.group(1))
    assert any("fake.detach()" in line for line in excerpt) and "with frozen(D), no_sync(D):" in excerpt
    source = iter(stripped_lines((ROOT / "gan" / "core" / "step.py").read_text(encoding="utf-8")))
    for line in excerpt:  # each line found after the previous one: `in` on an iterator consumes it
        assert line in source, f"README.md's step excerpt: {line!r} is not in gan/core/step.py after the line before it"


def links(doc: Path) -> list[str]:
    """The link targets of a markdown file, outside code blocks and inline code."""
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


def relative(target: str) -> bool:
    return not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith("//")


def heading_anchors(doc: Path) -> set[str]:
    """GitHub's anchors for a file's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_that_exist(doc):
    broken = [t for t in links(doc) if relative(t) and t.partition("#")[0]
              and not (doc.parent / t.partition("#")[0]).exists()]
    assert not broken, f"{doc.relative_to(ROOT)} links to files that do not exist: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_to_a_heading_name_one_that_exists(doc):
    broken = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path) if path else doc
        if relative(target) and anchor and linked.suffix == ".md" and linked.is_file():
            if anchor not in heading_anchors(linked):
                broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to headings that do not exist: {broken}"


def test_every_generated_block_is_stamped_and_the_stale_check_reads_git():
    """Measured numbers live in generated blocks (tools/blocks.py); each says how, where and from what code."""
    sys.path.insert(0, str(ROOT))
    from tools import blocks

    found = [b for path in DOCS for b in blocks.blocks(path)]
    assert found, "docs/ has no generated block"
    assert any(b["file"] == "README.md" for b in found), "the README's block is checked like the others"
    for block in found:
        assert {"command", "commit", "machine", "inputs"} <= block.keys(), block
    assert blocks.stale({"commit": "0000000", "inputs": "gan"}) == "commit 0000000 is not in this repository"
    head = blocks.git("rev-parse", "--short", "HEAD")
    assert blocks.stale({"commit": head, "inputs": "gan"}) is None  # nothing committed since HEAD


def test_a_block_goes_stale_when_its_inputs_change_but_not_when_only_their_comments_do(tmp_path, monkeypatch):
    """A real git repository: a recipe's comment rewritten changes no number; its value changed does."""
    sys.path.insert(0, str(ROOT))
    from tools import blocks

    def commit(text: str) -> str:
        (tmp_path / "configs").mkdir(exist_ok=True)
        (tmp_path / "configs" / "ring.yaml").write_text(text)
        for args in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"]):
            subprocess.run(["git", *args], cwd=tmp_path, check=True)
        return blocks.git("rev-parse", "--short", "HEAD")

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.setattr(blocks, "ROOT", tmp_path)
    made = commit("# compile: faster\ngamma: 1.0\n")
    commit("# compile: no faster\ngamma: 1.0\n")
    assert blocks.stale({"commit": made, "inputs": "configs"}) is None
    commit("# compile: no faster\ngamma: 0.1\n")
    assert blocks.stale({"commit": made, "inputs": "configs"}) == f"changed since {made}: configs/ring.yaml"


def test_a_block_of_one_recipe_stays_fresh_when_another_recipe_is_tuned(tmp_path, monkeypatch):
    """recipe_inputs: a block depends on the shared configs and its own recipes, in a real git repository."""
    sys.path.insert(0, str(ROOT))
    from tools import blocks

    def commit(path: str, text: str) -> str:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
        for args in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"]):
            subprocess.run(["git", *args], cwd=tmp_path, check=True)
        return blocks.git("rev-parse", "--short", "HEAD")

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.setattr(blocks, "ROOT", tmp_path)
    commit("configs/train.yaml", "seed: 0\n")
    commit("configs/experiment/grid.yaml", "gamma: 1.0\n")
    made = commit("configs/experiment/ring.yaml", "gamma: 0.1\n")
    ring = {"commit": made, "inputs": " ".join(blocks.recipe_inputs("ring"))}
    with pytest.raises(FileNotFoundError, match="configs/experiment/rnig.yaml"):
        blocks.recipe_inputs("rnig")  # a misspelt recipe would leave its block fresh forever
    commit("configs/experiment/grid.yaml", "gamma: 0.3\n")
    assert blocks.stale(ring) is None  # another recipe tuned
    commit("configs/experiment/ring.yaml", "gamma: 0.3\n")
    assert blocks.stale(ring) == f"changed since {made}: configs/experiment/ring.yaml"
    made = blocks.git("rev-parse", "--short", "HEAD")
    commit("configs/train.yaml", "seed: 1\n")  # a shared config: every recipe composes it
    assert blocks.stale({"commit": made, "inputs": " ".join(blocks.recipe_inputs("ring"))}) == \
        f"changed since {made}: configs/train.yaml"
