"""User recipes (``--recipes FILE``): a CSV with the reference table's header (any subset of its columns that holds
``catalogue.REQUIRED``), or YAML: a list of mappings, or a mapping whose ``recipes`` key holds that list, keyed by
the same column names. Cells are read as the packaged ones (``catalogue.parse_cell``); every row is checked when the
file is read, each error one line naming the file, the row (1 = the first recipe) and the column."""

from __future__ import annotations

import csv
import difflib
import io
import math
import re
from collections.abc import Callable
from functools import cache
from typing import Any, Final

from paraplan.errors import SpecError
from paraplan.recipes.catalogue import (
    MAX_CELL_CHARS,
    MAX_USER_FILE_BYTES,
    MAX_USER_ROWS,
    MODEL_PRESETS,
    REQUIRED,
    Cell,
    Recipe,
    bridge_recipes,
    cell_text,
    columns,
    make_recipe,
    parse_cell,
)


def _check_columns(path: str, names: list[str], where: str) -> None:
    allowed = columns()
    for name in names:
        if name not in allowed:
            near = difflib.get_close_matches(name, allowed, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise SpecError(f"--recipes {path}: {where}unknown column {name!r}{hint}; allowed: the columns of "
                            f"bridge_perf_recipes.csv: {', '.join(allowed)}")
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise SpecError(f"--recipes {path}: {where}missing column(s) {', '.join(missing)} (every recipe gives "
                        f"{', '.join(REQUIRED)})")


def _csv_rows(path: str, text: str) -> list[dict[str, Cell]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise SpecError(f"--recipes {path}: empty file (expected a CSV header or YAML recipes)") from None
    except csv.Error as err:
        raise SpecError(f"--recipes {path}: not a valid CSV header: {err}") from None
    header = [h.strip() for h in header]
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise SpecError(f"--recipes {path}: column {dup!r} appears twice in the header")
    _check_columns(path, header, "")
    rows: list[dict[str, Cell]] = []
    try:
        for values in reader:
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise SpecError(f"--recipes {path}: row {len(rows) + 1}: {len(values)} cells, the header has "
                                f"{len(header)}")
            _limit(path, len(rows) + 1)
            rows.append({c: _cell(path, len(rows) + 1, c, v) for c, v in zip(header, values, strict=True)})
    except csv.Error as err:
        raise SpecError(f"--recipes {path}: row {len(rows) + 1}: not valid CSV: {err}") from None
    return rows


def _limit(path: str, row: int) -> None:
    if row > MAX_USER_ROWS:
        raise SpecError(f"--recipes {path}: more than {MAX_USER_ROWS} recipes")


def _cell(path: str, row: int, column: str, value: Any) -> Cell:
    """A CSV cell or YAML value as a field (strings read as the packaged cells are)."""
    if isinstance(value, str):
        if len(value) > MAX_CELL_CHARS:
            raise SpecError(f"--recipes {path}: row {row}: column {column}: longer than {MAX_CELL_CHARS} characters")
        return parse_cell(value.strip())
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list) and all(isinstance(x, str) and len(x) <= MAX_CELL_CHARS for x in value) \
            and len(value) <= 256:
        return [str(x) for x in value]
    raise SpecError(f"--recipes {path}: row {row}: column {column}: expected a number, True/False, None, text or a "
                    f"list of names, got {type(value).__name__}")


def _yaml_rows(path: str, text: str) -> list[dict[str, Cell]]:
    from paraplan.fileio import load_yaml_text

    # the hardened reader: duplicate keys, deep nesting, alias bombs and control bytes refused in one line
    data = load_yaml_text(text, "--recipes", path)
    if isinstance(data, dict) and set(data) == {"recipes"}:
        data = data["recipes"]
    if not isinstance(data, list):
        raise SpecError(f"--recipes {path}: expected a list of recipes (or a mapping with a 'recipes' list), got "
                        f"{type(data).__name__}")
    rows: list[dict[str, Cell]] = []
    for i, item in enumerate(data, start=1):
        _limit(path, i)
        if not isinstance(item, dict) or not all(isinstance(k, str) for k in item):
            raise SpecError(f"--recipes {path}: row {i}: expected a mapping of column names to values")
        _check_columns(path, list(item), f"row {i}: ")
        rows.append({k: _cell(path, i, k, v) for k, v in item.items()})
    return rows


MEGATRON_RECOMPUTE_MODULES: Final = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                                     "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")
"""The selective recompute modules Megatron-Core accepts (transformer_config.py ``__post_init__``, allowed_modules,
d98e8a6); paraplan recomputes those of ``layout.RECOMPUTE_MODULES`` and notes the others."""
MEGATRON_OPTIMIZERS: Final = ("adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon")
"""``--optimizer`` choices (megatron_lm_flags_main_d98e8a6.tsv); paraplan models Adam and lists the others."""
_ENV_PAIR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[^;]*")
_TRUE_FALSE = "True or False"
_MOE_UNSET = ("", "?")
"""A MoE cell not set (the model's own setting) or not statically resolvable (bridge_perf_recipes.md)."""

Rule = tuple[Callable[[Cell], bool], str]
"""A column's check of a cell, and the allowed values in words."""


def _int_at_least(low: int, *unset: Cell) -> Rule:
    words = f"an integer >= {low}" + "".join(f" or {cell_text(u) if u != '' else 'empty'}" for u in unset)
    return (lambda v: v in unset if not isinstance(v, int) or isinstance(v, bool) else v >= low), words


def _number(low: float, high: float | None, *unset: Cell, above: bool = False) -> Rule:
    def ok(v: Cell) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return v in unset
        return math.isfinite(v) and (v > low if above else v >= low) and (high is None or v <= high)
    span = f"above {low:g}" if above else f"from {low:g} to {high:g}" if high is not None else f">= {low:g}"
    return ok, f"a number {span}" + "".join(f" or {cell_text(u) if u != '' else 'empty'}" for u in unset)


def _one_of(*allowed: Cell) -> Rule:
    return (lambda v: not isinstance(v, list) and any(v == a and type(v) is type(a) for a in allowed),
            "one of " + ", ".join(cell_text(a) if a != "" else "empty" for a in allowed))


def _bools(*unset: Cell) -> Rule:
    return (lambda v: isinstance(v, bool) or (not isinstance(v, list) and v in unset and not isinstance(v, int)),
            _TRUE_FALSE + "".join(f" or {cell_text(u) if u != '' else 'empty'}" for u in unset))


def _names(allowed: tuple[str, ...]) -> Rule:
    return (lambda v: v in (None, "") or (isinstance(v, list) and all(x in allowed for x in v)),
            f"None or a list of {', '.join(allowed)} (e.g. [{allowed[0]}])")


def _text(v: Cell) -> bool:
    return not isinstance(v, list)


def _state_dtypes(v: Cell) -> bool:
    from paraplan.specs.training import DTYPE_CHOICES

    fields = {"main_grads": "main_grads_dtype", "main_params": "main_params_dtype", "exp_avg": "exp_avg_dtype",
              "exp_avg_sq": "exp_avg_sq_dtype"}
    pairs = [p.partition("=") for p in v.split(";")] if isinstance(v, str) else []
    return (sorted(k for k, _, _ in pairs) == sorted(fields)
            and all(eq and x in DTYPE_CHOICES[fields[k]] for k, eq, x in pairs))


@cache
def column_rules() -> dict[str, Rule]:
    """What each column of a user row may hold (every column but those ``_check_row`` checks against the presets):
    the values paraplan reads (``recipes.knobs``), Megatron-LM's choices where paraplan only lists a column, and
    the table's own empty / ``?`` cells where bridge_perf_recipes.md allows them."""
    from paraplan.recipes.knobs import ATTENTION, PRECISIONS, RECOMPUTE, TASKS
    from paraplan.specs.training import CUDA_GRAPH_IMPLS, CUDA_GRAPH_MODULES, DTYPE_CHOICES, OFFLOAD_MODULES

    rules: dict[str, Rule] = {c: (_text, "text") for c in ("family", "config_variant", "notes", "peft",
                                                           "tp_comm_overlap_cfg")}
    rules.update({c: _int_at_least(1) for c in ("num_gpus", "seq_length", "global_batch_size", "micro_batch_size",
                                                "tp", "pp", "cp")})
    rules.update({c: _int_at_least(1, None, "") for c in ("vp", "ep", "etp", "dp", "recompute_num_layers",
                                                          "num_distributed_optimizer_instances",
                                                          "CUDA_DEVICE_MAX_CONNECTIONS")})
    rules.update({c: _int_at_least(0) for c in ("cpu_offloading_num_layers", "manual_gc_interval")})
    rules["mtp_num_layers"] = _int_at_least(0, None, "")
    rules["wgrad_deferral_limit"] = _int_at_least(-1)
    rules["moe_hybridep_num_sms"] = _int_at_least(1, None, *_MOE_UNSET)
    rules["optimizer_offload_fraction"] = _number(0.0, 1.0)
    rules["moe_expert_capacity_factor"] = _number(0.0, None, None, *_MOE_UNSET, above=True)
    rules.update({c: _bools() for c in (
        "sequence_parallel", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
        "cpu_offloading", "cpu_offloading_activations", "cpu_offloading_weights", "optimizer_cpu_offload",
        "fine_grained_activation_offloading", "fp8_param_gather", "fp4_param_gather", "grad_reduce_in_fp32",
        "use_distributed_optimizer", "use_megatron_fsdp", "overlap_grad_reduce", "overlap_param_gather",
        "overlap_param_gather_with_optimizer_step", "tp_comm_overlap", "manual_gc", "use_precision_aware_optimizer",
        "nccl_ub", "fsdp_double_buffer", "defer_embedding_wgrad_compute", "fp8_dot_product_attention",
        "reuse_grad_buf_for_mxfp8_param_ag", "use_transformer_engine_op_fuser", "gradient_accumulation_fusion")})
    rules.update({c: _bools(*_MOE_UNSET) for c in ("moe_a2a_overlap", "delay_wgrad_compute", "moe_permute_fusion",
                                                   "moe_shared_expert_overlap", "moe_paged_stash")})
    rules.update({c: _bools("") for c in ("moe_grouped_gemm", "moe_router_force_load_balancing", "moe_router_fusion")})
    rules["task"] = _one_of(*TASKS)
    rules["precision"] = _one_of(*PRECISIONS)
    rules["recompute_granularity"] = _one_of(*RECOMPUTE)
    rules["recompute_method"] = _one_of(None, "uniform", "block")
    rules["cuda_graph_impl"] = _one_of(*CUDA_GRAPH_IMPLS)
    rules["moe_token_dispatcher_type"] = _one_of(*_MOE_UNSET, "alltoall", "allgather", "flex")
    rules["moe_flex_dispatcher_backend"] = _one_of(*_MOE_UNSET, None, "deepep", "hybridep")
    rules["moe_router_dtype"] = _one_of("", None, "fp32", "fp64", "bf16")
    rules["attention_backend"] = _one_of(*ATTENTION)
    rules["cross_entropy_fusion_impl"] = _one_of("native", "te")
    rules["data_parallel_sharding_strategy"] = _one_of("no_shard", "optim", "optim_grads", "optim_grads_params")
    rules["outer_dp_sharding_strategy"] = _one_of("no_shard", "optim")
    rules["optimizer"] = _one_of(*MEGATRON_OPTIMIZERS)
    rules["recompute_modules"] = _names(MEGATRON_RECOMPUTE_MODULES)
    rules["offload_modules"] = _names(OFFLOAD_MODULES)
    rules["cuda_graph_scope"] = _names((*CUDA_GRAPH_MODULES, "full", "full_iteration"))
    rules["optimizer_state_dtypes"] = (_state_dtypes, "main_grads=X;main_params=X;exp_avg=X;exp_avg_sq=X with "
                                       + "; ".join(f"{k.removesuffix('_dtype')} one of {', '.join(DTYPE_CHOICES[k])}"
                                                   for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                                                             "exp_avg_sq_dtype")))
    rules["other_env"] = (lambda v: v in ("", None) or (isinstance(v, str) and all(
        _ENV_PAIR.fullmatch(p) for p in v.split(";"))), "empty or NAME=VALUE pairs separated by ;")
    rules["PYTORCH_CUDA_ALLOC_CONF"] = (lambda v: v is None or isinstance(v, str),
                                        "PyTorch allocator settings, e.g. expandable_segments:True")
    rules["first_last_layers_bf16"] = (lambda v: isinstance(v, bool) or (isinstance(v, str) and _BF16.fullmatch(v)
                                                                         is not None),
                                       "False, True or True(start=N,end=M)")
    rules["pipeline_model_parallel_layout"] = (lambda v: v is None or isinstance(v, str),
                                               "None or MCore layout notation (E, t, m, L, |, x*n, (...)*n)")
    return rules


_BF16 = re.compile(r"True\(start=\d{1,4},end=\d{1,4}\)")


def _check_cells(r: Recipe) -> None:
    """Every cell the row gives against its column's rule (``column_rules``)."""
    from paraplan.recipes.knobs import bad

    rules = column_rules()
    for column, value in r.fields.items():
        rule = rules.get(column)
        if rule is not None and not rule[0](value):
            raise bad(r, column, rule[1])


def _check_row(path: str, r: Recipe) -> None:
    from paraplan.recipes.knobs import (
        _where,
        layout_fields,
        not_modelled,
        recipe_job,
        recipe_memory_options,
        training_knobs,
    )
    from paraplan.specs.cluster import MAX_NUM_GPUS
    from paraplan.specs.training import TrainingSpec

    if not isinstance(r.fields.get("source"), str) or not r.fields["source"]:
        raise SpecError(f"--recipes {path}: row {r.row}: column source: expected a name (path:function or any "
                        "identifier)")
    if r.model_preset is None:
        from paraplan.recipes.catalogue import _preset_names

        known = sorted(set(MODEL_PRESETS) | _preset_names("models"))
        raise SpecError(f"--recipes {path}: row {r.row}: column model: {r.fields.get('model')!r} has no paraplan "
                        f"preset (allowed: {', '.join(known)})")
    if r.gpu_preset is None:
        from paraplan.recipes.catalogue import GPU_PRESETS, _preset_names

        known = sorted(set(GPU_PRESETS) | _preset_names("gpus"))
        raise SpecError(f"--recipes {path}: row {r.row}: column gpu: {r.fields.get('gpu')!r} has no paraplan preset "
                        f"(allowed: {', '.join(known)})")
    _check_cells(r)
    job = recipe_job(r)
    fields, _ = layout_fields(r)
    model_size = fields["tp"] * fields["pp"] * fields["cp"]
    if job.num_gpus > MAX_NUM_GPUS:
        from paraplan.recipes.knobs import bad

        raise bad(r, "num_gpus", f"at most {MAX_NUM_GPUS:,}")
    if job.num_gpus % model_size:  # the layout's columns do not divide the GPU count: name the first that does not
        from paraplan.recipes.knobs import _where

        left, column = job.num_gpus, "tp"
        for column in ("tp", "pp", "cp"):
            if left % fields[column]:
                break
            left //= fields[column]
        raise SpecError(f"{_where(r)}: column {column}: expected TP x PP x CP ({fields['tp']} x {fields['pp']} x "
                        f"{fields['cp']}) to divide num_gpus {job.num_gpus}, got {fields[column]}")
    dp = r.get("dp")
    if isinstance(dp, int) and dp * fields["tp"] * fields["pp"] * fields["cp"] != job.num_gpus:
        from paraplan.recipes.knobs import bad

        raise bad(r, "dp", f"num_gpus / (TP x PP x CP) = {job.num_gpus} / ({fields['tp']} x {fields['pp']} x "
                           f"{fields['cp']}), or empty")
    dp_size = job.num_gpus // model_size
    if job.gbs % (dp_size * fields["mbs"]):  # Megatron's check (num microbatches calculator), here at read time
        from paraplan.recipes.knobs import bad

        raise bad(r, "global_batch_size", f"a multiple of micro_batch_size x DP = {fields['mbs']} x {dp_size} "
                                          f"(DP = num_gpus / (TP x PP x CP))")
    recipe_memory_options(r)
    knobs = training_knobs(r, job.precision)
    try:  # the knobs together, as estimate --recipe builds them (e.g. a state dtype the optimizer cannot hold)
        TrainingSpec(seq_len=job.seq_len, global_batch_size=job.gbs, precision=job.precision,  # type: ignore[arg-type]
                     attention_backend=job.attention_backend, **knobs)  # type: ignore[arg-type]
    except SpecError as err:
        raise SpecError(f"{_where(r)}: {err}") from None
    not_modelled(r)


def read_user_recipes(path: str) -> list[Recipe]:
    """The recipes of a user file, each checked (SpecError in one line naming the row and column)."""
    from paraplan.fileio import read_input_text

    text = read_input_text(path, "--recipes", max_bytes=MAX_USER_FILE_BYTES)
    is_csv = path.lower().endswith(".csv")
    rows = _csv_rows(path, text) if is_csv else _yaml_rows(path, text)
    out: list[Recipe] = []
    seen: dict[str, Recipe] = {}
    for i, fields in enumerate(rows, start=1):
        r = make_recipe(fields, origin=path, row=i)
        _check_row(path, r)
        for name in dict.fromkeys((r.source, r.alias)):
            if name in seen and name == r.source:
                raise SpecError(f"--recipes {path}: row {i}: source '{name}' names row {seen[name].row} too (sources "
                                "are unique)")
            if name in seen:  # the alias paraplan makes: the user wrote the sources, name those
                raise SpecError(f"--recipes {path}: row {i} (source '{r.source}') is the same job as row "
                                f"{seen[name].row} (source '{seen[name].source}'): model, gpu, precision, num_gpus and "
                                "task alike; a config_variant tells two rows of one job apart")
            seen[name] = r
        out.append(r)
    if not out:
        raise SpecError(f"--recipes {path}: no recipes in the file")
    return out


def catalogue(user_file: str | None = None) -> tuple[Recipe, ...]:
    """The NVIDIA recipes followed by those of ``user_file`` (validated; an identifier or alias already in the
    library is an error naming the row)."""
    base = bridge_recipes()
    if user_file is None:
        return base
    if not user_file:  # an unset shell variable: not "no file"
        raise SpecError("--recipes: an empty file name (give a CSV or YAML file)")
    taken = {r.source for r in base} | {r.alias for r in base}
    out = list(base)
    for r in read_user_recipes(user_file):
        for name in dict.fromkeys((r.source, r.alias)):
            if name in taken:
                raise SpecError(f"--recipes {user_file}: row {r.row}: '{name}' is already a recipe of the library "
                                "(give the row another source)")
            taken.add(name)
        out.append(r)
    return tuple(out)
