"""Run Megatron-LM's own ``parse_args`` + ``validate_args`` on argument lists, then build the TransformerConfig
from them (``core_transformer_config_from_args``: its ``__post_init__`` checks), on CPU (our code).

Usage: ``python megatron_validate_worker.py MEGATRON_LM_DIR RESULTS_JSON < cases.json``; each case is
``{"name", "argv", "env", "world_size", "capability": [major, minor]}``, each result
``{"name", "ok", "error"}``. Megatron-LM is imported once from the checkout (never copied into this
repository). Stand-ins, none of which changes what validate_args decides for these arguments:

* ``torch.cuda.get_device_capability`` and ``torch.cuda.get_device_properties(...).major`` return the
  case's GPU capability (validate_args reads them for the CUDA_DEVICE_MAX_CONNECTIONS and FP8/MXFP8 checks);
* Megatron modules that import Triton kernels at import time get an inert stand-in module (Triton has
  no CPU build); torch itself still sees no Triton;
* ``typing.override`` (Python 3.12) is the identity on Python 3.11;
* WORLD_SIZE and RANK come from the case (validate_args reads the world size from them);
* Transformer Engine reads as version ``TE_VERSION`` (NeMo containers ship TE 2.x) and TransformerConfig's
  look-ups of its fused RoPE kernels find inert stand-ins.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import sys
import types
import typing
from typing import Any
from unittest import mock

TE_VERSION = "2.10.0"


class _Inert(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def _install_stand_ins(capability: list[int]) -> None:
    import torch

    triton = _Inert("triton")
    triton.__path__ = []
    triton.__version__ = "3.5.0"
    real_import = builtins.__import__

    def _import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and (name == "triton" or name.startswith("triton.")) and globals \
                and str(globals.get("__name__", "")).startswith("megatron"):
            return triton
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = _import
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # type: ignore[attr-defined]
    torch.cuda.get_device_capability = lambda *a, **k: tuple(capability)  # type: ignore[assignment]


def _kernel_stand_ins() -> None:
    """Transformer Engine's fused kernels are looked up by TransformerConfig; on CPU there are none, so the
    lookups find inert stand-ins (the NeMo containers these launches target ship TE 2.x)."""
    from megatron.core import utils
    from megatron.core.models.common.embeddings import rope_utils
    from packaging.version import Version

    utils._te_version = Version(TE_VERSION)  # the cached Transformer Engine version

    for name in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
        if getattr(rope_utils, name, None) is None:
            setattr(rope_utils, name, mock.MagicMock(name=name))


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    results_path = sys.argv[2]  # sys.argv is each case's argument list below
    cases = json.load(sys.stdin)
    _install_stand_ins(cases[0]["capability"] if cases else [9, 0])
    import torch
    from megatron.training.argument_utils import core_transformer_config_from_args
    from megatron.training.arguments import parse_args, validate_args

    _kernel_stand_ins()
    results = []
    base_env = dict(os.environ)
    for case in cases:
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update({k: str(v) for k, v in case["env"].items()})
        for name in case.get("unset", []):
            os.environ.pop(name, None)
        os.environ["WORLD_SIZE"] = str(case["world_size"])
        os.environ["RANK"] = "0"
        cap = tuple(case["capability"])
        torch.cuda.get_device_capability = lambda *a, _c=cap, **k: _c  # type: ignore[misc]
        props = types.SimpleNamespace(major=cap[0], minor=cap[1], name=f"stand-in sm_{cap[0]}{cap[1]}")
        torch.cuda.get_device_properties = lambda *a, _p=props, **k: _p  # type: ignore[misc]
        sys.argv = ["pretrain_gpt.py", *case["argv"]]
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                args = parse_args()
                validate_args(args, {})
                config = core_transformer_config_from_args(args)  # TransformerConfig.__post_init__ checks
            results.append({"name": case["name"], "ok": True, "error": None,
                            "data_parallel_size": args.data_parallel_size, "config": type(config).__name__})
        except SystemExit as err:  # argparse: an unknown flag or a bad value
            results.append({"name": case["name"], "ok": False, "error": f"SystemExit {err.code}: "
                            + out.getvalue()[-2000:]})
        except Exception as err:  # an assertion or ValueError of validate_args
            results.append({"name": case["name"], "ok": False, "error": f"{type(err).__name__}: {err}"})
    with open(results_path, "w", encoding="utf-8") as f:  # not stdout: Megatron's loggers write there
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
