"""Named userbuffers configs (Megatron-Bridge training/comm_overlap.py, packaged) and ``--tp-comm-overlap-cfg``
YAML files: each GEMM costed with its own method, SMs and splits, by hand from Transformer Engine's
module/base.py ``initialize_ub`` (``get_default_config`` updated with the user's config) and its CommOverlap kernels
(common/comm_gemm_overlap/comm_gemm_overlap.cpp: ``split_overlap_ag`` / ``split_overlap_rs`` of
``CommOverlapP2PBase``, ``split_overlap_rs`` and ``bulk_overlap`` of ``CommOverlapBase``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from paraplan.errors import SpecError
from paraplan.estimate import comm
from paraplan.estimate.time.compute import gemm_s, hbm_rate, sm_count_of
from paraplan.estimate.time.layer import attention_layer_time, dense_mlp_time
from paraplan.launch.megatron import argv, megatron_args
from paraplan.launch.parse import parse_file
from paraplan.launch.render import LaunchSpec, render_files
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.grid import Grid
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import TrainingSpec
from paraplan.specs.userbuffers import canonical, effective, packaged, resolve, yaml_text

ROOT = Path(__file__).resolve().parents[2]
LLAMA = load_model("llama3-70b")
B200, H100 = load_gpu("b200"), load_gpu("h100-80gb")
FP8_B200 = "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192"
BF16_H100 = "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"
LORA = "userbuffers_fp8_h100_h8192_tp2_mbs1_seqlen4096_lora"


def _lay(t: int) -> ParallelLayout:
    return ParallelLayout(tp=t, pp=1, dp=8 // t, mbs=1, recompute="none", sequence_parallel=True,
                          distributed_optimizer=True, tp_comm_overlap=True)


def _fp8_mlp_gemms_s(cluster: object, T: int, h: int, f: int, t: int) -> tuple[float, float, float]:
    """The dense MLP's FP8 GEMM times at TP ``t`` (fc1 fprop, fc2 fprop, fc2 dgrad), by ``gemm_s`` itself."""
    return (float(gemm_s(cluster, "fp8", T, 2 * f / t, h)), float(gemm_s(cluster, "fp8", T, h, f / t)),  # type: ignore[arg-type]
            float(gemm_s(cluster, "fp8", T, f / t, h)))  # type: ignore[arg-type]


def _coll(cluster: object, lay: ParallelLayout, nbytes: float, rs: bool = False) -> float:
    group = Grid.inner(lay).tp_group
    bw = comm.ring_busbw(cluster, group.size, group.stride)  # type: ignore[arg-type]
    alpha = comm.tier_latency_s(cluster, group.span)  # type: ignore[arg-type]
    fn = comm.reduce_scatter_s if rs else comm.all_gather_s
    return float(fn(nbytes, group.size, bw, alpha))


def test_packaged_configs_are_bridges_nineteen() -> None:
    cfgs = packaged()
    assert len(cfgs) == 19
    assert cfgs[FP8_B200]["fc2_fprop"] == {"aggregate": False, "atomic_gemm": False, "cga_size": 1, "fp8_buf": False,
                                           "method": "ring_exchange", "num_sm": 1, "set_sm_margin": True}
    assert cfgs[BF16_H100]["proj_fprop"]["num_sm"] == 24 and cfgs[BF16_H100]["proj_fprop"]["num_splits"] == 4
    assert "qkv_wgrad" not in cfgs[LORA] and cfgs[LORA]["fc1_dgrad"]["method"] == "pipeline"
    for cfg in cfgs.values():
        resolve(canonical(cfg))  # every packaged config passes the checks a user file gets


@pytest.mark.skipif(not Path(os.environ.get("BRIDGE_MIRROR", "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo"))
                    .exists(), reason="no Megatron-Bridge mirror")
def test_packaged_file_is_what_the_generator_writes() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bridge_ub_configs

    mirror = os.environ.get("BRIDGE_MIRROR", "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
    try:
        data = bridge_ub_configs.extract(mirror)
    except subprocess.CalledProcessError:
        pytest.skip("the mirror lacks the library commit")
    assert bridge_ub_configs.dumps(data) == bridge_ub_configs.OUT.read_text()


def test_effective_is_te_defaults_then_the_config() -> None:
    te = effective(None)
    assert (te["qkv_fprop"].method, te["qkv_fprop"].num_sm, te["qkv_fprop"].set_sm_margin) == ("ring_exchange", 1,
                                                                                                False)
    assert (te["proj_fprop"].method, te["proj_fprop"].num_sm, te["proj_fprop"].num_splits) == ("pipeline", 16, 4)
    assert te["proj_fprop"].set_sm_margin and not te["proj_fprop"].fp8_buf and te["qkv_fprop"].fp8_buf
    fp8 = effective(packaged()[FP8_B200])
    assert (fp8["proj_fprop"].method, fp8["proj_fprop"].num_sm, fp8["proj_fprop"].reduce_scatter) == (
        "ring_exchange", 1, True)
    lora = effective(packaged()[LORA])  # a non-bulk dgrad: initialize_ub's dgrad_reduce_scatter_overlap
    assert lora["fc1_dgrad"].reduce_scatter and lora["fc1_dgrad"].method == "pipeline" and lora["fc1_dgrad"].fp8_buf
    assert not lora["fc1_wgrad"].used and not lora["qkv_dgrad"].reduce_scatter


def test_fp8_b200_mlp_block_by_hand() -> None:
    """B200 TP2, FP8, fc1/fc2 under userbuffers_fp8_b200_h8192_tp2: fc1 fprop ring exchange (FP8 all-gather, 1 SM,
    no margin); fc2 fprop ring-exchange reduce-scatter in BF16 (1 SM with margin) and its final reduce of 2 chunks;
    fc2 dgrad ring exchange; fc1 dgrad bulk all-gather on 2 SMs; fc1 wgrad bulk reduce-scatter on 4 SMs."""
    cluster = make_cluster(B200, 8, 8)
    lay = _lay(2)
    training = TrainingSpec(seq_len=8192, global_batch_size=16, precision="fp8", tp_comm_overlap_cfg=FP8_B200)
    T, h, f, t = 8192, LLAMA.hidden_size, LLAMA.ffn, 2
    sms = sm_count_of(cluster)
    fc1, fc2, fc2_dgrad = _fp8_mlp_gemms_s(cluster, T, h, f, t)
    ag8, rs16 = _coll(cluster, lay, 1.0 * T * h), _coll(cluster, lay, 2.0 * T * h, rs=True)
    slowed = fc2 / (1 - 1 / sms)
    reduce = (t * 2.0 + 2.0) * T / t * h / hbm_rate(cluster)
    fwd = max(0.0, ag8 - fc1 / 2) + max(0.0, rs16 - slowed / 2) + (slowed - fc2) + reduce
    bwd = (max(0.0, ag8 - fc2_dgrad / 2) + max(0.0, ag8 - fc1) + 2 / sms * min(ag8, fc1)
           + max(0.0, rs16 - fc1) + 4 / sms * min(rs16, fc1))
    got = dense_mlp_time(LLAMA, cluster, training, lay, ffn=LLAMA.ffn)
    assert float(got.tp_fwd_exposed_s) == pytest.approx(fwd, rel=1e-9)
    assert float(got.tp_exposed_s) == pytest.approx(fwd + bwd, rel=1e-9)
    assert float(got.tp_link_s) == pytest.approx(3 * ag8 + 2 * rs16, rel=1e-9)
    default = dense_mlp_time(LLAMA, cluster, replace(training, tp_comm_overlap_cfg=""), lay, ffn=LLAMA.ffn)
    assert float(default.tp_exposed_s) != pytest.approx(fwd + bwd, rel=1e-6)  # the config changes the time


def test_bf16_h100_attention_block_by_hand() -> None:
    """H100 TP4, BF16, qkv/proj under userbuffers_bf16_h100_h8192_tp4: proj fprop pipelined on 24 SMs in 4 splits;
    qkv dgrad bulk all-gather on 4 SMs; qkv wgrad bulk reduce-scatter on 24 SMs."""
    cluster = make_cluster(H100, 8, 8)
    lay = _lay(4)
    training = TrainingSpec(seq_len=8192, global_batch_size=16, tp_comm_overlap_cfg=BF16_H100)
    T, h, t = 8192, LLAMA.hidden_size, 4
    sms = sm_count_of(cluster)
    kv = LLAMA.head_dim * max(LLAMA.query_groups, t)
    qkv = float(gemm_s(cluster, "bf16", T, (LLAMA.query_width + 2 * kv) / t, h))
    proj = float(gemm_s(cluster, "bf16", T, h, LLAMA.query_width / t))
    proj_dgrad = float(gemm_s(cluster, "bf16", T, LLAMA.query_width / t, h))
    ag, rs = _coll(cluster, lay, 2.0 * T * h), _coll(cluster, lay, 2.0 * T * h, rs=True)
    share = 24 / sms
    slowed = proj / (1 - share)
    fwd = max(0.0, 3 * (ag / 3 - qkv / 4)) + rs / 4 + 3 * max(0.0, (rs - slowed) / 4) + slowed - proj
    bwd = (max(0.0, 3 * (ag / 3 - proj_dgrad / 4)) + max(0.0, ag - qkv) + 4 / sms * min(ag, qkv)
           + max(0.0, rs - qkv) + 24 / sms * min(rs, qkv))
    got = attention_layer_time(LLAMA, cluster, training, lay)
    assert float(got.tp_fwd_exposed_s) == pytest.approx(fwd, rel=1e-9)
    assert float(got.tp_exposed_s) == pytest.approx(fwd + bwd, rel=1e-9)


def test_lora_config_reduce_scatters_the_dgrad_under_peft() -> None:
    """A pipelined fc1 dgrad (the LoRA configs) with --tp-comm-overlap-rs-dgrad (TE ``ub_overlap_rs_dgrad``): the
    input-gradient reduce-scatter rides the dgrad GEMM in 4 splits on 16 SMs (FP8 buffer); PEFT needs no input
    all-gather for wgrad."""
    cluster = make_cluster(H100, 8, 8)
    lay = _lay(2)
    training = TrainingSpec(seq_len=4096, global_batch_size=16, precision="fp8", peft=True, tp_comm_overlap_cfg=LORA,
                            tp_comm_overlap_rs_dgrad=True)
    T, h, f, t = 4096, LLAMA.hidden_size, LLAMA.ffn, 2
    sms = sm_count_of(cluster)
    fc1, fc2, fc2_dgrad = _fp8_mlp_gemms_s(cluster, T, h, f, t)
    ag8, rs8 = _coll(cluster, lay, 1.0 * T * h), _coll(cluster, lay, 1.0 * T * h, rs=True)
    m = 1 / (1 - 1 / sms)  # set_sm_margin on 1 SM (ring exchange)
    reduce = (t * 1.0 + 2.0) * T / t * h / hbm_rate(cluster)  # fc2 fprop ring exchange, fp8_buf: FP8 chunks
    fwd = max(0.0, ag8 - fc1 * m / 2) + fc1 * m - fc1 + max(0.0, rs8 - fc2 * m / 2) + fc2 * m - fc2 + reduce
    s16 = fc1 / (1 - 16 / sms)
    bwd = max(0.0, ag8 - fc2_dgrad * m / 2) + fc2_dgrad * m - fc2_dgrad + rs8 / 4 + 3 * max(0.0, (rs8 - s16) / 4) \
        + s16 - fc1
    got = dense_mlp_time(LLAMA, cluster, training, lay, ffn=LLAMA.ffn)
    assert float(got.tp_exposed_s) == pytest.approx(fwd + bwd, rel=1e-9)


@pytest.mark.parametrize("peft", [True, False])
def test_lora_config_without_rs_dgrad_runs_the_bulk_pair(peft: bool) -> None:
    """Megatron's default (no --tp-comm-overlap-rs-dgrad): TE keeps ``ub_bulk_dgrad`` / ``ub_bulk_wgrad``
    (layernorm_linear.py ``... and not self.ub_overlap_rs_dgrad``), so the LoRA config's pipelined fc1 dgrad
    communicator runs the bulk input all-gather (its 16 SMs, SM margin, FP8 buffer: ``bulk_overlap`` runs whatever
    PEFT) and the wgrad the bulk bf16 input-gradient reduce-scatter on TE's bulk defaults (16 SMs, SM margin; the
    config may not set it), which under PEFT (no wgrad GEMM) shows in full."""
    cluster = make_cluster(H100, 8, 8)
    lay = _lay(2)
    training = TrainingSpec(seq_len=4096, global_batch_size=16, precision="fp8", peft=peft, tp_comm_overlap_cfg=LORA)
    T, h, f, t = 4096, LLAMA.hidden_size, LLAMA.ffn, 2
    sms = sm_count_of(cluster)
    fc1, fc2, fc2_dgrad = _fp8_mlp_gemms_s(cluster, T, h, f, t)
    ag8, rs8 = _coll(cluster, lay, 1.0 * T * h), _coll(cluster, lay, 1.0 * T * h, rs=True)
    rs16 = _coll(cluster, lay, 2.0 * T * h, rs=True)
    m = 1 / (1 - 1 / sms)
    reduce = (t * 1.0 + 2.0) * T / t * h / hbm_rate(cluster)
    fwd = max(0.0, ag8 - fc1 * m / 2) + fc1 * m - fc1 + max(0.0, rs8 - fc2 * m / 2) + fc2 * m - fc2 + reduce
    s16 = fc1 / (1 - 16 / sms)
    rs_bwd = rs16 if peft else max(0.0, rs16 - s16) + s16 - fc1
    bwd = max(0.0, ag8 - fc2_dgrad * m / 2) + fc2_dgrad * m - fc2_dgrad + max(0.0, ag8 - s16) + s16 - fc1 + rs_bwd
    got = dense_mlp_time(LLAMA, cluster, training, lay, ffn=LLAMA.ffn)
    assert float(got.tp_exposed_s) == pytest.approx(fwd + bwd, rel=1e-9)
    on = dense_mlp_time(LLAMA, cluster, replace(training, tp_comm_overlap_rs_dgrad=True), lay, ffn=LLAMA.ffn)
    assert float(on.tp_exposed_s) != pytest.approx(float(got.tp_exposed_s), rel=1e-6)  # the knob moves it


def test_rs_dgrad_changes_nothing_with_a_bulk_dgrad() -> None:
    """TE's default and Bridge's non-LoRA configs keep a bulk qkv/fc1 dgrad: ``ub_overlap_rs_dgrad`` then finds no
    reduce-scatter communicator for it (``initialize_ub`` builds ``fc1_dgrad`` as an all-gather) and Megatron's
    flag moves nothing."""
    cluster = make_cluster(H100, 8, 8)
    lay = _lay(4)
    for cfg in ("", BF16_H100):
        training = TrainingSpec(seq_len=8192, global_batch_size=16, tp_comm_overlap_cfg=cfg)
        off = dense_mlp_time(LLAMA, cluster, training, lay, ffn=LLAMA.ffn)
        on = dense_mlp_time(LLAMA, cluster, replace(training, tp_comm_overlap_rs_dgrad=True), lay, ffn=LLAMA.ffn)
        assert float(on.tp_exposed_s) == float(off.tp_exposed_s)


def test_rs_dgrad_is_read_and_written_back() -> None:
    got = read_flags([*FLAGS, "--tp-comm-overlap-rs-dgrad"])
    assert got.training_fields["tp_comm_overlap_rs_dgrad"] is True
    assert not [n for n in got.notes if "rs-dgrad" in n]
    training = TrainingSpec(seq_len=2048, global_batch_size=8, tp_comm_overlap_rs_dgrad=True)
    words = argv(megatron_args(load_model("llama3-8b"), _lay(2), training))
    assert "--tp-comm-overlap-rs-dgrad" in words
    assert "--tp-comm-overlap-rs-dgrad" not in argv(megatron_args(load_model("llama3-8b"), _lay(2),
                                                                   replace(training, tp_comm_overlap_rs_dgrad=False)))


FLAGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap").split()


def test_megatron_args_read_the_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "ub.yaml"
    path.write_text(yaml_text(packaged()[BF16_H100]))
    got = read_flags([*FLAGS, "--tp-comm-overlap-cfg", str(path)])
    value = got.training_fields["tp_comm_overlap_cfg"]
    assert resolve(value) == packaged()[BF16_H100]
    assert not [n for n in got.notes if n.startswith("not modelled")]
    named = read_flags([*FLAGS, "--tp-comm-overlap-cfg", BF16_H100])  # no such file: Bridge's name, which
    assert named.training_fields["tp_comm_overlap_cfg"] == BF16_H100  # Megatron-LM cannot open (a broken rule)
    assert any(code == "TP_COMM_OVERLAP_CFG_NOT_A_FILE" for code, _ in named.problems)


@pytest.mark.parametrize(("text", "words"), [
    ("qkv_fprop: [1, 2\n", "not a readable YAML file"),
    ("- 1\n", "must be a mapping of GEMM names"),
    ("attn_fprop: {method: bulk}\n", "GEMM name must be one of"),
    ("qkv_fprop: {method: pipeline}\n", "qkv_fprop.method must be ring_exchange"),
    ("proj_fprop: {num_sm: -3}\n", "proj_fprop.num_sm must be an integer from 1"),
    ("proj_fprop: {num_sm: true}\n", "proj_fprop.num_sm must be an integer"),
    ("proj_fprop: {set_sm_margin: 1}\n", "proj_fprop.set_sm_margin must be true or false"),
    ("proj_fprop: {speed: 3}\n", "has no setting 'speed'"),
    ("fc1_dgrad: {method: pipeline}\nfc1_wgrad: {method: bulk}\n", "cannot set fc1_wgrad"),
])
def test_bad_yaml_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "ub.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        read_flags([*FLAGS, "--tp-comm-overlap-cfg", str(path)])
    assert words in str(err.value) and "--tp-comm-overlap-cfg" in str(err.value) and "\n" not in str(err.value)


def test_unknown_name_is_one_line() -> None:
    with pytest.raises(SpecError, match="tp_comm_overlap_cfg must be one of Megatron-Bridge's 19"):
        TrainingSpec(seq_len=2048, global_batch_size=8, tp_comm_overlap_cfg="userbuffers_bf16_x")


def test_launch_writes_the_yaml_and_check_reads_it_back(tmp_path: Path) -> None:
    cluster = make_cluster(B200, 16, 8)
    lay = ParallelLayout(tp=2, pp=4, dp=2, mbs=1, recompute="selective", sequence_parallel=True,
                         distributed_optimizer=True, tp_comm_overlap=True)
    training = TrainingSpec(seq_len=8192, global_batch_size=64, tp_comm_overlap_cfg=FP8_B200.replace("fp8", "bf16"))
    words = argv(megatron_args(LLAMA, lay, training), resolve=False)
    assert words[words.index("--tp-comm-overlap-cfg") + 1] == "${LAUNCH_DIR:-.}/tp_comm_overlap_cfg.yaml"
    assert "--tp-comm-overlap-cfg" not in argv(megatron_args(LLAMA, lay, replace(training, tp_comm_overlap_cfg="")))
    files = render_files(LaunchSpec(model=LLAMA, cluster=cluster, training=training, layout=lay), ["torchrun"])
    assert yaml.safe_load(files["tp_comm_overlap_cfg.yaml"]) == packaged()[training.tp_comm_overlap_cfg]
    assert "tp_comm_overlap_cfg.yaml" in json.loads(files["manifest.json"])["files"]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    parsed = parse_file(tmp_path / "torchrun.sh")
    assert resolve(parsed.flags.training_fields["tp_comm_overlap_cfg"]) == packaged()[training.tp_comm_overlap_cfg]
    plain = render_files(LaunchSpec(model=LLAMA, cluster=cluster, training=replace(training, tp_comm_overlap_cfg=""),
                                    layout=lay), ["torchrun"])
    assert "tp_comm_overlap_cfg.yaml" not in plain


def test_knob_takes_a_name() -> None:
    from paraplan.cli.options import knob_fields

    assert knob_fields([f"tp-comm-overlap-cfg={BF16_H100}"], "bf16") == {"tp_comm_overlap_cfg": BF16_H100}
    with pytest.raises(SpecError, match="no such file"):
        knob_fields(["tp-comm-overlap-cfg=userbuffers_nope"], "bf16")


def test_bridge_target_takes_only_the_recipes_own_config() -> None:
    from paraplan.launch.bridge import bridge_files, check_ub_cfg, choose_recipe
    from paraplan.recipes.catalogue import bridge_recipes

    model = load_model("llama3.1-405b")
    cluster = make_cluster(load_gpu("gb200"), 128, 4)
    lay = ParallelLayout(tp=4, pp=8, vp=8, cp=2, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                         distributed_optimizer=True, tp_comm_overlap=True)
    spec = LaunchSpec(model=model, cluster=cluster, layout=lay,
                      training=TrainingSpec(seq_len=8192, global_batch_size=64))
    recipe = choose_recipe(spec)
    own = next(r.get("tp_comm_overlap_cfg") for r in bridge_recipes()
               if r.get("source") == f"src/{recipe.module.replace('.', '/')}.py:{recipe.function}")
    assert own in packaged()
    check_ub_cfg(replace(spec, training=replace(spec.training, tp_comm_overlap_cfg=str(own))), recipe)
    other = replace(spec, training=replace(spec.training, tp_comm_overlap_cfg=BF16_H100))
    with pytest.raises(SpecError, match=r"--target bridge: tp_comm_overlap_cfg .* cannot be set"):
        bridge_files(other, "x")


def test_a_named_config_in_a_megatron_lm_script_is_a_broken_rule() -> None:
    """Review finding (session 8): Megatron-LM opens --tp-comm-overlap-cfg as a file on every rank at start-up
    (training/initialize.py _initialize_tp_communicators), so a Megatron-Bridge config name there fails; --knob takes
    the name (launch writes the YAML)."""
    from paraplan.specs.megatron_flags import memory_knobs_from_words

    got = read_flags([*FLAGS, "--tp-comm-overlap-cfg", BF16_H100])
    assert [code for code, _ in got.problems if code == "TP_COMM_OVERLAP_CFG_NOT_A_FILE"]
    knob = memory_knobs_from_words([f"--tp-comm-overlap-cfg={BF16_H100}"], "bf16")
    assert knob["tp_comm_overlap_cfg"] == BF16_H100
