"""The docs cannot drift from the code: the README's excerpt of the GAN step is lines of gan/core/step.py, in
order, and every relative link in README.md and docs/*.md points to a file (and a heading) that exists."""

from __future__ import annotations

import ast
import contextlib
import functools
import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import compose_config
from omegaconf import DictConfig, OmegaConf, open_dict

from gan.data.datasets import digits_dataset, mixture_means

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


def test_the_table_of_every_key_is_what_tools_keys_py_generates_now():
    """docs/usage.md's table of keys, defaults, bounds, resume policies and recipes cannot go stale: regenerate it
    with `python tools/keys.py --write`."""
    sys.path.insert(0, str(ROOT))
    from tools import keys

    usage = (ROOT / "docs" / "usage.md").read_text()
    block = usage[usage.index(keys.BEGIN) + len(keys.BEGIN):usage.index(keys.END)]
    assert block.strip() == keys.table(), "docs/usage.md's table of keys is stale: python tools/keys.py --write"


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


# --- Recipe rows: what README.md and docs/usage.md say each recipe trains is what Hydra composes ---------------

RECIPE_DOCS = [ROOT / "README.md", ROOT / "docs" / "usage.md"]
RECIPES = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))
NUMBER = r"[\d,]+(?:\.\d+)?(?:e-?\d+)?"


def cells(line: str) -> list[str]:
    """A markdown table row's cells, ``\\|`` inside a cell kept as ``|``."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def recipe_rows(doc: Path) -> list[tuple[list[str], str, str]]:
    """Every table row of ``doc`` whose first cell names recipes (`data=X` or `experiment=X`, X a file of
    configs/experiment/): (the recipes, the first cell, the second cell: what the row says they train)."""
    rows = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        row = cells(line)
        starts = len(row) >= 2 and row[0].startswith(("`data=", "`experiment="))
        names = re.findall(r"`(?:data|experiment)=(\w+)(?=[`\s])", row[0]) if starts else []
        if names and all(name in RECIPES for name in names):
            rows.append((names, row[0], row[1]))
    return rows


@functools.cache
def recipe(name: str) -> DictConfig:
    """configs/experiment/<name>.yaml composed by Hydra, as `python train.py experiment=<name>` sees it."""
    return compose_config(f"experiment={name}")


def num(text: str) -> float:
    return float(text.replace(",", ""))


def same(a, b) -> bool:
    return OmegaConf.to_container(a, resolve=True) == OmegaConf.to_container(b, resolve=True) \
        if isinstance(a, DictConfig) else a == b


class Row:
    """One recipe row being read: its recipes' composed configs, the row before's, and the mismatches found."""

    def __init__(self, names: list[str], previous: list[str] | None, configs: dict[str, DictConfig]):
        self.names, self.previous, self.configs = names, previous, configs
        self.wrong: list[str] = []
        self.claims = 0

    def expect(self, name: str, key: str, actual, claimed, ok: bool | None = None) -> None:
        self.claims += 1
        if not (same(actual, claimed) if ok is None else ok):
            self.wrong.append(f"{name}: the row says {key} = {claimed!r}, the config has {actual!r}")

    def each(self, key: str, claimed, get=None) -> None:
        for name in self.names:
            cfg = self.configs[name]
            self.expect(name, key, get(cfg) if get else OmegaConf.select(cfg, key), claimed)

    def per_recipe(self, m: re.Match, key: str, convert=num) -> None:
        """Groups v1/r1, v2/r2 give a value per recipe ("2 (ring) and 4 (grid)"); v one for every recipe."""
        pairs = [(m["r1"], m["v1"]), (m["r2"], m["v2"])] if "r1" in m.re.groupindex else \
            [(name, m["v"]) for name in self.names]
        for name, value in pairs:
            assert name in self.names, f"the row names {name!r}, not one of its recipes {self.names}"
            self.expect(name, key, OmegaConf.select(self.configs[name], key), convert(value))


def same_as(row: Row, other: str, *keys: str) -> None:
    for name in row.names:
        for key in keys:
            row.expect(name, f"{key} (as {other}'s)", OmegaConf.select(row.configs[name], key),
                       OmegaConf.select(recipe(other), key))


def unconditional(row: Row, m: re.Match) -> None:
    row.each("model.conditional", False)
    row.each("model.codes", 0)


# (pattern, check) in the order they are tried; each match is blanked, so a later, more general pattern never
# reads the same words again. A pattern's "c" group, where it has one, is the part consumed.
CLAIMS: list[tuple[str, Callable[[Row, re.Match], None]]] = [
    (r"its classifier feature space trained (?P<v>[\d,]+) steps",
     lambda row, m: row.each("eval.classifier_steps", num(m["v"]))),
    (r"otherwise the optimizer, schedule and EMA above", lambda row, m: same_as(row, row.previous[0], "optim", "ema")),
    (r"the MNIST recipe's DCGAN, optimizer", lambda row, m: same_as(row, "mnist", "model", "optim")),
    (r"the AC-GAN recipe \(`(?P<v>\w+)`\)",
     lambda row, m: same_as(row, m["v"], "model", "loss", "reg", "augment", "optim", "ema", "trainer.max_steps",
                            "data.batch_size", "eval.classifier_steps")),
    (r"the plain DCGAN", lambda row, m: [same_as_plain(row, name) for name in row.names]),
    (r"\(the default\)", lambda row, m: [row.expect(name, "the default recipe", recipe_of(compose_config()), name)
                                         for name in row.names]),
    (r"MLP (?P<l>\d+)x(?P<h>\d+)", lambda row, m: (row.each("model.name", "mlp"), row.each("model.layers", num(m["l"])),
                                                  row.each("model.hidden", num(m["h"])))),
    (r"\bMLP\b", lambda row, m: row.each("model.name", "mlp")),
    (r"\bDCGAN\b", lambda row, m: row.each("model.name", "dcgan")),
    (r"\bwidth (?P<v>\d+)", lambda row, m: row.each("model.width", num(m["v"]))),
    (r"\b(?P<v>\d+)x(?P=v)\b", lambda row, m: row.each("data.image_size", num(m["v"]))),
    (r"\bbatch (?P<v>[\d,]+)", lambda row, m: row.each("data.batch_size", num(m["v"]))),
    (r"R3GAN's objective", lambda row, m: (row.each("loss.name", "rpgan"), row.each("reg.name", "r1r2"))),
    (r"relativistic pairing", lambda row, m: row.each("loss.name", "rpgan")),
    (r"R1 \+ R2", lambda row, m: row.each("reg.name", "r1r2")),
    (r"R1 on D", lambda row, m: row.each("reg.name", "r1")),
    (r"`(?P<group>loss|reg|augment|model)=(?P<v>\w+)`", lambda row, m: row.each(f"{m['group']}.name", m["v"])),
    (r"on the (?P<r>\w+), (?P<c>whose modes are (?P<v>\d+)x tighter)",
     lambda row, m: [row.expect(m["r"], f"data.std ({other}'s over this)", None, num(m["v"]),
                                ok=math.isclose(row.configs[other].data.std / row.configs[m["r"]].data.std,
                                                num(m["v"])))
                     for other in row.names if other != m["r"]]),
    (rf"gamma (?P<v1>{NUMBER}) on the (?P<r1>\w+)[^;)]*; (?P<v2>{NUMBER}) on the (?P<r2>\w+)",
     lambda row, m: row.per_recipe(m, "reg.gamma")),
    (rf"gamma (?P<v>{NUMBER})", lambda row, m: row.per_recipe(m, "reg.gamma")),
    (r"every (?P<v>\d+)(?:st|nd|rd|th) D update", lambda row, m: row.each("reg.every", num(m["v"]))),
    (r"on every D step", lambda row, m: row.each("reg.every", 1)),
    (r"no augmentation", lambda row, m: row.each("augment.name", "none")),
    (r"no regularizer", lambda row, m: row.each("reg.name", "none")),
    (r"DiffAugment", lambda row, m: row.each("augment.name", "diff")),
    (r"LeCam", lambda row, m: row.each("reg.name", "lecam")),
    (rf"Adam \(beta1 = (?P<v>{NUMBER})\)", lambda row, m: (row.each("optim.g.betas.0", num(m["v"])),
                                                          row.each("optim.d.betas.0", num(m["v"])))),
    (rf"Adam betas \((?P<a>{NUMBER}), (?P<b>{NUMBER})\)",
     lambda row, m: [row.each(f"optim.{n}.betas", [num(m["a"]), num(m["b"])]) for n in "gd"]),
    (rf"at (?P<g>{NUMBER}) (?:for G and|\(G\) and) (?P<d>{NUMBER})(?: for D| \(D\))",
     lambda row, m: (row.each("optim.g.lr", num(m["g"])), row.each("optim.d.lr", num(m["d"])))),
    (r"falling linearly to 0", lambda row, m: row.each("optim.decay", "linear")),
    (r"\bAdam\b", lambda row, m: row.each("optim.g._target_", "torch.optim.Adam")),
    (r"\bEMA (?P<v>0\.\d+)", lambda row, m: (row.each("ema.enabled", True), row.each("ema.decay", num(m["v"])))),
    (r"\bEMA\b", lambda row, m: row.each("ema.enabled", True)),
    (r"(?P<v>[\d,]+) steps", lambda row, m: row.each("trainer.max_steps", num(m["v"]))),
    (r"bf16 autocast", lambda row, m: row.each("trainer.precision", "bf16-mixed")),
    (r"`channels_last`", lambda row, m: row.each("data.channels_last", True)),
    (r"Gaussian noise alone of (?P<v1>\d+) \((?P<r1>\w+)\) and (?P<v2>\d+) \((?P<r2>\w+)\) dimensions",
     lambda row, m: (row.per_recipe(m, "train.z_dim"), unconditional(row, m))),
    (r"noise alone|no class into G or D|no latent code|nothing knows the mode count|unconditional|without its labels",
     unconditional),
    (r"(?P<v>\d+) Fourier features", lambda row, m: row.each("model.d_fourier", num(m["v"]))),
    (r"Fourier features", lambda row, m: [row.expect(n, "model.d_fourier", row.configs[n].model.d_fourier, "> 0",
                                                     ok=row.configs[n].model.d_fourier > 0) for n in row.names]),
    (rf"scale (?P<v1>{NUMBER}) on the (?P<r1>\w+), (?P<v2>{NUMBER}) on the (?P<r2>\w+)",
     lambda row, m: row.per_recipe(m, "model.d_fourier_scale")),
    (r"mixtures of (?P<a>\d+) and (?P<b>\d+) Gaussians",
     lambda row, m: [row.expect(n, "modes", len(mixture_means(row.configs[n].data.name)), num(v))
                     for n, v in zip(row.names, (m["a"], m["b"]), strict=True)]),
    (r"scikit-learn's (?P<v>[\d,]+) digits",
     lambda row, m: row.expect(row.names[0], "digits", len(digits_dataset(8)), num(m["v"]))),
    (r"\((?P<v>[\d,]+) modes\)",
     lambda row, m: [row.expect(n, "modes (10 digits per channel)", 10 ** row.configs[n].data.channels, num(m["v"]))
                     for n in row.names]),
    (r"class-conditional|told the labels", lambda row, m: row.each("model.conditional", True)),
    (r"\bAC-GAN\b|whose D names the class", lambda row, m: (row.each("model.conditional", True),
                                                          row.each("model.d_condition", "classifier"))),
    (r"colour images", lambda row, m: row.each("data.channels", 3)),
    (r"`data\.(?P<v>\w+)=<", lambda row, m: row.expect("/".join(row.names), f"data.{m['v']}", None, "a key",
                                                       ok=any(m["v"] in row.configs[n].data.keys()
                                                              for n in row.names))),
]


def recipe_of(cfg: DictConfig) -> str:
    """The recipe a composed config is: the one configs/experiment/ file it equals, composed alone."""
    found = [name for name in RECIPES if same(recipe(name), cfg)]
    return found[0] if len(found) == 1 else f"one of {found}"


def same_as_plain(row: Row, name: str) -> None:
    """"The plain DCGAN": the network and objective of configs/train.yaml's own choices ('~experiment')."""
    plain = compose_config("~experiment", f"data={row.configs[name].data.name}")
    for key in ("model", "loss", "reg", "augment", "optim"):
        row.expect(name, f"{key} (the plain choices')", OmegaConf.select(row.configs[name], key),
                   OmegaConf.select(plain, key))


def read_row(names: list[str], text: str, previous: list[str] | None) -> Row:
    row = Row(names, previous, {name: recipe(name) for name in names})
    text = re.sub(r"`(?:data|experiment)=\w+`?", " ", text).replace("**", "")
    for pattern, check in CLAIMS:
        for m in list(re.finditer(pattern, text)):
            check(row, m)
            start, end = m.span("c") if "c" in m.re.groupindex else m.span()
            text = text[:start] + "\0" * (end - start) + text[end:]
    unread = re.findall(r"(?<![\w.\-])\d[\d,.]*x?(?![\w])", text)
    assert not unread, f"{names}: numbers no claim of this test reads: {unread} in {text.replace(chr(0), '_')!r}"
    return row


@pytest.mark.parametrize("doc", RECIPE_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recipe_row_says_what_hydra_composes(doc):
    """Each table row naming recipes (`data=X`, `experiment=X`) is read claim by claim -- width, image size,
    batch, objective, gamma and its interval, optimizer and rates, schedule, EMA, steps, precision, layout,
    conditioning, noise size, Fourier features, mode counts, "as recipe Y" -- and each claim compared with
    configs/experiment/X.yaml composed by Hydra (tests/conftest.py). A number the claims do not read fails the
    test too, so a new claim cannot go unchecked; and each recipe must have a row, and a row that trains in
    bf16 or with the labels must say so. The values come from the rows themselves, never from this test."""
    rows = recipe_rows(doc)
    assert {name for names, _, _ in rows for name in names} == set(RECIPES), f"{doc.name}: a recipe without a row"
    wrong, previous = [], None
    for names, first, text in rows:
        row = read_row(names, f"{first} | {text}", previous)
        assert row.claims >= 3, f"{names}: only {row.claims} claims read from {text!r}"
        for name in names:
            cfg = row.configs[name]
            told = bool(re.search(r"told the labels|class-conditional|AC-GAN", text))
            row.expect(name, "model.conditional (told the labels?)", bool(cfg.model.conditional), told)
            if doc.name == "usage.md":  # the reference says the precision of every recipe that is not float32
                row.expect(name, "trainer.precision", cfg.trainer.precision,
                           "bf16-mixed" if "bf16" in text else "32-true")
        wrong += row.wrong
        previous = names
    assert not wrong, f"{doc.name}'s recipe rows no longer say what the configs compose:\n" + "\n".join(wrong)


def test_the_override_tables_list_every_option_of_each_group():
    """`group=a|b|c` in the overrides tables of README.md and docs/usage.md: every option is a file of
    configs/<group>/, and every file of the group is listed."""
    for doc in RECIPE_DOCS:
        found = 0
        for line in doc.read_text(encoding="utf-8").splitlines():
            if not line.startswith("|"):
                continue
            for group, options in re.findall(r"`(\w+)=(\w+(?:\|\w+)+)", cells(line)[0] if cells(line) else ""):
                files = {p.stem for p in (ROOT / "configs" / group).glob("*.yaml")}
                assert set(options.split("|")) == files, f"{doc.name}: {group}= lists {options}; configs has {files}"
                found += 1
        assert found >= 5, f"{doc.name}: its overrides table lists {found} groups"


def train_commands(doc: Path) -> list[str]:
    """The train.py command lines of ``doc``'s bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0]
            if re.search(r"(^|\s)train\.py(\s|$)", line):
                commands.append(re.split(r"&&|;|\|\|", line.split("train.py", 1)[1])[0].strip())
    return commands


def command_overrides(command: str) -> list[str]:
    """A command's overrides, as Hydra's compose API takes them: placeholders filled in, flags, hydra.* keys and
    shell substitutions dropped, a sweep's first value (``seed=0,1,2``) taken."""
    command = re.sub(r"<[^>]*>", "/tmp/placeholder", command)
    overrides = []
    for token in shlex.split(command):
        if "=" not in token and not token.startswith("~") or "$" in token or "(" in token \
                or token.startswith(("-", "hydra.", "hydra/")):
            continue
        key, _, value = token.partition("=")
        if "," in value and not value.startswith("["):
            value = value.split(",")[0]
        overrides.append(f"{key}={value}" if _ else token)
    return overrides


COMMANDS = [(doc, command) for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
            for command in train_commands(doc)]


@pytest.mark.parametrize("doc, command", COMMANDS, ids=[f"{d.name}: {c[:60]}" for d, c in COMMANDS])
def test_every_train_command_of_the_docs_composes_to_what_it_sets(doc, command):
    """Each `python train.py ...` of the docs' bash blocks composes with Hydra, and every key=value it gives
    holds in the composed config (a group choice names its config: loss=hinge gives loss.name hinge)."""
    overrides = command_overrides(command)
    cfg = compose_config(*overrides)
    for override in overrides:
        key, _, value = override.lstrip("+~'").partition("=")
        if not _:
            continue
        node = OmegaConf.select(cfg, key, default=None)
        if key in ("data", "model", "loss", "reg", "augment"):
            assert cfg[key].name == value, f"{command}: {key}={value} composes {key}.name={cfg[key].name}"
        elif isinstance(node, DictConfig) or node is None and "." not in key:  # another group: its file
            assert (ROOT / "configs" / key / f"{value}.yaml").is_file(), f"{command}: no configs/{key}/{value}.yaml"
        elif "/" not in value:
            actual = OmegaConf.to_container(cfg, resolve=True)
            for part in key.split("."):
                actual = actual[part]
            claimed = yaml.safe_load(value)
            with contextlib.suppress(TypeError, ValueError):
                claimed = float(value) if isinstance(actual, float) else claimed
            assert actual == claimed, f"{command}: {key} is {actual!r}, not {value}"
    # And the checks a run makes before it starts let it through (a run and a checkpoint the docs name are left
    # out: they exist once the commands before have run; a GPU, which cannot exist here, is a CPU).
    from gan.training.checks import validate

    with open_dict(cfg):
        cfg.ckpt_path = cfg.init_from = None
        if cfg.trainer.accelerator == "gpu":
            cfg.trainer.accelerator, cfg.trainer.sync_batchnorm = "cpu", False
    validate(cfg)


# --- Every error line of docs/troubleshooting.md: raised by gan/, asserted by a test ----------------------------

PLACEHOLDER = r"\.\.\.|<[^>]*>|\bN\b"  # what the docs elide: "...", "<file>", "step N"
VALUE = r"\S*[=\d\[\]{}|<>\"]\S*|'[^' ]*'|\S*[A-Z]\S*[A-Z]\S*"  # key=value, numbers, quoted values, SIGTERM, Ctrl-C


def quoted_errors() -> list[str]:
    """The lines quoted in the first column of troubleshooting.md's table: each backticked span outside
    parentheses, and a longer alternative given as "(or `...`)"; spans in other parentheses are context
    ("after `launcher=joblib`") and short alternatives ("or `by SIGTERM`") part of the message before them."""
    found = []
    for line in (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        first, depth = cells(line)[0], []
        for m in re.finditer(r"`[^`]+`|\(|\)", first):
            if m.group() == "(":
                depth.append(first[m.end():m.end() + 3] == "or ")
            elif m.group() == ")":
                depth = depth[:-1]
            elif not depth or (all(depth) and len(m.group().split()) >= 3):
                found.append(m.group()[1:-1])
    return found


def string_literals(paths) -> list[str]:
    """Every string constant of these Python files, and the literal parts of every f-string (a hole splits one)."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                found += [v.value for v in node.values if isinstance(v, ast.Constant)]
    return found


def pieces(message: str) -> list[list[str]]:
    """The message's own words: runs between what the docs elide and the values a run fills in (keys=values,
    numbers, quoted values, signal names), split at punctuation, as lists of words."""
    return [piece.split() for chunk in re.split(PLACEHOLDER, message) for run in re.split(VALUE, chunk)
            for piece in re.split(r"[():;,?]", run) if piece.split()]


def longest_run(words: list[str], text: str, least: int, ends: bool = True) -> str | None:
    """The longest run of consecutive ``words`` (at least ``least`` of them) that ``text`` holds, words apart by
    any whitespace; a word of the run may be an f-string hole (``{name}``) in ``text``. ``ends=False``: only
    runs that end with the last word."""
    for size in range(len(words), least - 1, -1):
        for start in range(len(words) - size + 1) if ends else [len(words) - size]:
            run = words[start:start + size]
            if re.search(r"\s+".join(rf"(?:{re.escape(w)}|\{{[^}}\n]*\}})" for w in run), text):
                return " ".join(run)
    return None


@functools.cache
def relayed_texts() -> str:
    """Messages gan/ passes on from others, as its lines quote them: OmegaConf's type errors, PIL's decoding
    errors, the operating system's (strerror)."""
    import omegaconf
    import PIL

    files = [*Path(omegaconf.__file__).parent.rglob("*.py"), *Path(PIL.__file__).parent.glob("*.py")]
    return "\0".join([*string_literals(files), *(os.strerror(n) for n in range(1, 134))])


def test_every_error_line_of_troubleshooting_is_raised_by_gan_and_asserted_by_a_test():
    """Each line quoted in docs/troubleshooting.md is still what the code says, and a test makes it happen.

    The code: every piece of the quoted line (its words between what the docs elide -- "...", "<file>" -- and
    the values a run fills in -- keys=values, numbers, quoted values) must be in gan/'s string literals, read
    with `ast` so that implicitly joined literals are one string and an f-string's holes split it (a piece
    may lose two leading words, at most half of it: the doc's example values, e.g. "mnist train", stand
    where the code has a hole); or, for the part of a line gan/ passes on, in OmegaConf's or PIL's literals or
    the OS's error strings. A line reworded in the code, or in the docs alone, fails here.
    The test: at least one piece of three or more words (or a whole shorter piece), found in gan/ or in what
    it relays, must appear in tests/ (not this file), regex escapes removed and f-string holes allowed for
    single words -- the fragment a test's `match=` or `in` assertion checks when it triggers the error.
    Stronger than a pattern match against gan/ alone, short of triggering ~45 errors again here: that the
    test which holds the fragment asserts this very error is not proven, only that some test names it."""
    code = "\0".join(string_literals(sorted((ROOT / "gan").rglob("*.py"))))
    tests = "\0".join(re.sub(r"\\(.)", r"\1", p.read_text(encoding="utf-8"))
                      for p in sorted((ROOT / "tests").glob("*.py")) if p.name != "test_docs.py")
    messages = quoted_errors()
    assert len(messages) >= 40, f"troubleshooting.md quotes {len(messages)} lines: its table was not read"
    stale, untested = [], []
    for message in messages:
        found = []
        for words in pieces(message):
            least = max(len(words) - 2, (len(words) + 1) // 2)
            run = longest_run(words, code, least, ends=False) or \
                longest_run(words, relayed_texts(), least, ends=False)
            if run is None:
                stale.append(f"{message!r}: {' '.join(words)!r} is in no string of gan/")
            else:
                found.append(run.split())
        if not any(longest_run(words, tests, min(3, len(words))) for words in found):
            untested.append(message)
    assert not stale, "troubleshooting.md quotes words the code does not say:\n" + "\n".join(stale)
    assert not untested, "troubleshooting.md lines no test asserts:\n" + "\n".join(untested)


# --- Generated blocks: tools/blocks.py on the real docs, and its staleness check in a real git repository --------

def block_records() -> list[dict[str, str]]:
    sys.path.insert(0, str(ROOT))
    from tools import blocks

    return [b for path in DOCS for b in blocks.blocks(path)]


def test_every_real_block_parses_and_names_a_script_a_commit_and_inputs_that_exist():
    """Every `<!-- begin NAME | ... -->` of README.md and docs/*.md parses into a block (no begin marker left
    over), its command runs a script of this repository, its commit is in git history (`git cat-file -e`),
    and each of its inputs exists. Whether a real block is stale is NOT asserted: regenerating one takes
    up to hours of training, so `python tools/blocks.py` is the check a developer runs, not the suite."""
    found = block_records()
    markers = sum(len(re.findall(r"<!-- begin [\w-]+ \|", p.read_text(encoding="utf-8"))) for p in DOCS)
    assert len(found) == markers, f"{markers} begin markers, {len(found)} blocks parsed: a block is malformed"
    problems = []
    for block in found:
        where = f"{block['file']}#{block['name']}"
        scripts = [t for t in block["command"].split() if t.endswith(".py")]
        if not scripts or not (ROOT / scripts[0]).is_file():
            problems.append(f"{where}: its command runs no script here: {block['command']!r}")
        made = block["commit"].removesuffix("+dirty")
        if subprocess.run(["git", "cat-file", "-e", f"{made}^{{commit}}"], cwd=ROOT, capture_output=True).returncode:
            problems.append(f"{where}: commit {made} is not in git history")
        missing = [path for path in block["inputs"].split() if not (ROOT / path).exists()]
        if missing or not block["inputs"].split():
            problems.append(f"{where}: inputs that do not exist: {missing or 'none named'}")
    assert not problems, "\n".join(problems)


def test_blocks_main_reports_a_block_stale_exactly_when_an_input_changed_beyond_its_comments(tmp_path, monkeypatch,
                                                                                               capsys):
    """tools/blocks.py's own main() over a real git repository: blocks stamped at commit A; at B one block's
    input changes a value, another's only a YAML comment, a third's nothing. The first is STALE (exit code 1),
    the other two fresh; the same check the developer runs on the real docs."""
    sys.path.insert(0, str(ROOT))
    from tools import blocks

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    def write(files: dict[str, str]) -> str:
        for path, text in files.items():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(text)
        git("add", "-A")
        git("commit", "-q", "-m", "x")
        return git("rev-parse", "--short", "HEAD")

    git("init", "-q")
    a = write({"configs/a.yaml": "# tuned\ngamma: 1.0\n", "configs/b.yaml": "# tuned\ngamma: 1.0\n",
               "gan/c.py": "X = 1\n", "bench.py": "", "README.md": "# readme\n", "docs/x.md": "# x\n"})
    stamp = ("<!-- begin {0} | command: python bench.py | commit: {1} | machine: m | inputs: {2} -->\n{0}\n"
             "<!-- end {0} -->")
    (tmp_path / "docs" / "x.md").write_text("\n".join(stamp.format(name, a, inputs) for name, inputs in
                                                      (("value", "configs/a.yaml"), ("comment", "configs/b.yaml"),
                                                       ("untouched", "gan"))))
    write({"configs/a.yaml": "# tuned\ngamma: 0.1\n", "configs/b.yaml": "# tuned on the ring, at seed 0\ngamma: 1.0\n"})
    monkeypatch.setattr(blocks, "ROOT", tmp_path)
    assert blocks.main([]) == 1
    report = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()}
    assert sorted(report) == ["docs/x.md#comment", "docs/x.md#untouched", "docs/x.md#value"], report
    assert report["docs/x.md#value"].startswith("STALE") and f"changed since {a}: configs/a.yaml" in \
        report["docs/x.md#value"]
    assert report["docs/x.md#comment"].startswith("ok ")  # a YAML comment rewritten changes no number
    assert report["docs/x.md#untouched"].startswith("ok ")


# --- The house: docs/layout.svg is drawn from the code, and the README's Layout block names what gan/ holds ---------


def test_the_layout_picture_is_what_tools_layout_py_draws_now():
    """docs/layout.dot (rendered as docs/layout.svg, the picture in docs/design.md) cannot go stale: regenerate it
    with `python tools/layout.py`. Graphviz is not run here: the .dot is the picture's source."""
    sys.path.insert(0, str(ROOT))
    from tools import layout

    drawn = layout.dot()
    assert (ROOT / "docs" / "layout.dot").read_text(encoding="utf-8") == drawn, \
        "docs/layout.dot is stale: python tools/layout.py"
    assert '"gan.core.step" -> "gan.core.contexts"' in drawn  # the imports are read: the step imports contexts
    assert 'ltail="cluster_training", lhead="cluster_core"' in drawn  # and counted between folders
    assert [p.name for p in layout.PHASES] == re.findall(r'phase_\d+ \[label="(\w+)\\n', drawn)  # in order


def readme_layout() -> dict[str, str]:
    """The README's Layout block under ``gan/``: each entry's name (``core/``, ``errors.py, cli.py``) and its text,
    its continuation lines joined on. An entry is indented two spaces, its name set off from its text by two."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0].splitlines()
    entries: dict[str, str] = {}
    name = ""
    for line in lines[[line.rstrip() for line in lines].index("gan/") + 1:]:
        if not line.startswith("  "):  # back at the top level (tools/, tests/, ...)
            break
        if line.startswith("   "):
            entries[name] += " " + line.strip()
        else:
            name, _, text = re.split(r"(\s{2,}|$)", line.strip(), maxsplit=1)
            entries[name] = text.strip()
    return entries


def unbracketed(text: str) -> str:
    """``text`` without its asides in parentheses, nested ones included."""
    while (shorter := re.sub(r"\([^()]*\)", "", text)) != text:
        text = shorter
    return text


def modules_of(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}


def test_the_readme_layout_names_every_folder_and_module_of_gan_and_nothing_else():
    """Each folder of gan/ has its entry, whose text names each of its modules (``loader`` or ``loader.py``); a
    ``name.py`` there is a module of it (or one of the entry points, train.py or evaluate.py), and so is a bare
    word standing alone in its lists. gan/'s own modules are the names of the other entries."""
    entries = readme_layout()
    package = ROOT / "gan"
    folders = {p.name for p in package.iterdir() if p.is_dir() and modules_of(p)}
    named = {name.removesuffix("/") for name in entries if name.endswith("/")}
    problems = [f"gan/{f}/ has no entry" for f in sorted(folders - named)]
    problems += [f"{f}/ is not a folder of gan/" for f in sorted(named - folders)]
    for folder in sorted(folders & named):
        text, modules = entries[f"{folder}/"], modules_of(package / folder)
        problems += [f"gan/{folder}/: {m} is not named" for m in sorted(modules)
                     if not re.search(rf"(?<![\w.]){m}(?:\.py)?(?!\w)", text)]
        files = re.findall(r"(?<![\w./])(\w+)\.py\b", text)
        problems += [f"gan/{folder}/: {f}.py does not exist" for f in files
                     if f not in modules and not (ROOT / f"{f}.py").is_file()]
        items = [item.strip() for item in re.split(r"[,;:]", unbracketed(text))]
        problems += [f"gan/{folder}/: {item} is not a module of it" for item in items
                     if re.fullmatch(r"[a-z_][a-z0-9_]*", item) and item not in modules]
    own = {f.removesuffix(".py") for name in entries if not name.endswith("/") for f in re.split(r",\s*", name)}
    problems += [f"gan/{m}.py is not named" for m in sorted(modules_of(package) - own)]
    problems += [f"gan/{m}.py does not exist" for m in sorted(own - modules_of(package))]
    assert not problems, "README.md's Layout block:\n" + "\n".join(problems)


# --- Pages describe what is: commit hashes live in block stamps and in docs/changelog.md alone --------------------

HEX_WORD = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")
TOKEN = re.compile(r"[^\s`()\[\]<>\"',;]+")
FILE_NAME = re.compile(r"[\w-]+(?:\.[\w-]+)*\.[a-z][a-z0-9]{0,4}")


def named_commits(text: str) -> list[tuple[int, str]]:
    """(line number, word) for each commit hash ``text`` names outside its generated blocks.

    A commit hash is a word of 7 to 40 lowercase hex digits, at least one of them a letter and one a digit,
    with no letter or digit on either side (so a 64-digit SHA-256 digest is one longer word, never a hash).
    Not counted:
    - the lines of a generated block (tools/blocks.py's BLOCK), from its `<!-- begin NAME | ... -->` marker,
      whose stamp names the commit that made it, to its `<!-- end NAME -->`: the benchmark scripts write the
      whole block, and some repeat the stamp's commit in its first line, which no hand may edit;
    - a hex run inside a URL: its token (the text between spaces, backticks, brackets, quotes, commas and
      semicolons) holds "://";
    - a hex run inside a file name: it lies in the token's last path component, trailing punctuation dropped,
      and that component is a file name -- dot-separated parts of letters, digits, "_" and "-", ending in a
      lowercase extension of 1-5 characters, e.g. `weights-inception-2015-12-05-6726825d.pth`.
    A revision such as `abc1234:docs/results.md` or `abc1234..HEAD` is a hash: the run is not in the file
    name's component, and ".." makes no file name."""
    sys.path.insert(0, str(ROOT))
    from tools import blocks

    generated = set()
    for block in blocks.BLOCK.finditer(text):
        first = text.count("\n", 0, block.start()) + 1
        generated.update(range(first, first + block.group().count("\n") + 1))
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if number in generated:
            continue
        for token in TOKEN.finditer(line):
            word = token.group().rstrip(".:!?")
            last = word.rsplit("/", 1)[-1]
            in_file = FILE_NAME.fullmatch(last) is not None
            for hit in HEX_WORD.finditer(word):
                if not (re.search(r"[a-f]", hit.group()) and re.search(r"\d", hit.group())):
                    continue
                if "://" in word or in_file and hit.start() >= len(word) - len(last):
                    continue
                found.append((number, hit.group()))
    return found


def test_no_page_names_a_commit_outside_its_blocks_and_the_changelog():
    """README.md and docs/*.md describe the project as it is: a commit hash in their prose is history, which
    goes to docs/changelog.md (one line per decision, newest first), and the page describes what the code
    does. Generated blocks keep their stamps. What counts as a hash: `named_commits`."""
    assert named_commits("built at 1a2b3c4, and `git show 8da9f11:docs/results.md` (9bc3d19..HEAD)") == \
        [(1, "1a2b3c4"), (1, "8da9f11"), (1, "9bc3d19")]
    assert named_commits("`weights-inception-2015-12-05-6726825d.pth`, https://x.org/a/6726825d.pth, sha256 "
                         "`f58cb9b6ec323ed63459aa4fb441fe750cfe39fafad6da5cb504a16f19e958f4`, 2,048 and 1234567") == []
    found = [f"{doc.relative_to(ROOT)}:{number}: {word}" for doc in DOCS if doc.name != "changelog.md"
             for number, word in named_commits(doc.read_text(encoding="utf-8"))]
    assert not found, "commit hashes outside generated blocks (history belongs in docs/changelog.md):\n" + \
        "\n".join(found)


# A path the code's comments and docstrings point a reader to, and, where one follows (``x.py's Name``), the name.
POINTER = re.compile(r"\b((?:gan|docs|tests|benchmarks|tools|configs)/[\w/.-]*\w\.(?:py|md|yaml|sh))"
                     r"(?:'s ``?([A-Za-z_]\w*))?")
SOURCES = [*sorted((ROOT / "gan").rglob("*.py")), ROOT / "train.py", ROOT / "evaluate.py", ROOT / "pyproject.toml",
           *sorted((ROOT / "configs").rglob("*.yaml"))]


def test_the_codes_pointers_name_files_and_definitions_that_exist():
    """Where a docstring or comment sends the reader (``gan/training/outputs.py's Metrics``, ``docs/usage.md``),
    the file is there, and so is a class, function or constant of the name that follows ``'s``; a pointer that
    went stale when code moved fails here rather than in a reader's hands."""
    stale = []
    for source in SOURCES:
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for path, name in POINTER.findall(line):
                if re.search(r"/[A-Z]\.\w+$", path):  # a placeholder: configs/experiment/X.yaml
                    continue
                target = ROOT / path
                where = f"{source.relative_to(ROOT)}:{number}"
                if not target.is_file():
                    stale.append(f"{where}: {path} does not exist")
                elif name and target.suffix == ".py" and not re.search(
                        rf"^\s*(?:def|class) {name}\b|^\s*{name}\s*[:=]", target.read_text(encoding="utf-8"), re.M):
                    stale.append(f"{where}: {path} defines no {name}")
    assert not stale, "\n".join(stale)


def module_names(tree: ast.Module) -> set[str]:
    """Every name a module defines, imports, assigns (attributes too) or takes as an argument."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(target)
                             if isinstance(n, (ast.Name, ast.Attribute)))
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def test_the_codes_cross_references_name_what_their_module_has():
    """A docstring's bare :class:, :func:, :meth:, :data: or :attr: reference names something its own module defines,
    imports or holds; one to another module's name gives its dotted path."""
    stale = []
    for source in sorted((ROOT / "gan").rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        names = module_names(ast.parse(text))
        for number, line in enumerate(text.splitlines(), 1):
            stale += [f"{source.relative_to(ROOT)}:{number}: :{role}:`{ref}`"
                      for role, ref in re.findall(r":(class|func|meth|data|attr):`~?([\w.]+)`", line)
                      if "." not in ref and ref not in names]
    assert not stale, "\n".join(stale)
