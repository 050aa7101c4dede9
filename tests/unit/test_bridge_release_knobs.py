"""benchmarks/bridge_release_knobs.py: per Megatron-Bridge release, the settings of each performance config."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
brk = pytest.importorskip("bridge_release_knobs")

MIRROR = os.environ.get("BRIDGE_MIRROR", "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
NEEDS_MIRROR = pytest.mark.skipif(not Path(MIRROR).is_dir() or not (ROOT.parent / "shared" / "reference").is_dir(),
                                  reason="no Megatron-Bridge mirror (BRIDGE_MIRROR) or ../shared/reference")

WORKLOAD = '''
from dataclasses import replace
BASE = WorkloadBaseConfig(num_gpus=64, global_batch_size=128)
LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V1 = replace(BASE, micro_batch_size=2, use_megatron_fsdp=True,
                                                     cpu_offloading_num_layers=40)
LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V1 = LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V1
X = replace(LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V1, recompute_num_layers=SOME_NAME)
'''


def test_workload_configs_inherit_through_replace_and_take_the_class_defaults() -> None:
    env = brk.workload_configs(WORKLOAD, {"micro_batch_size": 1, "tensor_model_parallel_size": 1,
                                          "cpu_offloading_num_layers": None})
    c = env["LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V1"]
    assert (c["num_gpus"], c["global_batch_size"], c["micro_batch_size"]) == (64, 128, 2)
    assert c["use_megatron_fsdp"] is True and c["cpu_offloading_num_layers"] == 40
    assert c["tensor_model_parallel_size"] == 1  # the class default
    assert env["LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V1"] == c  # a plain alias
    assert env["X"]["recompute_num_layers"] == "?"  # a name, not a literal: unknown
    assert env["BASE"]["micro_batch_size"] == 1


def test_config_names_of_both_naming_schemes() -> None:
    m = brk._NAME.match("QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2")
    assert m and (m["model"], m["task"], m["gpu"], m["prec"], m["variant"]) == \
        ("QWEN3_235B_A22B", "PRETRAIN", "H100", "FP8_CS", "V2")
    m = brk._NAME_V02.match("LLAMA3_70B_GB200_FP8_MX_BASE_CONFIG")
    assert m and (m["model"], m["gpu"], m["prec"], m["task"]) == ("LLAMA3_70B", "GB200", "FP8_MX", None)
    m = brk._NAME_V02.match("LLAMA3_70B_GB200_SFT_BF16_BASE_CONFIG")
    assert m and m["task"] == "SFT"


def test_common_assignments_are_the_unconditional_literal_ones() -> None:
    text = '''
def set_llama3_common_configs(cfg):
    cfg.mixed_precision.grad_reduce_in_fp32 = False
    cfg.model.recompute_granularity = "selective"
    cfg.model.moe_router_dtype = some_value()
    if cfg.ddp.use_megatron_fsdp:
        cfg.ddp.fsdp_double_buffer = True
        cfg.model.moe_permute_fusion = True
def llama3_70b_pretrain_config_h100(cfg):
    cfg.model.cuda_graph_impl = "local"
'''
    assert brk.common_assignments(text) == {"grad_reduce_in_fp32": False, "recompute_granularity": "selective",
                                            "moe_router_dtype": "?"}


def test_apply_workload_as_set_workload_base_configs() -> None:
    harness = 'delay_wgrad_compute = True\nmoe_shared_expert_overlap = False\nmoe_hybridep_num_sms = 32\n' \
              'moe_token_dispatcher_type = "alltoall"\ncross_entropy_fusion_impl = "te"'
    s = brk.apply_workload({"moe_a2a_overlap": True, "moe_flex_dispatcher_backend": "hybridep",
                            "recompute_num_layers": 5, "cpu_offloading_num_layers": 0,
                            "cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "attn"},
                           "gb200", True, harness, "26.06")
    assert s["moe_a2a_overlap"] is True and s["delay_wgrad_compute"] is True
    assert s["moe_shared_expert_overlap"] is False
    assert (s["moe_token_dispatcher_type"], s["moe_flex_dispatcher_backend"], s["moe_hybridep_num_sms"]) == \
        ("flex", "hybridep", 32)
    assert (s["recompute_granularity"], s["recompute_method"], s["recompute_num_layers"]) == ("full", "block", 5)
    assert "cpu_offloading" not in s  # 0 layers: no offload
    assert s["cuda_graph_scope"] == ["attn"] and s["cross_entropy_fusion_impl"] == "te"
    # no backend on a MoE model: alltoall (where the release's harness says so)
    assert brk.apply_workload({}, "h100", True, harness, "26.04")["moe_token_dispatcher_type"] == "alltoall"
    assert "moe_token_dispatcher_type" not in brk.apply_workload({}, "h100", True, "", "26.04")
    assert "moe_token_dispatcher_type" not in brk.apply_workload({}, "h100", False, harness, "26.04")


def test_deepep_where_it_cannot_run_leaves_the_dispatcher_unknown() -> None:
    harness = 'moe_token_dispatcher_type = "alltoall"'
    assert brk.apply_workload({"moe_flex_dispatcher_backend": "deepep"}, "h100", True, harness, "26.04")[
        "moe_flex_dispatcher_backend"] == "deepep"
    for gpu, container in (("gb200", "26.04"), ("gb300", "26.06"), ("h100", "26.02")):
        s = brk.apply_workload({"moe_flex_dispatcher_backend": "deepep"}, gpu, True, harness, container)
        assert "moe_token_dispatcher_type" not in s and "moe_flex_dispatcher_backend" not in s


def test_harness_precision_edits_follow_the_branch() -> None:
    func = ast.parse('''
def get_precision_config(compute_dtype):
    if compute_dtype == "fp8_cs":
        c = bf16_with_fp8_current_scaling_mixed()
        c.first_last_layers_bf16 = False
        return c
    elif compute_dtype == "fp8_mx":
        return bf16_with_mxfp8_mixed()
''').body[0]
    out: dict[str, dict[str, object]] = {p: {"first_last_layers_bf16": True} for p in brk.PRESETS}
    assert isinstance(func, ast.FunctionDef)
    brk._harness_edits(func.body, None, out)
    assert out["fp8_cs"]["first_last_layers_bf16"] is False and out["fp8_mx"]["first_last_layers_bf16"] is True


def test_committed_data_lists_every_release_and_every_column_once() -> None:
    data = brk.load()
    assert [(r["container"], r["tag"]) for r in data["releases"]] == [(c, t) for c, t, _ in brk.RELEASES]
    for c in data["configs"]:
        read = {k for k, v in c["settings"].items() if v != "?"}
        assert read | set(c["unknown"]) == set(brk.COLUMNS) and not read & set(c["unknown"])
        assert c["container"] in {r[0] for r in brk.RELEASES}
        assert c["model"] in brk.MODELS and c["gpu"] in brk.GPUS


@NEEDS_MIRROR
def test_committed_data_is_what_the_mirror_gives() -> None:
    assert brk.dumps(brk.extract(MIRROR)) == brk.OUT.read_text()


@NEEDS_MIRROR
def test_deepseek_gb300_fp8_mx_gained_the_a2a_overlap_in_v0_5_0() -> None:
    # deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V1: v0.4.0 sets no moe_a2a_overlap;
    # v0.5.0 sets moe_a2a_overlap=True, cuda_graph_impl="full_iteration", fp8_dot_product_attention=True
    data = json.loads(brk.OUT.read_text())
    by = {(c["tag"], c["name"]): c["settings"] for c in data["configs"]}
    old = by[("v0.4.0", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V1")]
    new = by[("v0.5.0", "DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V1")]
    assert "moe_a2a_overlap" not in old and old.get("cuda_graph_impl") != "full_iteration"
    assert new["moe_a2a_overlap"] is True and new["delay_wgrad_compute"] is True
    assert new["cuda_graph_impl"] == "full_iteration" and new["fp8_dot_product_attention"] is True


def test_main_without_a_mirror_skips(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BRIDGE_MIRROR", "/nonexistent/mirror")
    assert brk.main() == 0
    assert "skipped" in capsys.readouterr().out


HARNESS = '''
def llama3_70b_pretrain_config_gb200(precision: str = "bf16", mock: bool = True) -> ConfigContainer:
    if precision == "bf16":
        comm_overlap_cfg = userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192
    else:
        comm_overlap_cfg = userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192
    cfg = llama3_70b_pretrain_config()
    if cfg.ddp.use_megatron_fsdp:
        cfg.ddp.fsdp_double_buffer = True
    cfg.comm_overlap.tp_comm_overlap_cfg = comm_overlap_cfg
    cfg.comm_overlap.tp_comm_overlap = False if precision == "nvfp4" else cfg.comm_overlap.tp_comm_overlap
    return cfg


def qwen3_235b_a22b_pretrain_config_h100(precision: str = "bf16") -> ConfigContainer:
    cfg = qwen3_235b_a22b_pretrain_config(comm_overlap_config=CommOverlapConfig(tp_comm_overlap=True))
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=bool(cfg.model.tensor_model_parallel_size > 1))
    return cfg


def deepseek_v3_pretrain_config_b200(precision: str = "bf16") -> ConfigContainer:
    cfg = pretrain_config()
    if cfg.model.tensor_model_parallel_size > 1:
        cfg.comm_overlap.tp_comm_overlap = True
    return cfg
'''
RECIPES = {"llama3_70b_pretrain_config": "def llama3_70b_pretrain_config():\n    cfg.comm_overlap = "
                                         "CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=UB_H100)\n",
           "qwen3_235b_a22b_pretrain_config": "def qwen3_235b_a22b_pretrain_config(): pass\n",
           "pretrain_config": "def pretrain_config():\n    cfg.comm_overlap = "
                              "CommOverlapConfig(tp_comm_overlap=False)\n"}


@pytest.mark.parametrize(("model", "gpu", "prec", "tp", "want"), [
    ("llama3_70b", "gb200", "bf16", 2,
     {"tp_comm_overlap": True, "tp_comm_overlap_cfg": "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192"}),
    ("llama3_70b", "gb200", "fp8_cs", 2,
     {"tp_comm_overlap": True, "tp_comm_overlap_cfg": "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192"}),
    ("llama3_70b", "gb200", "nvfp4", 2,
     {"tp_comm_overlap": False, "tp_comm_overlap_cfg": "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192"}),
    ("qwen3_235b_a22b", "h100", "bf16", 2, {"tp_comm_overlap": True, "tp_comm_overlap_cfg": ""}),  # tp>1 at TP 2
    ("qwen3_235b_a22b", "h100", "bf16", 1, {"tp_comm_overlap": False, "tp_comm_overlap_cfg": ""}),
    ("deepseek_v3", "b200", "bf16", 2, {}),  # a branch on the model's TP touches it: unknown
    ("llama3_8b", "gb200", "bf16", 1, {}),  # no harness function
])
def test_harness_userbuffers_per_config(model: str, gpu: str, prec: str, tp: int, want: dict[str, object]) -> None:
    funcs = {n.name: n for n in ast.parse(HARNESS).body if isinstance(n, ast.FunctionDef)}
    assert brk.workload_comm_overlap(funcs, RECIPES, model, gpu, prec, tp) == want


def test_yaml_release_userbuffers_from_the_recipe_and_the_map() -> None:
    table = {"llama3_70b": {"tp_comm_overlap": True, "tp_comm_overlap_cfg": "UB_H100"},
             "map": {"llama3_70b": {"gb200": {"bf16": "UB_B200_BF16", "fp8": "UB_B200_FP8"}}}}
    assert brk.yaml_config_comm_overlap(table, "llama3_70b", "gb200", "fp8_cs", 2) == {
        "tp_comm_overlap": True, "tp_comm_overlap_cfg": "UB_B200_FP8"}
    assert brk.yaml_config_comm_overlap(table, "llama3_70b", "h100", "bf16", 4) == {
        "tp_comm_overlap": True, "tp_comm_overlap_cfg": "UB_H100"}
    assert brk.yaml_config_comm_overlap(table, "llama3_8b", "h100", "bf16", 1) == {}


@NEEDS_MIRROR
def test_release_userbuffers_as_the_harness_sets_them() -> None:
    # v0.4.0 scripts/performance/configs/llama/llama3_llm_pretrain.py llama3_70b_pretrain_config_gb200: the bf16 /
    # fp8 userbuffers config, tp_comm_overlap off for nvfp4; qwen3_llm_pretrain.py's H100 235B: CommOverlapConfig(False)
    data = json.loads(brk.OUT.read_text())
    by = {(c["tag"], c["name"]): c["settings"] for c in data["configs"]}
    bf16 = by[("v0.4.0", "LLAMA3_70B_PRETRAIN_CONFIG_GB200_BF16_V1")]
    assert bf16["tp_comm_overlap"] is True
    assert bf16["tp_comm_overlap_cfg"] == "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192"
    assert by[("v0.4.0", "LLAMA3_70B_PRETRAIN_CONFIG_GB200_NVFP4_V1")]["tp_comm_overlap"] is False
    assert by[("v0.4.0", "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_BF16_V1")]["tp_comm_overlap"] is False
    rc3 = by[("v0.1.0rc3", "llama31_405b:h100:num_gpus_1024:fp8_cs")]  # helpers.py COMM_OVERLAP_CONFIG_MAP
    assert rc3["tp_comm_overlap_cfg"] == "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192"


def test_rows_run_their_release_configs_userbuffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """attach_recipe_knobs: a release config's tp_comm_overlap replaces the row's default (with SP, as Bridge needs
    it), and its named config goes into the knobs; a config that leaves it unread keeps the row's."""
    import published_cases as pc

    def case(i: int, ub: bool) -> object:
        return pc.Case(id=f"published:{i:04d}", source="Megatron-Bridge", label="Llama-3 70B", model={}, gpu="gb200",
                       num_gpus=64, gpus_per_node=None, seq_len=8192, gbs=128, precision="bf16",
                       target_tokens_per_s_per_gpu=1.0, moe=False,
                       layout={"tp": 2, "pp": 4, "cp": 1, "vp": 5, "ep": 1, "mbs": 1, "sequence_parallel": True,
                               "tp_comm_overlap": ub})
    name = "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192"
    configs = {1: {"tp_comm_overlap": True, "tp_comm_overlap_cfg": name}, 2: {"tp_comm_overlap": False},
               3: {"tp_comm_overlap": "?"}}
    monkeypatch.setattr(pc, "release_config_matches", lambda: [
        pc.ReleaseMatch(row=i, label="", container="26.04", tag="v0.4.0",
                        config={"name": f"C{i}", "tag": "v0.4.0", "precision": "bf16", "settings": s})
        for i, s in configs.items()])
    cases = [case(1, False), case(2, True), case(3, True)]
    pc.attach_recipe_knobs(cases)  # type: ignore[arg-type]
    got = [(c.layout["tp_comm_overlap"], c.knobs.get("tp_comm_overlap_cfg"))  # type: ignore[attr-defined]
           for c in cases]
    assert got == [(True, name), (False, None), (True, None)]


TWO_MODELS = '''
def set_deepseek_v3_common_configs(cfg):
    cfg.model.recompute_granularity = "selective"
def set_deepseek_v4_pro_common_configs(cfg):
    cfg.model.cross_entropy_fusion_impl = "native"
    cfg.mixed_precision.fp8_param_gather = True
    cfg.ddp.grad_reduce_in_fp32 = False
def deepseek_v3_pretrain_config_gb200(precision="bf16"):
    cfg = pretrain_config()
    set_deepseek_v3_common_configs(cfg)
    set_workload_base_configs(cfg, base_cfg)
    return cfg
'''


def test_common_settings_are_only_those_of_the_functions_the_config_calls() -> None:
    # v0.5.1 deepseek_llm_pretrain.py holds DeepSeek-V4-Pro's common settings beside DeepSeek-V3's; a V3 config
    # calls only set_deepseek_v3_common_configs
    func = next(n for n in ast.parse(TWO_MODELS).body if isinstance(n, ast.FunctionDef)
                and n.name == "deepseek_v3_pretrain_config_gb200")
    called = brk.called_common_functions(func)
    assert called == {"set_deepseek_v3_common_configs"}
    assert brk.common_assignments(TWO_MODELS, "deepseek_v3", called) == {"recompute_granularity": "selective"}
    # without the call graph: the functions whose name part the model starts with (deepseek_v3, not deepseek_v4_pro)
    assert brk.common_assignments(TWO_MODELS, "deepseek_v3") == {"recompute_granularity": "selective"}
    assert brk.common_assignments(TWO_MODELS)["cross_entropy_fusion_impl"] == "native"  # every function


QWEN_HARNESS = '''
def qwen3_235b_a22b_pretrain_config_h100(precision="bf16"):
    cfg = qwen3_235b_a22b_pretrain_config()
    cfg.model.moe_flex_dispatcher_backend = base_cfg.moe_flex_dispatcher_backend
    cfg.model.moe_token_dispatcher_type = "alltoall"
    set_qwen3_common_configs(cfg)
    set_workload_base_configs(cfg, base_cfg)
    cfg.mixed_precision.fp4_param_gather = False
    if cfg.ddp.use_megatron_fsdp:
        cfg.ddp.nccl_ub = True
    return cfg
'''


def test_harness_dispatcher_wins_where_the_workload_leaves_the_dispatcher() -> None:
    # v0.3.1: set_workload_base_configs does not touch the dispatcher, so the harness function's "alltoall" (set after
    # the recipe applied its flex backend) runs, whatever backend the workload names; from v0.4.0 the workload's
    # apply_flex_dispatcher_backend call comes last and its backend wins
    func = ast.parse(QWEN_HARNESS).body[0]
    assert isinstance(func, ast.FunctionDef)
    assert brk.harness_dispatcher(func) == "alltoall" and brk.harness_dispatcher(None) is None
    f = {"moe_flex_dispatcher_backend": "deepep"}
    old = brk.apply_workload(f, "h100", True, "", "26.02.01", "alltoall")
    assert old["moe_token_dispatcher_type"] == "alltoall" and "moe_flex_dispatcher_backend" not in old
    new = brk.apply_workload(f, "h100", True, brk.WORKLOAD_APPLIES_FLEX, "26.04", "alltoall")
    assert (new["moe_token_dispatcher_type"], new["moe_flex_dispatcher_backend"]) == ("flex", "deepep")
    flex = brk.apply_workload({"moe_flex_dispatcher_backend": "hybridep"}, "gb200", True, "", "26.02.01", "flex")
    assert (flex["moe_token_dispatcher_type"], flex["moe_flex_dispatcher_backend"]) == ("flex", "hybridep")


def test_harness_overrides_after_the_workload_win() -> None:
    func = ast.parse(QWEN_HARNESS).body[0]
    assert isinstance(func, ast.FunctionDef)
    # the dispatcher line comes before set_workload_base_configs, nccl_ub only under a branch: neither
    assert brk.harness_overrides(func) == {"fp4_param_gather": False}
    assert brk.harness_overrides(None) == {}


@NEEDS_MIRROR
def test_qwen3_235b_h100_ran_alltoall_in_26_02_01() -> None:
    # v0.3.1 qwen3_workload_base_configs.py BASE_QWEN3_235B_A22B_CONFIG: moe_flex_dispatcher_backend="deepep";
    # qwen3_llm_pretrain.py qwen3_235b_a22b_pretrain_config_h100: cfg.model.moe_token_dispatcher_type = "alltoall";
    # overrides.py set_workload_base_configs (v0.3.1) calls no apply_flex_dispatcher_backend
    data = json.loads(brk.OUT.read_text())
    by = {(c["tag"], c["name"]): c["settings"] for c in data["configs"]}
    s = by[("v0.3.1", "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2")]
    assert s["moe_token_dispatcher_type"] == "alltoall" and "moe_flex_dispatcher_backend" not in s
    gb = by[("v0.3.1", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2")]  # its harness function says "flex"
    assert (gb["moe_token_dispatcher_type"], gb["moe_flex_dispatcher_backend"]) == ("flex", "hybridep")
    git = brk.Git(MIRROR)
    text = git.show("v0.5.1", "scripts/performance/configs/deepseek/deepseek_llm_pretrain.py") or ""
    func = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)
                and n.name == "deepseek_v3_pretrain_config_gb200")
    common = brk.common_assignments(text, "deepseek_v3", brk.called_common_functions(func))
    assert "cross_entropy_fusion_impl" not in common and "fp8_param_gather" not in common  # V4-Pro's
    assert "native" in str(brk.common_assignments(text))  # what merging every function gave


RECIPE = '''
def qwen3_30b_a3b_pretrain_config(**kw):
    return _common(**kw)
def _common(**kw):
    cfg = make()
    cfg.model.moe_permute_fusion = False
    _tune(cfg)
    return cfg
def _tune(cfg):
    cfg.model.moe_permute_fusion = True
def other_pretrain_config():
    cfg.model.moe_permute_fusion = False
'''
PROVIDERS = '''
class GPTModelProvider:
    moe_permute_fusion: bool = False
class Base(GPTModelProvider):
    moe_permute_fusion: bool = is_te_min_version("2.1.0") if HAVE_TE else False
class Sized(Base):
    num_layers: int = 48
class Plain(GPTModelProvider):
    num_layers: int = 2
class Unset:
    num_layers: int = 2
'''


def test_recipe_permute_fusion_follows_the_functions_the_recipe_calls() -> None:
    assert brk.recipe_permute_fusion(RECIPE, "qwen3_30b_a3b_pretrain_config") is True  # the last one set
    assert brk.recipe_permute_fusion(RECIPE, "other_pretrain_config") is False
    assert brk.recipe_permute_fusion("def f():\n    cfg.model.seq_length = 4\n", "f") is None


def test_provider_permute_fusion_through_the_base_classes() -> None:
    classes = {n.name: n for n in ast.parse(PROVIDERS).body if isinstance(n, ast.ClassDef)}
    assert brk.provider_permute_fusion(classes, ("Missing", "Sized")) is True  # TE >= 2.1 in every container
    assert brk.provider_permute_fusion(classes, ("Plain",)) is False
    assert brk.provider_permute_fusion(classes, ("Unset",)) is None
    assert brk.provider_permute_fusion(classes, ("Missing",)) is None


def test_permute_default_only_where_the_config_leaves_it() -> None:
    defaults = {"qwen3_30b_a3b": True}
    assert brk.with_permute_default({"moe_permute_fusion": False}, "qwen3_30b_a3b", defaults) == {
        "moe_permute_fusion": False}
    assert brk.with_permute_default({}, "qwen3_30b_a3b", defaults) == {"moe_permute_fusion": True}
    assert brk.with_permute_default({}, "llama3_70b", defaults) == {}


@NEEDS_MIRROR
def test_models_run_their_provider_s_permute_fusion_per_release() -> None:
    git = brk.Git(MIRROR)
    # v0.1.0rc3: Qwen3MoEModelProvider (models/qwen/qwen_provider.py) True, DeepSeek's recipe True; no gpt-oss yet
    rc3 = brk.model_permute_fusion(git, "v0.1.0rc3")
    assert rc3["qwen3_235b_a22b"] is True and rc3["deepseek_v3"] is True and rc3["gpt_oss_120b"] is None
    # v0.2.0: the AutoBridge providers, GPTOSSProvider (models/gpt_oss/gpt_oss_provider.py) True
    assert brk.model_permute_fusion(git, "v0.2.0")["gpt_oss_120b"] is True
    # v0.5.1: the recipes set it (recipes/gpt_oss/gpt_oss.py, recipes/kimi/kimi_k2.py)
    assert set(brk.model_permute_fusion(git, "v0.5.1").values()) == {True}
    data = brk.load()
    qwen = [c for c in data["configs"] if c["container"] == "25.09" and c["model"].startswith("qwen3")]
    assert qwen and all(c["settings"]["moe_permute_fusion"] is True for c in qwen)
    dense = [c for c in data["configs"] if c["model"].startswith("llama")]
    assert dense and all("moe_permute_fusion" not in c["settings"] for c in dense)
