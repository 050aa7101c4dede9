"""Run Megatron-LM's own ``parse_args`` + ``validate_args`` on argument lists, on CPU (our code).

Usage: ``python megatron_validate_worker.py MEGATRON_LM_DIR < cases.json > results.json``; each case is
``{"name", "argv", "env", "world_size", "capability": [major, minor]}``, each result
``{"name", "ok", "error"}``. Megatron-LM is imported once from the checkout (never copied into this
repository). Stand-ins, none of which changes what validate_args decides for these arguments:

* ``torch.cuda.get_device_capability`` and ``torch.cuda.get_device_properties(...).major`` return the
  case's GPU capability (validate_args reads them for the CUDA_DEVICE_MAX_CONNECTIONS and FP8/MXFP8 checks);
* Megatron modules that import Triton kernels at import time get an inert stand-in module (Triton has
  no CPU build); torch itself still sees no Triton;
* ``typing.override`` (Python 3.12) is the identity on Python 3.11;
* WORLD_SIZE and RANK come from the case (validate_args reads the world size from them).
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


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    cases = json.load(sys.stdin)
    _install_stand_ins(cases[0]["capability"] if cases else [9, 0])
    import torch
    from megatron.training.arguments import parse_args, validate_args

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
            results.append({"name": case["name"], "ok": True, "error": None,
                            "data_parallel_size": args.data_parallel_size})
        except SystemExit as err:  # argparse: an unknown flag or a bad value
            results.append({"name": case["name"], "ok": False, "error": f"SystemExit {err.code}: "
                            + out.getvalue()[-2000:]})
        except Exception as err:  # an assertion or ValueError of validate_args
            results.append({"name": case["name"], "ok": False, "error": f"{type(err).__name__}: {err}"})
    json.dump(results, sys.__stdout__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
