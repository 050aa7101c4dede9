"""Round trip: model + layout -> pretrain_gpt.py arguments -> parsed back -> the same model and layout.

``as_launched`` states Megatron's own normalisations (sequence parallel off at TP 1, fields of
absent features at their defaults, position table >= sequence); the property compares with it.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from paraplan.launch.check import rule_violations
from paraplan.launch.megatron import argv, as_launched, megatron_args
from paraplan.launch.parse import parse_file, parse_script
from paraplan.launch.render import LaunchSpec, render_files, write_files
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, model_from_megatron_args
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec

from .cases import deepseek_uneven_spec, llama70b_spec, moe_single_node_spec

H100 = load_gpu("h100-80gb")


@st.composite
def model_fields(draw: st.DrawFn, tp: int, ep: int, num_layers: int) -> dict[str, Any]:
    heads = tp * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([32, 64]))
    f: dict[str, Any] = {"num_layers": num_layers, "hidden_size": heads * head_dim,
                         "num_attention_heads": heads, "vocab_size": draw(st.integers(1000, 60000)),
                         "make_vocab_size_divisible_by": draw(st.sampled_from([1, 64, 128]))}
    f["max_position_embeddings"] = draw(st.sampled_from([None, 1024, 8192]))
    if draw(st.booleans()):
        f["ffn_hidden_size"] = 64 * tp * draw(st.integers(1, 8))
    if draw(st.booleans()):
        f["kv_channels"] = draw(st.sampled_from([32, 64, 128]))
    for key in ("swiglu", "untie_embeddings_and_output_weights", "add_qkv_bias", "qk_layernorm"):
        f[key] = draw(st.booleans())
    f["add_bias_linear"] = draw(st.booleans())
    f["position_embedding_type"] = draw(st.sampled_from(["learned_absolute", "rope", "yarn", "none"]))
    f["normalization"] = draw(st.sampled_from(["LayerNorm", "RMSNorm"]))
    f["hidden_dropout"] = draw(st.sampled_from([0.0, 0.1, 0.05]))
    f["attention_dropout"] = draw(st.sampled_from([0.0, 0.1]))
    f["mtp_num_layers"] = draw(st.sampled_from([0, 1]))
    if draw(st.booleans()):
        f.update(multi_latent_attention=True, kv_lora_rank=draw(st.sampled_from([32, 64])),
                 q_lora_rank=draw(st.sampled_from([None, 96])), qk_head_dim=draw(st.sampled_from([32, 64])),
                 qk_pos_emb_head_dim=32, v_head_dim=draw(st.sampled_from([32, 64])))
    else:
        groups = [g for g in (1, 2, 4, 8) if heads % g == 0 and (g % tp == 0 or tp % g == 0)]
        f["num_query_groups"] = draw(st.sampled_from([None, *groups]))
    if ep > 1 or draw(st.booleans()):
        f["num_experts"] = ep * draw(st.sampled_from([1, 2, 4]))
        f["moe_router_topk"] = draw(st.integers(1, f["num_experts"]))
        f["moe_ffn_hidden_size"] = draw(st.sampled_from([None, 64 * tp * 2]))
        f["moe_shared_expert_intermediate_size"] = draw(st.sampled_from([None, 64 * tp]))
        f["moe_shared_expert_gate"] = draw(st.booleans())
        f["moe_layer_freq"] = draw(st.sampled_from([1, 2, "pattern"]))
        if f["moe_layer_freq"] == "pattern":
            f["moe_layer_freq"] = tuple(draw(st.lists(st.sampled_from([0, 1]), min_size=num_layers,
                                                      max_size=num_layers)))
    return f


@st.composite
def launch_cases(draw: st.DrawFn) -> tuple[ModelSpec, ParallelLayout, TrainingSpec]:
    tp, pp, cp, dp = (draw(st.sampled_from(v)) for v in ([1, 2, 4, 8], [1, 2, 4], [1, 2], [1, 2, 4]))
    vp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if (tp * cp * dp) % e == 0]))
    split = draw(st.sampled_from(["even", "uneven", "layout"])) if pp > 1 else "even"
    uneven = split == "uneven" and pp > 2
    first = last = 0
    counts: tuple[int, ...] = ()
    if split == "layout":  # --pipeline-model-parallel-layout: any layer count per virtual stage
        counts = tuple(draw(st.lists(st.integers(0, 3), min_size=pp * vp, max_size=pp * vp)))
        num_layers = sum(counts)
        assume(num_layers > 0)
    elif uneven:
        first, last = vp * draw(st.integers(1, 2)), vp * draw(st.integers(1, 2))
        num_layers = first + last + (pp - 2) * vp * draw(st.integers(1, 2))
    else:
        num_layers = pp * vp * draw(st.integers(1, 3))
    emb = loss = False
    if split == "even" and vp == 1 and pp > 1:  # count embedding / loss as layers of the split
        emb, loss = draw(st.booleans()), draw(st.booleans())
        num_layers = pp * draw(st.integers(1, 3)) + pp - int(emb) - int(loss)
    model = model_from_megatron_args(draw(model_fields(tp, ep, num_layers)))
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    dist_opt, fsdp = draw(st.booleans()), draw(st.booleans())
    grad = draw(st.booleans())
    layout = ParallelLayout(
        tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=draw(st.sampled_from([0, 1])) if ep > 1 else 0, dp=dp,
        mbs=draw(st.sampled_from([1, 2])), recompute=recompute,
        recompute_modules=draw(st.sampled_from([("core_attn",), ("core_attn", "mlp"), ("layernorm",)])),
        recompute_num_layers=draw(st.sampled_from([1, 2])) if recompute == "full" else 1,
        sequence_parallel=draw(st.booleans()), distributed_optimizer=dist_opt, fsdp=fsdp,
        overlap_grad_reduce=grad, overlap_param_gather=grad and (dist_opt or fsdp) and draw(st.booleans()),
        tp_comm_overlap=tp > 1 and draw(st.booleans()), first_stage_layers=first, last_stage_layers=last,
        account_for_embedding=emb, account_for_loss=loss, pipeline_layout=counts,
    )
    seq = 2 * cp * tp * draw(st.sampled_from([64, 128]))
    gbs = layout.mbs * dp * pp * draw(st.integers(1, 4))
    precision = draw(st.sampled_from(["bf16", "fp8", "fp16"]))
    training = TrainingSpec(seq_len=seq, global_batch_size=gbs, precision=precision,
                            attention_backend=draw(st.sampled_from(["flash", "unfused"])))
    cluster = make_cluster(H100, layout.world_size)
    assume(not rule_violations(model, training, cluster, layout))
    return model, layout, training


def launcher_for(world: int) -> list[str]:
    nodes, per_node = (world // 8, 8) if world >= 8 else (1, world)
    return ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node)]


def assert_round_trip(model: ModelSpec, layout: ParallelLayout, training: TrainingSpec, text: str) -> None:
    parsed = parse_script(text)
    want_model, want_layout = as_launched(model, layout, training)
    assert parsed.world_size == layout.world_size
    assert parsed.layout() == want_layout
    assert replace(parsed.flags.model, name=model.name, source=model.source) == want_model
    assert parsed.training() == training
    assert parsed.unknown_flags == ()
    assert parsed.flags.problems == ()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                    HealthCheck.too_slow])
@given(launch_cases())
def test_layout_args_parse_back_to_the_same_layout_and_model(case: tuple[ModelSpec, ParallelLayout,
                                                                         TrainingSpec]) -> None:
    model, layout, training = case
    words = argv(megatron_args(model, layout, training))
    assert_round_trip(model, layout, training, shlex.join([*launcher_for(layout.world_size),
                                                           "pretrain_gpt.py", *words]))
    m2, l2 = as_launched(model, layout, training)
    assert as_launched(m2, l2, training) == (m2, l2)


def test_written_launch_files_parse_back(tmp_path: Any) -> None:
    for make in (llama70b_spec, moe_single_node_spec, deepseek_uneven_spec):
        spec: LaunchSpec = make()
        out = tmp_path / make.__name__
        write_files(render_files(spec, ["all"]), out)
        want_model, want_layout = as_launched(spec.model, spec.layout, spec.training)
        for name in ("torchrun.sh", "job.sbatch", "megatron_args.sh"):
            parsed = parse_file(out / name)
            world = None if name == "megatron_args.sh" else spec.cluster.num_gpus
            assert parsed.world_size == world, name
            assert parsed.layout(spec.cluster.num_gpus) == want_layout, name
            assert replace(parsed.flags.model, name=spec.model.name, source=spec.model.source) == want_model
            assert parsed.training(spec.cluster.num_gpus) == spec.training
