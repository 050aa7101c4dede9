"""Loading specs at the file boundary: presets, Hugging Face config.json, Megatron-args files.

pydantic validates the raw dictionaries against the same frozen dataclasses the library uses;
its errors come back as ``SpecError`` naming the field and the allowed values, so pydantic never
leaks into the public API.

Model references (``--model``):
  * a preset name (``paraplan models``);
  * a Hugging Face ``config.json`` (has ``model_type``), mapped as in ecosystem.md section 3;
  * a JSON or YAML file whose keys are Megatron-LM argument names (missing keys take Megatron's
    defaults; ``group_query_attention`` and ``moe_layer_freq`` strings like "[0]*3+[1]*58" accepted).
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from paraplan.errors import SpecError
from paraplan.fileio import (
    MAX_YAML_BYTES,
    brief,
    check_regular_file,
    clip,
    load_json_text,
    load_yaml_text,
    path_exists,
    read_input_text,
    read_yaml,
)
from paraplan.specs.cluster import EfficiencySpec, GpuSpec
from paraplan.specs.megatron_args import model_from_megatron_args as model_from_megatron_args  # re-exported
from paraplan.specs.megatron_args import parse_moe_layer_freq as parse_moe_layer_freq  # re-exported
from paraplan.specs.model import ModelSpec
from paraplan.specs.topology import TIER_FIELDS, TierSpec
from paraplan.specs.validate import validate_fields as validate_fields  # re-exported
from paraplan.units import GBIT, GIB, TB, TFLOP

_PRESETS = "paraplan.specs.presets"


def _preset_dir(kind: str) -> Any:
    return resources.files(_PRESETS).joinpath(kind)


# ----------------------------------------------------------------------------- models
def model_preset_names() -> list[str]:
    """Names of the built-in model presets."""
    return sorted(p.name[:-5] for p in _preset_dir("models").iterdir() if p.name.endswith(".yaml"))


def _read_yaml_resource(kind: str, name: str) -> dict[str, Any]:
    text = _preset_dir(kind).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: 10x faster
    if not isinstance(data, dict):
        raise SpecError(f"{kind}: preset '{name}' must hold a mapping of fields")
    return data




def load_model_preset(name: str) -> ModelSpec:
    """A built-in model preset; unknown names list the known ones."""
    names = model_preset_names()
    if name not in names:
        raise SpecError(f"unknown model preset '{name}' (known: {', '.join(names)})")
    data = _read_yaml_resource("models", name)
    data.setdefault("name", name)
    return model_from_megatron_args(data, name=name)


def _model_from_log(path: Path) -> ModelSpec:
    """The model a Megatron log's argument dump describes (``paraplan tune`` names a run's log as its
    model when the run was read from its own log)."""
    from paraplan.errors import IngestError
    from paraplan.ingest import read_log
    from paraplan.specs.megatron_flags import argv_from_dump, read_flags

    try:
        log = read_log(path)
    except IngestError as err:
        raise SpecError(f"model: {err}") from None
    if log.run_config is None or not log.run_config.arguments:
        raise SpecError(f"model: '{path}' is a log without Megatron's argument dump (give a preset, config.json or a "
                        "Megatron-args YAML)")
    return read_flags(argv_from_dump(log.run_config.arguments), name=path.stem, source=str(path)).model


def load_model(ref: str) -> ModelSpec:
    """A preset name, a Hugging Face config.json, a Megatron-args JSON/YAML file, or a Megatron log
    with its argument dump (.log/.txt/.out, gzipped or not)."""
    if not ref.strip():  # Path("") is the current folder: an empty (or blank) name is a slip (an unset variable)
        raise SpecError("model: empty (give a preset, e.g. llama3-8b, or a file)")
    path = Path(ref)
    if not path_exists(path) and (ref in model_preset_names() or not any(c in ref for c in "/\\.")):
        return load_model_preset(ref)
    if not path_exists(path) and len(ref) < 256:
        raise SpecError(f"model: file '{ref}' not found (and not a preset: {', '.join(model_preset_names())})")
    check_regular_file(path, "model")  # a FIFO would block, /dev/zero fill memory
    if path.suffix in (".log", ".txt", ".gz", ".out"):
        return _model_from_log(path)
    text = read_input_text(path, "model", max_bytes=MAX_YAML_BYTES)
    data = load_json_text(text, "model", ref) if path.suffix == ".json" else load_yaml_text(text, "model", ref)
    if not isinstance(data, dict):
        raise SpecError(f"model: '{ref}' must hold a mapping of fields")
    if "model_type" in data:
        from paraplan.specs.hf import model_from_hf_config

        return model_from_hf_config(data, name=path.stem)
    return model_from_megatron_args(data, name=path.stem, source=str(path))


# ----------------------------------------------------------------------------- GPUs
def gpu_preset_names() -> list[str]:
    """Names of the built-in GPU presets."""
    return sorted(p.name[:-5] for p in _preset_dir("gpus").iterdir() if p.name.endswith(".yaml"))


_HUMAN_GPU_KEYS = {
    "hbm_gib": ("hbm_bytes", GIB),
    "hbm_tbyte_per_s": ("hbm_bytes_per_s", TB),
    "bf16_tflops": ("peak_bf16_flops_per_s", TFLOP),
    "fp8_tflops": ("peak_fp8_flops_per_s", TFLOP),
    "fp32_tflops": ("peak_fp32_simt_flops_per_s", TFLOP),
    "fp4_tflops": ("peak_fp4_flops_per_s", TFLOP),
    "sfu_texp_per_s": ("sfu_exp_per_s", 1e12),
    "nvlink_gbyte_per_s": ("nvlink_bytes_per_s", 1e9),
    "network_gbit_per_s": ("network_bytes_per_s", GBIT),
    "host_link_gbyte_per_s": ("host_link_bytes_per_s", 1e9),
    "reserved_gib": ("reserved_bytes", GIB),
}


def gpu_override_keys() -> list[str]:
    """Keys a GPU file or ``--gpu-set`` may set (human units; efficiency is a section)."""
    machine = {target for target, _ in _HUMAN_GPU_KEYS.values()} | {"efficiency"}
    return [*_HUMAN_GPU_KEYS, *(f.name for f in fields(GpuSpec) if f.name not in machine)]


def gpu_from_dict(data: dict[str, Any], *, name: str) -> GpuSpec:
    """GpuSpec from a preset/cluster-file mapping with human units in the key names."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("gbps", "nvlink_gbps", "network_gbps"):
            raise SpecError(f"gpu.{key}: ambiguous unit; say gbit or gbyte (e.g. network_gbit_per_s)")
        if key in _HUMAN_GPU_KEYS:
            target, scale = _HUMAN_GPU_KEYS[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float | str)):
                raise SpecError(f"gpu.{key}: expected a number, got {brief(value)}")
            try:
                out[target] = None if value is None else float(value) * scale
            except (ValueError, OverflowError):
                raise SpecError(f"gpu.{key}: expected a number, got {brief(value)}") from None
            if out[target] is not None and not (math.isfinite(out[target]) and out[target] > 0):
                raise SpecError(f"gpu.{key}: expected a finite number > 0, got {brief(value)}")
        elif key == "efficiency":
            if value is not None and not isinstance(value, dict):
                raise SpecError(f"gpu.efficiency: expected a mapping of fields "
                                f"(allowed: {', '.join(f.name for f in fields(EfficiencySpec))}), got {brief(value)}")
            out[key] = validate_fields(EfficiencySpec, dict(value or {}), "gpu.efficiency.")
        elif key == "topology":
            out[key] = tiers_from_list(value)
        else:
            out[key] = value
    out.setdefault("name", name)
    out.setdefault("peak_fp8_flops_per_s", None)
    out.setdefault("efficiency_calibrated", "efficiency" in data)
    return validate_fields(GpuSpec, out, "gpu.")  # type: ignore[no-any-return]


_HUMAN_TIER_KEYS = {"gbyte_per_s": 1e9, "gbit_per_s": GBIT}
MAX_TIERS = 8
"""Most tiers a topology lists (NVLink, rail, leaf, spine, super-spine: five in the largest fabrics)."""


def tiers_from_list(value: Any) -> tuple[TierSpec, ...]:
    """``topology:`` of a GPU file: a list of tier mappings (``paraplan.specs.topology``), rates
    as ``gbyte_per_s`` or ``gbit_per_s`` (or ``bytes_per_s``)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value) or len(value) > MAX_TIERS:
        raise SpecError(f"gpu.topology: expected a list of at most {MAX_TIERS} tiers, e.g. [{{name: nvlink}}, "
                        "{name: leaf, size_gpus: 256}, {name: spine, oversubscription: 4}]")
    out = []
    for i, raw in enumerate(value):
        tier = dict(raw)
        where = f"gpu.topology.{clip(tier.get('name', i))}."
        rates = [k for k in ("bytes_per_s", *_HUMAN_TIER_KEYS) if tier.get(k) is not None]
        if len(rates) > 1:
            raise SpecError(f"{where}{rates[1]}: give one of bytes_per_s, gbyte_per_s, gbit_per_s")
        for key, scale in _HUMAN_TIER_KEYS.items():
            if key in tier:
                v = tier.pop(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                    raise SpecError(f"{where}{key}: expected a number, got {brief(v)}")
                tier["bytes_per_s"] = None if v is None else float(v) * scale
        out.append(validate_fields(TierSpec, tier, where))
    return tuple(out)


def _tier_dicts(tiers: tuple[TierSpec, ...]) -> list[dict[str, Any]]:
    return [{f.name: getattr(t, f.name) for f in fields(t)} for t in tiers]


def _set_tier_field(current: dict[str, Any], key: str, value: Any) -> None:
    """``topology.<tier>.<field>=value`` (``--gpu-set``): change one field of a named tier; a
    GPU without tiers gets its two (nvlink, network) first."""
    parts = key.split(".")
    if len(parts) != 3:
        raise SpecError(f"gpu.{clip(key)}: expected topology.<tier>.<field> (fields: {', '.join(TIER_FIELDS)}, "
                        "gbyte_per_s, gbit_per_s)")
    _, name, fname = parts
    tiers = current["topology"] = current.get("topology") or [{"name": "nvlink"}, {"name": "network"}]
    match = [t for t in tiers if t.get("name") == name]
    if not match:
        raise SpecError(f"gpu.{clip(key)}: no tier '{clip(name)}' "
                        f"(tiers: {clip(', '.join(str(t.get('name')) for t in tiers))})")
    if fname in _HUMAN_TIER_KEYS or fname == "bytes_per_s":
        match[0].pop("bytes_per_s", None)
    match[0][fname] = value


MAX_GPU_BASE_CHAIN = 16
"""Most GPU files chained through ``base:`` (a file's base names a preset or another file)."""


def load_gpu(ref: str, *, _chain: tuple[str, ...] = ()) -> GpuSpec:
    """A GPU preset name, or a YAML/JSON file describing a custom GPU (same keys as presets); a file's
    ``base:`` names the preset or file it starts from (a cycle is an error naming it)."""
    names = gpu_preset_names()
    if ref in names:
        return gpu_from_dict(_read_yaml_resource("gpus", ref), name=ref)
    if not ref.strip():  # Path("") is the current folder: an empty (or blank) name is a slip (an unset variable)
        raise SpecError("gpu: empty (give a preset, e.g. h100-80gb, or a file)")
    path = Path(ref)
    if path_exists(path) or len(ref) >= 256:
        key = str(path.resolve()) if path_exists(path) else ref
        if key in _chain:
            cycle = [Path(c).name for c in (*_chain[_chain.index(key):], key)]
            raise SpecError(f"gpu: base: cycle {' -> '.join(cycle)}")
        if len(_chain) >= MAX_GPU_BASE_CHAIN:
            raise SpecError(f"gpu: base: more than {MAX_GPU_BASE_CHAIN} files chained through base:")
        data = read_yaml(path, "gpu")
        if not isinstance(data, dict):
            raise SpecError(f"gpu: '{clip(ref)}' must hold a mapping of fields")
        base = data.pop("base", None)
        if base is not None:
            if not isinstance(base, str):
                raise SpecError(f"gpu.base: expected a GPU preset name or file, got {brief(base)}")
            if not Path(base).is_absolute() and not path_exists(base) and base not in names:
                base = str(path.parent / base)  # a file next to this one
            return override_gpu(load_gpu(base, _chain=(*_chain, key)), data)
        return gpu_from_dict(data, name=path.stem)
    raise SpecError(f"unknown gpu {brief(ref)} (known: {', '.join(names)}; or a YAML file)")


def override_gpu(gpu: GpuSpec, overrides: dict[str, Any]) -> GpuSpec:
    """A GPU with some fields replaced (human-unit keys as in the presets; nested efficiency)."""
    if not overrides:
        return gpu
    current: dict[str, Any] = {}
    inverse = {target: (key, scale) for key, (target, scale) in _HUMAN_GPU_KEYS.items()}
    for f in fields(gpu):
        value = getattr(gpu, f.name)
        if f.name in inverse:
            key, scale = inverse[f.name]
            current[key] = None if value is None else value / scale
        elif f.name == "efficiency":
            current[f.name] = {g.name: getattr(value, g.name) for g in fields(value)}
        elif f.name == "topology":
            current[f.name] = _tier_dicts(value)
        else:
            current[f.name] = value
    for key, value in overrides.items():
        if key == "efficiency":
            if value is not None and not isinstance(value, dict):
                raise SpecError(f"gpu.efficiency: expected a mapping of fields "
                                f"(allowed: {', '.join(f.name for f in fields(EfficiencySpec))}), got {brief(value)}")
            current["efficiency"].update(value or {})
            current["efficiency_calibrated"] = True  # a profile or the user's own numbers
        elif key.startswith("topology."):
            _set_tier_field(current, key, value)
        else:
            current[key] = value
    return gpu_from_dict(current, name=gpu.name)


def with_overrides(model: ModelSpec, **kwargs: Any) -> ModelSpec:
    """A model with some fields replaced (validated)."""
    return replace(model, **kwargs)
