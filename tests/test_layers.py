"""The package's layers, enforced: each is imported alone in a fresh interpreter and may load only the
layers below it; and no module of gan/ imports, directly or through others, a module that imports it.

    gan.config      the config's keys and their composition: Hydra and OmegaConf, no torch (the entry points'
                    errors are read without it)
    gan.core        pure PyTorch: no Lightning, Hydra or OmegaConf
    gan.data        datasets, the step-indexed sampler, the loader
    gan.run         a run: its config's types, its module, the builder, checkpoints, finding and loading it
    gan.evaluation  metrics, features, sampling, pictures, and evaluate.py's app: on the run layer alone
    gan.training    the training loop on Fabric, what it writes, checks, guard, audit
    gan.patterns    the demonstrations: imported by nothing else
    gan.api         the Python API (from gan import train, evaluate): above them all, loaded by none
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gan"

FRAMEWORKS = ("lightning", "pytorch_lightning", "hydra", "omegaconf")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(module_name(p) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


def loaded_after_importing(modules: list[str]) -> set[str]:
    """``sys.modules`` of a fresh interpreter after importing ``modules``."""
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def in_layer(name: str, layer: str) -> bool:
    return name == layer or name.startswith(layer + ".")


# layer -> what it may not load (frameworks by top-level name, project layers by prefix)
FORBIDDEN = {
    "gan.config": ("torch", "lightning", "pytorch_lightning", "gan.core", "gan.data", "gan.run", "gan.evaluation",
                   "gan.training", "gan.patterns", "gan.cli", "gan.api"),
    "gan.core": FRAMEWORKS + ("gan.data", "gan.evaluation", "gan.training", "gan.patterns", "gan.cli", "gan.api"),
    "gan.data": ("gan.run", "gan.evaluation", "gan.training", "gan.patterns", "gan.cli", "gan.api"),
    "gan.run": ("gan.evaluation", "gan.training", "gan.patterns", "gan.cli", "gan.api"),
    "gan.evaluation": ("gan.training", "gan.patterns", "gan.cli", "gan.api"),
    "gan.training": ("gan.patterns", "gan.evaluation.app", "gan.api"),
}


@pytest.mark.parametrize("layer", FORBIDDEN)
def test_a_layer_loads_only_the_layers_below_it(layer):
    modules = [m for m in MODULES if in_layer(m, layer)]
    assert modules, f"{layer} has no modules"
    loaded = loaded_after_importing(modules)
    wrong = sorted(name for name in loaded for bad in FORBIDDEN[layer] if in_layer(name, bad))
    assert not wrong, f"importing {layer} loads {wrong}"


def test_the_entry_points_do_not_load_the_demonstrations():
    loaded = loaded_after_importing(["train", "evaluate"])
    assert not [m for m in loaded if in_layer(m, "gan.patterns")]
    assert "gan.training.loop" in loaded and "gan.evaluation.app" in loaded  # the check looks where it should


def imports_of(path: Path) -> set[str]:
    """The gan modules ``path`` imports anywhere in it (function-level imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from gan.core import step`
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {name for name in found if name in MODULES and name != "gan"}


def test_no_import_cycle():
    graph = {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        for imported in graph.get(module, ()):
            if imported != module:
                visit(imported, path + [module])
        done.add(module)

    for module in graph:
        visit(module, [])
    assert "gan.core.step" in graph["gan.training.loop"]  # the graph is read: the loop runs the step


def test_only_the_demonstrations_import_the_demonstrations():
    library = [*PACKAGE.rglob("*.py"), ROOT / "train.py", ROOT / "evaluate.py"]  # scripts in benchmarks/ may
    importers = sorted(module_name(p) for p in library
                       if not in_layer(module_name(p), "gan.patterns")
                       and any(in_layer(m, "gan.patterns") for m in imports_of_any(p)))
    assert importers == [], f"these import gan.patterns: {importers}"


def imports_of_any(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found
