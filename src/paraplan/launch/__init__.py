"""Launch files from a layout, and launch scripts read back into specs.

``megatron``  the single mapping (model, layout, training) -> ``pretrain_gpt.py`` arguments
``render``    megatron_args.sh, env.sh, torchrun.sh, job.sbatch (jinja2 templates), pytorchjob.yaml,
              trainjob.yaml (``kubernetes``), the Megatron-Bridge files (``bridge``), manifest.json;
              atomic writing; the site profile (``site``, its Kubernetes section ``k8s_site``)
``parse``     a script / arguments file -> specs, world size, unknown flags, defaults applied
``flags``     Megatron argument words -> specs (used by ``parse``)
``shell``     the small bash reader ``parse`` uses
"""

from __future__ import annotations

from paraplan.launch.megatron import (
    EMITTED_FLAGS,
    MEGATRON_COMMIT,
    Arg,
    ArgGroup,
    Placeholder,
    argv,
    as_launched,
    megatron_args,
)
from paraplan.launch.parse import ParsedScript, parse_file, parse_script

__all__ = [
    "EMITTED_FLAGS",
    "MEGATRON_COMMIT",
    "Arg",
    "ArgGroup",
    "ParsedScript",
    "Placeholder",
    "argv",
    "as_launched",
    "megatron_args",
    "parse_file",
    "parse_script",
]
