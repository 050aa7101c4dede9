"""--target bridge: bridge_recipe.py (a Megatron-Bridge recipe with paraplan's layout) and bridge_overrides.txt.

Always: the recipe choice (performance recipe table, else the base recipe), the values, that the Python file
holds only literals in its tables and compiles, and the override list. Optional (MEGATRON_BRIDGE = a
Megatron-Bridge source checkout, MEGATRON_LM = Megatron-LM's, or Bridge's 3rdparty/Megatron-LM): every override
key is a field of Bridge's config dataclasses (read with ``ast`` from the sources, nothing imported or copied),
and every recipe function paraplan can name exists there.
"""

from __future__ import annotations

import ast
import csv
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from paraplan.errors import SpecError
from paraplan.launch.bridge import (
    BASE_RECIPES,
    RUNTIME_FIELDS,
    EnvValue,
    Recipe,
    choose_recipe,
    overrides,
    perf_table,
)
from paraplan.launch.render import render_files

from .cases import llama70b_spec
from .matrix import NAMES, plan_spec

SHARED_CSV = Path(__file__).parents[2].parent / "shared/reference/bridge_perf_recipes.csv"


def literal_tables(source: str) -> dict[str, Any]:
    """The module-level constant assignments of bridge_recipe.py, each of which must be a literal."""
    tree = ast.parse(source)
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
            if node.targets[0].id == "CHECKPOINT_DIR":
                continue
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def test_perf_recipe_is_chosen_for_model_gpu_and_precision() -> None:
    recipe = choose_recipe(plan_spec("deepseek-v3-gb200-fp8"))
    assert recipe == Recipe("megatron.bridge.perf_recipes.deepseek.gb200.deepseek_v3",
                            "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config", "perf")
    recipe = choose_recipe(plan_spec("llama3-70b-tp4-pp4-vp5-cp2"))  # h100 bf16: the 64-GPU recipe
    assert recipe.kind == "perf" and recipe.function == "llama3_70b_pretrain_64gpu_h100_bf16_config"


def test_base_recipe_when_no_perf_recipe_and_error_when_none() -> None:
    recipe = choose_recipe(plan_spec("llama2-7b-a100-tp2"))
    assert recipe == Recipe("megatron.bridge.recipes.llama", "llama2_7b_pretrain_config", "base")
    with pytest.raises(SpecError, match="--target bridge: Megatron-Bridge has no recipe for model 'gpt2'"):
        render_files(plan_spec("gpt2-dp8"), ["bridge"])
    files = render_files(plan_spec("gpt2-dp8"), ["all"])  # all: the targets the model has
    assert "bridge_recipe.py" not in files and "skipped_targets" in files["manifest.json"]


def test_a_model_named_like_a_preset_with_another_architecture_gets_no_bridge_recipe() -> None:
    from dataclasses import replace

    spec = plan_spec("llama3-70b-tp4-pp4-vp5-cp2")
    tiny = replace(spec, model=replace(spec.model, num_layers=2, hidden_size=256))
    with pytest.raises(SpecError, match=r"^--target bridge: model 'llama3-70b' differs from the llama3-70b preset "
                                        r"that Bridge's recipe builds: num_layers 2 \(preset 80\), hidden_size 256"):
        render_files(tiny, ["bridge"])
    files = render_files(tiny, ["all"])  # all: skipped with the reason, the other targets written
    assert "bridge_recipe.py" not in files and "differs from the llama3-70b preset" in files["manifest.json"]
    assert "bridge_recipe.py" in render_files(spec, ["bridge"])  # the preset itself still gets its recipe


def test_overrides_carry_the_layout() -> None:
    spec = plan_spec("deepseek-v3-custom-layout")
    items = dict(overrides(spec, choose_recipe(spec)))
    assert items["model.pipeline_model_parallel_size"] == 8 and items["model.virtual_pipeline_model_parallel_size"] == 2
    assert items["model.expert_model_parallel_size"] == 64 and items["model.expert_tensor_parallel_size"] == 1
    layout = items["model.pipeline_model_parallel_layout"]
    assert isinstance(layout, str) and layout.startswith("Etttt|") and layout.endswith("|tmL")
    assert items["train.global_batch_size"] == 1024 and items["dataset.seq_length"] == 4096
    fsdp = plan_spec("llama3-8b-fsdp")
    items = dict(overrides(fsdp, choose_recipe(fsdp)))
    assert items["ddp.use_megatron_fsdp"] is True and items["ddp.use_distributed_optimizer"] is True
    assert items["ddp.data_parallel_sharding_strategy"] == "optim_grads_params"
    # gradient-accumulation fusion stays Bridge's default (on) under Megatron-FSDP unless the plan's knob turns it off
    assert items["model.gradient_accumulation_fusion"] is True and items["checkpoint.ckpt_format"] == "fsdp_dtensor"
    unfused = replace(fsdp, training=replace(fsdp.training, gradient_accumulation_fusion=False))
    assert dict(overrides(unfused, choose_recipe(unfused)))["model.gradient_accumulation_fusion"] is False
    base = plan_spec("llama2-7b-a100-tp2")
    assert dict(overrides(base, choose_recipe(base)))["mixed_precision"] == "bf16_mixed"


def test_recipe_file_is_literals_and_compiles() -> None:
    spec = plan_spec("llama3-70b-tp8-overlap")
    files = render_files(spec, ["bridge"])
    source = files["bridge_recipe.py"]
    compile(source, "bridge_recipe.py", "exec")
    tables = literal_tables(source)
    items = dict(overrides(spec, choose_recipe(spec)))
    assert tables["OVERRIDES"] == {k: v for k, v in items.items() if not isinstance(v, EnvValue)}
    assert tables["ENV_OVERRIDES"] == {k: (v.env, v.default) for k, v in items.items() if isinstance(v, EnvValue)}
    assert tables["TP_COMM_OVERLAP"] is True and tables["ENV"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    imports = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom)]
    assert imports[0].module == "megatron.bridge.perf_recipes.llama.h100.llama3"
    lines = files["bridge_overrides.txt"].splitlines()
    body = [line for line in lines if not line.startswith("#")]
    assert "model.tensor_model_parallel_size=8" in body and "model.tp_comm_overlap=true" in body
    assert "model.virtual_pipeline_model_parallel_size=null" in body
    assert len(body) == len(items) + 1  # + dataset.blend=null before dataset.data_path


def test_shipped_recipe_table_is_the_reference_table() -> None:
    if not SHARED_CSV.is_file():
        pytest.skip("../shared is absent")
    with SHARED_CSV.open(encoding="utf-8") as f:
        ref = [{k: r[k] for k in ("source", "model", "gpu", "num_gpus", "task", "precision", "config_variant")}
               for r in csv.DictReader(f)]
    assert perf_table() == ref


# ---- optional: against Megatron-Bridge's (and Megatron-LM's) source ----

SECTIONS = {"model": ["GPTModelProvider", "MLAModelProvider"], "rng": ["RNGConfig"],
            "mixed_precision": ["MixedPrecisionConfig"], "ddp": ["DistributedDataParallelConfig"],
            "train": ["TrainingConfig"], "dataset": ["GPTDatasetConfig"], "checkpoint": ["CheckpointConfig"],
            "tokenizer": ["TokenizerConfig"], "comm_overlap": ["CommOverlapConfig"], "optimizer": ["OptimizerConfig"],
            "scheduler": ["SchedulerConfig"], "": ["ConfigContainer"]}


def _sources() -> tuple[Path, Path]:
    bridge = os.environ.get("MEGATRON_BRIDGE")
    if not bridge or not (Path(bridge) / "src/megatron/bridge/training/config.py").is_file():
        pytest.skip("MEGATRON_BRIDGE is not set to a Megatron-Bridge checkout")
    mlm = os.environ.get("MEGATRON_LM") or str(Path(bridge) / "3rdparty/Megatron-LM")
    if not (Path(mlm) / "megatron/core/transformer/transformer_config.py").is_file():
        pytest.skip("MEGATRON_LM (Megatron-LM source, for TransformerConfig) is not set")
    return Path(bridge), Path(mlm)


def _python_files(bridge: Path, mlm: Path) -> Iterator[Path]:
    for d in ("src/megatron/bridge/training", "src/megatron/bridge/models"):
        yield from (bridge / d).rglob("*.py")
    for d in ("megatron/core/transformer", "megatron/core/distributed", "megatron/core/datasets",
              "megatron/core/optimizer",
              "megatron/training/config"):
        yield from (mlm / d).rglob("*.py")
    yield mlm / "megatron/core/model_parallel_config.py"


def _classes(bridge: Path, mlm: Path) -> dict[str, tuple[set[str], list[str]]]:
    """class name -> (annotated fields, base names with import aliases resolved)."""
    out: dict[str, tuple[set[str], list[str]]] = {}
    for path in _python_files(bridge, mlm):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        alias = {a.asname: a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names if a.asname}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                          and isinstance(s.target, ast.Name)}
                bases = [alias.get(b.id, b.id) if isinstance(b, ast.Name) else
                         b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
                old = out.get(node.name, (set(), []))
                out[node.name] = (old[0] | fields, old[1] + bases)
    return out


def _fields(name: str, classes: dict[str, tuple[set[str], list[str]]], seen: set[str] | None = None) -> set[str]:
    seen = seen or set()
    if name in seen or name not in classes:
        return set()
    seen.add(name)
    own, bases = classes[name]
    return own.union(*(_fields(b, classes, seen) for b in bases))


def test_every_override_key_is_a_bridge_config_field() -> None:
    bridge, mlm = _sources()
    classes = _classes(bridge, mlm)
    fields = {section: set().union(*(_fields(c, classes) for c in names)) for section, names in SECTIONS.items()}
    assert {"tensor_model_parallel_size", "multi_latent_attention"} <= fields["model"]  # the reader works
    assert "not_a_field" not in fields["model"]
    specs = [plan_spec(name) for name in NAMES]
    keys = {k for spec in specs if spec.model.name in BASE_RECIPES for k, _ in overrides(spec, choose_recipe(spec))}
    keys |= set(RUNTIME_FIELDS)
    keys |= {k for k, _ in overrides(llama70b_spec(), choose_recipe(llama70b_spec()))}
    unfused = plan_spec("llama3-8b-dp8")  # the attention backend, written only when unfused
    unfused = replace(unfused, training=replace(unfused.training, attention_backend="unfused"))
    keys |= {k for k, _ in overrides(unfused, choose_recipe(unfused))}
    missing = []
    for key in sorted(keys):
        section, _, name = key.rpartition(".")
        if name not in fields[section]:
            missing.append(key)
    assert not missing, f"not fields of Bridge's config dataclasses: {missing}"


def test_every_recipe_function_exists_in_bridge() -> None:
    bridge, _ = _sources()
    for module, function in BASE_RECIPES.values():
        package = bridge / "src" / module.replace(".", "/")
        text = "\n".join(p.read_text(encoding="utf-8") for p in package.rglob("*.py"))
        assert f"def {function}(" in text or f" as {function}" in text, f"{module}.{function}"
    for row in perf_table():
        path, _, function = row["source"].partition(":")
        assert f"def {function}(" in (bridge / path).read_text(encoding="utf-8"), row["source"]


def test_cli_all_notes_a_target_the_model_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    args = ["launch", "--model", "gpt2", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "1024", "--gbs", "64"]
    assert main([*args, "--out", str(tmp_path / "all")]) == 0
    assert "note: bridge not written: --target bridge: Megatron-Bridge has no recipe" in capsys.readouterr().out
    assert (tmp_path / "all/trainjob.yaml").exists() and not (tmp_path / "all/bridge_recipe.py").exists()
    assert main([*args, "--target", "bridge", "--out", str(tmp_path / "bridge")]) == 1
    assert not (tmp_path / "bridge").exists()  # nothing written


def test_perf_recipe_launch_trains_the_run_and_saves_checkpoints() -> None:
    # _benchmark_common sets train_iters = 50 and checkpoint.save = load = None; async_save without save is refused
    # by CheckpointConfig.finalize: both files set them, from the same placeholders as the Megatron-LM launch
    spec = plan_spec("deepseek-v3-gb200-fp8")
    assert choose_recipe(spec).kind == "perf"
    files = render_files(spec, ["bridge"])
    body = [line for line in files["bridge_overrides.txt"].splitlines() if not line.startswith("#")]
    assert "train.train_iters='${oc.decode:${oc.env:TRAIN_ITERS,1000}}'" in body
    assert """checkpoint.save='${oc.env:CHECKPOINT_DIR,"checkpoints"}'""" in body
    assert """checkpoint.load='${oc.env:CHECKPOINT_DIR,"checkpoints"}'""" in body
    assert "dataset.data_path='${oc.env:DATA_PATH}'" in body
    assert "tokenizer.tokenizer_model='${oc.env:TOKENIZER_MODEL}'" in body
    assert body.index("dataset.blend=null") == body.index("dataset.data_path='${oc.env:DATA_PATH}'") - 1
    # the plan's (default) knobs are written, not the recipe's: no CUDA graphs, fp32 grad reduce
    assert 'model.cuda_graph_impl="none"' in body and "model.cuda_graph_scope=[]" in body
    assert "optimizer.overlap_param_gather_with_optimizer_step=false" in body
    assert "mixed_precision.grad_reduce_in_fp32=true" in body and "ddp.grad_reduce_in_fp32=true" in body
    # a benchmark-only setting the plan did not model is reset, with the reason in the recipe file
    assert "scheduler.lr_decay_iters=null" in body
    assert "_benchmark_common decays the LR over its 50 iterations" in files["bridge_recipe.py"]
    tables = literal_tables(files["bridge_recipe.py"])
    assert tables["ENV_OVERRIDES"]["train.train_iters"] == ("TRAIN_ITERS", 1000)
    assert tables["ENV_OVERRIDES"]["checkpoint.save"] == ("CHECKPOINT_DIR", "checkpoints")
    base = plan_spec("llama2-7b-a100-tp2")  # a base recipe: no benchmark reset, but the planned knobs
    assert "scheduler.lr_decay_iters" not in dict(overrides(base, choose_recipe(base)))
    assert dict(overrides(base, choose_recipe(base)))["model.cuda_graph_impl"] == "none"
    assert "train.train_iters" in dict(overrides(base, choose_recipe(base)))


def test_async_save_override_comes_with_a_save_directory() -> None:
    from dataclasses import replace

    from paraplan.launch.megatron import CheckpointArgs

    spec = replace(plan_spec("llama3-70b-tp8-overlap"),
                   checkpoint=CheckpointArgs(save_interval_iters=5000, ckpt_format="torch_dist", async_save=True,
                                             reason="test"))
    items = dict(overrides(spec, choose_recipe(spec)))
    assert items["checkpoint.async_save"] is True and isinstance(items["checkpoint.save"], EnvValue)
    assert items["checkpoint.save_interval"] == 1000  # capped at the TRAIN_ITERS default: 5000 is never reached
    assert "SAVE_INTERVAL=5000" in render_files(spec, ["megatron"])["megatron_args.sh"]


def test_mixtral_note_says_which_bridge_modules_were_checked() -> None:
    with pytest.raises(SpecError, match=r"no Mixtral recipe module in megatron\.bridge\.recipes and no Mixtral model "
                       r"provider in megatron\.bridge\.models"):
        choose_recipe(plan_spec("mixtral-8x7b-ep8"))


def test_override_list_parses_and_resolves_as_bridge_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Bridge: parse_hydra_overrides (Hydra's override parser) on an OmegaConf config, then
    # OmegaConf.to_container(resolve=True) (training/utils/omegaconf_utils.py); optional: needs hydra-core
    pytest.importorskip("hydra")
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    spec = plan_spec("deepseek-v3-gb200-fp8")
    text = render_files(spec, ["bridge"])["bridge_overrides.txt"]
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    tree: dict[str, object] = {}
    for line in lines:  # the recipe's config, as a tree of the overridden keys
        section, _, name = line.split("=", 1)[0].rpartition(".")
        (tree.setdefault(section, {}) if section else tree)[name] = None  # type: ignore[index]
    cfg = OmegaConf.create(tree)
    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=OverridesParser.create().parse_overrides(lines), cfg=cfg)
    monkeypatch.setenv("DATA_PATH", "/data/pile_text_document")
    monkeypatch.setenv("TOKENIZER_MODEL", "deepseek-ai/DeepSeek-V3")
    monkeypatch.delenv("TRAIN_ITERS", raising=False)
    monkeypatch.delenv("CHECKPOINT_DIR", raising=False)
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    assert out["train"]["train_iters"] == 1000 and out["checkpoint"]["save"] == "checkpoints"
    assert out["dataset"]["data_path"] == "/data/pile_text_document" and out["dataset"]["blend"] is None
    assert out["model"]["cuda_graph_impl"] == "none" and out["model"]["cuda_graph_scope"] == []
    assert out["model"]["tensor_model_parallel_size"] == dict(overrides(spec, choose_recipe(spec)))[
        "model.tensor_model_parallel_size"]
    monkeypatch.setenv("TRAIN_ITERS", "250000")
    assert OmegaConf.to_container(cfg, resolve=True)["train"]["train_iters"] == 250000  # type: ignore[index]


def _knob_spec(**knobs: object) -> Any:
    from dataclasses import replace

    spec = plan_spec("deepseek-v3-gb200-fp8")
    return replace(spec, training=replace(spec.training, **knobs))


def test_bridge_writes_every_knob_the_plan_estimated() -> None:
    # reviewer A2 / B5: the knobs were reset to Bridge defaults (CUDA graphs off) or not written at all
    spec = _knob_spec(cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn", "moe_router"),
                      grad_reduce_in_bf16=True, moe_token_dispatcher_type="flex",
                      moe_flex_dispatcher_backend="hybridep",
                      moe_permute_fusion=True, fp8_param_gather=True, use_precision_aware_optimizer=True,
                      exp_avg_dtype="bf16", cp_comm_type="a2a", fsdp_double_buffer=True)
    items = dict(overrides(spec, choose_recipe(spec)))
    assert items["model.cuda_graph_impl"] == "transformer_engine"
    assert items["model.cuda_graph_scope"] == ["attn", "moe_router"]
    assert items["model.use_te_rng_tracker"] is True and items["rng.te_rng_tracker"] is True
    assert items["mixed_precision.grad_reduce_in_fp32"] is False and items["ddp.grad_reduce_in_fp32"] is False
    assert items["model.moe_token_dispatcher_type"] == "flex"
    assert items["model.moe_flex_dispatcher_backend"] == "hybridep" and items["model.moe_permute_fusion"] is True
    assert items["mixed_precision.fp8_param_gather"] is True
    assert items["mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"] is True  # gb200 fp8: MXFP8 (config.py)
    assert items["optimizer.use_precision_aware_optimizer"] is True and items["optimizer.exp_avg_dtype"] == "bfloat16"
    assert items["model.cp_comm_type"] == "a2a" and items["ddp.fsdp_double_buffer"] is True
    files = render_files(spec, ["bridge"])
    body = [line for line in files["bridge_overrides.txt"].splitlines() if not line.startswith("#")]
    assert 'model.cuda_graph_impl="transformer_engine"' in body and "model.cuda_graph_scope=[attn,moe_router]" in body
    assert 'optimizer.exp_avg_dtype="bfloat16"' in body
    tables = literal_tables(files["bridge_recipe.py"])
    assert tables["OVERRIDES"]["model.cuda_graph_impl"] == "transformer_engine"
    assert tables["COMM_OVERLAP"]["overlap_param_gather_with_optimizer_step"] is False
    # comm_overlap's setup writes its DP-overlap defaults (True when DP > 1) over ddp: the plan's values go there too
    assert tables["COMM_OVERLAP"]["overlap_grad_reduce"] == items["ddp.overlap_grad_reduce"]


def test_offloading_and_fp4_knobs_are_written() -> None:
    spec = plan_spec("llama3-70b-tp8-overlap")
    from dataclasses import replace

    spec = replace(spec, training=replace(spec.training, fine_grained_activation_offloading=True,
                                          offload_modules=("core_attn",), gradient_accumulation_fusion=False))
    items = dict(overrides(spec, choose_recipe(spec)))
    assert items["model.fine_grained_activation_offloading"] is True and items["model.offload_modules"] == ["core_attn"]
    assert items["model.gradient_accumulation_fusion"] is False
    assert "model.moe_token_dispatcher_type" not in items  # dense model: no MoE fields


def test_fields_the_override_list_cannot_set_are_named() -> None:
    from paraplan.launch.bridge import bridge_overrides_gaps

    base = plan_spec("llama2-7b-a100-tp2")  # base recipe: mixed_precision is the preset name "bf16_mixed"
    assert bridge_overrides_gaps(base) == ["mixed_precision.grad_reduce_in_fp32"]
    files = render_files(base, ["bridge"])
    assert "mixed_precision.grad_reduce_in_fp32" not in [ln.split("=")[0] for ln in
                                                          files["bridge_overrides.txt"].splitlines()]
    assert "Not settable here (bridge_recipe.py sets them): mixed_precision.grad_reduce_in_fp32" in \
        files["bridge_overrides.txt"]
    assert literal_tables(files["bridge_recipe.py"])["OVERRIDES"]["mixed_precision.grad_reduce_in_fp32"] is True
    assert '"bridge_overrides_not_set": [\n    "mixed_precision.grad_reduce_in_fp32"' in files["manifest.json"]
    assert "bridge_overrides_not_set" not in render_files(plan_spec("deepseek-v3-gb200-fp8"), ["bridge"])[
        "manifest.json"]  # a performance recipe: its mixed_precision is a config, every field is settable
    fp8_moments = _knob_spec(use_precision_aware_optimizer=True, exp_avg_dtype="fp8")
    assert bridge_overrides_gaps(fp8_moments) == ["optimizer.exp_avg_dtype"]  # torch.uint8: no Hydra name


def test_cli_note_names_the_fields_the_override_list_cannot_set(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from paraplan.cli import main

    args = ["launch", "--model", "llama2-7b", "--gpu", "a100-80gb", "--num-gpus", "8", "--seq-len", "4096",
            "--gbs", "64", "--target", "bridge", "--out", str(tmp_path / "b")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "note: bridge_overrides.txt cannot set mixed_precision.grad_reduce_in_fp32 (bridge_recipe.py does)" in out
    assert "does not carry the memory knobs" not in out
