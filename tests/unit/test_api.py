"""The public API: ``paraplan.__all__``, the lazy exports, ``paraplan.estimate``/``paraplan.plan`` against the
library functions they wrap, and the code of docs/api.md run block by block."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import paraplan
from paraplan.errors import NoFeasiblePlanError, SpecError

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
TRAINING = {"seq_len": 4096, "global_batch_size": 64}


def test_all_lists_every_export_and_each_resolves() -> None:
    exports = paraplan._EXPORTS
    assert sorted(paraplan.__all__) == sorted(["__version__", *exports])
    assert len(set(paraplan.__all__)) == len(paraplan.__all__)
    for name, module in exports.items():
        obj = getattr(paraplan, name)
        real = getattr(obj, "__wrapped__", obj) if name == "estimate" else obj  # see the next test
        assert getattr(sys.modules[module], name) is real, name
    assert dir(paraplan) == sorted(paraplan.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = paraplan.nonexistent


def test_star_import_gives_the_api() -> None:
    namespace: dict[str, object] = {}
    exec("from paraplan import *", namespace)
    assert {"estimate", "plan", "ModelSpec", "Estimate", "Plan", "__version__"} <= set(namespace)
    assert callable(namespace["estimate"])


def test_import_paraplan_stays_light() -> None:
    """``import paraplan`` and ``from paraplan import __version__`` load neither numpy nor pydantic; the first
    exported name does."""
    code = ("import sys, paraplan; from paraplan import __version__; "
            "light = not ({'numpy', 'pydantic'} & set(sys.modules)); paraplan.ModelSpec; "
            "print(light, 'pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]


def test_estimate_is_the_api_function_and_the_formula_subpackage() -> None:
    """Every import form of the subpackage works before and after the API is used, and the call is the API's."""
    code = ("import paraplan.estimate.params, paraplan.estimate.step_time, paraplan; "
            "import paraplan.estimate.time as time_pkg; from paraplan import estimate; "
            "from paraplan.estimate.params import model_param_counts; import paraplan.api, inspect; "
            "print(estimate is paraplan.estimate, estimate.__wrapped__ is paraplan.api.estimate, "
            "paraplan.estimate.params.__name__, time_pkg.__name__, "
            "inspect.signature(estimate) == inspect.signature(paraplan.api.estimate), callable(model_param_counts))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "paraplan.estimate.params", "paraplan.estimate.time", "True", "True"]
    with pytest.raises(AttributeError, match="cannot be replaced"):
        paraplan.estimate = 1  # type: ignore[assignment]


def test_estimate_is_the_library_estimate() -> None:
    from paraplan.estimator import estimate as estimate_layout
    from paraplan.layout import layout_for_world
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu, load_model
    from paraplan.specs.training import TrainingSpec

    est = paraplan.estimate("llama3-8b", "h100-80gb", 8, layout={"tp": 2, "mbs": 2}, training=TRAINING)
    ref = estimate_layout(load_model("llama3-8b"), make_cluster(load_gpu("h100-80gb"), 8),
                          TrainingSpec(seq_len=4096, global_batch_size=64), layout_for_world(8, tp=2, mbs=2))
    assert est.to_dict() == ref.to_dict()
    assert est.layout.dp == 4


def test_plan_is_the_library_plan() -> None:
    from paraplan.search import SearchSpace
    from paraplan.search import plan as search
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu, load_model
    from paraplan.specs.training import TrainingSpec

    p = paraplan.plan("llama3-8b", "h100-80gb", 8, training=TRAINING, space={"tp": [1, 2]}, top_k=3)
    ref = search(load_model("llama3-8b"), make_cluster(load_gpu("h100-80gb"), 8),
                 TrainingSpec(seq_len=4096, global_batch_size=64), space=SearchSpace(tp=(1, 2)), top_k=3)
    assert p.to_dict() == ref.to_dict()
    assert len(p.candidates) == 3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"layout": {"tq": 2}}, r"layout\.tq: unknown field \(allowed: .*\btp\b"),
    ({"layout": {"dp": 2}}, r"layout\.dp: unknown field .*DP is derived"),
    ({"layout": {"tp": 3}}, r"world size \(8\) is not divisible"),
    ({"training": {"seq_len": 4096}}, r"training\.global_batch_size"),
    ({"training": {"seq_len": 4096, "global_batch_size": 64, "gbs": 1}}, r"training\.gbs: unknown field"),
    ({"num_gpus": None}, r"num_gpus: required unless gpu is a ClusterSpec"),
    ({"num_gpus": 0}, r"num_gpus must be a positive integer, got 0"),
    ({"model": 7}, r"model: expected a preset name, a file path or a ModelSpec, got int"),
    ({"gpu": 7}, r"gpu: expected .* got int"),
])
def test_bad_input_is_one_spec_error(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"model": "llama3-8b", "gpu": "h100-80gb", "num_gpus": 8, "layout": {"tp": 2},
                               "training": TRAINING}
    args.update(kwargs)
    with pytest.raises(SpecError, match=message) as info:
        paraplan.estimate(**args)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_plan_bad_input_and_no_fit() -> None:
    with pytest.raises(SpecError, match=r"space\.tpp: unknown field"):
        paraplan.plan("llama3-8b", "h100-80gb", 8, training=TRAINING, space={"tpp": (1,)})
    with pytest.raises(SpecError, match="top_k must be a positive integer, got 0"):
        paraplan.plan("llama3-8b", "h100-80gb", 8, training=TRAINING, top_k=0)
    with pytest.raises(SpecError, match="objective must be throughput or memory-headroom"):
        paraplan.plan("llama3-8b", "h100-80gb", 8, training=TRAINING, objective="speed")  # type: ignore[arg-type]
    with pytest.raises(NoFeasiblePlanError):
        paraplan.plan("llama3.1-405b", "h100-80gb", 8, training=TRAINING)


def test_a_cluster_spec_takes_no_second_world_size() -> None:
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import load_gpu

    cluster = make_cluster(load_gpu("h100-80gb"), 8)
    est = paraplan.estimate("llama3-8b", cluster, layout={"tp": 8}, training=TRAINING)
    assert est.cluster is cluster
    with pytest.raises(SpecError, match="num_gpus: 16 differs from the ClusterSpec's 8"):
        paraplan.estimate("llama3-8b", cluster, 16, layout={"tp": 8}, training=TRAINING)


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def test_doc_has_examples() -> None:
    blocks = _python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 4
    assert any("paraplan.estimate(" in b for b in blocks) and any("plan(" in b for b in blocks)


@pytest.mark.parametrize("index", range(len(_python_blocks(DOC.read_text(encoding="utf-8")))))
def test_doc_example_runs(index: int) -> None:
    block = _python_blocks(DOC.read_text(encoding="utf-8"))[index]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, f"docs/api.md block {index + 1}", "exec"), {"__name__": "__doc_example__"})
    assert out.getvalue().strip(), "each example prints what it shows"


# ----------------------------------------------------------------------------- the CLI's door
def _type_checking_imports() -> dict[str, str]:
    """name -> module of each ``from M import N as N`` under ``if TYPE_CHECKING:`` in api.py (what mypy sees)."""
    import ast

    tree = ast.parse((Path(paraplan.__file__).parent / "api.py").read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                found.update({a.asname or a.name: imp.module for a in imp.names})
    return found


def test_each_reexport_is_its_modules_object_with_a_line_and_typed_alike() -> None:
    import importlib

    import paraplan.api as api

    typed = _type_checking_imports()
    for name, (module, line) in api.REEXPORTS.items():
        assert getattr(api, name) is getattr(importlib.import_module(module), name), name
        assert typed.get(name) == module, f"{name}: the TYPE_CHECKING import differs from REEXPORTS"
        assert line.endswith(".") and "\n" not in line and len(line) <= 100, name
    assert set(typed) - set(api.REEXPORTS) == {"Objective"}  # only the annotations' own names besides
    assert set(api.REEXPORTS) <= set(api.__all__) and len(set(api.__all__)) == len(api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = api.nonexistent


def test_import_paraplan_api_stays_light() -> None:
    """The API module imports the library only when a function runs or a re-exported name is first asked for:
    ``paraplan models`` takes ``preset_rows`` through it without numpy, pydantic or yaml."""
    code = ("import sys, paraplan.api as api; heavy = ('numpy', 'pydantic', 'yaml'); "
            "before = sorted(set(heavy) & set(sys.modules)); api.preset_rows; "
            "after = sorted(set(heavy) & set(sys.modules)); api.Estimate; "
            "print(before, after, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "[]", "True"]


def test_the_docs_list_every_reexport() -> None:
    import paraplan.api as api

    text = DOC.read_text(encoding="utf-8")
    missing = [name for name in api.REEXPORTS if f"`{name}`" not in text]
    assert not missing, f"docs/api.md does not list {', '.join(missing)}"
