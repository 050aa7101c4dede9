"""Where a Megatron-Bridge perf recipe's settings come from, when NVIDIA did not publish a run of them.

Megatron-Bridge 067f987's flat perf recipes (``src/megatron/bridge/perf_recipes``, made from the former harness by
commit aad7d9ce2, "unified flat performance recipes") include recipes NVIDIA derived from another GPU count by weak
scaling: the same per-GPU settings, the global batch size scaled with data parallelism. The former harness did it
at run time: ``scripts/performance/utils/overrides.py`` ``set_post_overrides`` at aad7d9ce2^ scales the GBS of the
selected workload config to ``gbs_scaling_factor * num_gpus`` (overrides.py:546; ``_weak_scaled_global_batch_size``
came later, ee1bbeb0c) when ``-ng`` differs from the config's ``num_gpus``, and ``argument_parser.py`` selects
``--config_variant v2`` by default. Such a recipe keeps the per-GPU activations of the run it came from; its model
state (optimizer, and with Megatron-FSDP weights and gradients too) is sharded over fewer data-parallel ranks where
it was scaled down (more memory per GPU than the config it came from) and over more where it was scaled up.
Two kinds, each checked against the code at 067f987 and the published summary
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

LEGACY_BASE_GPUS: Final[dict[str, int]] = {
    **{f"llama3_8b_pretrain_{n}gpu_{g}_{p}_config": 8
       for n, g, ps in ((32, "gb200", ("bf16", "fp8cs")), (32, "gb300", ("bf16", "fp8cs", "fp8mx", "nvfp4")),
                        (64, "h100", ("bf16", "fp8cs")), (64, "b200", ("bf16", "fp8cs"))) for p in ps},
    **{f"llama3_70b_pretrain_32gpu_{g}_{p}_config": 64 for g in ("gb200", "gb300") for p in ("bf16", "fp8cs")},
    **{f"llama31_405b_pretrain_512gpu_h100_{p}_config": 1024 for p in ("bf16", "fp8cs")},
    **{f"qwen3_30b_a3b_pretrain_{n}gpu_{g}_{p}_config": base
       for n, g, base in ((32, "gb200", 8), (32, "gb300", 8), (64, "h100", 16), (64, "b200", 8))
       for p in ("bf16", "fp8cs")},
    **{f"nemotronh_56b_pretrain_256gpu_{g}_fp8cs_config": 64 for g in ("b200", "gb300")},
    "deepseek_v3_pretrain_64gpu_h100_bf16_config": 1024,
}
"""The GPU count of the recipe each ``LEGACY_SCALED_GBS`` function starts from at 067f987 (the config it passes to
``_with_global_batch_size``, or, for DeepSeek-V3, the 1024-GPU config it calls before setting the GBS)."""

CANNOT_RUN: Final[dict[str, str]] = {
    **{f"deepseek_v3_pretrain_64gpu_h100_{p}_config": "TP=2 PP=8 EP=64 ETP=1 needs a multiple of 512 GPUs "
       "(ETP x EP x PP)" for p in ("bf16", "fp8cs")},
    **{f"deepseek_v3_pretrain_256gpu_{g}_fp8mx_partial_cg_dev_config": "its pipeline layout Et*4|(tttt|)*14tmL has 16 "
       "stages, PP=4 x VP=2 is 8 (Megatron-Core's TransformerConfig asserts that VP equals the layout's stages / PP)"
       for g in ("gb200", "gb300")},
}
"""Recipe functions at 067f987 whose coded layout cannot run (deepseek/h100/deepseek_v3.py: the 64-GPU configs keep
the 1024-GPU layout, TP2 PP8 EP64, and Megatron-LM needs world size divisible by ETP x EP x PP: 512;
deepseek/gb200|gb300/deepseek_v3.py partial_cg_dev: a 16-stage layout at PP4 VP2, refused by
transformer_config.py __post_init__'s "virtual_pipeline_model_parallel_size conflicts with
pipeline_model_parallel_layout"); value: why."""

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

def legacy_reason(function: str) -> str:
    """The reason of a ``LEGACY_SCALED_GBS`` recipe: scaled from ``LEGACY_BASE_GPUS[function]`` GPUs, up or down."""
    base_gpus = LEGACY_BASE_GPUS[function]
    gpus = int(function.split("gpu_")[0].rsplit("_", 1)[-1])
    direction = (f"scaled down from the {base_gpus}-GPU recipe: the model state is sharded over fewer data-parallel "
                 "ranks than in the run it came from" if base_gpus > gpus else
                 f"scaled up from the {base_gpus}-GPU recipe: the model state is sharded over more data-parallel "
                 "ranks than in the run it came from")
    return ("derived by NVIDIA by weak scaling, no published run: its docstring says \"legacy-scaled GBS\" "
            "(another GPU count's recipe with the GBS scaled to data parallelism, perf_recipes/llama/common.py "
            "_with_global_batch_size), and the published summary has no row at this GPU count and GBS; " + direction)


def v2_reason(docstring: str, contradicts: bool) -> str:
    """The reason of a ``WEAK_SCALED_V2`` recipe whose docstring says ``docstring`` (``contradicts``: the coded
    layout is another)."""
    doc = (f"; its docstring says {docstring}, the V1 128-GPU config's layout, not the coded one" if contradicts
           else "")
    return ("derived by NVIDIA by weak scaling, no published run: the layout of the former harness's V2 config "
            "(256 GPUs, GBS 1536; scripts/performance/configs/llama/llama31_workload_base_configs.py at aad7d9ce2^) "
            "at 128 GPUs and GBS 768 (set_post_overrides: gbs_scaling_factor x num_gpus)" + doc
            + "; the published 128-GPU runs are the V1 configs at GBS 64 (25.09, 25.11), and the model state is "
            "sharded over half the data-parallel ranks of the V2 config's 256 GPUs")


def derivation_of(function: str) -> str:
    """Why recipe ``function`` (its name, the part of ``source`` after ``:``) is not a run NVIDIA published; ""
    when it is not one of ``LEGACY_SCALED_GBS`` or ``WEAK_SCALED_V2``."""
    if function in WEAK_SCALED_V2:
        reason = v2_reason(*WEAK_SCALED_V2[function])
    else:
        reason = legacy_reason(function) if function in LEGACY_SCALED_GBS else ""
    if function in CANNOT_RUN:
        reason = "; ".join(filter(None, (f"the coded layout cannot run: {CANNOT_RUN[function]}", reason)))
    return reason
