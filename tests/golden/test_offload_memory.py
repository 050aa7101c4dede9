"""Golden values of activation offloading, PEFT and the MoE routed-copy activations, by hand from the code each
formula cites (Megatron-LM main @ d98e8a6, Transformer Engine main).

- Layer-level CPU offloading (TE ``cpu_offload.py`` ``_init_offload_synchronization_dicts``): layers 0..N-1 are
  offloaded and "peak memory usage of saving activations is (num_layers - num_offloaded_layers) * T".
- Fine-grained offloading (Megatron ``--offload-modules``): the inputs of ``core_attn`` (Q, K, V) and
  ``attn_proj`` (the attention output O) leave the GPU; one layer's worth (the last group) stays.
- PEFT (Bridge task=peft): frozen base weights are in no grad buffer and no optimizer shard.
- MoE (``moe/experts.py`` ``bias_act_func``): per routed copy fc1 input h, SwiGLU input 2 f_e, fc2 input f_e (bf16)
  and its fp32 probability; the expert output is not kept.
- Host link (TE docs, CPU offloading): PCIe Gen5 x16 64 GB/s per direction, NVLink-C2C 450 GB/s.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import SpecError
from paraplan.estimate import activations as act
from paraplan.estimate.time.offload import activation_offload_exposed_s, optimizer_offload_s
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import OFFLOAD_MODULES, TrainingSpec

LLAMA8 = load_model("llama3-8b")
LLAMA70 = load_model("llama3-70b")


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=64, **kw)  # type: ignore[arg-type]


def _stage(model, gpu: str, n: int, training: TrainingSpec, layout: ParallelLayout):  # type: ignore[no-untyped-def]
    est = estimate(model, make_cluster(load_gpu(gpu), n), training, layout)
    return est, est.stages[0]


PP1 = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, recompute="none")


def test_layer_offloading_keeps_l_minus_n_layers() -> None:
    base_est, base = _stage(LLAMA8, "gb200", 8, _t(), PP1)
    off_est, off = _stage(LLAMA8, "gb200", 8, _t(cpu_offloading_num_layers=8), PP1)
    L = LLAMA8.num_layers
    assert L == 32
    # the 32 layers' activations of the one micro-batch in flight, by hand (bf16, no TP, flash, SwiGLU, GQA):
    T, h, f, q, kv = 8192, 4096, 14336, 4096, 8 * 128
    attn = 2 * T * h + 2 * T * h + 2 * T * (q + 2 * kv) + 2 * T * q + 4 * 32 * T
    mlp = 2 * T * h + 2 * T * h + 2 * T * 2 * f + 2 * T * f
    saved = float(base.memory.activations_bytes - off.memory.activations_bytes)
    assert saved == pytest.approx(8 * (attn + mlp))
    assert float(off.memory.weights_bytes) == float(base.memory.weights_bytes)
    # the 8 layers go over NVLink-C2C (450 GB/s a direction) behind compute: nothing exposed on GB200
    assert off_est.time.link_comm_s["offload"] == pytest.approx(
        base_est.num_microbatches * 2 * 8 * (attn + mlp) / 450e9)
    assert off_est.time.exposed_comm_s["offload"] == pytest.approx(0.0)
    assert "offload" not in base_est.time.exposed_comm_s


def test_layer_offloading_over_pcie_can_be_exposed() -> None:
    est, _ = _stage(LLAMA8, "h100-80gb", 8, _t(cpu_offloading_num_layers=30), PP1)
    gb, _ = _stage(LLAMA8, "gb200", 8, _t(cpu_offloading_num_layers=30), PP1)
    assert est.time.link_comm_s["offload"] > gb.time.link_comm_s["offload"] * 450 / 64 * 0.99
    assert est.time.exposed_comm_s["offload"] >= 0.0


def test_fine_grained_offloading_moves_qkv_and_the_attention_output() -> None:
    layout = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, recompute="none")
    _, base = _stage(LLAMA8, "b200", 8, _t(), layout)
    _, off = _stage(LLAMA8, "b200", 8, _t(fine_grained_activation_offloading=True,
                                           offload_modules=("core_attn", "attn_proj")), layout)
    T, q, kv = 8192, 4096, 8 * 128
    per_layer = 2 * T * (q + 2 * kv) + 2 * T * q  # Q, K, V and O in bf16
    # every layer's offloaded inputs leave the GPU, one layer's worth (the last group) stays
    saved = float(base.memory.activations_bytes - off.memory.activations_bytes)
    assert saved == pytest.approx((LLAMA8.num_layers - 1) * per_layer)


def test_moe_routed_copies_keep_no_expert_output() -> None:
    m = load_model("qwen3-30b-a3b")
    h, fe, k, E = m.hidden_size, m.moe_ffn, m.moe_router_topk, m.num_experts
    assert (h, fe, k, E, m.swiglu, m.shared_ffn, m.hidden_dropout) == (2048, 768, 8, 128, True, 0, 0.0)
    ctx = act.ActivationContext(seq_len=4096, mbs=1, tp=1, cp=1, sp=False, ep=8, etp=1, recompute_code=0,
                                recompute_modules=(), recompute_num_layers=1, fp8=False)
    T = 4096
    copies = T * k
    expected = 2 * T * h + 2 * T * h + 2 * 4 * T * E + copies * (2 * h + 2 * 2 * fe + 2 * fe + 4)
    assert float(act.moe_mlp_bytes(m, ctx)) == pytest.approx(expected)


def test_peft_frozen_weights_keep_no_grads_or_optimizer() -> None:
    layout = ParallelLayout(tp=2, pp=4, dp=1, mbs=1, recompute="none", sequence_parallel=True)
    _, full = _stage(LLAMA70, "b300", 8, _t(), layout)
    _, peft = _stage(LLAMA70, "b300", 8, _t(peft=True), layout)
    assert float(peft.memory.grads_bytes) == 0.0 and float(peft.memory.optimizer_bytes) == 0.0
    assert float(peft.memory.weights_bytes) == float(full.memory.weights_bytes) == pytest.approx(
        2.0 * float(full.params.total))
    p = float(full.params.total)  # no distributed optimizer: 4 B fp32 grads + 12 B Adam state per parameter
    assert float(full.memory.total_bytes - peft.memory.total_bytes) == pytest.approx(16.0 * p)


def test_recipe_peft_and_offload_columns_are_applied() -> None:
    from paraplan.recipes.catalogue import bridge_recipes
    from paraplan.recipes.knobs import training_knobs

    lib = [r for r in bridge_recipes() if r.runnable]
    peft = next(r for r in lib if r.get("task") == "peft")
    assert training_knobs(peft, "bf16")["peft"] is True
    off = next(r for r in lib if r.get("cpu_offloading") is True)
    assert training_knobs(off, "bf16")["cpu_offloading_num_layers"] == off.get("cpu_offloading_num_layers")
    fine = next(r for r in lib if r.get("fine_grained_activation_offloading") is True)
    kn = training_knobs(fine, "bf16")
    assert kn["fine_grained_activation_offloading"] and kn["offload_modules"] == tuple(fine.get("offload_modules"))
    # the Bridge launcher: bf16 with Adam turns the precision-aware optimizer on (run_script.py _run_training)
    bf16 = next(r for r in lib if r.get("precision") == "bf16" and r.get("use_precision_aware_optimizer") is False)
    assert training_knobs(bf16, "bf16")["use_precision_aware_optimizer"] is True


def test_exposed_offload_time_by_hand() -> None:
    # 64 GB one way over 64 GB/s = 1 s; a 1.5 s micro-batch hides 0.5 s of it in forward and all of it in backward
    assert float(activation_offload_exposed_s(64e9, 64e9, 1.5)) == pytest.approx(0.5)
    assert float(activation_offload_exposed_s(64e9, 64e9, 3.0)) == pytest.approx(0.0)
    assert float(activation_offload_exposed_s(64e9, 64e9, 0.3)) == pytest.approx((1 - 0.1) + (1 - 0.2))


def test_optimizer_offload_time_by_hand() -> None:
    t = _t(use_precision_aware_optimizer=True, optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    # 1e9 local params, half on the host: 0.5e9 x (4 B fp32 grad down + 2 B bf16 param up) / 64e9
    # + 0.5e9 x 36 B / 100e9 of host Adam
    assert float(optimizer_offload_s(t, 1e9, 64e9)) == pytest.approx(0.5e9 * 6 / 64e9 + 0.5e9 * 36 / 100e9)
    assert float(optimizer_offload_s(_t(), 1e9, 64e9)) == 0.0


def test_host_link_defaults() -> None:
    assert load_gpu("h100-80gb").host_bytes_per_s == 64e9
    assert load_gpu("b200").host_bytes_per_s == 64e9
    assert load_gpu("gb200").host_bytes_per_s == 450e9
    assert load_gpu("gb300").host_bytes_per_s == 450e9
    assert load_gpu("a100-80gb").host_bytes_per_s == 32e9


FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--use-distributed-optimizer").split()


def test_offload_flags_read_and_written_back() -> None:
    t = read_flags([*FLAGS, "--cpu-offloading-num-layers", "3"]).training_fields
    assert t["cpu_offloading_num_layers"] == 3
    t = read_flags([*FLAGS, "--fine-grained-activation-offloading", "--offload-modules", "core_attn",
                    "attn_proj", "expert_fc1"]).training_fields
    assert t["fine_grained_activation_offloading"] and t["offload_modules"] == ("core_attn", "attn_proj", "expert_fc1")
    training = _t(fine_grained_activation_offloading=True, offload_modules=("core_attn", "attn_proj"))
    layout = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, recompute="none")
    words = argv(megatron_args(LLAMA8, layout, training), resolve=True)
    i = words.index("--offload-modules")
    assert words[i + 1:i + 3] == ["core_attn", "attn_proj"] and "--fine-grained-activation-offloading" in words
    back = read_flags(words).training_fields
    assert back["offload_modules"] == ("core_attn", "attn_proj") and back["fine_grained_activation_offloading"]
    words = argv(megatron_args(LLAMA8, layout, _t(cpu_offloading_num_layers=4)), resolve=True)
    assert words[words.index("--cpu-offloading-num-layers") + 1] == "4"
    assert read_flags(words).training_fields["cpu_offloading_num_layers"] == 4


@pytest.mark.parametrize(("kw", "message"), [
    ({"fine_grained_activation_offloading": True}, "needs offload_modules"),
    ({"fine_grained_activation_offloading": True, "offload_modules": ("attn_proj",)}, "attn_proj cannot be set"),
    ({"fine_grained_activation_offloading": True, "offload_modules": ("core_attn",), "cpu_offloading_num_layers": 2},
     "cannot be enabled with cpu_offloading"),
    ({"offload_modules": ("gdp_qkv",)}, "offload_modules must be a list of"),
    ({"cpu_offloading_num_layers": -1}, "cpu_offloading_num_layers must be an integer >= 0"),
])
def test_bad_offload_knobs_one_line(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as err:
        _t(**kw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_megatron_refuses_layer_offloading_with_pp_or_recompute() -> None:
    from paraplan.errors import LayoutError

    with pytest.raises(LayoutError, match="Pipeline parallelism with CPU offloading"):
        _stage(LLAMA8, "gb200", 16, _t(cpu_offloading_num_layers=4),
               ParallelLayout(tp=1, pp=2, dp=8, mbs=1, recompute="none"))
    with pytest.raises(LayoutError, match="activation recomputation"):
        _stage(LLAMA8, "gb200", 8, _t(cpu_offloading_num_layers=4),
               ParallelLayout(tp=1, pp=1, dp=8, mbs=1, recompute="selective"))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 31), mods=st.sets(st.sampled_from([m for m in OFFLOAD_MODULES if m != "fused_group_mlp"])),
       mbs=st.sampled_from([1, 2]), tp=st.sampled_from([1, 2]))
def test_turning_offload_on_never_raises_memory(n: int, mods: set[str], mbs: int, tp: int) -> None:
    layout = ParallelLayout(tp=tp, pp=1, dp=8 // tp, mbs=mbs, recompute="none", sequence_parallel=tp > 1)
    base = estimate(LLAMA8, make_cluster(load_gpu("gb200"), 8), _t(), layout).peak_bytes
    layer = estimate(LLAMA8, make_cluster(load_gpu("gb200"), 8), _t(cpu_offloading_num_layers=n), layout)
    assert layer.peak_bytes <= base * (1 + 1e-12)
    if "attn_proj" in mods:
        mods.add("core_attn")
    if mods:
        fine = estimate(LLAMA8, make_cluster(load_gpu("gb200"), 8),
                        _t(fine_grained_activation_offloading=True, offload_modules=tuple(sorted(mods))), layout)
        assert fine.peak_bytes <= base * (1 + 1e-12)
    peft = estimate(LLAMA8, make_cluster(load_gpu("gb200"), 8), _t(peft=True), layout)
    assert peft.peak_bytes < base
    assert np.isfinite(layer.time.step_s)
