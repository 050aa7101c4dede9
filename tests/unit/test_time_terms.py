"""The step-time terms are named and sourced: every function and class in the term modules has a
docstring, every number in a formula is a module constant with its own docstring (no bare
literals beyond 0, 1 and exponents), and the composer's breakdown adds up to the step."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import paraplan.estimate.time as time_pkg
from paraplan.estimate import comm, step_time
from paraplan.estimator import estimate
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.training import TrainingSpec

TERM_FILES = [*sorted(Path(time_pkg.__file__).parent.glob("*.py")), Path(step_time.__file__), Path(comm.__file__)]


def _bare_literals(fn: ast.AST) -> list[tuple[int, object]]:
    exponents = {id(n.right) for n in ast.walk(fn) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)}
    return [(n.lineno, n.value) for n in ast.walk(fn)
            if isinstance(n, ast.Constant) and type(n.value) in (int, float) and n.value not in (0, 1)
            and id(n) not in exponents]


@pytest.mark.parametrize("path", TERM_FILES, ids=lambda p: p.name)
def test_formulas_use_named_constants(path: Path) -> None:
    tree = ast.parse(path.read_text())
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    assert [n.name for n in functions if ast.get_docstring(n) is None and not n.name.startswith("_")] == []
    found = [lit for fn in functions if isinstance(fn, ast.FunctionDef) for lit in _bare_literals(fn)]
    assert found == [], f"{path.name}: unnamed numbers (line, value): {found}"


@pytest.mark.parametrize("path", TERM_FILES, ids=lambda p: p.name)
def test_every_constant_has_a_docstring(path: Path) -> None:
    body = ast.parse(path.read_text()).body
    missing = []
    for i, node in enumerate(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id.isupper()
                and isinstance(node.value, ast.Constant) and type(node.value.value) in (int, float)):
            nxt = body[i + 1] if i + 1 < len(body) else None
            if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                missing.append(node.target.id)
    assert missing == []


@pytest.mark.parametrize(("model", "gpu", "n", "layout"), [
    ("llama3-70b", "h100-80gb", 64, ParallelLayout(tp=4, pp=4, vp=2, cp=2, dp=2, mbs=1)),
    ("mixtral-8x7b", "h100-80gb", 64, ParallelLayout(tp=2, pp=2, ep=8, dp=16, mbs=1, recompute="full")),
    ("qwen3-30b-a3b", "gb200", 512, ParallelLayout(tp=2, pp=4, ep=32, dp=64, mbs=1, fsdp=True,
                                                   distributed_optimizer=False)),
])
def test_breakdown_adds_up_to_the_step(model: str, gpu: str, n: int, layout: ParallelLayout) -> None:
    est = estimate(load_model(model), make_cluster(load_gpu(gpu), n), TrainingSpec(seq_len=4096, global_batch_size=256),
                   layout)
    t = est.time.as_dict()
    parts = (t["compute_s"] + t["recompute_s"] + t["bubble_s"] + t["optimizer_s"] + t["overhead_s"]
             + sum(t["exposed_comm_s"].values()))
    assert t["step_s"] == pytest.approx(parts, rel=1e-12)
    assert set(t["exposed_comm_s"]) == set(t["link_comm_s"]) == {"tp", "cp", "ep", "pp", "dp"}
    for key, exposed in t["exposed_comm_s"].items():
        assert 0.0 <= exposed <= t["link_comm_s"][key] + 1e-12 or key == "pp", key
