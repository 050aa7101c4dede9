"""The index of the built-in presets: ``index.json`` next to this file holds the rows that ``paraplan models``
and ``paraplan gpus`` print (every ``--format`` is made from them), generated from the YAML presets by the
real loaders and ``model_param_counts``. The two commands read it with json alone, so they import none of
pydantic, numpy and yaml (``benchmarks/startup.py``).

Regenerate it after changing a preset, a loader or the parameter count::

    python -m paraplan.specs.presets.index

``tests/cli/test_startup.py`` regenerates it in memory and fails while the packaged file differs. The
index also records the SHA-256 of each YAML preset: when the files beside it differ (a preset edited, added
or removed in a checkout and the index not regenerated), ``preset_rows`` computes the rows with the loaders
instead, so the output is never stale, only slower.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Literal

Kind = Literal["models", "gpus"]
KINDS: tuple[Kind, ...] = ("models", "gpus")
PRESETS_DIR = os.path.dirname(os.path.abspath(__file__))
"""The folder of the YAML presets (``models/``, ``gpus/``) and of ``index.json``."""
INDEX_PATH = os.path.join(PRESETS_DIR, "index.json")
REGENERATE = "python -m paraplan.specs.presets.index"
"""The command that rewrites ``index.json``."""


def yaml_sha256() -> dict[str, str]:
    """``kind/name.yaml`` -> SHA-256 of its bytes, for every YAML preset beside this module (sorted)."""
    import hashlib

    out: dict[str, str] = {}
    for kind in KINDS:
        for fname in sorted(os.listdir(os.path.join(PRESETS_DIR, kind))):
            if fname.endswith(".yaml"):
                with open(os.path.join(PRESETS_DIR, kind, fname), "rb") as fh:
                    out[f"{kind}/{fname}"] = hashlib.sha256(fh.read()).hexdigest()
    return out


def model_rows() -> list[dict[str, Any]]:
    """One row per model preset (the loaders and numpy: the slow path the index spares)."""
    from paraplan.estimate.params import model_param_counts
    from paraplan.specs.load import load_model_preset, model_preset_names

    rows: list[dict[str, Any]] = []
    for name in model_preset_names():
        m = load_model_preset(name)
        counts = model_param_counts(m, max_positions=m.max_position_embeddings or 4096)
        rows.append({"name": name, "layers": m.num_layers, "hidden": m.hidden_size,
                     "heads": m.num_attention_heads, "kv_heads": m.query_groups,
                     "experts": m.num_experts, "topk": m.moe_router_topk if m.is_moe else None,
                     "params": counts.total, "active_params": counts.active_per_token,
                     "source": m.source})
    return rows


def gpu_rows() -> list[dict[str, Any]]:
    """One row per GPU preset, in the units of the column names (the loaders: the slow path)."""
    from paraplan.specs.load import gpu_preset_names, load_gpu
    from paraplan.units import GB, GIB, TB, TFLOP

    rows: list[dict[str, Any]] = []
    for name in gpu_preset_names():
        g = load_gpu(name)
        rows.append({"name": name, "hbm_gib": g.hbm_bytes / GIB, "hbm_tbyte_per_s": g.hbm_bytes_per_s / TB,
                     "bf16_tflops": g.peak_bf16_flops_per_s / TFLOP,
                     "fp8_tflops": None if g.peak_fp8_flops_per_s is None else g.peak_fp8_flops_per_s / TFLOP,
                     "fp4_tflops": None if g.peak_fp4_flops_per_s is None else g.peak_fp4_flops_per_s / TFLOP,
                     "nvlink_gbyte_per_s": g.nvlink_bytes_per_s / GB,
                     "network_gbyte_per_s": g.network_bytes_per_s / GB,
                     "gpus_per_node": g.gpus_per_node, "nvlink_domain_size": g.nvlink_domain_size,
                     "source": g.source})
    return rows


def build_index() -> dict[str, Any]:
    """The index as ``index.json`` holds it, computed now from the YAML presets."""
    return {"regenerate": REGENERATE, "yaml_sha256": yaml_sha256(), "models": model_rows(), "gpus": gpu_rows()}


def index_text(index: dict[str, Any]) -> str:
    """``index`` as the file's text (rows keep their column order: the CSV header and the JSON output)."""
    return json.dumps(index, indent=1, ensure_ascii=False) + "\n"


def preset_rows(kind: Kind) -> list[dict[str, Any]]:
    """The rows ``paraplan models`` (``kind="models"``) or ``paraplan gpus`` prints: from ``index.json`` while it
    matches the YAML presets byte for byte, else computed by the loaders."""
    try:
        with open(INDEX_PATH, encoding="utf-8") as fh:
            index = json.load(fh)
        if index["yaml_sha256"] == yaml_sha256():
            rows = index[kind]
            assert isinstance(rows, list)
            return rows
    except (OSError, ValueError, KeyError, TypeError, AssertionError):  # missing or unreadable: compute
        pass
    return model_rows() if kind == "models" else gpu_rows()


def main() -> int:
    """Rewrite ``index.json`` from the YAML presets (whole or not at all); prints what it wrote."""
    from paraplan.fileio import write_text_atomic

    index = build_index()
    write_text_atomic(INDEX_PATH, index_text(index), option="index", force=True)
    print(f"{INDEX_PATH}: {len(index['models'])} models, {len(index['gpus'])} GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
