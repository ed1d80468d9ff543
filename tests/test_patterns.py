"""Each claim of gan/patterns/, asserted on the values its demonstration measured.

The demonstrations run here on small models with few repetitions. Timings on a shared 2-core machine
are not asserted: where a claim is about cost, the tests assert the counted FLOPs or saved bytes
instead, and leave the milliseconds to the table of ``python -m gan.patterns``.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from mutation import D_NOT_FROZEN, WITHOUT_DETACH, mutated_step

from gan.core import step
from gan.patterns import gan_step
from gan.patterns.claims import DEMOS, markdown_table
from gan.patterns.claims import main as patterns_main
from gan.patterns.measure import PYTORCH, STEP, Result, contains

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
SMALL = {"size": 16, "width": 8, "batch": 8, "repeats": 1}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread while these tests run: their ops are tiny, and when other processes share
    the 2 cores, OpenMP's second thread waits to be scheduled at every op (seconds per test instead of
    milliseconds). Nothing here asserts a timing, so nothing measured changes meaning."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Every claim's expectations are written once, in its function in gan/patterns/; a test asserts its verdict. The
# arguments make each demonstration small; the CUDA-only rows run where a GPU exists.
CLAIMS = {
    "to_device": {}, "requires_grad": {}, "freeze": SMALL, "volatile": {}, "detach": {}, "gan_d_step": SMALL,
    "reuse_d_fake": {}, "conditional": {"num_classes": 3}, "no_grad": SMALL, "leaf": {},
    "backward_needs_grad": {}, "optimizer_leaf": {}, "parameter_buffer": {},
}
CUDA_CLAIMS = {"timing": {"size": 2048, "matmuls": 10}, "non_blocking": {"batch": 256, "steps": 5}}


@functools.cache
def on_cpu(name: str) -> Result:
    """Claim ``name``'s result on the CPU, small (the CUDA rows: skipped), run once for all the tests below."""
    return DEMOS[name](CPU, **CLAIMS.get(name, {}))


@pytest.mark.parametrize("name", CLAIMS)
def test_claim_holds_on_cpu(name: str) -> None:
    result = on_cpu(name)
    assert result.expected, "a claim states what it expects"
    assert result.ok, result.failures()


@needs_cuda
@pytest.mark.parametrize("name", CUDA_CLAIMS)
def test_cuda_claim_holds(name: str) -> None:
    result = DEMOS[name](torch.device("cuda"), **CUDA_CLAIMS[name])
    assert result.ok, result.failures()


@pytest.mark.parametrize("name", CUDA_CLAIMS)
def test_cuda_claims_are_skipped_on_cpu_with_the_reason(name: str) -> None:
    result = on_cpu(name)
    assert result.ok is None and result.verdict == "skipped (CPU)"
    assert "CPU" in result.measured or "synchronously" in result.measured


def test_a_verdict_compares_each_expectation() -> None:
    result = Result("x", PYTORCH, "claim", "ran", "measured", {"a": {"b": 2}, "err": "boom"},
                    {"a.b": 2, "err": contains("boom")})
    assert result.ok and result.verdict == "holds"
    result.values["a"]["b"] = 3
    assert result.ok is False
    assert result.failures() == ["a.b: measured 3, expected 2"]
    assert result.verdict == "DOES NOT HOLD: a.b: measured 3, expected 2"


# --- which rows run the training step ----------------------------------------------------------------------

def calls_the_step(function: Callable[..., object], seen: set[object] | None = None) -> bool:
    """Whether ``function``'s source uses a function of gan.core.step (``step.g_update``, ...), itself or
    through the gan.patterns helpers it names, read with ``inspect.getsource``."""
    seen = set() if seen is None else seen
    seen.add(function)
    names = function.__globals__
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and names.get(node.value.id) is step and inspect.isfunction(getattr(step, node.attr, None))):
            return True
        helper = names.get(node.id) if isinstance(node, ast.Name) else None
        if (inspect.isfunction(helper) and helper not in seen and helper.__module__.startswith("gan.patterns.")
                and calls_the_step(helper, seen)):
            return True
    return False


@pytest.mark.parametrize("name", DEMOS)
def test_a_row_runs_the_training_step_exactly_when_its_claim_calls_into_gan_core_step(name: str) -> None:
    assert on_cpu(name).subject == (STEP if calls_the_step(DEMOS[name]) else PYTORCH)


def test_the_subject_column_says_which_rows_run_the_training_step() -> None:
    names = ("freeze", "gan_d_step", "conditional", "leaf", "to_device", "detach", "reuse_d_fake", "no_grad")
    rows = markdown_table(on_cpu(name) for name in names).splitlines()
    assert rows[0].split(" | ")[1] == "subject"
    subjects = {name: row.split(" | ")[1] for name, row in zip(names, rows[2:])}
    assert subjects == {"freeze": "the training step", "gan_d_step": "the training step",
                        "conditional": "the training step", "leaf": "PyTorch", "to_device": "PyTorch",
                        "detach": "PyTorch", "reuse_d_fake": "PyTorch", "no_grad": "PyTorch"}


def test_a_result_names_one_of_the_two_subjects() -> None:
    with pytest.raises(ValueError, match="subject"):
        Result("x", "numpy", "claim", "ran", "measured", {}, {})


# --- the claims certify the step that trains: break gan/core/step.py and they fail ---------------------------

def test_without_detach_in_the_step_the_d_step_claim_fails() -> None:
    with mutated_step(*WITHOUT_DETACH):
        result = gan_step.gan_d_step(CPU, **SMALL)
    assert result.ok is False
    failed = {line.split(":")[0] for line in result.failures()}
    assert {"g_grads_touched", "d_input_requires_grad", "g_step_error.detach"} <= failed
    assert gan_step.gan_d_step(CPU, **SMALL).ok  # restored


def test_with_d_not_frozen_in_the_step_the_freeze_and_conditional_claims_fail() -> None:
    with mutated_step(*D_NOT_FROZEN):
        freeze, conditional = gan_step.freeze(CPU, **SMALL), gan_step.conditional(CPU, num_classes=3)
    assert {line.split(":")[0] for line in freeze.failures()} == {"g_step_d_no_grad", "flop_ratio"}
    assert conditional.values["conditional"]["g_step_d_untouched"] is False and conditional.ok is False


def test_every_claim_is_listed_once() -> None:
    assert len(DEMOS) == 15
    assert all(name == demo.__name__ for name, demo in DEMOS.items())


def test_only_runs_one_demonstration(capsys: pytest.CaptureFixture[str]) -> None:
    assert patterns_main(["--only", "leaf"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| claim | subject | what was run | what was measured | verdict |"
    assert len(lines) == 3 and lines[2].startswith("| `leaf`:") and lines[2].endswith("| holds |")


def test_unknown_name_is_one_line_listing_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert patterns_main(["--only", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'nope'" in err
    assert all(name in err for name in DEMOS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: --device cuda is valid here")
def test_missing_cuda_is_one_line_and_exit_2() -> None:
    # Through `python -m`, as a user runs it.
    done = subprocess.run([sys.executable, "-m", "gan.patterns", "--device", "cuda"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "cuda" in done.stderr


def test_the_script_writes_the_table_into_the_docs_block_stamped_with_its_inputs(tmp_path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("patterns_script", ROOT / "benchmarks" / "patterns.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    results = [on_cpu("leaf"), on_cpu("timing")]
    monkeypatch.setattr(script, "run", lambda device: results)  # two rows stand for the fifteen
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    doc = tmp_path / "patterns.md"
    doc.write_text("# Autograd patterns\n\nHow the rows are measured.\n")
    assert script.main(["--write", str(doc)]) == 0
    assert script.main(["--write", str(doc)]) == 0  # a second run replaces the block
    text = doc.read_text()
    assert text.startswith("# Autograd patterns\n\nHow the rows are measured.\n\n<!-- begin patterns | command: "
                           f"OMP_NUM_THREADS=1 python benchmarks/patterns.py --write {doc} | commit: ")
    assert text.count("<!-- begin patterns") == 1 and text.endswith("<!-- end patterns -->\n")
    assert "| inputs: gan/core gan/patterns -->" in text
    assert markdown_table(results) in text and "2 claims: 1 hold, 1 skipped (they need CUDA)" in text
