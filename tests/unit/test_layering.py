"""The import direction of paraplan's modules, read from the source with ``ast``.

Every ``import`` and ``from ... import`` counts, at module level and inside functions (a lazy import
still makes the importing module depend on the imported one); only imports under ``if TYPE_CHECKING:``
are left out, because they never run. Each module belongs to a layer (``LAYERS``); a module may import
its own layer and the layers below it, never a layer above. Over the whole module graph there is no
cycle, inside a layer either.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "paraplan"

LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("base", ("paraplan._version", "paraplan.units", "paraplan.errors", "paraplan.fileio"),
     "Units, the error types and safe file reading/writing: no paraplan imports but each other."),
    ("readers", ("paraplan.ingest",),
     "Megatron/Primus logs and TensorBoard events read into records; they know nothing of specs, so that "
     "specs can read a model from a log's argument dump."),
    ("specs", ("paraplan.specs", "paraplan.layout", "paraplan.schedules"),
     "The inputs: model, GPU/cluster, training and profile specs, their loaders, the Megatron flag reader, "
     "the parallel layout and the pipeline schedules it names (each schedule's bubble, in-flight micro-batches "
     "and timeline read only the model spec)."),
    ("estimate", ("paraplan.estimate", "paraplan.estimator", "paraplan.rules", "paraplan.checkpoint",
                  "paraplan.goodput", "paraplan.headroom", "paraplan.bands"),
     "Formulas for one layout: Megatron's rules, memory, step time, checkpoint cost and goodput, and the memory "
     "margin a layout keeps free."),
    ("search", ("paraplan.search", "paraplan.ranking"),
     "Every valid layout evaluated (vectorised) and ranked (the ranking tiers and rules)."),
    ("applications", ("paraplan.explain", "paraplan.launch", "paraplan.report", "paraplan.tune",
                      "paraplan.budget", "paraplan.calibrate", "paraplan.serialize", "paraplan.recipes",
                      "paraplan.specs.presets.index"),
     "What is done with estimates and plans: explanations, launch files, reports, tuning against a log, "
     "budgets, calibration, plan files, the comparison with NVIDIA's published recipes, and the preset index "
     "(its rows carry parameter counts)."),
    ("api", ("paraplan", "paraplan.api"),
     "The public API: paraplan.estimate, paraplan.plan and the exported types."),
    ("cli", ("paraplan.cli", "paraplan.__main__"),
     "The command line: parses options, calls the library, prints."),
)
"""(layer, module prefixes, what it holds), bottom first. A module is in the layer of its longest matching
prefix (``paraplan.specs.presets.index`` is an application although it lives under specs); ``paraplan`` (the
root package) is no prefix, so a new top-level module without a layer fails ``test_every_module_has_a_layer``."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for i, (_, prefixes, _) in enumerate(LAYERS):
        for prefix in prefixes:
            # the root package names itself only: a new top-level module must be given its layer
            inside = prefix != "paraplan" and module.startswith(prefix + ".")
            if (module == prefix or inside) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    return best


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks (their ``else`` runs)."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """paraplan modules ``module`` imports at run time -> the line of the first such import."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        while name and name not in modules:  # a name inside a module: the module
            name = name.rpartition(".")[0]
        if name and name != module:
            found.setdefault(name, line)

    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "paraplan":
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "paraplan":
                continue
            for alias in node.names:  # ``from paraplan.launch import flags``: the submodule itself
                add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    modules = all_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


GRAPH = import_graph()


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in GRAPH if layer_of(m) < 0)
    assert not missing, f"modules without a layer in LAYERS: {', '.join(missing)}"


def test_the_graph_sees_lazy_and_relative_imports() -> None:
    """The reader itself: a function-level import counts, a TYPE_CHECKING one does not."""
    assert "paraplan.ingest.summary" in GRAPH["paraplan.ingest.records"]
    assert "paraplan.ingest.records" not in GRAPH["paraplan.ingest.summary"]  # named for typing only
    assert "paraplan.ingest" in GRAPH["paraplan.specs.load"]  # lazy, inside _model_from_log
    assert "paraplan.cli._app" in GRAPH["paraplan.cli"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module: str) -> None:
    own = layer_of(module)
    upward = [f"{module} (layer {LAYERS[own][0]}) imports {target} (layer {LAYERS[layer_of(target)][0]}) "
              f"at line {line}" for target, line in sorted(GRAPH[module].items()) if layer_of(target) > own]
    assert not upward, "; ".join(upward)


def test_no_import_cycle() -> None:
    sorter = graphlib.TopologicalSorter({m: set(targets) for m, targets in GRAPH.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as err:
        cycle = err.args[1]
        pytest.fail("import cycle: " + " -> ".join(cycle))


def test_cycle_check_would_fail_on_a_cycle() -> None:
    """The check above is not vacuous: the same sorter rejects a two-module circle."""
    sorter = graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}})
    with pytest.raises(graphlib.CycleError):
        sorter.prepare()


COMPUTE_ENTRY_POINTS = {("paraplan.estimator", "estimate"), ("paraplan.search", "plan")}
"""The library functions the public API wraps: the CLI reaches them through ``paraplan.api``."""

CLI_MAY_IMPORT = ("paraplan.api", "paraplan.cli", "paraplan.errors", "paraplan.units", "paraplan._version")
"""The paraplan modules (and packages) a CLI module may import at run time: the API is the CLI's one door to the
library; besides it only the CLI itself, the error types, the units and the version."""


def cli_library_imports(module: str, path: Path) -> list[str]:
    """``module:line imports NAME`` for each run-time import in ``module`` (a CLI module) of a paraplan module
    outside ``CLI_MAY_IMPORT``, at module level or inside a function (``if TYPE_CHECKING:`` imports never run)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            named = [(alias.name, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            named = [(source, f"{source}.{alias.name}") for alias in node.names]
        else:
            continue
        for source, name in named:
            if source.split(".")[0] != "paraplan":
                continue
            # ``from paraplan import __version__``, ``from paraplan import api``: judge the name, not the root
            target = name if source == "paraplan" else source
            if not any(target == ok or target.startswith(ok + ".") for ok in CLI_MAY_IMPORT):
                found.append(f"{module}:{node.lineno} imports {name}")
    return found


def test_the_cli_computes_only_through_the_api() -> None:
    found = []
    for module, path in all_modules().items():
        if layer_of(module) != len(LAYERS) - 1:
            continue
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found += [f"{module}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                          if (node.module, a.name) in COMPUTE_ENTRY_POINTS]
    assert not found, "use paraplan.api: " + "; ".join(found)


def test_the_cli_imports_the_library_only_through_the_api() -> None:
    found = [line for module, path in all_modules().items() if layer_of(module) == len(LAYERS) - 1
             for line in cli_library_imports(module, path)]
    assert not found, "the CLI reaches the library through paraplan.api: " + "; ".join(found)


CLI_IMPORT_CASES = {
    "from paraplan.api import plan\nfrom paraplan.errors import SpecError\nimport paraplan.units\n": [],
    "from paraplan._version import __version__\nfrom . import render\nfrom .options import x\n": [],
    "if TYPE_CHECKING:\n    from paraplan.search import Plan\n": [],
    "from paraplan.search import SearchSpace\n": ["paraplan.cli.x:1 imports paraplan.search.SearchSpace"],
    "def f():\n    import paraplan.tune\n": ["paraplan.cli.x:2 imports paraplan.tune"],
    "def f():\n    from ..serialize import dumps_json\n": ["paraplan.cli.x:2 imports paraplan.serialize.dumps_json"],
    "from paraplan import __version__, plan\n": ["paraplan.cli.x:1 imports paraplan.__version__",
                                                   "paraplan.cli.x:1 imports paraplan.plan"],
    "if TYPE_CHECKING:\n    pass\nelse:\n    from paraplan.fileio import clip\n":
        ["paraplan.cli.x:4 imports paraplan.fileio.clip"],
}
"""A CLI module's source -> what the check reports (it names the offending import, lazy and relative ones too)."""


@pytest.mark.parametrize("source", CLI_IMPORT_CASES)
def test_the_cli_import_check_names_each_offending_import(source: str, tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text(source, encoding="utf-8")
    assert cli_library_imports("paraplan.cli.x", path) == CLI_IMPORT_CASES[source]
