"""A matrix of launch plans (dense, GQA, MoE with EP/ETP, MLA + MTP, FSDP, FP8 recipes, recompute, TP
overlap, uneven and custom pipeline layouts, several GPU generations), each made the way ``paraplan launch``
makes it: the layout is estimated (rules checked) and the checkpoint advice fills the checkpoint flags.

The knob plans carry full-iteration CUDA graphs (with full recompute and with Megatron-FSDP), per-layer graphs
with selective recompute, and fine-grained activation offloading (NVTE_CPU_OFFLOAD_V1 in env.sh).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from paraplan.checkpoint import advise
from paraplan.estimator import estimate
from paraplan.launch.megatron import CheckpointArgs
from paraplan.launch.render import LaunchSpec
from paraplan.launch.site import SiteProfile
from paraplan.layout import layout_for_world
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec

# name: (model, gpu, num_gpus, layout fields, training fields)
PLANS: dict[str, tuple[str, str, int, dict[str, Any], dict[str, Any]]] = {
    "gpt2-dp8": ("gpt2", "h100-80gb", 8, {}, {"seq_len": 1024, "global_batch_size": 64}),
    "gpt2-fp16": ("gpt2", "a100-80gb", 8, {"tp": 2}, {"seq_len": 1024, "global_batch_size": 64,
                                                       "precision": "fp16"}),
    "gpt3-175b-tp8-pp16-vp3": ("gpt3-175b", "h100-80gb", 1024, {"tp": 8, "pp": 16, "vp": 3},
                               {"seq_len": 2048, "global_batch_size": 1536}),
    "llama3-8b-dp8": ("llama3-8b", "h100-80gb", 8, {}, {"seq_len": 8192, "global_batch_size": 128}),
    "llama3-8b-fp8-tp2": ("llama3-8b", "h100-80gb", 8, {"tp": 2},
                          {"seq_len": 8192, "global_batch_size": 128, "precision": "fp8"}),
    "llama3-8b-fsdp": ("llama3-8b", "h100-80gb", 16, {"fsdp": True}, {"seq_len": 8192, "global_batch_size": 128}),
    "llama3-8b-fsdp-fp8": ("llama3-8b", "h100-80gb", 8, {"fsdp": True, "distributed_optimizer": False},
                           {"seq_len": 8192, "global_batch_size": 128, "precision": "fp8"}),
    "llama3-8b-fsdp-tp2-b200": ("llama3-8b", "b200", 16, {"fsdp": True, "tp": 2},
                                {"seq_len": 8192, "global_batch_size": 128}),
    "llama3-70b-tp4-pp4-vp5-cp2": ("llama3-70b", "h100-80gb", 64, {"tp": 4, "pp": 4, "vp": 5, "cp": 2},
                                   {"seq_len": 8192, "global_batch_size": 512}),
    "llama3-70b-mxfp8-b200": ("llama3-70b", "b200", 64, {"tp": 4, "pp": 2},
                              {"seq_len": 8192, "global_batch_size": 256, "precision": "fp8"}),
    "llama3-70b-tp8-overlap": ("llama3-70b", "h100-80gb", 64, {"tp": 8, "pp": 2, "tp_comm_overlap": True},
                               {"seq_len": 4096, "global_batch_size": 256}),
    "llama3-70b-uneven-pp3": ("llama3-70b", "h100-80gb", 48, {"tp": 8, "pp": 3, "first_stage_layers": 26,
                                                              "last_stage_layers": 26},
                              {"seq_len": 4096, "global_batch_size": 96}),
    "llama3-70b-custom-layout": ("llama3-70b", "h100-80gb", 64, {"tp": 8, "pp": 4, "vp": 2,
                                                                 "pipeline_layout": (9, 10, 10, 11, 10, 10, 10, 10)},
                                 {"seq_len": 4096, "global_batch_size": 128}),
    "llama3-70b-full-recompute": ("llama3-70b", "h100-80gb", 32, {"tp": 8, "pp": 4, "recompute": "full",
                                                                  "recompute_num_layers": 2},
                                  {"seq_len": 8192, "global_batch_size": 64}),
    "llama3.1-405b-account-for": ("llama3.1-405b", "h100-80gb", 512, {
        "tp": 8, "pp": 8, "cp": 2, "account_for_embedding": True, "account_for_loss": True},
        {"seq_len": 8192, "global_batch_size": 512}),
    "llama3.1-405b-gb200": ("llama3.1-405b", "gb200", 576, {"tp": 8, "pp": 9, "vp": 7},
                            {"seq_len": 8192, "global_batch_size": 576}),
    "llama2-7b-a100-tp2": ("llama2-7b", "a100-80gb", 16, {"tp": 2}, {"seq_len": 4096, "global_batch_size": 256}),
    "llama2-13b-selective-mlp": ("llama2-13b", "h100-80gb", 16, {"tp": 2, "pp": 2, "recompute_modules":
                                                                 ("core_attn", "mlp")},
                                 {"seq_len": 4096, "global_batch_size": 128}),
    "llama2-70b-unfused": ("llama2-70b", "h100-80gb", 64, {"tp": 8, "pp": 2},
                           {"seq_len": 4096, "global_batch_size": 128, "attention_backend": "unfused"}),
    "qwen2.5-7b-qkv-bias": ("qwen2.5-7b", "h200-141gb", 8, {"tp": 2}, {"seq_len": 8192, "global_batch_size": 64}),
    "qwen2.5-72b-tp8-pp4": ("qwen2.5-72b", "h100-80gb", 64, {"tp": 8, "pp": 4},
                            {"seq_len": 8192, "global_batch_size": 128}),
    "gpt-neox-20b": ("gpt-neox-20b", "a100-80gb", 32, {"tp": 4, "pp": 2}, {"seq_len": 2048, "global_batch_size": 256}),
    "nemotron4-340b": ("nemotron4-340b", "h100-80gb", 768, {"tp": 8, "pp": 12, "vp": 2},
                       {"seq_len": 4096, "global_batch_size": 768}),
    "mixtral-8x7b-ep8": ("mixtral-8x7b", "h100-80gb", 8, {"ep": 8, "etp": 1},
                         {"seq_len": 4096, "global_batch_size": 64}),
    "mixtral-8x7b-fsdp-fp8": ("mixtral-8x7b", "h100-80gb", 8, {
        "tp": 2, "ep": 4, "etp": 1, "recompute": "full", "recompute_num_layers": 2, "fsdp": True,
        "distributed_optimizer": False}, {"seq_len": 4096, "global_batch_size": 64, "precision": "fp8"}),
    "mixtral-8x7b-mxfp8-b200": ("mixtral-8x7b", "b200", 16, {"tp": 2, "ep": 8, "etp": 1},
                                {"seq_len": 4096, "global_batch_size": 128, "precision": "fp8"}),
    "mixtral-8x22b-tp4-pp4-ep8": ("mixtral-8x22b", "h100-80gb", 128, {"tp": 4, "pp": 4, "ep": 8, "etp": 1},
                                  {"seq_len": 4096, "global_batch_size": 256}),
    "qwen3-30b-a3b-ep8": ("qwen3-30b-a3b", "h100-80gb", 16, {"ep": 8, "etp": 1},
                          {"seq_len": 4096, "global_batch_size": 128}),
    "qwen3-30b-a3b-etp2": ("qwen3-30b-a3b", "h100-80gb", 16, {"tp": 2, "ep": 4, "etp": 2},
                           {"seq_len": 4096, "global_batch_size": 128}),
    "qwen3-235b-pp2-ep16": ("qwen3-235b-a22b", "h100-80gb", 256, {"tp": 4, "pp": 2, "ep": 16, "etp": 1},
                            {"seq_len": 4096, "global_batch_size": 512}),
    "deepseek-v3-uneven": ("deepseek-v3", "h100-80gb", 1024, {
        "tp": 2, "pp": 16, "ep": 64, "etp": 1, "first_stage_layers": 3, "last_stage_layers": 2,
        "recompute": "full", "recompute_num_layers": 1}, {"seq_len": 4096, "global_batch_size": 4096}),
    "deepseek-v3-custom-layout": ("deepseek-v3", "h100-80gb", 512, {
        "tp": 1, "pp": 8, "vp": 2, "ep": 64, "etp": 1,
        "pipeline_layout": (4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1)},
        {"seq_len": 4096, "global_batch_size": 1024}),
    "deepseek-v3-gb200-fp8": ("deepseek-v3", "gb200", 256, {
        "pp": 4, "ep": 64, "etp": 1, "first_stage_layers": 16, "last_stage_layers": 15,
        "recompute": "selective", "recompute_modules": ("mla_up_proj", "mlp")},
        {"seq_len": 4096, "global_batch_size": 512, "precision": "fp8"}),
    "deepseek-v3-fsdp-ep": ("deepseek-v3", "h100-80gb", 256, {"ep": 64, "etp": 1, "fsdp": True},
                            {"seq_len": 4096, "global_batch_size": 512}),
    "llama3-8b-full-iteration-graph": ("llama3-8b", "h100-80gb", 8, {"tp": 2, "recompute": "full",
                                                                      "recompute_method": "block",
                                                                      "recompute_num_layers": 4},
                                       {"seq_len": 4096, "global_batch_size": 64, "cuda_graph_impl": "full_iteration"}),
    "llama3-8b-fsdp-full-iteration-graph": ("llama3-8b", "h100-80gb", 8, {"fsdp": True},
                                            {"seq_len": 4096, "global_batch_size": 64,
                                             "cuda_graph_impl": "full_iteration"}),
    "qwen3-30b-a3b-te-graph-router": ("qwen3-30b-a3b", "h100-80gb", 16, {"ep": 8, "etp": 1},
                                      {"seq_len": 4096, "global_batch_size": 256,
                                       "cuda_graph_impl": "transformer_engine",
                                       "cuda_graph_modules": ("attn", "moe_router", "moe_preprocess")}),
    "llama3-8b-fine-grained-offload": ("llama3-8b", "h100-80gb", 8, {"tp": 2},
                                       {"seq_len": 4096, "global_batch_size": 64,
                                        "fine_grained_activation_offloading": True,
                                        "offload_modules": ("core_attn", "attn_proj")}),
}

MINI: dict[str, tuple[str, dict[str, Any], str, int, dict[str, Any], dict[str, Any]]] = {
    # MLA with plain RoPE and no q_lora_rank (DeepSeek-V2-Lite style), MTP at PP 2
    "mla-rope-no-q-lora-mtp": ("deepseek-v3", {"num_layers": 8, "q_lora_rank": None, "position_embedding_type": "rope",
                                               "moe_layer_freq": (0, 1, 1, 1, 1, 1, 1, 1), "num_experts": 16},
                               "h100-80gb", 16, {"pp": 2, "ep": 8, "etp": 1},
                               {"seq_len": 4096, "global_batch_size": 64}),
}


def _spec(model: ModelSpec, gpu: str, num_gpus: int, lay: dict[str, Any], train: dict[str, Any]) -> LaunchSpec:
    cluster = make_cluster(load_gpu(gpu), num_gpus)
    layout = layout_for_world(num_gpus, **lay)
    training = TrainingSpec(**train)
    est = estimate(model, cluster, training, layout)  # the rules, as launch runs them
    site = SiteProfile()
    advice = advise(est, site.storage(), site.failures())
    ckpt = CheckpointArgs(save_interval_iters=advice.save_interval_iters, ckpt_format=advice.size.ckpt_format,
                          async_save=advice.timing.async_save, reason=advice.reason())
    return LaunchSpec(model=model, cluster=cluster, training=training, layout=layout,
                      prediction=est.to_dict(), site=site, checkpoint=ckpt)


def plan_spec(name: str) -> LaunchSpec:
    """The LaunchSpec of one matrix entry (PLANS or MINI)."""
    if name in PLANS:
        model_name, gpu, n, lay, train = PLANS[name]
        return _spec(load_model(model_name), gpu, n, lay, train)
    base, changes, gpu, n, lay, train = MINI[name]
    return _spec(replace(load_model(base), name=name, **changes), gpu, n, lay, train)


NAMES: tuple[str, ...] = (*PLANS, *MINI)
