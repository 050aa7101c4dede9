"""Per Megatron-Bridge release, the settings of each performance config that move memory or time, read statically
from the release's git tree (``BRIDGE_MIRROR``: a Megatron-Bridge git directory with the release tags), written to
``benchmarks/data/bridge_release_knobs.json`` (committed; ``published_cases.attach_recipe_knobs`` reads it).

    BRIDGE_MIRROR=/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo python benchmarks/bridge_release_knobs.py

Container -> release (``RELEASES``): ``docs/versions1.json`` of the Bridge tree at 067f987 (the 26.08 performance
summary's commit) names the container of every documentation version ("0.6.0 (latest) · 26.08", "0.5.1 · 26.06.01",
..., "0.1.0 · 25.09"); ``docs/releases/software-versions.md`` gives the same Bridge version per NeMo Framework
container (25.09: 0.1.0rc3, the only 0.1.0 tag that predates the 25.09 summary's first appearance at v0.1.0rc4).

The configs took three forms over the releases, each read as the harness of that release applies it:
  * v0.1.0rc3 (``yaml``): ``scripts/performance/configs/<family>/<model>_llm_pretrain.yaml``: ``perf_matrix``
    (gpu -> num_gpus_N -> common + precision) and the ``ConfigContainer`` overrides every config of the file gets;
    ``cuda_graphs: true`` is ``enable_cuda_graph`` (utils/helpers.py ``set_cuda_graph_overrides``), Megatron-Core's
    per-layer graphs (``cuda_graph_impl="local"``, the whole layer).
  * v0.2.0 ... v0.5.1 (``workload``): ``scripts/performance/configs/<family>/*workload_base_configs.py``: the
    ``WorkloadBaseConfig(...)`` / ``replace(BASE, ...)`` assignments (fields not given take the class defaults of
    that tag's ``utils/utils.py``), applied as that tag's ``set_workload_base_configs`` does (utils/overrides.py or
    utils/helpers.py: FSDP, CUDA graphs, offload / block recompute, MoE A2A overlap with delay-wgrad, the flex
    backend or alltoall, HybridEP SMs, TE cross entropy), plus the unconditional literal assignments of the
    ``set_*common_configs`` functions the config's harness function (``<model>_pretrain_config_<gpu>`` in
    *_llm_pretrain.py) calls, that function's own ``moe_token_dispatcher_type`` where the tag's workload leaves the
    dispatcher alone (up to v0.3.1), and its literal assignments after ``set_workload_base_configs``.
  * v0.6.0 (``perf_recipes``): ``src/megatron/bridge/perf_recipes/<family>/<gpu>/<model>.py``, the form of the
    packaged recipe library (bridge_perf_recipes.csv, @067f987): a recipe function whose source (and the source of
    the same-file functions it calls) is identical at v0.6.0 takes the library row's settings; any other is unknown.
Both older forms also get the precision preset of that tag (``training/mixed_precision.py`` ``bf16_with_*_mixed``:
``fp8_param_gather``, ``fp4_param_gather``, ``first_last_layers_bf16``, with the harness's own edits in
``get_precision_config``) and the launcher's bf16 rule (``use_precision_aware_optimizer = True`` for compute dtype
bf16, dropped again under Megatron-FSDP), each only where the text is found at that tag.

A column a config does not set, or that cannot be read statically, is listed under ``unknown`` (the row keeps
Megatron's default / the harness default for it); the script prints the count per release.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "data" / "bridge_release_knobs.json"
LIBRARY_COMMIT = "067f987"

RELEASES: list[tuple[str, str, str]] = [
    ("25.09", "v0.1.0rc3", "versions1.json '0.1.0 · 25.09'; software-versions.md 25.09: Megatron-Bridge 0.1.0rc3"),
    ("25.11", "v0.2.0", "versions1.json '0.2.0 · 25.11'; software-versions.md 25.11: 0.2.0"),
    ("26.02", "v0.3.0", "versions1.json '0.3.0 · 26.02'; software-versions.md 26.02: 0.3.0"),
    ("26.02.01", "v0.3.1", "versions1.json '0.3.1 · 26.02.01'; known-issues.md 'Fixed in 26.02.01 (r0.3.1)'"),
    ("26.04", "v0.4.0", "versions1.json '0.4.0 · 26.04'; software-versions.md 26.04: 0.4.0"),
    ("26.04.01", "v0.4.2", "versions1.json '0.4.2 · 26.04.01'; docs/fern/docs.yml '0.4.2 (latest) · 26.04.01'"),
    ("26.06", "v0.5.0", "versions1.json '0.5.0 · 26.06'; software-versions.md 26.06: 0.5.0"),
    ("26.06.01", "v0.5.1", "versions1.json '0.5.1 · 26.06.01' (commit 0f113aba4)"),
    ("26.08", "v0.6.0", "versions1.json '0.6.0 (latest) · 26.08'; v0.6.0's performance-summary.md: 26.08"),
]
"""NeMo container -> Megatron-Bridge release tag, with the primary evidence (files of the Bridge tree)."""

COLUMNS = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
           "cpu_offloading", "cpu_offloading_num_layers", "cuda_graph_impl", "cuda_graph_scope", "fp8_param_gather",
           "fp4_param_gather", "grad_reduce_in_fp32", "use_precision_aware_optimizer", "use_megatron_fsdp",
           "tp_comm_overlap", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_hybridep_num_sms",
           "moe_a2a_overlap", "delay_wgrad_compute", "moe_permute_fusion", "moe_router_dtype",
           "moe_shared_expert_overlap", "fp8_dot_product_attention", "first_last_layers_bf16",
           "cross_entropy_fusion_impl", "nccl_ub", "pipeline_model_parallel_layout", "tp_comm_overlap_cfg",
           "moe_paged_stash")
"""The bridge_perf_recipes.csv columns (that move memory or time) recorded per config; a config's ``unknown`` lists
those it leaves unread."""
LAYOUT = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
          "virtual_pipeline_model_parallel_size": "vp", "expert_model_parallel_size": "ep",
          "expert_tensor_parallel_size": "etp", "global_batch_size": "global_batch_size",
          "micro_batch_size": "micro_batch_size", "num_gpus": "num_gpus"}
YAML_LAYOUT = {"tp": "tp", "pp": "pp", "cp": "cp", "vp": "vp", "ep": "ep", "etp": "etp", "mbs": "micro_batch_size",
               "gbs": "global_batch_size"}
ATTR_COLUMN = {"overlap_moe_expert_parallel_comm": "moe_a2a_overlap"}
"""Config attribute names that differ from their column name."""
PRESETS = {"fp8_cs": "bf16_with_fp8_current_scaling_mixed", "fp8_mx": "bf16_with_mxfp8_mixed",
           "fp8_ds": "bf16_with_fp8_delayed_scaling_mixed", "fp8_sc": "bf16_with_fp8_subchannel_scaling_mixed",
           "nvfp4": "bf16_with_nvfp4_mixed", "bf16": "bf16_mixed"}
PREC_WORDS = {"fp8_cs": ("fp8_cs", "cs"), "fp8_mx": ("fp8_mx", "mx", "mxfp8"), "fp8_ds": ("fp8_ds", "ds"),
              "fp8_sc": ("fp8_sc", "ss", "sc"), "nvfp4": ("nvfp4",), "bf16": ("bf16",)}
_NAME = re.compile(r"^(?P<model>[A-Z0-9_]+?)_(?P<task>PRETRAIN|SFT|LORA|FINETUNE)_CONFIG_(?P<gpu>H100|B200|B300|GB200|"
                   r"GB300|VR200|R100)_(?P<prec>BF16|FP8_CS|FP8_MX|FP8_DS|FP8_SC|NVFP4)(?:_(?P<variant>[A-Z0-9_]+))?$")
_NAME_V02 = re.compile(r"^(?P<model>[A-Z0-9_]+?)_(?P<gpu>H100|B200|B300|GB200|GB300|VR200|R100)_"
                       r"(?:(?P<task>SFT|LORA)_)?(?P<prec>BF16|FP8_CS|FP8_MX|FP8_DS|FP8_SC|NVFP4)_BASE_CONFIG$")
"""v0.2.0's names: ``{MODEL}_{SIZE}_{GPU}[_{TASK}]_{PRECISION}_BASE_CONFIG`` (pretrain when no task)."""
_FUNC = re.compile(r"^(?P<model>[a-z0-9_]+?)_(?P<task>pretrain|sft|peft)_(?P<n>\d+)gpu_(?P<gpu>[a-z0-9]+)_"
                   r"(?P<prec>bf16|fp8cs|fp8mx|fp8ds|fp8sc|nvfp4)(?:_(?P<variant>[a-z0-9_]+))?_config$")


class Git:
    """Read-only access to the mirror's trees."""

    def __init__(self, git_dir: str) -> None:
        self.git_dir = git_dir

    def _run(self, *args: str) -> str:
        return subprocess.run(["git", f"--git-dir={self.git_dir}", *args], check=True, capture_output=True,
                              text=True).stdout

    def show(self, rev: str, path: str) -> str | None:
        try:
            return self._run("show", f"{rev}:{path}")
        except subprocess.CalledProcessError:
            return None

    def files(self, rev: str, prefix: str) -> list[str]:
        return [p for p in self._run("ls-tree", "-r", "--name-only", rev, prefix).splitlines() if p]

    def commit(self, rev: str) -> str:
        return self._run("rev-parse", f"{rev}^{{commit}}").strip()


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return "?"


def _column(attr: str) -> str:
    return ATTR_COLUMN.get(attr, attr)


def _is_common(name: str) -> bool:
    return name.startswith("set_") and "common" in name


def called_common_functions(func: ast.FunctionDef) -> set[str]:
    """The ``set_*common*`` functions a harness config function calls (``set_deepseek_v3_common_configs(cfg)``)."""
    return {n.func.id for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and _is_common(n.func.id)}


def common_assignments(text: str, model: str | None = None, called: set[str] | None = None) -> dict[str, Any]:
    """Unconditional ``cfg.<section>.<field> = <literal>`` statements in the body of each ``set_*common*`` function
    (the family settings every config of the file gets), as {column: value}; non-literal values are ``?``.

    With ``called`` (``called_common_functions`` of the config's harness function, ``<model>_pretrain_config_<gpu>``),
    only the functions it calls: a file holds the common settings of several models (v0.5.1 deepseek_llm_pretrain.py:
    ``set_deepseek_v4_pro_common_configs``, fp8 parameter gather, native cross entropy, bf16 gradients, which
    DeepSeek-V3's functions never call; v0.2.0-v0.3.1 qwen3_llm_pretrain.py: ``set_qwen3_next_common_configs``).
    Without it, with ``model``, the functions whose name part (``set_<part>_common_configs``) the model name starts
    with: the gpt_oss file's ``set_gpt_oss_20b_common_configs`` (offload of 95 layers, HybridEP with 128 SMs) is the
    20B's, not the 120B's, which its ``gpt_oss_120b_pretrain_config_*`` functions set with
    ``set_gpt_oss_common_configs``."""
    out: dict[str, Any] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and _is_common(node.name):
            part = node.name.removeprefix("set_").removesuffix("_configs").removesuffix("_common")
            if called is not None:
                if node.name not in called:
                    continue
            elif model is not None and not model.startswith(part):
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                        and isinstance(stmt.targets[0], ast.Attribute):
                    col = _column(stmt.targets[0].attr)
                    if col in COLUMNS:
                        out[col] = _literal(stmt.value)
    return out


def preset_flags(git: Git, tag: str) -> dict[str, dict[str, Any]]:
    """Precision -> {column: value} of the tag's mixed-precision presets (``cfg.<field> = <literal>`` in each
    ``bf16_with_*_mixed`` body), with the harness's ``get_precision_config`` edits on top."""
    out: dict[str, dict[str, Any]] = {p: {} for p in PRESETS}
    text = git.show(tag, "src/megatron/bridge/training/mixed_precision.py")
    if text is None:
        return out
    bodies = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    for prec, fname in PRESETS.items():
        node = bodies.get(fname)
        if node is None:
            continue
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Attribute) \
                    and stmt.targets[0].attr in ("fp8_param_gather", "fp4_param_gather", "first_last_layers_bf16"):
                out[prec][stmt.targets[0].attr] = _literal(stmt.value)
        for col in ("fp8_param_gather", "fp4_param_gather", "first_last_layers_bf16"):
            out[prec].setdefault(col, False)
    for path in ("scripts/performance/utils/precision.py", "scripts/performance/utils/helpers.py"):
        src = git.show(tag, path)
        if src is None or "def get_precision_config" not in src:
            continue
        func = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)
                    and n.name == "get_precision_config")
        _harness_edits(func.body, None, out)
    return out


def _harness_edits(body: list[ast.stmt], prec: str | None, out: dict[str, dict[str, Any]]) -> None:
    for stmt in body:
        if isinstance(stmt, ast.If):
            words = {c.value for c in ast.walk(stmt.test) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            inner = next((p for p, ws in PREC_WORDS.items() if words & set(ws)), prec)
            _harness_edits(stmt.body, inner, out)
            _harness_edits(stmt.orelse, prec, out)
        elif prec is not None and isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Attribute) \
                and stmt.targets[0].attr in ("fp8_param_gather", "fp4_param_gather", "first_last_layers_bf16"):
            out[prec][stmt.targets[0].attr] = _literal(stmt.value)


def harness_text(git: Git, tag: str) -> str:
    """The tag's launcher code (where the bf16 / FSDP / CUDA-graph / MoE rules live)."""
    parts = [git.show(tag, f"scripts/performance/{p}") or ""
             for p in ("run_script.py", "utils/overrides.py", "utils/helpers.py", "utils/utils.py")]
    return "\n".join(parts)


def _workload_defaults(git: Git, tag: str) -> dict[str, Any]:
    text = git.show(tag, "scripts/performance/utils/utils.py") or ""
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == "WorkloadBaseConfig":
            return {s.target.id: _literal(s.value) for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None}
    return {}


def workload_configs(text: str, defaults: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Module-level ``NAME = WorkloadBaseConfig(...)`` / ``replace(BASE, ...)`` / ``NAME = OTHER`` as field dicts."""
    env: dict[str, dict[str, Any]] = {}
    for node in ast.parse(text).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name, value = node.targets[0].id, node.value
        if isinstance(value, ast.Name) and value.id in env:
            env[name] = dict(env[value.id])
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            if value.func.id == "WorkloadBaseConfig":
                fields = dict(defaults)
            elif value.func.id == "replace" and value.args and isinstance(value.args[0], ast.Name) \
                    and value.args[0].id in env:
                fields = dict(env[value.args[0].id])
            else:
                continue
            fields.update({k.arg: _literal(k.value) for k in value.keywords if k.arg})
            env[name] = fields
    return env


NO_DEEPEP = ("26.02",)
"""Containers that shipped without DeepEP: docs/releases/known-issues.md (@067f987), 26.02: "DeepEP is not supported
in the current NeMo framework 26.02 container (nvcr.io/nvidia/nemo:26.02), which results in reduced DSv3
performance ... on H100". Their DeepEP configs did not run DeepEP; what ran instead is not stated (unknown)."""


def _flex(backend: str, gpu: str, harness: str, container: str) -> dict[str, Any]:
    """``apply_flex_dispatcher_backend`` (training/flex_dispatcher_backend.py): the flex dispatcher with the backend
    and no shared-expert overlap; DeepEP needs SM 8.x/9.x or a B200/B300 device name, so on GB200/GB300 the function
    returns without a change (the base recipe's dispatcher: unknown), as in a container without DeepEP."""
    if backend == "deepep" and (gpu in ("gb200", "gb300") or container in NO_DEEPEP):
        return {}
    out: dict[str, Any] = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": backend,
                           "moe_shared_expert_overlap": False}
    if backend == "hybridep" and "moe_hybridep_num_sms = 32" in harness:
        out["moe_hybridep_num_sms"] = 32
    return out


def _graphs(f: dict[str, Any]) -> dict[str, Any]:
    """``_set_cuda_graph_overrides``: the impl and scope given (a string scope is a one-item list); impl none clears
    the scope."""
    s: dict[str, Any] = {}
    if f.get("cuda_graph_impl") is not None:
        s["cuda_graph_impl"] = f["cuda_graph_impl"]
        if f["cuda_graph_impl"] == "none":
            s["cuda_graph_scope"] = []
    if f.get("cuda_graph_scope") is not None and s.get("cuda_graph_impl") != "none":
        scope = f["cuda_graph_scope"]
        s["cuda_graph_scope"] = [scope] if isinstance(scope, str) else scope
    return s


def _recompute(f: dict[str, Any]) -> dict[str, Any]:
    """``_set_recompute_overrides``: offload of N > 0 layers; ``recompute_num_layers`` is full/block/N;
    ``recompute_modules`` is selective with those modules."""
    s: dict[str, Any] = {}
    n_off = f.get("cpu_offloading_num_layers")
    if isinstance(n_off, int) and n_off > 0:
        s.update(cpu_offloading=True, cpu_offloading_num_layers=n_off)
    if f.get("recompute_num_layers") is not None:
        s.update(recompute_granularity="full", recompute_method="block",
                 recompute_num_layers=f["recompute_num_layers"])
    if f.get("recompute_modules") is not None:
        s.update(recompute_granularity="selective", recompute_modules=f["recompute_modules"])
    return s


WORKLOAD_APPLIES_FLEX = "apply_flex_dispatcher_backend(cfg.model, settings.moe_flex_dispatcher_backend)"
"""From v0.4.0, ``set_workload_base_configs`` (utils/overrides.py) ends with the workload's dispatcher: the flex
backend when it names one, else ``moe_token_dispatcher_type = "alltoall"``; up to v0.3.1 it leaves the dispatcher as
the harness function and its recipe set it."""


def harness_dispatcher(func: ast.FunctionDef | None) -> str | None:
    """The last unconditional ``cfg.model.moe_token_dispatcher_type = "<literal>"`` in a harness config function's
    body (v0.3.1 qwen3_llm_pretrain.py ``qwen3_235b_a22b_pretrain_config_h100``: ``"alltoall"``, set after the recipe
    applied its flex backend), or None."""
    found = None
    for stmt in func.body if func is not None else []:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute) \
                and stmt.targets[0].attr == "moe_token_dispatcher_type":
            value = _literal(stmt.value)
            found = value if isinstance(value, str) else None
    return found


def harness_overrides(func: ast.FunctionDef | None) -> dict[str, Any]:
    """{column: literal} of the unconditional ``cfg.<section>.<field> = <literal>`` statements a harness config
    function makes after its ``set_workload_base_configs(cfg, base_cfg)`` call, which therefore win over the workload
    and the presets (v0.4.2-v0.5.1 deepseek_llm_pretrain.py ``deepseek_v3_pretrain_config_b200``:
    ``cfg.mixed_precision.fp4_param_gather = False``). Userbuffers are read by ``harness_comm_overlap``."""
    out: dict[str, Any] = {}
    after = False
    for stmt in func.body if func is not None else []:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name) \
                and stmt.value.func.id == "set_workload_base_configs":
            after = True
        elif after and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Attribute):
            col = _column(stmt.targets[0].attr)
            if col in COLUMNS and col not in ("tp_comm_overlap", "tp_comm_overlap_cfg"):
                out[col] = _literal(stmt.value)
    return out


def apply_workload(f: dict[str, Any], gpu: str, moe: bool, harness: str, container: str,
                   dispatcher: str | None = None) -> dict[str, Any]:
    """The columns a WorkloadBaseConfig sets, as that tag's ``set_workload_base_configs`` applies them;
    ``dispatcher``: the harness function's own ``moe_token_dispatcher_type`` (``harness_dispatcher``), which is what
    runs where ``set_workload_base_configs`` leaves the dispatcher alone (``WORKLOAD_APPLIES_FLEX`` absent): the flex
    backend of the workload only with ``"flex"``."""
    s: dict[str, Any] = {**_graphs(f), **_recompute(f)}
    if f.get("use_megatron_fsdp") is True:
        s["use_megatron_fsdp"] = True
    if f.get("nccl_ub") is not None:
        s["nccl_ub"] = f["nccl_ub"]
    if f.get("moe_a2a_overlap") is True:
        s["moe_a2a_overlap"] = True
        if "delay_wgrad_compute = True" in harness:
            s["delay_wgrad_compute"] = True
        if "moe_shared_expert_overlap = False" in harness:
            s["moe_shared_expert_overlap"] = False
    if f.get("fp8_dot_product_attention") is not None:
        s["fp8_dot_product_attention"] = f["fp8_dot_product_attention"]
    if f.get("pp_layout") is not None:
        s["pipeline_model_parallel_layout"] = f["pp_layout"]
    if 'cross_entropy_fusion_impl = "te"' in harness:
        s["cross_entropy_fusion_impl"] = "te"
    if moe:
        s.update(_moe_dispatcher(f, gpu, harness, container, dispatcher))
    return s


def _moe_dispatcher(f: dict[str, Any], gpu: str, harness: str, container: str, dispatcher: str | None
                    ) -> dict[str, Any]:
    """The dispatcher columns of an MoE workload (``apply_workload``)."""
    backend = f.get("moe_flex_dispatcher_backend")
    if dispatcher is not None and WORKLOAD_APPLIES_FLEX not in harness:
        if dispatcher != "flex":
            return {"moe_token_dispatcher_type": dispatcher}
        return _flex(str(backend), gpu, harness, container) if backend is not None else {}
    if backend is not None:
        return _flex(str(backend), gpu, harness, container)
    if 'moe_token_dispatcher_type = "alltoall"' in harness:
        return {"moe_token_dispatcher_type": "alltoall"}
    return {}


MOE_FAMILIES = ("deepseek", "qwen", "gpt_oss", "kimi")
_FULL_ITER_GUARD = re.compile(r'if (?:precision == "(?P<prec>[a-z0-9_]+)" and )?'
                              r"is_full_iteration_cuda_graph\(cfg\.model\):\s*\n\s*set_full_iter_cg_configs\(cfg\)")


def full_iteration_paged_stash(texts: list[str], prec: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``moe_paged_stash`` True for a full-iteration config whose family harness (v0.5.x *_llm_pretrain.py) applies
    ``set_full_iter_cg_configs`` at its precision: that helper sets ``moe_paged_stash = True`` with
    ``moe_expert_rank_capacity_factor = 1.5`` (HybridEP's static rank budget, which makes the dispatch sync-free for
    the graph), gated ``if [precision == "fp8_mx" and] is_full_iteration_cuda_graph(cfg.model)``."""
    if settings.get("cuda_graph_impl") != "full_iteration":
        return {}
    for text in texts:
        if "def set_full_iter_cg_configs" not in text or "cfg.model.moe_paged_stash = True" not in text:
            continue
        if any(m["prec"] in (None, prec) for m in _FULL_ITER_GUARD.finditer(text)):
            return {"moe_paged_stash": True}
    return {}


def _precision_cols(prec: str, presets: dict[str, dict[str, Any]], harness: str, fsdp: bool) -> dict[str, Any]:
    s = dict(presets.get(prec, {}))
    if prec == "bf16" and "use_precision_aware_optimizer = True" in harness:
        s["use_precision_aware_optimizer"] = not fsdp  # _set_megatron_fsdp_overrides turns it off again
    return s


MODELS = ("llama3_8b", "llama3_70b", "llama31_405b", "deepseek_v3", "qwen3_30b_a3b", "qwen3_235b_a22b",
          "gpt_oss_120b", "kimi_k2")
GPUS = ("h100", "b200", "b300", "gb200", "gb300")
"""The configs recorded: the models and GPUs paraplan has presets for (paraplan.recipes.catalogue MODEL_PRESETS,
GPU_PRESETS); the others could not be estimated."""


def _record(container: str, tag: str, path: str, name: str, model: str, task: str, gpu: str, prec: str,
            variant: str, layout: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    settings = {k: v for k, v in settings.items() if k in COLUMNS}
    return {"container": container, "tag": tag, "file": path, "name": name, "model": model, "task": task,
            "gpu": gpu, "precision": prec, "variant": variant, **layout,
            "settings": dict(sorted(settings.items())),
            "unknown": sorted(c for c in COLUMNS if c not in settings or settings[c] == "?")}


# --- per-config tp_comm_overlap / tp_comm_overlap_cfg (the userbuffers the harness sets) -----------------------
def _comm_overlap_call(node: ast.AST) -> dict[str, Any] | None:
    """``CommOverlapConfig(tp_comm_overlap=..., tp_comm_overlap_cfg=NAME)`` as {column: value} (``?`` for a
    non-literal tp_comm_overlap, ``tp>1`` for ``bool(cfg.model.tensor_model_parallel_size > 1)``); None otherwise."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "CommOverlapConfig"):
        return None
    out: dict[str, Any] = {"tp_comm_overlap_cfg": None}
    for kw in node.keywords:
        if kw.arg == "tp_comm_overlap":
            text = ast.unparse(kw.value)
            out["tp_comm_overlap"] = "tp>1" if "tensor_model_parallel_size > 1" in text else _literal(kw.value)
        elif kw.arg == "tp_comm_overlap_cfg":
            out["tp_comm_overlap_cfg"] = kw.value.id if isinstance(kw.value, ast.Name) else _literal(kw.value)
    return out


def recipe_comm_overlap(source: str) -> dict[str, Any]:
    """The ``CommOverlapConfig(...)`` a base recipe function's source builds (its only one, or all agreeing):
    {tp_comm_overlap, tp_comm_overlap_cfg}; ``?`` where none or several disagree."""
    found = [c for node in ast.walk(ast.parse(source)) if (c := _comm_overlap_call(node)) is not None
             and "tp_comm_overlap" in c]
    if not found or any(c != found[0] for c in found):
        return {"tp_comm_overlap": "?", "tp_comm_overlap_cfg": "?"}
    return found[0]


def _precision_test(test: ast.expr, prec: str) -> bool | None:
    """``precision == "x"`` / ``!=`` / ``in (...)`` / ``not in`` evaluated at ``prec``; None when the test is
    anything else."""
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "precision"
            and len(test.ops) == 1):
        return None
    value = _literal(test.comparators[0])
    op = test.ops[0]
    if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(value, str):
        return (prec == value) == isinstance(op, ast.Eq)
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(value, (tuple, list, set)):
        return (prec in value) == isinstance(op, ast.In)
    return None


_UB_TARGETS = ("comm_overlap_cfg", "comm_overlap", "tp_comm_overlap", "tp_comm_overlap_cfg")


def harness_comm_overlap(func: ast.FunctionDef, prec: str, base: dict[str, Any], recipes: dict[str, str]
                         ) -> dict[str, Any]:
    """{tp_comm_overlap, tp_comm_overlap_cfg} of a per-GPU config function of the harness (``*_llm_pretrain.py``)
    at precision ``prec``, evaluated statement by statement: the base recipe's ``CommOverlapConfig``
    (``recipes``: function name -> source; or the ``comm_overlap_config=`` it is given), then the function's own
    ``cfg.comm_overlap = CommOverlapConfig(...)``, ``cfg.comm_overlap.tp_comm_overlap[_cfg] = ...`` (its
    ``False if precision == "nvfp4" else ...`` form too) and the ``comm_overlap_cfg`` variable chosen by precision
    branches. A branch on anything but the precision that touches these is ``?``."""
    state: dict[str, Any] = dict(base)
    local: dict[str, Any] = {}
    _ub_run(func.body, prec, state, local, recipes)
    return state


def _ub_run(body: list[ast.stmt], prec: str, state: dict[str, Any], local: dict[str, Any],
            recipes: dict[str, str]) -> None:
    for stmt in body:
        if isinstance(stmt, ast.If):
            which = _precision_test(stmt.test, prec)
            if which is None:
                if any((isinstance(n, ast.Attribute) and n.attr in _UB_TARGETS)
                       or (isinstance(n, ast.Name) and n.id == "comm_overlap_cfg") for n in ast.walk(stmt)):
                    state.update(tp_comm_overlap="?", tp_comm_overlap_cfg="?")
                continue
            _ub_run(stmt.body if which else stmt.orelse, prec, state, local, recipes)
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            _ub_assign(stmt.targets[0], stmt.value, prec, state, local, recipes)


def _ub_assign(target: ast.expr, value: ast.expr, prec: str, state: dict[str, Any], local: dict[str, Any],
               recipes: dict[str, str]) -> None:
    if isinstance(target, ast.Name) and target.id == "comm_overlap_cfg":
        local["cfg"] = value.id if isinstance(value, ast.Name) else _literal(value)
    elif isinstance(target, ast.Name) and isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
            and value.func.id in recipes:  # cfg = <recipe>_pretrain_config(...)
        given = next((_comm_overlap_call(k.value) for k in value.keywords if k.arg == "comm_overlap_config"), None)
        state.update(given if given is not None else recipe_comm_overlap(recipes[value.func.id]))
    elif isinstance(target, ast.Attribute) and target.attr == "comm_overlap":
        call = _comm_overlap_call(value)
        state.update(call if call is not None else {"tp_comm_overlap": "?", "tp_comm_overlap_cfg": "?"})
    elif isinstance(target, ast.Attribute) and target.attr == "tp_comm_overlap_cfg":
        if isinstance(value, ast.Name):
            state["tp_comm_overlap_cfg"] = local.get("cfg", "?") if value.id == "comm_overlap_cfg" else value.id
        else:
            state["tp_comm_overlap_cfg"] = _literal(value)
    elif isinstance(target, ast.Attribute) and target.attr == "tp_comm_overlap":
        _ub_switch(value, prec, state)


def _ub_switch(value: ast.expr, prec: str, state: dict[str, Any]) -> None:
    """``cfg.comm_overlap.tp_comm_overlap = <literal>`` or ``= X if precision == ... else <unchanged>``."""
    if not isinstance(value, ast.IfExp):
        state["tp_comm_overlap"] = _literal(value)
        return
    which = _precision_test(value.test, prec)
    chosen = None if which is None else (value.body if which else value.orelse)
    if chosen is None:
        state["tp_comm_overlap"] = "?"
    elif not (isinstance(chosen, ast.Attribute) and chosen.attr == "tp_comm_overlap"):
        state["tp_comm_overlap"] = _literal(chosen)


def _resolve_tp(state: dict[str, Any], tp: Any) -> dict[str, Any]:
    """``tp>1`` at the config's TP; a ``?`` value dropped (unknown); the cfg kept only as a name."""
    out: dict[str, Any] = {}
    on = state.get("tp_comm_overlap", "?")
    if on == "tp>1":
        on = bool(isinstance(tp, int) and tp > 1) if isinstance(tp, int) else "?"
    if isinstance(on, bool):
        out["tp_comm_overlap"] = on
        cfg = state.get("tp_comm_overlap_cfg")
        if isinstance(cfg, str) and cfg != "?":
            out["tp_comm_overlap_cfg"] = cfg
        elif cfg is None:
            out["tp_comm_overlap_cfg"] = ""
    return out


def recipe_functions(git: Git, tag: str) -> dict[str, str]:
    """Every module-level function of the tag's ``src/megatron/bridge/recipes`` tree: name -> source."""
    out: dict[str, str] = {}
    for path in git.files(tag, "src/megatron/bridge/recipes/"):
        if path.endswith(".py"):
            try:
                out.update(_functions(git.show(tag, path) or ""))
            except SyntaxError:
                continue
    return out


def harness_functions(git: Git, tag: str, family_dir: str) -> tuple[dict[str, ast.FunctionDef], dict[str, str]]:
    """The per-GPU config functions of a family's ``*_llm_pretrain.py`` files (name -> node) and the names they
    import under another (``from ... import deepseek_v3_pretrain_config as pretrain_config``: alias -> name)."""
    out: dict[str, ast.FunctionDef] = {}
    aliases: dict[str, str] = {}
    for other in git.files(tag, family_dir + "/"):
        if other.endswith("_pretrain.py"):
            for node in ast.parse(git.show(tag, other) or "").body:
                if isinstance(node, ast.FunctionDef):
                    out[node.name] = node
                elif isinstance(node, ast.ImportFrom):
                    aliases.update({a.asname: a.name for a in node.names if a.asname})
    return out, aliases


def workload_comm_overlap(funcs: dict[str, ast.FunctionDef], recipes: dict[str, str], model: str, gpu: str,
                          prec: str, tp: Any) -> dict[str, Any]:
    """{tp_comm_overlap, tp_comm_overlap_cfg} of a workload config: its model and GPU's harness function
    (``<model>_pretrain_config_<gpu>`` from v0.3.0, ``<model>_<gpu>_config`` at v0.2.0) at its precision."""
    func = funcs.get(f"{model}_pretrain_config_{gpu}") or funcs.get(f"{model}_{gpu}_config")
    if func is None:
        return {}
    return _resolve_tp(harness_comm_overlap(func, prec, {"tp_comm_overlap": "?", "tp_comm_overlap_cfg": "?"},
                                            recipes), tp)


def _map_names(node: ast.AST) -> Any:
    """A dict literal whose leaves are names (``COMM_OVERLAP_CONFIG_MAP``) as nested dicts of the names."""
    if isinstance(node, ast.Dict):
        return {_literal(k): _map_names(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    return node.id if isinstance(node, ast.Name) else _literal(node)


def yaml_comm_overlap(git: Git, tag: str) -> dict[str, dict[str, Any]]:
    """v0.1.0rc3: model (``<name>_<size>``) -> the {tp_comm_overlap, tp_comm_overlap_cfg} of its recipe's
    ``pretrain_config`` (src/megatron/bridge/recipes/<family>/<model>.py), with run_script.py's
    ``comm_overlap_config=CommOverlapConfig(...)`` for that model over it, and ``"map"`` -> run_script's
    ``COMM_OVERLAP_CONFIG_MAP`` (utils/helpers.py: model -> gpu -> compute dtype -> config name)."""
    out: dict[str, dict[str, Any]] = {}
    for path in git.files(tag, "src/megatron/bridge/recipes/"):
        stem = path.rsplit("/", 1)[-1].removesuffix(".py")
        funcs = _functions(git.show(tag, path) or "") if path.endswith(".py") else {}
        if "pretrain_config" in funcs:
            out[stem] = recipe_comm_overlap(funcs["pretrain_config"])
    run = git.show(tag, "scripts/performance/run_script.py") or ""
    for node in ast.walk(ast.parse(run)):
        if isinstance(node, ast.If):
            words = [c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            given = [c for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.keyword)
                     and n.arg == "comm_overlap_config" and (c := _comm_overlap_call(n.value)) is not None]
            if len(words) == 2 and given:
                out["_".join(words)] = given[0]
    helpers = git.show(tag, "scripts/performance/utils/helpers.py") or ""
    for node in ast.parse(helpers).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id == "COMM_OVERLAP_CONFIG_MAP":
            out["map"] = _map_names(node.value)
    return out


def yaml_config_comm_overlap(table: dict[str, dict[str, Any]], model: str, gpu: str, prec: str,
                             tp: Any) -> dict[str, Any]:
    """One v0.1.0rc3 config's userbuffers: its model's recipe / run_script value, the named config of
    ``COMM_OVERLAP_CONFIG_MAP`` at compute dtype bf16 or fp8 (run_script ``args.compute_dtype``) where it has one."""
    state = dict(table.get(model, {"tp_comm_overlap": "?", "tp_comm_overlap_cfg": "?"}))
    named = table.get("map", {}).get(model, {}).get(gpu, {}).get("bf16" if prec == "bf16" else "fp8")
    if isinstance(named, str):
        state["tp_comm_overlap_cfg"] = named
    return _resolve_tp(state, tp)


# --- moe_permute_fusion where the perf config leaves it: the base recipe's, else the model provider's ---------------
PROVIDER_CLASSES = {"qwen3_30b_a3b": ("Qwen3MoEModelProvider30B_A3B", "Qwen3MoEModelProvider"),
                    "qwen3_235b_a22b": ("Qwen3MoEModelProvider235B_A22B", "Qwen3MoEModelProvider"),
                    "gpt_oss_120b": ("GPTOSSProvider120B", "GPTOSSProvider"),
                    "deepseek_v3": ("DeepSeekV3ModelProvider", "DeepSeekV3Provider"),
                    "kimi_k2": ("KimiK2Provider",)}
"""The provider class a model's base recipe builds (the first the tag defines): v0.1.0rc3 recipes/qwen/
qwen3_235b_a22b.py ``Qwen3MoEModelProvider235B_A22B(...)``; v0.2.0-v0.3.0 the recipes' ``AutoBridge`` providers,
models/qwen/qwen3_moe_bridge.py ``Qwen3MoEModelProvider(``, models/gpt_oss/gpt_oss_bridge.py ``GPTOSSProvider(``,
models/deepseek/deepseek_v3_bridge.py ``DeepSeekV3ModelProvider(``; v0.3.0 recipes/kimi/kimi_k2.py
``KimiK2Provider(``."""
TE_MIN_VERSION_TRUE = 'is_te_min_version("2.1.0") if HAVE_TE else False'
"""A provider default that is on in every container here: docs/releases/software-versions.md (@067f987) lists
Transformer Engine 2.7.0 in the oldest container (25.09) and newer ones after it (models/deepseek/deepseek_provider.py
``DeepSeekProvider``, models/kimi/kimi_provider.py ``KimiK2Provider``: ``moe_permute_fusion``)."""


def _permute_literal(node: ast.expr) -> Any:
    if ast.unparse(node) == ast.unparse(ast.parse(TE_MIN_VERSION_TRUE, mode="eval").body):
        return True
    value = _literal(node)
    return value if isinstance(value, bool) else "?"


def recipe_permute_fusion(text: str, func: str) -> Any:
    """``moe_permute_fusion`` as the base recipe function ``func`` of a recipe file sets it: its unconditional
    ``<x>.moe_permute_fusion = <literal>`` statements and those of the same-file functions it calls (v0.3.1-v0.5.1
    recipes/qwen/qwen3_moe.py, recipes/gpt_oss/gpt_oss.py, recipes/kimi/kimi_k2.py: ``cfg.model.moe_permute_fusion =
    True``; v0.1.0rc3-v0.5.1 recipes/deepseek/deepseek_v3.py ``model_cfg`` / ``cfg.model``), the last one set; None
    when none sets it."""
    funcs = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    found: list[Any] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in funcs:
            return
        seen.add(name)
        for stmt in funcs[name].body:
            for call in ast.walk(stmt):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                    visit(call.func.id)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Attribute) and stmt.targets[0].attr == "moe_permute_fusion":
                found.append(_permute_literal(stmt.value))

    visit(func)
    return found[-1] if found else None


def provider_permute_fusion(classes: dict[str, ast.ClassDef], names: tuple[str, ...]) -> Any:
    """The ``moe_permute_fusion`` class default of the first of ``names`` defined, through its base classes
    (``moe_permute_fusion: bool = True`` in models/qwen/qwen_provider.py ``Qwen3MoEModelProvider``,
    models/gpt_oss/gpt_oss_provider.py ``GPTOSSProvider``); None when neither it nor a base sets one (Megatron's
    ``TransformerConfig`` default, off)."""
    todo = [next((n for n in names if n in classes), "")]
    while todo:
        cls = classes.get(todo.pop(0))
        if cls is None:
            continue
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                    and stmt.target.id == "moe_permute_fusion" and stmt.value is not None:
                return _permute_literal(stmt.value)
        todo.extend(b.id for b in cls.bases if isinstance(b, ast.Name))
    return None


def model_permute_fusion(git: Git, tag: str) -> dict[str, Any]:
    """Model -> the ``moe_permute_fusion`` its base recipe runs with at the tag: the recipe's own
    (``recipe_permute_fusion``: ``<model>_pretrain_config``, at v0.1.0rc3 ``pretrain_config`` of
    recipes/<family>/<model>.py), else its provider's class default (``provider_permute_fusion``). What a perf config
    leaves unset runs this, not Megatron's default (off)."""
    classes: dict[str, ast.ClassDef] = {}
    for path in git.files(tag, "src/megatron/bridge/models/"):
        if path.endswith(".py") and "provider" in path.rsplit("/", 1)[-1]:
            try:
                tree = ast.parse(git.show(tag, path) or "")
            except SyntaxError:
                continue
            classes.update({n.name: n for n in tree.body if isinstance(n, ast.ClassDef)})
    texts = {p: git.show(tag, p) or "" for p in git.files(tag, "src/megatron/bridge/recipes/") if p.endswith(".py")}
    out: dict[str, Any] = {}
    for model, names in PROVIDER_CLASSES.items():
        value = None
        for path, text in texts.items():
            stem = path.rsplit("/", 1)[-1].removesuffix(".py")
            func = "pretrain_config" if stem == model and "def pretrain_config(" in text else f"{model}_pretrain_config"
            if f"def {func}(" in text:
                value = recipe_permute_fusion(text, func)
                break
        out[model] = value if value is not None else provider_permute_fusion(classes, names)
    return out


def with_permute_default(settings: dict[str, Any], model: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with ``moe_permute_fusion`` from the model's recipe / provider (``model_permute_fusion``) where
    the config does not set it."""
    if "moe_permute_fusion" in settings or defaults.get(model) is None:
        return settings
    return {**settings, "moe_permute_fusion": defaults[model]}


def release_workload(git: Git, container: str, tag: str) -> list[dict[str, Any]]:
    """Every WorkloadBaseConfig of a v0.2.0-v0.5.1 tag."""
    defaults, harness, presets = _workload_defaults(git, tag), harness_text(git, tag), preset_flags(git, tag)
    recipes = recipe_functions(git, tag)
    permute = model_permute_fusion(git, tag)
    out = []
    for path in git.files(tag, "scripts/performance/configs/"):
        if not path.endswith("workload_base_configs.py"):
            continue
        family = path.split("/")[-2]
        texts = [git.show(tag, other) or "" for other in git.files(tag, path.rsplit("/", 1)[0] + "/")
                 if other.endswith("_pretrain.py")]
        funcs, aliases = harness_functions(git, tag, path.rsplit("/", 1)[0])
        known = {**recipes, **{a: recipes[n] for a, n in aliases.items() if n in recipes}}
        for name, f in workload_configs(git.show(tag, path) or "", defaults).items():
            m = _NAME.match(name) or _NAME_V02.match(name)
            if m is None or (m["task"] or "PRETRAIN") != "PRETRAIN":
                continue
            gpu, prec = m["gpu"].lower(), m["prec"].lower()
            model = m["model"].lower()
            func = funcs.get(f"{model}_pretrain_config_{gpu}") or funcs.get(f"{model}_{gpu}_config")
            called = called_common_functions(func) if func is not None else None
            common: dict[str, Any] = {}
            for text in texts:
                common.update(common_assignments(text, model, called))
            variant = (m.groupdict().get("variant") or "").lower()
            moe = family in MOE_FAMILIES or int(f.get("expert_model_parallel_size") or 1) > 1
            s = {**common, **_precision_cols(prec, presets, harness, f.get("use_megatron_fsdp") is True),
                 **apply_workload(f, gpu, moe, harness, container, harness_dispatcher(func)),
                 **workload_comm_overlap(funcs, known, m["model"].lower(), gpu, prec,
                                         f.get("tensor_model_parallel_size")),
                 **harness_overrides(func)}
            if moe:
                s.update(full_iteration_paged_stash(texts, prec, s))
                s = with_permute_default(s, model, permute)
            layout = {LAYOUT[k]: f.get(k) for k in LAYOUT}
            out.append(_record(container, tag, path, name, m["model"].lower(), "pretrain", gpu, prec,
                               variant, layout, s))
    return out


def release_yaml(git: Git, container: str, tag: str) -> list[dict[str, Any]]:
    """Every perf_matrix entry of the v0.1.0rc3 YAML configs."""
    import yaml

    harness, presets = harness_text(git, tag), preset_flags(git, tag)
    ub_table = yaml_comm_overlap(git, tag)
    permute = model_permute_fusion(git, tag)
    out = []
    for path in git.files(tag, "scripts/performance/configs/"):
        if not path.endswith("_llm_pretrain.yaml"):
            continue
        doc = yaml.safe_load(git.show(tag, path) or "") or {}
        cc = doc.get("ConfigContainer", {}) or {}
        common = {_column(k): v for sec in ("model", "mixed_precision", "ddp", "optimizer", "comm_overlap")
                  for k, v in (cc.get(sec) or {}).items() if _column(k) in COLUMNS}
        model = path.rsplit("/", 1)[1].removesuffix("_llm_pretrain.yaml")
        family = path.split("/")[-2]
        for gpu, by_n in (doc.get("perf_matrix") or {}).items():
            for nkey, block in (by_n or {}).items():
                base = block.get("common", {}) or {}
                for prec, vals in block.items():
                    if prec == "common":
                        continue
                    f = {**base, **(vals or {})}
                    prec = {"fp8_ss": "fp8_sc"}.get(prec, prec)  # the YAML's subchannel key
                    s = {**common, **_precision_cols(prec, presets, harness, f.get("use_megatron_fsdp") is True)}
                    if f.get("use_megatron_fsdp") is True:
                        s["use_megatron_fsdp"] = True
                    if f.get("cuda_graphs") is True:
                        s.update(cuda_graph_impl="local", cuda_graph_scope=[])
                    elif f.get("cuda_graphs") is False:
                        s.update(cuda_graph_impl="none", cuda_graph_scope=[])
                    wl = {"cpu_offloading_num_layers": f.get("cpu_offloading_num_layers"),
                          "recompute_num_layers": f.get("recompute_num_layers"),
                          "moe_flex_dispatcher_backend": "deepep" if f.get("use_deepep") else None}
                    s.update(apply_workload(wl, gpu, family in MOE_FAMILIES, harness, container))
                    if "tp_comm_overlap" not in s:
                        s.update(yaml_config_comm_overlap(ub_table, model, gpu, prec, f.get("tp")))
                    s = with_permute_default(s, model, permute)  # MoE models only (v0.1.0rc3's family is qwen3)
                    layout = {YAML_LAYOUT[k]: f.get(k) for k in YAML_LAYOUT}
                    layout["num_gpus"] = int(nkey.removeprefix("num_gpus_"))
                    out.append(_record(container, tag, path, f"{model}:{gpu}:{nkey}:{prec}", model, "pretrain",
                                       gpu, prec, "", layout, s))
    return out


def _functions(text: str) -> dict[str, str]:
    tree = ast.parse(text)
    return {n.name: ast.get_source_segment(text, n) or "" for n in tree.body if isinstance(n, ast.FunctionDef)}


def _closure(name: str, funcs: dict[str, str]) -> str:
    seen, todo, parts = set(), [name], []
    while todo:
        n = todo.pop()
        if n in seen or n not in funcs:
            continue
        seen.add(n)
        parts.append(funcs[n])
        todo.extend(re.findall(r"\b([a-z0-9_]+_config)\(", funcs[n]))
    return "\n".join(sorted(parts))


def release_perf_recipes(git: Git, container: str, tag: str) -> list[dict[str, Any]]:
    """v0.6.0: the library rows (bridge_perf_recipes.csv @067f987) whose function is identical at the tag."""
    csv_path = Path(__file__).resolve().parents[2] / "shared" / "reference" / "bridge_perf_recipes.csv"
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    out, cache_old, cache_new = [], {}, {}
    for r in rows:
        path, _, func = r["source"].partition(":")
        m = _FUNC.match(func)
        if m is None or m["task"] != "pretrain":
            continue
        if path not in cache_old:
            old, new = git.show(tag, path), git.show(LIBRARY_COMMIT, path)
            cache_old[path] = _functions(old) if old else {}
            cache_new[path] = _functions(new) if new else {}
        same = func in cache_old[path] and _closure(func, cache_old[path]) == _closure(func, cache_new[path])
        s: dict[str, Any] = {}
        if same:
            from paraplan.recipes.catalogue import parse_cell

            s = {c: parse_cell(r[c]) for c in COLUMNS if r.get(c, "") not in ("", "?")}
        layout = {k: _int_or_none(r[c]) for k, c in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("vp", "vp"),
                                                      ("ep", "ep"), ("etp", "etp"),
                                                      ("global_batch_size", "global_batch_size"),
                                                      ("micro_batch_size", "micro_batch_size"),
                                                      ("num_gpus", "num_gpus"))}
        prec = {"fp8cs": "fp8_cs", "fp8mx": "fp8_mx", "fp8ds": "fp8_ds", "fp8sc": "fp8_sc"}.get(m["prec"], m["prec"])
        rec = _record(container, tag, path, func, m["model"], "pretrain", m["gpu"], prec, m["variant"] or "",
                      layout, s)
        if not same:
            rec["unknown"] = list(COLUMNS)
            rec["changed_since_tag"] = True
        out.append(rec)
    return out


def _int_or_none(text: str) -> int | None:
    return int(text) if re.fullmatch(r"\d+", text or "") else None


def extract(git_dir: str) -> dict[str, Any]:
    git = Git(git_dir)
    releases, configs = [], []
    for container, tag, evidence in RELEASES:
        if git.files(tag, "src/megatron/bridge/perf_recipes/"):
            form, rows = "perf_recipes", release_perf_recipes(git, container, tag)
        elif any(p.endswith("workload_base_configs.py") for p in git.files(tag, "scripts/performance/configs/")):
            form, rows = "workload", release_workload(git, container, tag)
        else:
            form, rows = "yaml", release_yaml(git, container, tag)
        releases.append({"container": container, "tag": tag, "commit": git.commit(tag), "form": form,
                         "evidence": evidence})
        rows = [r for r in rows if r["model"] in MODELS and r["gpu"] in GPUS]
        releases[-1]["configs"] = len(rows)
        configs.extend(rows)
    return {"generated_by": "benchmarks/bridge_release_knobs.py", "library_commit": LIBRARY_COMMIT,
            "columns": list(COLUMNS), "releases": releases, "configs": configs}


def dumps(data: dict[str, Any]) -> str:
    """The data file's text: one config per line (diffs between runs stay readable), ``unknown`` left out (every
    column a config's ``settings`` lacks is unknown)."""
    head = {k: v for k, v in data.items() if k != "configs"}
    lines = [json.dumps({k: v for k, v in c.items() if k != "unknown"}, separators=(",", ":"))
             for c in data["configs"]]
    body = ",\n".join(lines)
    return json.dumps(head, indent=1)[:-2] + ',\n "configs": [\n' + body + "\n]}\n"


def load(path: Path = OUT) -> dict[str, Any]:
    """The data file with each config's ``unknown`` columns filled back in."""
    data: dict[str, Any] = json.loads(path.read_text())
    for c in data["configs"]:
        c["unknown"] = sorted(k for k in data["columns"] if k not in c["settings"] or c["settings"][k] == "?")
    return data


def main() -> int:
    git_dir = os.environ.get("BRIDGE_MIRROR", "")
    if not git_dir or not Path(git_dir).exists():
        print("BRIDGE_MIRROR (a Megatron-Bridge git directory with the release tags) is not set or absent: skipped")
        return 0
    data = extract(git_dir)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(dumps(data))
    for rel in data["releases"]:
        rows = [c for c in data["configs"] if c["container"] == rel["container"]]
        unknown = sum(len(c["unknown"]) for c in rows)
        print(f"{rel['container']:<9} {rel['tag']:<10} {rel['form']:<12} configs {len(rows):4d}; "
              f"unknown cells {unknown}/{len(rows) * len(COLUMNS)}")
    print(f"wrote {OUT.relative_to(Path.cwd()) if OUT.is_relative_to(Path.cwd()) else OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
