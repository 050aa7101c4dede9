"""Where a Megatron-Bridge perf recipe's settings come from, when NVIDIA did not publish a run of them.

Megatron-Bridge 067f987's flat perf recipes (``src/megatron/bridge/perf_recipes``, made from the former harness by
commit aad7d9ce2, "unified flat performance recipes") include recipes NVIDIA derived from another GPU count by weak
scaling: the same per-GPU settings, the global batch size scaled with data parallelism. The former harness did it
at run time: ``scripts/performance/utils/overrides.py`` ``set_post_overrides`` at aad7d9ce2^ scales the GBS of the
selected workload config by DP / base DP (``_weak_scaled_global_batch_size``) when ``-ng`` differs from the
config's ``num_gpus``, and ``argument_parser.py`` selects ``--config_variant v2`` by default. Such a recipe keeps
the per-GPU activations of the run it came from, but its model state (optimizer, and with Megatron-FSDP weights and
gradients too) is sharded over fewer data-parallel ranks, so it needs more memory per GPU than the
config it was scaled from. Two kinds, each checked against the code at 067f987 and the published summary
(``../shared/calibration/published_runs.csv``, the Megatron-Bridge rows):

- ``LEGACY_SCALED_GBS``: NVIDIA's own docstring says "legacy-scaled GBS": the function returns another GPU count's
  recipe with only the GBS changed (``llama/common.py`` ``_with_global_batch_size``); the published summary has no
  row at these GPU counts and batch sizes.
- ``WEAK_SCALED_V2``: the Llama-3.1-405B 128-GPU recipes. Each codes the layout of the former harness's V2 config,
  a 256-GPU job at GBS 1536 (``scripts/performance/configs/llama/llama31_workload_base_configs.py`` at
  aad7d9ce2^), at 128 GPUs and GBS 768: what ``setup_experiment.py -ng 128`` ran with the default variant.
  Twelve of their docstrings name the layout of the V1 config (128 GPUs, GBS 64) instead. The published 128-GPU
  405B rows (containers 25.09 and 25.11) are the V1 configs at GBS 64 (B200: TP4 PP8 VP8 CP2; GB200: TP2
  Megatron-FSDP); none has the coded layout at 128 GPUs or GBS 768.

``derivation_of`` gives the reason for a recipe function ("" for the rest).
"""

from __future__ import annotations

from typing import Final

LEGACY_SCALED_GBS: Final = frozenset({
    "llama3_8b_pretrain_32gpu_gb200_bf16_config", "llama3_8b_pretrain_32gpu_gb200_fp8cs_config",
    "llama3_8b_pretrain_32gpu_gb300_bf16_config", "llama3_8b_pretrain_32gpu_gb300_fp8cs_config",
    "llama3_8b_pretrain_32gpu_gb300_fp8mx_config", "llama3_8b_pretrain_32gpu_gb300_nvfp4_config",
    "llama3_8b_pretrain_64gpu_h100_bf16_config", "llama3_8b_pretrain_64gpu_h100_fp8cs_config",
    "llama3_8b_pretrain_64gpu_b200_bf16_config", "llama3_8b_pretrain_64gpu_b200_fp8cs_config",
    "llama3_70b_pretrain_32gpu_gb200_bf16_config", "llama3_70b_pretrain_32gpu_gb200_fp8cs_config",
    "llama3_70b_pretrain_32gpu_gb300_bf16_config", "llama3_70b_pretrain_32gpu_gb300_fp8cs_config",
    "llama31_405b_pretrain_512gpu_h100_bf16_config", "llama31_405b_pretrain_512gpu_h100_fp8cs_config",
    "qwen3_30b_a3b_pretrain_32gpu_gb200_bf16_config", "qwen3_30b_a3b_pretrain_32gpu_gb200_fp8cs_config",
    "qwen3_30b_a3b_pretrain_32gpu_gb300_bf16_config", "qwen3_30b_a3b_pretrain_32gpu_gb300_fp8cs_config",
    "qwen3_30b_a3b_pretrain_64gpu_h100_bf16_config", "qwen3_30b_a3b_pretrain_64gpu_h100_fp8cs_config",
    "qwen3_30b_a3b_pretrain_64gpu_b200_bf16_config", "qwen3_30b_a3b_pretrain_64gpu_b200_fp8cs_config",
    "nemotronh_56b_pretrain_256gpu_b200_fp8cs_config", "nemotronh_56b_pretrain_256gpu_gb300_fp8cs_config",
    "deepseek_v3_pretrain_64gpu_h100_bf16_config",
})
"""The recipe functions at 067f987 whose docstring says "legacy-scaled GBS" (``grep -rn legacy-scaled
src/megatron/bridge/perf_recipes``: 27)."""

WEAK_SCALED_V2: Final[dict[str, tuple[str, bool]]] = {
    "llama31_405b_pretrain_128gpu_b200_bf16_config": ("TP=4 PP=8 CP=2", True),
    "llama31_405b_pretrain_128gpu_b200_fp8cs_config": ("TP=4 PP=8 CP=2", True),
    "llama31_405b_pretrain_128gpu_b200_fp8mx_config": ("TP=4 PP=8 CP=2", True),
    "llama31_405b_pretrain_128gpu_b200_nvfp4_config": ("TP=4 PP=16", False),
    "llama31_405b_pretrain_128gpu_b300_bf16_config": ("TP=2 PP=8", True),
    "llama31_405b_pretrain_128gpu_b300_fp8cs_config": ("TP=2 PP=8", True),
    "llama31_405b_pretrain_128gpu_b300_fp8mx_config": ("TP=2 PP=8", True),
    "llama31_405b_pretrain_128gpu_b300_nvfp4_config": ("TP=4 PP=8 CP=2", True),
    "llama31_405b_pretrain_128gpu_gb200_bf16_config": ("TP=4 PP=8 CP=2", True),
    "llama31_405b_pretrain_128gpu_gb200_fp8cs_config": ("FSDP", True),
    "llama31_405b_pretrain_128gpu_gb200_fp8mx_config": ("TP=4 PP=8 CP=2", True),
    "llama31_405b_pretrain_128gpu_gb200_nvfp4_config": ("TP=4 PP=16", False),
    "llama31_405b_pretrain_128gpu_gb300_bf16_config": ("FSDP", False),
    "llama31_405b_pretrain_128gpu_gb300_fp8cs_config": ("FSDP", True),
    "llama31_405b_pretrain_128gpu_gb300_fp8mx_config": ("TP=4 PP=8 CP=2", True),
    "llama31_405b_pretrain_128gpu_gb300_nvfp4_config": ("TP=4 PP=8", False),
}
"""The 16 Llama-3.1-405B 128-GPU recipe functions at 067f987: each sets the layout of the former harness's V2
config of its GPU and precision (256 GPUs, GBS 1536; B200's V2 is GB200's, B300's GB300's) at 128 GPUs and GBS 768
(checked field by field, TP PP CP VP and Megatron-FSDP, against ``llama31_workload_base_configs.py`` at aad7d9ce2^).
Value: the docstring's words, and whether they contradict the coded layout (they name the V1 128-GPU config's)."""

LEGACY_REASON: Final = ("derived by NVIDIA by weak scaling, no published run: its docstring says \"legacy-scaled "
                        "GBS\" (another GPU count's recipe with the GBS scaled to data parallelism, "
                        "perf_recipes/llama/common.py _with_global_batch_size), and the published summary has no row "
                        "at this GPU count and GBS; the model state is sharded over fewer data-parallel ranks than in "
                        "the run it came from")


def v2_reason(docstring: str, contradicts: bool) -> str:
    """The reason of a ``WEAK_SCALED_V2`` recipe whose docstring says ``docstring`` (``contradicts``: the coded
    layout is another)."""
    doc = (f"; its docstring says {docstring}, the V1 128-GPU config's layout, not the coded one" if contradicts
           else "")
    return ("derived by NVIDIA by weak scaling, no published run: the layout of the former harness's V2 config "
            "(256 GPUs, GBS 1536; scripts/performance/configs/llama/llama31_workload_base_configs.py at aad7d9ce2^) "
            "at 128 GPUs and GBS 768 (set_post_overrides, _weak_scaled_global_batch_size)" + doc
            + "; the published 128-GPU runs are the V1 configs at GBS 64 (25.09, 25.11), and the model state is "
            "sharded over half the data-parallel ranks of the V2 config's 256 GPUs")


def derivation_of(function: str) -> str:
    """Why recipe ``function`` (its name, the part of ``source`` after ``:``) is not a run NVIDIA published; ""
    when it is not one of ``LEGACY_SCALED_GBS`` or ``WEAK_SCALED_V2``."""
    if function in WEAK_SCALED_V2:
        return v2_reason(*WEAK_SCALED_V2[function])
    return LEGACY_REASON if function in LEGACY_SCALED_GBS else ""
