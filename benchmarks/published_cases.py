"""Rows of ../shared/calibration/{published_runs,vtrain_runs}.csv as estimate cases.

Conversion rules follow ../shared/calibration/SOURCES.md: the measured target is tokens/s/GPU,
taken directly, from the step time (gbs*seq/(step*num_gpus)), or from TFLOP/s divided by that
source's own FLOPs formula (SC21 Eq. 3 with recompute; Megatron's mid-2024 formula for the H100
README table; Korthikanti model FLOPs for MegaScale MFU). Dimensions missing from a table come from
the model's published config. Rows that cannot be expressed are skipped with a reason.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paraplan.ingest.summary import quantile

SHARED = Path(__file__).resolve().parents[2] / "shared" / "calibration"

GPU_MAP = {
    "H100-SXM-80GB": "h100-80gb", "H100-SXM-80GB (700W, HBM3)": "h100-80gb",
    "H100 (96GB HBM2e, 500W)": "h100-80gb", "H100 (HBM2e, lower-TDP SXM; doc says 94GB/95GB)": "h100-80gb",
    "H200": "h200-141gb", "A100-SXM-80GB": "a100-80gb", "A100-SXM-40GB": "a100-40gb",
    "A100 (Selene)": "a100-80gb", "A100 (DGX-A100)": "a100-40gb", "NVIDIA Ampere (A100-class)": "a100-80gb",
    "A100 (vTrain; SXM, memory size not stated)": "a100-80gb", "B200": "b200", "B300": "b300",
    "GB200": "gb200", "GB300": "gb300",
}
NVL72 = {"gb200", "gb300"}
PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "mxfp8": "fp8", "fp8-cs": "fp8",
             "fp8-blockwise": "fp8", "fp8 tensorwise": "fp8", "fp8 rowwise": "fp8",
             "fp8 (float8 linears)": "fp8", "fp8 (TransformerEngine)": "fp8", "nvfp4": "fp4"}
FP8_RECIPE = {"mxfp8": "mxfp8", "fp8-cs": "tensorwise", "fp8-blockwise": "blockwise", "fp8 tensorwise": "tensorwise"}
"""The ``--fp8-recipe`` of the rows that name one (others: Megatron's default, delayed scaling). The presets'
``fp8_gemm_speedup`` was fitted (session 3) with every row as delayed scaling; on Blackwell, where these rows are,
it sits at its bound (2, the FP8/BF16 peak ratio), so it holds none of their quantisation cost."""
# source prefix -> (short name, defaults: sp, distributed optimizer, recompute, tp_overlap, ogr)
# attn: sources from before FlashAttention reached Megatron (2020-2022 Megatron-LM and
# Megatron-DeepSpeed, and vTrain's Megatron-DeepSpeed) ran unfused attention (baddbmm + fused
# scale-mask-softmax); the others run flash/cuDNN attention. Used only with
# `calibration.py --source-attention` (the default scores every row with flash, as score.py).
# ogr: overlap of the DP gradient reduce / parameter gather. Megatron-DeepSpeed sources (MT-NLG,
# BLOOM, vTrain) run DeepSpeed's engine, which reduces after the backward pass (ZeRO overlap_comm
# is off by default): False. Megatron-LM sources that do not say: paraplan's CLI default
# (--overlap-grad-reduce on), which is also what shared/tools/scoring/score.py runs.
# kernel: the flash-attention kernel generation (TrainingSpec.attention_kernel), a fact of the source's software
# (SOURCES.md), used by every score (not fitted to any row). "fa2" for NeMo 24.03.01 (SOURCES.md section 10):
# its Transformer Engine 1.4 picks cuDNN FusedAttention on sm90 and flash-attn 2 elsewhere (TE v1.4 attention.py
# DotProductAttention.forward, "Select FusedAttention on sm90 and FlashAttention on others"), the 2023-24 kernels.
# "current" (the default) for: the Megatron-Bridge rows (NeMo containers 25.09-26.08, SOURCES.md section 5: today's
# kernels, on which the presets' attention_frac was fitted); the Megatron-LM README H100 rows (Megatron-Core r0.8.0,
# July 2024, section 2: no container or TE version stated, and in the H100 fit); and every 2020-2022 source (SC21,
# Megatron README 2020, Korthikanti, MT-NLG, BLOOM, vTrain), which ran no flash attention at all but unfused
# attention (the attn fact above, `calibration.py --source-attention`): FA2 would be a kernel they did not run.
SOURCES: list[tuple[str, str, dict[str, Any]]] = [
    ("NVIDIA-NeMo/Megatron-Bridge performance summary", "Megatron-Bridge",
     dict(sp=True, dopt=True, rec="none", tp_overlap=True)),
    ("NVIDIA/NeMo performance summary", "NeMo perf", dict(sp=True, dopt=True, rec="none", kernel="fa2")),
    ("NVIDIA/NeMo long sequence", "NeMo long-seq", dict(sp=True, dopt=True, rec="none", kernel="fa2")),
    ("NVIDIA/Megatron-LM examples/llama", "Megatron-LM llama3 fp8", dict(sp=True, dopt=True, rec="none")),
    ("MegaScale (NSDI'24) Table 2 - Megatron-LM", "MegaScale T2 Megatron", dict(sp=True, dopt=True, rec="selective")),
    ("MegaScale (NSDI'24) Figure 9 - Megatron-LM", "MegaScale F9 Megatron", dict(sp=True, dopt=True, rec="selective")),
    ("MegaScale (NSDI'24) Table 3", "MegaScale T3", dict(sp=True, dopt=True, rec="selective")),
    ("Megatron-Core MoE technical report", "MCore MoE report", dict(sp=True, dopt=True, rec="none")),
    ("NVIDIA/Megatron-LM dev docs: DeepSeek-V3", "Megatron-LM DSv3 guide", dict(sp=True, dopt=True, rec="none")),
    ("Narayanan et al. 2021", "SC21 Table 1", dict(attn="unfused", sp=False, dopt=False, rec="full")),
    ("NVIDIA Megatron-LM README (2020", "Megatron README 2020", dict(attn="unfused", sp=False, dopt=False, rec="full")),
    ("NVIDIA Megatron-LM README (H100 weak", "Megatron README H100",
     dict(sp=True, dopt=True, rec="none", tp_overlap=True)),
    ("Korthikanti et al. 2022 (arXiv 2205.05198) Tables", "Korthikanti T3/T5",
     dict(attn="unfused", sp=False, dopt=False, rec=None)),
    ("MT-NLG 530B", "MT-NLG 530B", dict(attn="unfused", sp=False, dopt=True, rec="full", ogr=False)),
    ("bigscience-workshop/bigscience tr11-176B-ml chronicles", "BLOOM prequel",
     dict(attn="unfused", sp=False, dopt=True, rec="full", ogr=False)),
    ("bigscience-workshop/bigscience tr11-176B-ml README", "BLOOM-176B",
     dict(attn="unfused", sp=False, dopt=True, rec="full", ogr=False)),
    ("vTrain data", "vTrain", dict(attn="unfused", sp=False, dopt=False, rec="full", ogr=False)),
]
NON_MEGATRON = ("MegaScale (NSDI'24) Table 2 - MegaScale", "MegaScale (NSDI'24) Figure 9 - MegaScale",
                "pytorch/torchtitan", "mosaicml/llm-foundry", "Llama 3 paper", "OPT paper")


class Skip(Exception):
    """A row that cannot be expressed as an estimate."""


@dataclass
class Case:
    """One measured run as paraplan inputs plus the target."""

    id: str
    source: str
    label: str
    model: dict[str, Any]
    gpu: str
    num_gpus: int
    gpus_per_node: int | None
    seq_len: int
    gbs: int
    layout: dict[str, Any]
    precision: str
    target_tokens_per_s_per_gpu: float
    moe: bool
    attention_backend: str = "flash"
    notes: list[str] = field(default_factory=list)
    fp8_recipe: str = "delayed"
    """``--fp8-recipe`` of an FP8 row (``FP8_RECIPE``)."""
    attention_kernel: str = "current"
    """The flash-attention kernel generation the source ran (``SOURCES`` ``kernel``; TrainingSpec.attention_kernel)."""
    nvfp4_quantize_kernel: str = "fused"
    """How the row's Transformer Engine casts NVFP4 operands (``nvfp4_quantize_kernel_of``;
    TrainingSpec.nvfp4_quantize_kernel)."""
    knobs: dict[str, Any] = field(default_factory=dict)
    """TrainingSpec knobs the row ran with (``attach_recipe_knobs``); empty: Megatron's defaults."""
    excluded: str = ""
    """Why the row is left out of the scores (``DOCUMENTED_REGRESSIONS``, the source's own statement); empty: scored."""
    fold_key: str = ""
    """The row's identity for cross-validation folds (``row_fold_key``): its content, not its position in the CSV."""


def _i(x: str | None) -> int | None:
    x = (x or "").strip()
    return int(float(x)) if x else None


def _f(x: str | None) -> float | None:
    x = (x or "").strip()
    return float(x) if x else None


def _llama(L: int, h: int, a: int, g: int | None, ffn: int, V: int, kv: int | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"num_layers": L, "hidden_size": h, "num_attention_heads": a, "vocab_size": V,
                         "ffn_hidden_size": ffn, "normalization": "RMSNorm", "swiglu": True,
                         "position_embedding_type": "rope", "untie_embeddings_and_output_weights": True,
                         "add_bias_linear": False, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    if g and g != a:
        m["num_query_groups"] = g
    if kv and kv * a != h:
        m["kv_channels"] = kv
    return m


def _gpt(L: int, h: int, a: int, V: int, ffn: int | None) -> dict[str, Any]:
    m: dict[str, Any] = {"num_layers": L, "hidden_size": h, "num_attention_heads": a, "vocab_size": V,
                         "max_position_embeddings": 2048}
    if ffn and ffn != 4 * h:
        m["ffn_hidden_size"] = ffn
    return m


def _deepseek(mtp: bool, experts: int = 256, heads: int = 128, vocab: int = 129280, dense: int = 3) -> dict[str, Any]:
    m = _llama(61, 7168, heads, None, 18432, vocab, 128)
    m.update({"multi_latent_attention": True, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128,
              "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "qk_layernorm": True, "num_experts": experts,
              "moe_router_topk": 8, "moe_ffn_hidden_size": 2048, "moe_shared_expert_intermediate_size": 2048,
              "moe_layer_freq": [0] * dense + [1] * (61 - dense), "make_vocab_size_divisible_by": 128})
    if mtp:
        m["mtp_num_layers"] = 1
    return m


def _qwen3_moe(L: int, h: int, a: int, moe_ffn: int, dense_ffn: int) -> dict[str, Any]:
    m = _llama(L, h, a, 4, dense_ffn, 151936, 128)
    m.update({"num_experts": 128, "moe_router_topk": 8, "moe_ffn_hidden_size": moe_ffn, "qk_layernorm": True})
    return m


def _preset(name: str) -> dict[str, Any]:
    """A packaged model preset as the Megatron-argument dict the cases carry (every field it sets)."""
    import yaml

    from paraplan.specs.presets import __file__ as presets_init

    data: dict[str, Any] = yaml.safe_load((Path(presets_init).parent / "models" / f"{name}.yaml").read_text())
    return {k: v for k, v in data.items() if k not in ("name", "source")}


def model_for_row(r: dict[str, str]) -> dict[str, Any]:
    """Model dims for a row (raises Skip)."""
    label = r["model"]
    L, h, ffn, a = _i(r["num_layers"]), _i(r["hidden_size"]), _i(r["ffn_hidden_size"]), _i(r["num_heads"])
    g, V = _i(r["num_query_groups"]), _i(r["vocab_size"])
    if label.startswith(("Nemotron-3", "DeepSeek-V4", "OPT")):
        raise Skip("model dims not stated")
    if label.startswith("DeepSeek-V3"):
        lab = re.search(r"table model label '([^']*)'", r["notes"])
        return _deepseek("w/o MTP" not in (lab.group(1) if lab else ""))
    if label.startswith("Kimi-K2"):
        return _deepseek(False, experts=384, heads=64, vocab=163840, dense=1)
    if label.startswith("Qwen3-30B-A3B"):
        return _qwen3_moe(48, 2048, 32, 768, 6144)
    if label.startswith("Qwen3-235B-A22B"):
        return _qwen3_moe(94, 4096, 64, 1536, 12288)
    if label.startswith("gpt-oss-120B"):
        return _preset("gpt-oss-120b")  # sliding window, sinks, biases, QuickGELU GLU: the model as it is
    if L is None or h is None or a is None:
        raise Skip("dims not stated")
    if label.startswith(("Llama-2", "Llama-3")):
        if ffn is None or V is None:
            raise Skip("Llama row without dims")
        return _llama(L, h, a, g or a, ffn, V)
    if label.startswith("Nemotron"):
        m = _llama(L, h, a, g or a, ffn or 4 * h, V or 256000)
        m.update({"normalization": "LayerNorm", "swiglu": False})  # squared-ReLU: 2-matrix MLP
        return m
    if label.startswith("BLOOM"):
        return {"num_layers": L, "hidden_size": h, "num_attention_heads": a, "vocab_size": V or 250680,
                "position_embedding_type": "none"}
    if label.startswith(("GPT", "MT-NLG")):
        return _gpt(L, h, a, V or 51200, ffn)
    raise Skip(f"unknown model family {label!r}")


def _target(r: dict[str, str], short: str, m: dict[str, Any], seq: int, gbs: int, n: int) -> float:
    tok, step = _f(r["tokens_per_sec_per_gpu"]), _f(r["step_time_s"])
    if tok:
        return tok
    if step:
        return gbs * seq / (step * n)
    tf = _f(r["tflops_per_gpu"])
    L, h, V = m["num_layers"], m["hidden_size"], m["vocab_size"]
    if short == "SC21 Table 1" and tf:
        # Narayanan et al. 2021 Eq. 3 (with recompute): 96*B*s*l*h^2*(1 + s/6h + V/16lh) per batch
        return tf * 1e12 / (96 * L * h * h * (1 + seq / (6 * h) + V / (16 * L * h)))
    if short == "Megatron README H100" and tf:
        ffn = m.get("ffn_hidden_size", 4 * h)
        # Megatron-LM num_floating_point_operations, mid-2024 (no causal discount), per token
        per_tok = 12 * L * h * h * (1 + 1 + ffn / h + seq / h) + 6 * h * V
        return tf * 1e12 / per_tok
    raise Skip("no tokens/s, step time, or TFLOP/s with a documented formula")


def row_to_case(split: str, i: int, r: dict[str, str]) -> Case:  # noqa: C901 - flat per-column rules
    """One CSV row -> Case (raises Skip)."""
    src = r["source"]
    if src.startswith(NON_MEGATRON):
        raise Skip("not a Megatron run")
    info = next(((short, d) for prefix, short, d in SOURCES if src.startswith(prefix)), None)
    if info is None:
        raise Skip("source not used")
    short, d = info
    if short == "vTrain":
        short = "vTrain multi-node" if "ground_truth_multi" in r["source_detail"] else "vTrain single-node"
    notes = r["notes"]
    if "CHECK:" in notes:
        raise Skip("CHECK: inconsistent printed numbers")
    if "but the table's GBS column is" in notes:
        raise Skip("BLOOM table GBS contradicts the text above it (throughput would exceed the A100 peak)")
    if re.search(r"task=(LoRA|SFT)", notes):
        raise Skip("fine-tuning row")
    gpu = GPU_MAP.get(r["gpu"])
    if gpu is None:
        raise Skip(f"GPU {r['gpu']!r} has no preset")
    prec_raw = r["precision"].strip()
    precision = PRECISION.get(prec_raw, "fp8" if "precision column absent" in notes else "bf16")
    n, tp, pp = _i(r["num_gpus"]), _i(r["tp"]), _i(r["pp"])
    if not n or tp is None or pp is None:
        raise Skip("GPU count or TP/PP not stated")
    cp, ep, vp = _i(r["cp"]) or 1, _i(r["ep"]) or 1, _i(r["vp"]) or 1
    dp = _i(r["dp"]) or n // (tp * pp * cp)
    gbs, mbs, seq = _i(r["gbs"]), _i(r["mbs"]) or 1, _i(r["seq_length"])
    if not gbs or not seq or tp * pp * cp * dp != n:
        raise Skip("batch/sequence not stated or grid mismatch")
    if short == "Megatron README 2020" and not _i(r["mbs"]):
        mbs = gbs // dp
    dopt_raw = r["distributed_optimizer"].strip()
    fsdp = dopt_raw.startswith("megatron-fsdp")
    if ("FSDP" in dopt_raw or "fsdp" in dopt_raw) and not fsdp:
        raise Skip("non-Megatron FSDP")
    rec = r["recompute"].strip() or d["rec"]
    if rec is None:
        raise Skip("recompute not stated")
    rec = "selective" if rec.startswith("selective") else rec
    sp_raw = r["sequence_parallel"].strip().lower()
    sp = {"yes": True, "no": False}.get(sp_raw, d["sp"]) and tp > 1
    dopt = (d["dopt"] if not dopt_raw else not dopt_raw.startswith(("no", "ZeRO stage 0"))) and dp > 1
    model = model_for_row(r)
    moe = bool(model.get("num_experts"))
    if not moe and ep > 1:
        raise Skip("EP on a dense model")
    seq_ok = model.get("max_position_embeddings")
    if seq_ok and seq_ok < seq:
        model["max_position_embeddings"] = seq
    layout = {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": ep, "etp": 1 if moe else 0, "dp": dp, "mbs": mbs,
              "recompute": rec, "sequence_parallel": sp, "distributed_optimizer": dopt,
              "overlap_grad_reduce": d.get("ogr", True),
              "overlap_param_gather": (dopt or fsdp) and d.get("ogr", True), "fsdp": fsdp,
              "tp_comm_overlap": sp and d.get("tp_overlap", False)}
    if gbs % (mbs * dp):
        raise Skip("gbs not a multiple of mbs*dp")
    target = _target(r, short, model, seq, gbs, n)
    per_node = None if gpu in NVL72 else (_i(r["gpus_per_node"]) or 8)
    return Case(id=f"{split}:{i:04d}", source=short, label=r["model"], model=model, gpu=gpu, num_gpus=n,
                gpus_per_node=per_node, seq_len=seq, gbs=gbs, layout=layout, precision=precision,
                target_tokens_per_s_per_gpu=target, moe=moe, attention_backend=d.get("attn", "flash"),
                fp8_recipe=FP8_RECIPE.get(prec_raw, "delayed"), attention_kernel=d.get("kernel", "current"),
                nvfp4_quantize_kernel=nvfp4_quantize_kernel_of(row_container(r["notes"])), fold_key=row_fold_key(r))


CONTAINER_TE_RELEASE: dict[str, tuple[int, int]] = {"25.09": (2, 7), "25.11": (2, 9), "26.02": (2, 12),
                                                    "26.02.01": (2, 12), "26.04": (2, 14), "26.04.01": (2, 14),
                                                    "26.06": (2, 16), "26.06.01": (2, 16), "26.08": (2, 17)}
"""NeMo container -> its Transformer Engine release (major, minor), from Megatron-Bridge docs/releases/
software-versions.md (25.09: 2.7.0, 25.11: 2.9, 26.02: 2.12, 26.04: 2.14+71bbefb, 26.06: 2.16). The patch
containers and 26.08 are not listed there; Bridge's uv.lock at the release tag pins their TE
(``git show TAG:uv.lock``, package ``transformer-engine``): v0.3.1 (26.02.01) 2.12.0+5671fd3, v0.4.2 (26.04.01)
2.14.1+366798e, v0.5.1 (26.06.01) 2.16.0+b9d690e, v0.6.0 (26.08) 2.17.1+4329ff8 (v0.4.0, 26.04: 2.14.0+71bbefb, as
software-versions.md)."""
NVFP4_FUSED_ROW_COL_TE: tuple[int, int] = (2, 14)
"""The first TE release that casts an NVFP4 operand's rowwise and RHT columnwise copies in one kernel
(csrc/quantizer.cpp ``nvte_quantize_with_hadamard_transform``; v2.13 still calls
``nvte_hadamard_transform_cast_fusion_columnwise`` after ``nvte_quantize_v2``)."""


def nvfp4_quantize_kernel_of(container: str | None) -> str:
    """TrainingSpec.nvfp4_quantize_kernel of a row measured in NeMo ``container``: ``split`` where its TE release
    (``CONTAINER_TE_RELEASE``) is older than ``NVFP4_FUSED_ROW_COL_TE``, else ``fused`` (no container: fused)."""
    te = CONTAINER_TE_RELEASE.get(container or "")
    return "split" if te is not None and te < NVFP4_FUSED_ROW_COL_TE else "fused"


FOLD_KEY_COLUMNS = ("source", "source_detail", "model", "gpu", "num_gpus", "tp", "pp", "vp", "cp", "ep", "dp", "mbs",
                    "gbs", "seq_length", "precision", "tokens_per_sec_per_gpu", "tflops_per_gpu", "step_time_s")
"""The columns that identify a measured run: a row keeps its cross-validation fold when rows are added anywhere in
the file (the newest Bridge release is inserted at the top) or when its notes are edited."""


def row_fold_key(r: dict[str, str]) -> str:
    """``FOLD_KEY_COLUMNS`` of a CSV row joined with '|' (missing columns empty)."""
    return "|".join((r.get(c) or "").strip() for c in FOLD_KEY_COLUMNS)


def pct(xs: list[float], q: float) -> float:
    """Quantile q of the errors (linear interpolation, as numpy's default); NaN when there are none."""
    value = quantile(xs, q)
    return math.nan if value is None else value


DOCUMENTED_REGRESSIONS: tuple[tuple[str, str, str], ...] = (
    ("26.06.01", "gpt-oss-120B",
     "software regression stated by the source: docs/performance-summary-archive.md @067f987, 26.06.01 GPT OSS 120B "
     "rows, footnote [^gpt-oss-note] \"Performance regression in GPT-OSS 120B pre-training is a known issue "
     "(NVIDIA/cudnn-frontend#256). It will be resolved with the next container release.\" (the same jobs: 26.06 and "
     "26.08 about 1.6x faster with the same recipe)"),
)
"""(NeMo container, published model, reason): Megatron-Bridge rows whose own page says they ran with a software
regression no recipe setting expresses; they are kept as cases with ``Case.excluded`` set, left out of every score
and fit (``load_cases``), and printed with the reason by calibration.py (``excluded_lines``)."""


def documented_regression(r: dict[str, str]) -> str:
    """The ``DOCUMENTED_REGRESSIONS`` reason of a published_runs.csv row, or ``""``."""
    if not r["source"].startswith(BRIDGE_SOURCE):
        return ""
    container = row_container(r["notes"])
    return next((why for c, model, why in DOCUMENTED_REGRESSIONS if c == container and r["model"] == model), "")


def load_cases(split: str, include_excluded: bool = False) -> tuple[list[Case], dict[str, int]]:
    """All usable cases of a split ('published' or 'vtrain') and skip counts per reason; the rows of a documented
    software regression (``DOCUMENTED_REGRESSIONS``) only with ``include_excluded`` (``Case.excluded`` says why)."""
    path = SHARED / ("published_runs.csv" if split == "published" else "vtrain_runs.csv")
    cases: list[Case] = []
    skipped: dict[str, int] = {}
    ub_off = bridge_rows_without_tp_comm_overlap() if split == "published" else set()
    tokendrop: set[str] = set()
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            try:
                case = row_to_case(split, i, r)
                if i in ub_off:
                    case.layout["tp_comm_overlap"] = False
                if TOKENDROP_LABEL in r["notes"]:
                    tokendrop.add(case.id)
                case.excluded = documented_regression(r) if split == "published" else ""
                cases.append(case)
            except Skip as err:
                skipped[str(err)] = skipped.get(str(err), 0) + 1
    if split == "published":
        attach_recipe_knobs(cases)
    for case in cases:  # Bridge's --use_tokendrop (scripts/performance/utils/overrides.py: apply_moe_token_drop)
        if case.id in tokendrop:
            case.knobs = {**case.knobs, **TOKENDROP_KNOBS}
    if not include_excluded:
        for c in cases:
            if c.excluded:
                skipped["documented software regression"] = skipped.get("documented software regression", 0) + 1
        cases = [c for c in cases if not c.excluded]
    return cases, skipped


TOKENDROP_LABEL = "(tokendrop)'"
"""How a Bridge table names a row run with ``--use_tokendrop`` (its model label ends in "(tokendrop)")."""
TOKENDROP_KNOBS: dict[str, Any] = {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}
"""What ``--use_tokendrop`` sets: Megatron-Bridge training/utils/moe_token_drop.py ``apply_moe_token_drop`` (its
defaults, capacity factor 1.0 with padding to capacity)."""


BRIDGE_SOURCE = "NVIDIA-NeMo/Megatron-Bridge performance summary"
BRIDGE_MODELS = {"Llama-3 8B": "llama3-8b", "Llama-3 70B": "llama3-70b", "Llama-3.1 405B": "llama3.1-405b",
                 "DeepSeek-V3": "deepseek-v3", "Qwen3-235B-A22B": "qwen3-235b-a22b", "Qwen3-30B-A3B": "qwen3-30b-a3b",
                 "gpt-oss-120B": "gpt-oss-120b"}
"""Published model names -> paraplan presets (the recipe library's ``model_preset``); other models have no preset."""
BRIDGE_PRECISIONS = {"bf16": ("bf16",), "mxfp8": ("fp8_mx",), "fp8-cs": ("fp8_cs",), "nvfp4": ("nvfp4",),
                     "fp8": ("fp8_cs", "fp8_sc", "fp8_ds"), "fp8-blockwise": ("fp8_sc",)}
"""Published precision -> recipe precisions it may be (the summary's plain "fp8" is current scaling on Blackwell
and current or blockwise scaling on Hopper); a blank precision matches any."""


@dataclass
class BridgeMatch:
    """A Megatron-Bridge performance-summary row and the library recipe with its job and layout (or why none)."""

    row: int
    label: str
    recipe: Any = None
    reason: str = ""


def _recipe_key(r: Any) -> tuple[Any, ...]:
    def n(col: str) -> int:
        v = r.get(col)
        return v if isinstance(v, int) and not isinstance(v, bool) else 1

    return (r.model_preset, r.gpu_preset, n("num_gpus"), n("tp"), n("pp"), n("cp"), n("vp"), n("ep"),
            n("micro_batch_size"), n("global_batch_size"))


def bridge_recipe_matches() -> list[BridgeMatch]:
    """Every Megatron-Bridge row of published_runs.csv joined to its recipe in the packaged library on model, GPU,
    GPU count, layout (TP, PP, CP, VP, EP), micro and global batch and precision (a recipe without a variant
    first when several match)."""
    from paraplan.recipes.catalogue import bridge_recipes

    index: dict[tuple[Any, ...], list[Any]] = {}
    for rec in bridge_recipes():
        if rec.runnable:
            index.setdefault(_recipe_key(rec), []).append(rec)
    out: list[BridgeMatch] = []
    for i, r, label in bridge_rows():
        preset, gpu = BRIDGE_MODELS.get(r["model"]), GPU_MAP.get(r["gpu"])
        if preset is None or gpu is None:
            missing = r["model"] if preset is None else r["gpu"]
            out.append(BridgeMatch(i, label, reason=f"no paraplan preset for {missing}"))
            continue
        key = (preset, gpu, *(_i(r[c]) or 1 for c in ("num_gpus", "tp", "pp", "cp", "vp", "ep", "mbs", "gbs")))
        precs = BRIDGE_PRECISIONS.get(r["precision"].strip())
        found = [x for x in index.get(key, []) if precs is None or x.get("precision") in precs]
        if not found:
            out.append(BridgeMatch(i, label, reason="no recipe with this job, layout, batch and precision"))
            continue
        found.sort(key=lambda x: (x.get("config_variant") not in (None, ""), x.alias))
        out.append(BridgeMatch(i, label, recipe=found[0]))
    return out


def bridge_rows() -> Iterator[tuple[int, dict[str, str], str]]:
    """The Megatron-Bridge rows of published_runs.csv: (row index, row, label naming it and its CSV line)."""
    with open(SHARED / "published_runs.csv", newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            if r["source"].startswith(BRIDGE_SOURCE):
                yield i, r, f"{r['model']} {r['gpu']} x{r['num_gpus']} {r['precision'] or '?'} (line {i + 2})"


def bridge_rows_without_tp_comm_overlap() -> set[int]:
    """Megatron-Bridge rows (published_runs.csv row numbers) that ran without userbuffers: the matched recipe sets
    ``tp_comm_overlap`` False, or, unmatched, the row is NVFP4 (every NVFP4 recipe with TP > 1 in the library sets
    it False). The others keep the source's default (``tp_overlap`` True)."""
    out: set[int] = set()
    nvfp4: set[int] = set()
    with open(SHARED / "published_runs.csv", newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            if r["source"].startswith(BRIDGE_SOURCE) and r["precision"].strip() == "nvfp4":
                nvfp4.add(i)
    for m in bridge_recipe_matches():
        if m.recipe is not None:
            if str(m.recipe.get("tp_comm_overlap")).lower() in ("false", "0", ""):
                out.add(m.row)
        elif m.row in nvfp4:
            out.add(m.row)
    return out


def bridge_fit_line(matches: list[BridgeMatch]) -> str:
    """``bridge rows with recipe knobs: N matched, M unmatched; fit F/N`` (each matched row estimated with its
    recipe's knobs, ``estimate --recipe``)."""
    from paraplan.errors import PlannerError
    from paraplan.recipes.knobs import estimate_recipe

    matched = [m for m in matches if m.recipe is not None]
    fit = 0
    for m in matched:
        try:
            fit += int(estimate_recipe(m.recipe).fits)
        except PlannerError:
            pass
    return (f"bridge rows with recipe knobs: {len(matched)} matched, {len(matches) - len(matched)} unmatched; "
            f"fit {fit}/{len(matched)}")


def bridge_unmatched_lines(matches: list[BridgeMatch]) -> list[str]:
    """The Bridge rows that match no recipe, one indented line each with the reason."""
    return [f"  unmatched: {m.label}: {m.reason}" for m in matches if m.recipe is None]


RELEASE_KNOBS = Path(__file__).resolve().parent / "data" / "bridge_release_knobs.json"
"""Per NeMo container, the Megatron-Bridge release's performance-config settings (``bridge_release_knobs.py``)."""
RELEASE_MODELS = {"Llama-3 8B": "llama3_8b", "Llama-3 70B": "llama3_70b", "Llama-3.1 405B": "llama31_405b",
                  "DeepSeek-V3": "deepseek_v3", "Qwen3-235B-A22B": "qwen3_235b_a22b", "Qwen3-30B-A3B": "qwen3_30b_a3b",
                  "gpt-oss-120B": "gpt_oss_120b", "Kimi-K2": "kimi_k2"}
"""Published model names -> the configs' model names (every release names its configs so)."""
RELEASE_GPUS = {"h100-80gb": "h100", "b200": "b200", "b300": "b300", "gb200": "gb200", "gb300": "gb300"}
_MEGATRON_COLUMNS: dict[str, Any] = {
    "grad_reduce_in_fp32": True, "fp8_param_gather": False, "fp4_param_gather": False,
    "use_precision_aware_optimizer": False, "optimizer": "",
    "optimizer_state_dtypes": "main_grads=fp32;main_params=fp32;exp_avg=fp32;exp_avg_sq=fp32",
    "cuda_graph_impl": "none", "cuda_graph_scope": [], "first_last_layers_bf16": False,
    "fp8_dot_product_attention": False, "use_megatron_fsdp": False, "fsdp_double_buffer": False,
    "overlap_param_gather_with_optimizer_step": False, "gradient_accumulation_fusion": True, "cpu_offloading": False,
    "cpu_offloading_num_layers": 0, "fine_grained_activation_offloading": False, "optimizer_cpu_offload": False,
    "moe_token_dispatcher_type": "", "moe_flex_dispatcher_backend": "", "moe_hybridep_num_sms": "",
    "moe_a2a_overlap": False, "delay_wgrad_compute": "", "moe_permute_fusion": "", "moe_shared_expert_overlap": "",
    "recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None, "recompute_modules": None,
    "task": "pretrain"}
"""A release config's unread columns: Megatron-LM's defaults (what a row without knobs runs: fp32 gradient buffers,
no parameter gather in FP8, fp32 optimizer states, no CUDA graphs, no offload, no recompute) and, for MoE, the
model's own dispatcher settings (empty: TrainingSpec's defaults)."""


@dataclass
class ReleaseMatch:
    """A Megatron-Bridge row and the performance config of its container's release it ran (or why none)."""

    row: int
    label: str
    container: str | None
    tag: str | None = None
    config: dict[str, Any] | None = None
    reason: str = ""


def release_configs() -> dict[str, Any]:
    """The committed ``bridge_release_knobs.json``."""
    import json

    data: dict[str, Any] = json.loads(RELEASE_KNOBS.read_text())
    return data


def _config_key(c: dict[str, Any]) -> tuple[Any, ...]:
    def n(x: Any) -> int:
        return x if isinstance(x, int) and not isinstance(x, bool) else 1

    return (c["model"], c["gpu"], n(c["tp"]), n(c["pp"]), n(c["cp"]), n(c["vp"]), n(c["ep"]),
            n(c["micro_batch_size"]))


def release_config_matches() -> list[ReleaseMatch]:
    """Every Megatron-Bridge row of published_runs.csv joined to a performance config of its container's release
    (``bridge_release_knobs.json``) on model, GPU, layout (TP, PP, CP, VP, EP), micro batch, precision and global
    batch per GPU (the harness weak-scales the config's global batch with the GPU count, utils/overrides.py
    ``set_post_overrides``); among several, the one at the row's GPU count, then the first variant."""
    data = release_configs()
    tags = {r["container"]: r["tag"] for r in data["releases"]}
    index: dict[tuple[str, tuple[Any, ...]], list[dict[str, Any]]] = {}
    for c in data["configs"]:
        index.setdefault((c["container"], _config_key(c)), []).append(c)
    out: list[ReleaseMatch] = []
    for i, r, label in bridge_rows():
        container = row_container(r["notes"])
        m = ReleaseMatch(i, label, container, tags.get(container or ""))
        out.append(m)
        model, gpu = RELEASE_MODELS.get(r["model"]), RELEASE_GPUS.get(GPU_MAP.get(r["gpu"], ""))
        if m.tag is None or model is None or gpu is None:
            m.reason = "no release for the container" if m.tag is None else "no paraplan preset"
            continue
        key = (model, gpu, *(_i(r[c]) or 1 for c in ("tp", "pp", "cp", "vp", "ep", "mbs")))
        precs = _row_precisions(r, gpu)
        n, gbs = _i(r["num_gpus"]) or 0, _i(r["gbs"]) or 0
        found = [c for c in index.get((container or "", key), [])
                 if (precs is None or c["precision"] in precs) and isinstance(c["num_gpus"], int)
                 and isinstance(c["global_batch_size"], int) and gbs * c["num_gpus"] == c["global_batch_size"] * n]
        if not found:
            m.reason = "no config of the release with this layout, batch and precision"
            continue
        found.sort(key=lambda c: (c["num_gpus"] != n, c["variant"] not in ("", "v1"), c["precision"] != "fp8_ds",
                                  c["name"]))
        m.config = found[0]
    return out


def _row_precisions(r: dict[str, str], gpu: str) -> tuple[str, ...] | None:
    """The config precisions a row may have run. The 25.09 table has no precision column (SOURCES.md): its page note
    says the parenthesized numbers are "different FP8 quantization granularity (GB200/B200: 32x32 ...; H100: 128x128
    ...)", i.e. MXFP8 on Blackwell and blockwise (subchannel) on H100; the primary numbers are the launcher's default
    FP8 recipe, delayed scaling (v0.1.0rc3 scripts/performance/README.md: ``--fp8_recipe`` "Defaults to 'ds'"),
    preferred over current scaling when both configs exist."""
    text = r["precision"].strip()
    if text or "precision column absent" not in r["notes"]:
        return BRIDGE_PRECISIONS.get(text)
    if "row built from the parenthesized values" in r["notes"]:
        return ("fp8_sc",) if gpu == "h100" else ("fp8_mx",)
    return ("fp8_ds", "fp8_cs")


def release_recipe(config: dict[str, Any], case: Case) -> Any:
    """A release config as a recipe row of the library (``paraplan.recipes``): the row's layout and job, the
    config's read columns, Megatron's defaults for the rest (``_MEGATRON_COLUMNS``)."""
    from paraplan.recipes.catalogue import Recipe

    lay = case.layout
    settings = {k: v for k, v in config["settings"].items() if v != "?"}
    fields: dict[str, Any] = {**_MEGATRON_COLUMNS, **settings, "source": config["name"],
                              "precision": config["precision"], "tp": lay["tp"], "pp": lay["pp"], "cp": lay["cp"],
                              "vp": lay["vp"] if lay["vp"] > 1 else None, "ep": lay["ep"], "etp": None,
                              "micro_batch_size": lay["mbs"], "sequence_parallel": lay["sequence_parallel"],
                              "use_distributed_optimizer": True, "overlap_grad_reduce": True,
                              "overlap_param_gather": True, "tp_comm_overlap": lay["tp_comm_overlap"]}
    return Recipe(fields=fields, alias=config["name"], model_preset=None, gpu_preset=None,
                  origin=f"bridge {config['tag']}")


def row_container(notes: str) -> str | None:
    """The NeMo container a Bridge row was measured in (``container NeMo X`` in its notes), or None."""
    found = re.search(r"container NeMo ([0-9][0-9.]*[0-9])", notes)
    return found.group(1) if found else None


def deepseek_v3_bridge_layout(pp: int, vp: int) -> tuple[int, ...] | None:
    """Decoder layers per virtual stage of the pipeline layout Megatron-Bridge gives DeepSeek-V3 at (PP, VP), or None
    where it sets none. Mirrors ``set_deepseek_v3_pipeline_model_parallel_layout`` (the same ``layout_map`` in
    recipes/deepseek/deepseek_v3.py from v0.2.0 to 067f987 ``_get_deepseek_v3_pipeline_layout``), which every
    DeepSeek-V3 performance config calls: the embedding with 4, 8 or 16 decoder layers on the first virtual stage,
    the MTP layer and the loss with the remaining 1, 5 or 13 on the last (61 layers): 16 virtual stages
    (PP x VP = 16 x 1, 8 x 2, 4 x 4) ``E t*4 | (t*4 |)*14 t m L``; 8 (8 x 1, 4 x 2) ``E t*8 | (t*8 |)*6 t*5 m L``;
    4 x 1 ``E t*16 | t*16 | t*16 | t*13 m L``. A release config that names its own layout (``pp_layout``) wins
    (``attach_recipe_knobs``); the releases' JSON leaves the function's value unresolved."""
    per = {16: 4, 8: 8}.get(pp * vp) if (pp, vp) in ((16, 1), (8, 2), (4, 4), (8, 1), (4, 2)) else None
    if (pp, vp) == (4, 1):
        return (16, 16, 16, 13)
    if per is None:
        return None
    stages = pp * vp
    return (per,) * (stages - 1) + (61 - per * (stages - 1),)


def attach_recipe_knobs(cases: list[Case]) -> None:
    """Give each Bridge row the settings of its container's release config (``release_config_matches``), as the
    library's ``estimate --recipe`` applies a recipe: the TrainingSpec knobs (``knobs.training_knobs`` at the row's
    precision: gradient and optimizer-state dtypes, FP8 recipe and parameter gather, CUDA graphs, activation offload,
    FP8 attention, first/last layers in bf16, the MoE dispatcher, flex backend and SMs, delay-wgrad, shared-expert
    overlap, the named userbuffers config ``tp_comm_overlap_cfg``), ``tp_comm_overlap`` where the config sets it,
    the combined_1f1b schedule where it sets ``moe_a2a_overlap``, Megatron-FSDP and the recompute it sets
    (``knobs.layout_fields``), and its pipeline layout (the config's ``pp_layout``, else for DeepSeek-V3 the one
    Bridge's model recipe sets, ``deepseek_v3_bridge_layout``; without one the row keeps paraplan's balanced
    ``--pipeline-split auto``). The row's own layout is kept (it matched the config's). Rows without a match keep
    Megatron's defaults (``Case.knobs`` empty)."""
    from paraplan.recipes.knobs import layout_fields, training_knobs

    by_row = {int(c.id.split(":")[1]): c for c in cases if c.id.startswith("published:")}
    for m in release_config_matches():
        case = by_row.get(m.row)
        if case is None or m.config is None:
            continue
        on = m.config["settings"].get("tp_comm_overlap", "?")
        if isinstance(on, bool):  # the release config's userbuffers (Bridge turns them off without TP > 1 and SP)
            case.layout["tp_comm_overlap"] = on and bool(case.layout["sequence_parallel"])
        rec = release_recipe(m.config, case)
        case.knobs = training_knobs(rec, case.precision)
        fields, _ = layout_fields(rec)
        for key in ("recompute", "recompute_modules", "recompute_method", "recompute_num_layers", "schedule"):
            if key in fields:
                case.layout[key] = fields[key]
        counts = fields.get("pipeline_layout")
        if counts is None and m.config.get("model") == "deepseek_v3":
            counts = deepseek_v3_bridge_layout(case.layout["pp"], case.layout["vp"])
        if counts is not None and len(counts) == case.layout["pp"] * case.layout["vp"] \
                and sum(counts) == case.model.get("num_layers"):
            case.layout["pipeline_layout"] = tuple(counts)
        if fields["fsdp"]:
            case.layout.update(fsdp=True, distributed_optimizer=False, overlap_param_gather=True)


def release_match_lines() -> list[str]:
    """Bridge rows matched to a release config, per container (``bridge rows with release knobs``)."""
    lines, matches = [], release_config_matches()
    for container in dict.fromkeys(m.container for m in matches):
        ms = [m for m in matches if m.container == container]
        ok = sum(m.config is not None for m in ms)
        pre = [m for m in ms if m.reason != "no paraplan preset"]
        lines.append(f"  {container} ({ms[0].tag}): {ok}/{len(pre)} matched ({len(ms) - len(pre)} without a preset)")
    ok = sum(m.config is not None for m in matches)
    nopre = sum(m.reason == "no paraplan preset" for m in matches)
    return [f"bridge rows with release knobs: {ok} matched, {len(matches) - ok - nopre} unmatched, "
            f"{nopre} without a paraplan preset", *lines]


def release_fit_line(cases: list[Case]) -> str:
    """``bridge rows with release knobs: fit F/N`` (every Bridge row matched to its release config, estimated with
    those knobs as calibration.py scores it; N counts the rows that could be estimated)."""
    from calibration import _backend, case_training, load_gpu
    from paraplan.cli.options import apply_pipeline_split
    from paraplan.errors import PlannerError
    from paraplan.estimator import estimate
    from paraplan.layout import ParallelLayout
    from paraplan.specs.cluster import make_cluster
    from paraplan.specs.load import model_from_megatron_args

    fit = total = 0
    for c in cases:
        if not c.knobs:
            continue
        try:
            model = model_from_megatron_args(c.model, name=c.label)
            layout, _ = apply_pipeline_split(model, ParallelLayout(**c.layout), "auto")
            est = estimate(model, make_cluster(load_gpu(c.gpu), c.num_gpus, c.gpus_per_node),
                           case_training(c, _backend(c)), layout)
        except PlannerError:
            continue
        total += 1
        fit += int(est.fits)
    return f"bridge rows with release knobs: fit {fit}/{total}"


if __name__ == "__main__":
    # python benchmarks/published_cases.py: Bridge rows matched to their release's configs, per container, and fit
    print("\n".join(release_match_lines()))
    print(release_fit_line(load_cases("published")[0]))
