"""The layout -> pretrain_gpt.py argument mapping: flag names, flag choices, Megatron's rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.errors import LayoutError
from paraplan.launch.megatron import (
    EMITTED_FLAGS,
    FSDP_REQUIRED_FLAGS,
    MEGATRON_COMMIT,
    argv,
    flag_pairs,
    megatron_args,
    moe_layer_freq_string,
    needs_max_connections_1,
)
from paraplan.launch.render import environment
from paraplan.layout import ParallelLayout, layout_for_world
from paraplan.specs.load import load_model, model_preset_names
from paraplan.specs.megatron_flags import known_flags
from paraplan.specs.training import TrainingSpec

from .cases import TSV, deepseek_uneven_spec, llama70b_spec, moe_single_node_spec

TRAIN = TrainingSpec(seq_len=4096, global_batch_size=256)


def tsv_flags() -> set[str]:
    if not TSV.exists():
        pytest.skip(f"{TSV} not available")
    lines = TSV.read_text(encoding="utf-8").splitlines()
    return {name for line in lines[2:] for name in line.split("\t")[0].split("|")}


def flags_of(words: list[str]) -> list[str]:
    return [w for w in words if w.startswith("--")]


LAYOUTS = [
    ParallelLayout(),
    ParallelLayout(tp=8, pp=4, vp=2, cp=2, recompute="full", recompute_num_layers=2),
    ParallelLayout(tp=2, pp=2, fsdp=True, distributed_optimizer=False, tp_comm_overlap=True,
                   recompute="selective", recompute_modules=("core_attn", "mlp")),
    ParallelLayout(tp=2, pp=4, vp=2, first_stage_layers=2, last_stage_layers=2, recompute="none",
                   overlap_param_gather=False, overlap_grad_reduce=False,
                   distributed_optimizer=False),
    ParallelLayout(pp=2, account_for_embedding=True, account_for_loss=True, ep=2, etp=1),
]


def all_emitted() -> set[str]:
    out: set[str] = set()
    for name in model_preset_names():
        model = load_model(name)
        for lay in LAYOUTS:
            if model.is_moe and model.add_bias_linear:  # Megatron: "Bias in Moe is only supported when ETP==1"
                lay = replace(lay, etp=1)
            for precision in ("bf16", "fp8"):
                training = replace(TRAIN, precision=precision)  # type: ignore[arg-type]
                for arch in ("hopper", "blackwell", "cdna3"):
                    out.update(flags_of(argv(megatron_args(model, lay, training, arch=arch))))
    return out


def test_every_emittable_flag_exists_in_megatron_main() -> None:
    missing = sorted(set(EMITTED_FLAGS) - tsv_flags())
    assert not missing, f"not Megatron-LM flags at {MEGATRON_COMMIT}: {missing}"


def test_every_emitted_flag_is_declared_and_exists_in_megatron() -> None:
    emitted = all_emitted()
    assert emitted <= set(EMITTED_FLAGS)
    assert emitted <= tsv_flags()
    assert emitted <= known_flags()


def test_packaged_flag_list_is_the_tsv() -> None:
    assert known_flags() == tsv_flags()


def test_even_interleaving_uses_layers_per_virtual_stage() -> None:
    model = load_model("llama3-70b")  # 80 layers / PP 4 / VP 5 = 4 layers per virtual stage
    pairs = dict(flag_pairs(megatron_args(model, llama70b_spec().layout, TRAIN)))
    assert pairs["--num-layers-per-virtual-pipeline-stage"] == "4"
    assert "--num-virtual-stages-per-pipeline-rank" not in pairs
    assert "--virtual-pipeline-model-parallel-size" not in pairs


def test_uneven_split_uses_virtual_stages_per_rank_and_first_last() -> None:
    model = load_model("llama3-8b")  # 32 layers: first 4, last 4, 2 middle ranks of 12
    lay = ParallelLayout(tp=1, pp=4, vp=2, first_stage_layers=4, last_stage_layers=4)
    pairs = dict(flag_pairs(megatron_args(model, lay, TRAIN)))
    assert pairs["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert pairs["--decoder-first-pipeline-num-layers"] == "4"
    assert pairs["--decoder-last-pipeline-num-layers"] == "4"
    assert "--num-layers-per-virtual-pipeline-stage" not in pairs


def test_sequence_parallel_is_not_emitted_at_tp1() -> None:
    pairs = dict(flag_pairs(megatron_args(load_model("llama3-8b"), ParallelLayout(tp=1), TRAIN)))
    assert "--sequence-parallel" not in pairs


def test_recompute_flags() -> None:
    model = load_model("llama3-8b")
    full = dict(flag_pairs(megatron_args(model, ParallelLayout(recompute="full", recompute_num_layers=4),
                                         TRAIN)))
    assert (full["--recompute-granularity"], full["--recompute-method"], full["--recompute-num-layers"]) == \
        ("full", "uniform", "4")
    sel = dict(flag_pairs(megatron_args(model, ParallelLayout(recompute_modules=("core_attn", "mlp")), TRAIN)))
    assert sel["--recompute-granularity"] == "selective" and sel["--recompute-modules"] == "core_attn mlp"
    assert "--recompute-method" not in sel
    none = dict(flag_pairs(megatron_args(model, ParallelLayout(recompute="none"), TRAIN)))
    assert not any(f.startswith("--recompute") for f in none)


def test_fp8_recipe_is_what_the_spec_says() -> None:
    # the launch writes the spec's recipe on every architecture (it wrote mxfp8 on Blackwell for a delayed spec)
    model = load_model("llama3-8b")
    fp8 = replace(TRAIN, precision="fp8")
    hopper = dict(flag_pairs(megatron_args(model, ParallelLayout(), fp8, arch="hopper")))
    blackwell = dict(flag_pairs(megatron_args(model, ParallelLayout(), fp8, arch="blackwell")))
    assert (hopper["--fp8-format"], hopper["--fp8-recipe"]) == ("hybrid", "delayed")
    assert blackwell["--fp8-recipe"] == "delayed"
    mx = dict(flag_pairs(megatron_args(model, ParallelLayout(), replace(fp8, fp8_recipe="mxfp8"), arch="blackwell")))
    assert mx["--fp8-recipe"] == "mxfp8"
    assert "--bf16" in hopper


@pytest.mark.parametrize(("training", "code"), [
    (replace(TRAIN, precision="fp8", fp8_recipe="mxfp8"), "MXFP8_NEEDS_BLACKWELL"),
    (replace(TRAIN, precision="fp4"), "FP4_NEEDS_BLACKWELL"),
])
def test_blackwell_only_recipes_are_refused_before_blackwell(training: TrainingSpec, code: str) -> None:
    from paraplan.launch.megatron import launch_violations

    model = load_model("llama3-8b")
    hopper = launch_violations(model, ParallelLayout(), training, arch="hopper")
    assert [c for c, _ in hopper] == [code] and "compute capability 10.0" in hopper[0][1]
    assert launch_violations(model, ParallelLayout(), training, arch="blackwell") == []


def test_fp4_launch_writes_the_fp4_flags() -> None:
    model = load_model("llama3-8b")
    fp4 = replace(TRAIN, precision="fp4", fp4_param_gather=True, first_last_layers_bf16=True,
                  num_layers_at_start_in_bf16=0, num_layers_at_end_in_bf16=4)
    words = megatron_args(model, ParallelLayout(distributed_optimizer=True), fp4, arch="blackwell")
    pairs = dict(flag_pairs(words))
    assert (pairs["--fp4-format"], pairs["--fp4-recipe"]) == ("e2m1", "nvfp4")
    assert "--fp8-format" not in pairs and "--bf16" in pairs
    assert "--fp4-param-gather" in pairs and "--first-last-layers-bf16" in pairs
    assert (pairs["--num-layers-at-start-in-bf16"], pairs["--num-layers-at-end-in-bf16"]) == ("0", "4")
    plain = dict(flag_pairs(megatron_args(model, ParallelLayout(), replace(TRAIN, precision="fp4"), arch="blackwell")))
    assert not {"--fp4-param-gather", "--first-last-layers-bf16", "--num-layers-at-end-in-bf16"} & set(plain)


def test_fp16_training_is_launched_with_fp16() -> None:
    # --bf16 and --fp16 are separate Megatron flags; an fp16 plan launched as bf16 would run with
    # fp32 gradient accumulation and a different memory footprint than predicted.
    model = load_model("llama3-8b")
    pairs = dict(flag_pairs(megatron_args(model, ParallelLayout(), replace(TRAIN, precision="fp16"))))
    assert "--fp16" in pairs and "--bf16" not in pairs


def test_fsdp_flags_and_checkpoint_format() -> None:
    pairs = dict(flag_pairs(megatron_args(moe_single_node_spec().model, moe_single_node_spec().layout,
                                          moe_single_node_spec().training)))
    assert "--use-megatron-fsdp" in pairs
    assert pairs["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert pairs["--ckpt-format"] == "fsdp_dtensor"
    # NVIDIA's Megatron-FSDP guide: the distributed optimizer (v1 needs it), although the layout says
    # distributed_optimizer=False; gradient-accumulation fusion stays on (Megatron only warns, NVIDIA's FSDP
    # recipes keep it)
    assert moe_single_node_spec().layout.distributed_optimizer is False
    assert "--use-distributed-optimizer" in pairs and "--no-gradient-accumulation-fusion" not in pairs
    for flag, value, _ in FSDP_REQUIRED_FLAGS:
        assert flag in pairs and (value is None or pairs[flag] == value)


def test_mla_with_mtp_uses_rope_with_mla_rope_type() -> None:
    spec = deepseek_uneven_spec()
    pairs = dict(flag_pairs(megatron_args(spec.model, spec.layout, spec.training)))
    assert spec.model.position_embedding_type == "yarn" and spec.model.mtp_num_layers
    assert pairs["--position-embedding-type"] == "rope" and pairs["--rope-type"] == "yarn"
    assert pairs["--rotary-scaling-factor"] == "40.0"
    assert "--no-rope-fusion" not in pairs
    rope = replace(spec.model, position_embedding_type="rope")
    pairs = dict(flag_pairs(megatron_args(rope, spec.layout, spec.training)))
    assert pairs["--rope-type"] == "rope" and "--no-rope-fusion" in pairs  # fused RoPE for MLA is YaRN only


def test_mtp_with_yarn_without_mla_is_refused() -> None:
    spec = deepseek_uneven_spec()
    model = replace(spec.model, multi_latent_attention=False, q_lora_rank=None)
    with pytest.raises(LayoutError, match=r"Multi-Token Prediction \(MTP\) is not supported with yarn"):
        megatron_args(model, spec.layout, spec.training)


def test_model_flags_for_gqa_llama() -> None:
    pairs = dict(flag_pairs(megatron_args(load_model("llama3-70b"), ParallelLayout(tp=8), TRAIN)))
    assert "--group-query-attention" in pairs and pairs["--num-query-groups"] == "8"
    for flag in ("--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear"):
        assert flag in pairs
    assert pairs["--position-embedding-type"] == "rope" and pairs["--normalization"] == "RMSNorm"
    assert pairs["--max-position-embeddings"] == "8192"


def test_max_position_embeddings_is_at_least_the_sequence() -> None:
    model = replace(load_model("llama3-8b"), max_position_embeddings=2048)
    pairs = dict(flag_pairs(megatron_args(model, ParallelLayout(), TRAIN)))
    assert pairs["--max-position-embeddings"] == "4096"


def test_mla_moe_mtp_flags_for_deepseek() -> None:
    spec = deepseek_uneven_spec()
    pairs = dict(flag_pairs(megatron_args(spec.model, spec.layout, spec.training)))
    assert "--multi-latent-attention" in pairs and "--group-query-attention" not in pairs
    assert (pairs["--q-lora-rank"], pairs["--kv-lora-rank"]) == ("1536", "512")
    assert pairs["--moe-layer-freq"] == "[0]*3+[1]*58"
    assert pairs["--moe-token-dispatcher-type"] == "alltoall" and "--moe-grouped-gemm" in pairs
    assert pairs["--mtp-num-layers"] == "1"
    assert pairs["--expert-model-parallel-size"] == "64" and pairs["--expert-tensor-parallel-size"] == "1"


def test_moe_layer_freq_string_round_trips() -> None:
    assert moe_layer_freq_string(1) == "1"
    assert moe_layer_freq_string((0, 1, 1, 0)) == "[0]+[1]*2+[0]"
    assert eval(moe_layer_freq_string((0,) * 3 + (1,) * 58)) == [0] * 3 + [1] * 58  # Megatron evals it


@pytest.mark.parametrize("text", ["\u00b2", "[1]*\u00b2", "[0]*\u0663+[1]"])
def test_moe_layer_freq_refuses_non_ascii_digits_in_one_line(text: str) -> None:
    from paraplan.errors import SpecError
    from paraplan.specs.megatron_args import parse_moe_layer_freq

    with pytest.raises(SpecError, match=r"^moe_layer_freq: cannot read"):  # str.isdigit('\u00b2') is True
        parse_moe_layer_freq(text, 4)
    assert parse_moe_layer_freq("[0]*1+[1]*3", 4) == (0, 1, 1, 1)


def test_moe_knobs_on_a_dense_model_are_noted_not_half_written(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main
    from paraplan.launch.megatron import dense_moe_knobs_note

    t = replace(TRAIN, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                moe_hybridep_num_sms=16, moe_permute_fusion=True)
    dense, moe = load_model("llama3-8b"), load_model("qwen3-30b-a3b")
    words = argv(megatron_args(dense, ParallelLayout(), t))
    assert not [w for w in words if w.startswith("--moe-")]  # _moe_mla writes no dispatcher for a dense model
    note = dense_moe_knobs_note(dense, t)
    assert note is not None and "--moe-flex-dispatcher-backend" in note and "--moe-permute-fusion" in note
    assert dense_moe_knobs_note(moe, t) is None and dense_moe_knobs_note(dense, TRAIN) is None
    moe_words = argv(megatron_args(moe, ParallelLayout(ep=8, dp=8), t))
    assert moe_words[moe_words.index("--moe-token-dispatcher-type") + 1] == "flex"
    assert moe_words[moe_words.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    assert main(["estimate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "4096",
                 "--gbs", "64", "--knob", "moe-permute-fusion", "--format", "json"]) in (0, 4)
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("no MoE layers: --moe-permute-fusion ignored" in n for n in notes)


def test_data_and_tokenizer_are_marked_placeholders() -> None:
    words = argv(megatron_args(load_model("llama3-8b"), ParallelLayout(), TRAIN))
    assert "${DATA_PATH:?set DATA_PATH" in words[words.index("--data-path") + 1]
    assert words[words.index("--tokenizer-model") + 1].startswith("${TOKENIZER_MODEL:?")


@pytest.mark.parametrize(("layout", "message"), [
    (ParallelLayout(tp=1, tp_comm_overlap=True),
     "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled"),
    (ParallelLayout(distributed_optimizer=False, overlap_param_gather=True),
     "--overlap-param-gather only supported with distributed optimizer, megatron fsdp, or dist_muon"),
    (ParallelLayout(overlap_grad_reduce=False, overlap_param_gather=True),
     "Must use --overlap-param-gather with --overlap-grad-reduce"),
    (ParallelLayout(pp=4, recompute="full", recompute_num_layers=9),
     "recompute_num_layers must be between 1 and num_layers_per_pipeline_rank: 8"),
])
def test_flag_combinations_megatron_rejects_raise_its_message(layout: ParallelLayout, message: str) -> None:
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        megatron_args(load_model("llama3-8b"), layout, TRAIN)


def test_cuda_device_max_connections_rule() -> None:
    assert needs_max_connections_1(ParallelLayout(tp=2), "hopper")
    assert needs_max_connections_1(ParallelLayout(cp=2), "ampere")
    assert not needs_max_connections_1(ParallelLayout(tp=2), "blackwell")
    assert not needs_max_connections_1(ParallelLayout(tp=2, fsdp=True), "hopper")
    assert not needs_max_connections_1(ParallelLayout(), "hopper")
    env = {name: value for name, value, _ in environment(llama70b_spec())}
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env["NCCL_IB_SL"] == "1"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {n for n, _, _ in environment(moe_single_node_spec())}


def test_layout_for_world_layouts_render_for_every_preset() -> None:
    for name in model_preset_names():
        model = load_model(name)
        words = argv(megatron_args(model, layout_for_world(8, tp=1), TRAIN))
        assert words[words.index("--num-layers") + 1] == str(model.num_layers)


def test_moe_rules_from_megatron_core() -> None:
    moe = load_model("mixtral-8x7b")
    with pytest.raises(LayoutError, match="Bias in Moe is only supported when ETP==1"):
        megatron_args(replace(moe, add_bias_linear=True), ParallelLayout(tp=2, ep=2), TRAIN)
    fp8 = replace(TRAIN, precision="fp8")
    with pytest.raises(LayoutError, match="Delayed scaling does not support moe_act and layernorm"):
        megatron_args(moe, ParallelLayout(recompute_modules=("moe_act",)), fp8)
    with pytest.raises(LayoutError, match="Delayed scaling does not support moe_act and layernorm"):
        megatron_args(moe, ParallelLayout(recompute_modules=("moe_act",)), fp8, arch="blackwell")  # a recipe rule
    megatron_args(moe, ParallelLayout(recompute_modules=("moe_act",)), replace(fp8, fp8_recipe="mxfp8"),
                  arch="blackwell")
    top1 = dict(flag_pairs(megatron_args(replace(moe, moe_router_topk=1), ParallelLayout(), TRAIN)))
    assert "--moe-router-pre-softmax" in top1


def test_explicit_pipeline_layout_is_emitted_as_megatrons_string() -> None:
    model = load_model("deepseek-v3")
    counts = (3,) + (4,) * 14 + (2,)  # 61 layers over PP 16
    pairs = dict(flag_pairs(megatron_args(model, ParallelLayout(pp=16, ep=8, etp=1, pipeline_layout=counts),
                                          TRAIN)))
    text = pairs["--pipeline-model-parallel-layout"]
    assert text.startswith("Ettt|tttt|") and text.endswith("|ttmL") and text.count("|") == 15
    for flag in ("--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
                 "--num-virtual-stages-per-pipeline-rank"):
        assert flag not in pairs


@pytest.mark.parametrize("name", ["llama3.1-405b", "deepseek-v3", "nemotron4-340b", "qwen3-30b-a3b",
                                  "gpt-neox-20b"])
def test_recipe_flags_are_emitted_and_read_back(name: str) -> None:
    """RoPE base/scaling, norm epsilon and router options decide what Megatron trains: they are
    emitted when they differ from Megatron's default and ``check`` reads the same model back."""
    from paraplan.launch.megatron import as_launched
    from paraplan.specs.megatron_flags import read_flags
    from paraplan.specs.model import RECIPE_FLAGS

    model = load_model(name)
    lay = ParallelLayout(tp=1, pp=1, ep=1, etp=1)
    pairs = dict(flag_pairs(megatron_args(model, lay, TRAIN)))
    expected = {
        "llama3.1-405b": {"--rotary-base": "500000", "--use-rope-scaling": None},
        "deepseek-v3": {"--rotary-scaling-factor": "40.0", "--mscale-all-dim": "1.0",
                        "--moe-router-score-function": "sigmoid", "--moe-router-enable-expert-bias": None,
                        "--moe-router-num-groups": "8", "--moe-router-group-topk": "4",
                        "--moe-router-topk-scaling-factor": "2.5", "--moe-router-pre-softmax": None,
                        "--moe-router-load-balancing-type": "seq_aux_loss", "--moe-aux-loss-coeff": "0.0001",
                        "--norm-epsilon": "1e-06"},
        "nemotron4-340b": {"--rotary-percent": "0.5", "--apply-layernorm-1p": None, "--squared-relu": None},
        "qwen3-30b-a3b": {"--rotary-base": "1000000", "--moe-aux-loss-coeff": "0.001", "--moe-router-dtype": "fp32"},
        "gpt-neox-20b": {"--rotary-percent": "0.25"},
    }[name]
    assert {k: pairs.get(k, "MISSING") for k in expected} == expected
    assert "--rope-scaling-factor" not in pairs  # 8 is Megatron's default
    parsed = read_flags(argv(megatron_args(model, lay, TRAIN)))
    want, _ = as_launched(model, lay, TRAIN)
    got = parsed.model
    assert {f: getattr(got, f) for f, _, _ in RECIPE_FLAGS} == {f: getattr(want, f) for f, _, _ in RECIPE_FLAGS}


def test_packaged_dest_table_is_the_tsv() -> None:
    """megatron_dests.tsv (argument dump -> command line) is the flag TSV's dest, first flag and action."""
    from paraplan.specs.megatron_flags import _dests

    if not TSV.exists():
        pytest.skip(f"{TSV} not available")
    want: dict[str, tuple[str, str]] = {}
    for line in TSV.read_text(encoding="utf-8").splitlines()[2:]:
        cols = line.split("\t")
        if cols[2] != "Help":
            want.setdefault(cols[1], (cols[0].split("|")[0], cols[2]))
    assert {dest: (flag, action) for dest, (flag, action, _) in _dests().items()} == want


@pytest.mark.parametrize(("precision", "recipe", "column"), [
    ("fp8", "delayed", "fp8_ds"), ("fp8", "tensorwise", "fp8_cs"), ("fp8", "mxfp8", "fp8_mx"),
    ("fp8", "blockwise", "fp8_sc"), ("fp4", "delayed", "nvfp4"), ("bf16", "delayed", "bf16"),
])
def test_bridge_precision_is_the_specs(precision: str, recipe: str, column: str) -> None:
    from paraplan.launch.bridge import bridge_precision

    assert bridge_precision(precision, "hopper", recipe)[0] == column
    # Megatron's default on Blackwell picks NVIDIA's MXFP8 performance recipes (none is delayed scaling)
    blackwell = "fp8_mx" if (precision, recipe) == ("fp8", "delayed") else column
    assert bridge_precision(precision, "blackwell", recipe)[0] == blackwell
