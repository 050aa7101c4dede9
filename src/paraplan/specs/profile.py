"""Cluster profiles: calibrated efficiency parameters written by ``paraplan calibrate``.

    gpu: h100-80gb              # the GPU preset the profile was fitted for
    source: "3 runs on cluster X, 2026-11-29"
    efficiency:                 # any EfficiencySpec field
      gemm_max_frac: 0.71
      dp_overlap_frac: 0.8

``--profile FILE`` on any command replaces those efficiency fields of the GPU.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from paraplan.errors import SpecError
from paraplan.fileio import brief, read_yaml
from paraplan.specs.cluster import EfficiencySpec


def load_profile(path: str, gpu_name: str) -> dict[str, Any]:
    """Efficiency overrides from a profile file; SpecError naming the field on bad content."""
    data = read_yaml(path, "profile")
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
