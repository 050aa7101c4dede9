"""Cluster profiles: calibrated efficiency parameters written by ``paraplan calibrate``.

    gpu: h100-80gb              # the GPU preset the profile was fitted for
    source: "3 runs on cluster X, 2026-11-29"
    efficiency:                 # any EfficiencySpec field
      gemm_max_frac: 0.71
      dp_overlap_frac: 0.8

``--profile FILE`` on any command replaces those efficiency fields of the GPU. A profile may also
describe the fabric it was measured on (``paraplan.specs.topology``): a full tier list, or changes
to named tiers of the GPU's::

    topology: [{name: nvlink}, {name: leaf, size_gpus: 256}, {name: spine, oversubscription: 4}]
    topology: {network: {bus_frac: 0.85}}
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from paraplan.errors import SpecError
from paraplan.fileio import brief, read_yaml
from paraplan.specs.cluster import EfficiencySpec


def profile_overrides(path: str, gpu_name: str) -> dict[str, Any]:
    """The GPU overrides a profile file makes (``override_gpu`` keys): its efficiency fields and,
    where it has one, its topology (a tier list, or ``topology.<tier>.<field>`` changes)."""
    data = read_yaml(path, "profile")
    out: dict[str, Any] = {"efficiency": load_profile(path, gpu_name, data=data)}
    topo = data.get("topology") if isinstance(data, dict) else None
    if isinstance(topo, dict):
        for tier, changes in topo.items():
            if not isinstance(changes, dict):
                raise SpecError(f"profile: topology.{tier} must map tier fields to values, got {changes!r}")
            out |= {f"topology.{tier}.{key}": value for key, value in changes.items()}
    elif topo is not None:
        out["topology"] = topo
    return out


def load_profile(path: str, gpu_name: str, *, data: Any = None) -> dict[str, Any]:
    """Efficiency overrides from a profile file; SpecError naming the field on bad content."""
    data = read_yaml(path, "profile") if data is None else data
    if not isinstance(data, dict) or not isinstance(data.get("efficiency"), dict):
        raise SpecError(f"profile: '{path}' needs an 'efficiency' mapping")
    if data.get("gpu") not in (None, gpu_name):
        raise SpecError(f"profile: '{path}' was fitted for gpu {brief(data.get('gpu'))}, not '{gpu_name}'")
    allowed = {f.name for f in fields(EfficiencySpec)}
    eff = data["efficiency"]
    for key, value in eff.items():
        if key not in allowed:
            raise SpecError(f"profile: efficiency.{key}: unknown field (allowed: {', '.join(sorted(allowed))})")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise SpecError(f"profile: efficiency.{key} must be a number, got {brief(value)}")
    return dict(eff)
