"""paraplan: plan hybrid parallelism for Megatron-LM training.

Library first: specs (model, GPU/cluster, training) -> layouts -> memory and step-time
estimates -> ranked plans. The CLI (``paraplan``) is a thin layer over these functions.

    >>> import paraplan
    >>> est = paraplan.estimate("llama3-8b", "h100-80gb", 8, layout={"tp": 2},
    ...                         training={"seq_len": 4096, "global_batch_size": 64})
    >>> est.fits
    True

The names in ``__all__`` load on first use (PEP 562), so ``import paraplan`` (and ``paraplan --version``)
imports neither numpy nor pydantic. docs/api.md documents them.

``paraplan.estimate`` calls ``paraplan.api.estimate`` and also answers for the formula subpackage of the same
name (``paraplan.estimate.params``, ``import paraplan.estimate.time as t``): see ``_Estimate``.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from paraplan._version import __version__

if TYPE_CHECKING:
    from paraplan.api import estimate, plan
    from paraplan.errors import IngestError, LayoutError, NoFeasiblePlanError, PlannerError, SpecError
    from paraplan.estimate.memory import MemoryOptions
    from paraplan.estimate.step_time import StepTime, Throughput
    from paraplan.estimator import Estimate
    from paraplan.layout import ParallelLayout
    from paraplan.search import Plan, SearchSpace
    from paraplan.specs.cluster import ClusterSpec, EfficiencySpec, GpuSpec, make_cluster
    from paraplan.specs.load import load_gpu, load_model
    from paraplan.specs.model import ModelSpec
    from paraplan.specs.training import TrainingSpec

_EXPORTS: dict[str, str] = {
    "estimate": "paraplan.api",
    "plan": "paraplan.api",
    "ModelSpec": "paraplan.specs.model",
    "GpuSpec": "paraplan.specs.cluster",
    "EfficiencySpec": "paraplan.specs.cluster",
    "ClusterSpec": "paraplan.specs.cluster",
    "make_cluster": "paraplan.specs.cluster",
    "TrainingSpec": "paraplan.specs.training",
    "ParallelLayout": "paraplan.layout",
    "SearchSpace": "paraplan.search",
    "MemoryOptions": "paraplan.estimate.memory",
    "load_model": "paraplan.specs.load",
    "load_gpu": "paraplan.specs.load",
    "Estimate": "paraplan.estimator",
    "StepTime": "paraplan.estimate.step_time",
    "Throughput": "paraplan.estimate.step_time",
    "Plan": "paraplan.search",
    "PlannerError": "paraplan.errors",
    "SpecError": "paraplan.errors",
    "LayoutError": "paraplan.errors",
    "NoFeasiblePlanError": "paraplan.errors",
    "IngestError": "paraplan.errors",
}
"""Exported name -> the module that defines it (imported on first use)."""

__all__ = [
    "ClusterSpec",
    "EfficiencySpec",
    "Estimate",
    "GpuSpec",
    "IngestError",
    "LayoutError",
    "MemoryOptions",
    "ModelSpec",
    "NoFeasiblePlanError",
    "ParallelLayout",
    "Plan",
    "PlannerError",
    "SearchSpace",
    "SpecError",
    "StepTime",
    "Throughput",
    "TrainingSpec",
    "__version__",
    "estimate",
    "load_gpu",
    "load_model",
    "make_cluster",
    "plan",
]
"""``__version__`` and every name of ``_EXPORTS`` (tests/unit/test_api.py checks that they agree)."""


def _load(name: str) -> Any:
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __getattr__(name: str) -> Any:
    """PEP 562: an exported name is imported from its module the first time it is asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'paraplan' has no attribute {name!r}")
    value = _load(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


class _Estimate:
    """``paraplan.estimate``: calling it is ``paraplan.api.estimate`` (``__wrapped__``: its signature and help);
    its other attributes are those of the formula subpackage ``paraplan.estimate``, so every import form of the
    subpackage keeps working (``import paraplan.estimate.time as t`` looks ``estimate`` up on this package)."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _load("estimate")(*args, **kwargs)

    @property
    def __wrapped__(self) -> Any:
        return _load("estimate")

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return str(_load("estimate").__doc__)

    def __getattr__(self, name: str) -> Any:
        import importlib

        return getattr(importlib.import_module("paraplan.estimate"), name)

    def __repr__(self) -> str:
        return "<paraplan.estimate: the API function paraplan.api.estimate and the formula subpackage>"


_ESTIMATE = _Estimate()


class _Package(types.ModuleType):
    """The package's module type: ``estimate`` stays the API entry although a subpackage has its name.

    Importing ``paraplan.estimate.<module>`` makes the import system set the attribute ``estimate`` of this
    package to the subpackage; the setter keeps the subpackage in ``sys.modules`` only (where every
    ``from paraplan.estimate.X import Y`` finds it) and the getter returns ``_Estimate``, which calls the function
    and answers for the subpackage."""

    @property
    def estimate(self) -> Any:
        return _ESTIMATE

    @estimate.setter
    def estimate(self, value: Any) -> None:
        if not isinstance(value, types.ModuleType) or value.__name__ != "paraplan.estimate":
            raise AttributeError("paraplan.estimate is the API entry and cannot be replaced")


sys.modules[__name__].__class__ = _Package
