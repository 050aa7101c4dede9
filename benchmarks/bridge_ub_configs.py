"""Megatron-Bridge's named userbuffers configs (``training/comm_overlap.py``: ``userbuffers_<dtype>_<gpu>_h<hidden>_
tp<TP>[_cp<CP>]_mbs<MBS>_seqlen<S>[_lora] = TransformerLayerTPOverlapCfg(...)``), read statically from the Bridge git
tree at the recipe library's commit (``LIBRARY_COMMIT``) and written to ``src/paraplan/recipes/ub_configs.json``
(packaged; ``paraplan.specs.userbuffers`` reads it):

    BRIDGE_MIRROR=/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo python benchmarks/bridge_ub_configs.py

Each config is written as Megatron-Bridge hands it to Transformer Engine (``CommOverlapConfig.setup``:
``asdict(tp_comm_overlap_cfg)`` with the None-valued GEMMs removed): per GEMM name the dataclass's fields with its
defaults filled in (``PipelineOverlapCfg`` / ``RingExchangeOverlapCfg`` / ``BulkOverlapCfg``). A default is taken as
Python reads it: ``PipelineOverlapCfg.fp8_buf``'s default is the tuple ``(False,)``, which TE's ``initialize_ub``
tests for truth (``user_ub_cfg[name].get("fp8_buf", False) and name in methods["pipeline"]``), so it is written
``true``. Bridge is not imported.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "src" / "paraplan" / "recipes" / "ub_configs.json"
LIBRARY_COMMIT = "067f987"
SOURCE = "src/megatron/bridge/training/comm_overlap.py"
CLASSES = ("PipelineOverlapCfg", "RingExchangeOverlapCfg", "BulkOverlapCfg")


def _defaults(tree: ast.Module) -> dict[str, dict[str, Any]]:
    """Class name -> {field: default (truth of a non-bool default, as TE reads it)} for the three overlap classes;
    fields without a default map to None (a config must give them)."""
    out: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in CLASSES:
            fields: dict[str, Any] = {}
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    value = None if stmt.value is None else ast.literal_eval(stmt.value)
                    if isinstance(value, tuple):
                        value = bool(value)
                    fields[stmt.target.id] = value
            out[node.name] = fields
    return out


def configs(text: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Config name -> GEMM name -> settings, for every module-level ``name = TransformerLayerTPOverlapCfg(...)``."""
    tree = ast.parse(text)
    defaults = _defaults(tree)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "TransformerLayerTPOverlapCfg"):
            continue
        gemms: dict[str, dict[str, Any]] = {}
        for kw in node.value.keywords:
            if kw.arg is None or (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                continue  # asdict + "remove keys with None values"
            call = kw.value
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in defaults):
                raise ValueError(f"{node.targets[0].id}.{kw.arg}: not a literal overlap config")
            fields = dict(defaults[call.func.id])
            fields.update({k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
            missing = [k for k, v in fields.items() if v is None]
            if missing:
                raise ValueError(f"{node.targets[0].id}.{kw.arg}: {', '.join(missing)} not given")
            gemms[kw.arg] = {k: (bool(v) if isinstance(v, tuple) else v) for k, v in sorted(fields.items())}
        out[node.targets[0].id] = dict(sorted(gemms.items()))
    return out


def extract(git_dir: str) -> dict[str, Any]:
    text = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{LIBRARY_COMMIT}:{SOURCE}"], check=True,
                          capture_output=True, text=True).stdout
    return {"generated_by": "benchmarks/bridge_ub_configs.py", "source": f"Megatron-Bridge {LIBRARY_COMMIT} {SOURCE}",
            "configs": configs(text)}


def dumps(data: dict[str, Any]) -> str:
    """The data file's text: one config per line."""
    head = {k: v for k, v in data.items() if k != "configs"}
    body = ",\n".join(f"  {json.dumps(name)}: {json.dumps(cfg, separators=(',', ':'))}"
                      for name, cfg in data["configs"].items())
    return json.dumps(head, indent=1)[:-2] + ',\n "configs": {\n' + body + "\n }\n}\n"


def main() -> int:
    git_dir = os.environ.get("BRIDGE_MIRROR", "")
    if not git_dir or not Path(git_dir).exists():
        print("BRIDGE_MIRROR (a Megatron-Bridge git directory) is not set or absent: skipped")
        return 0
    data = extract(git_dir)
    OUT.write_text(dumps(data))
    print(f"{len(data['configs'])} configs -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
