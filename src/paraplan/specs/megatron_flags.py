"""Megatron-LM arguments (a list of words) -> ModelSpec, layout fields and training fields.

The flag names Megatron-LM defines are in ``megatron_flags.txt`` (from the generated dump of
Megatron-LM main @ d98e8a6, ../shared/reference/megatron_lm_flags_main_d98e8a6.tsv). Flags that
are not there are listed as unknown, not fatal. Important flags that are missing take Megatron's
own defaults (ecosystem.md 1.2), and each one is stated in ``defaults_applied``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

from paraplan.errors import SpecError
from paraplan.fileio import brief
from paraplan.layout import RECOMPUTE_MODULES
from paraplan.specs.megatron_args import model_from_megatron_args
from paraplan.specs.model import RECIPE_FLAGS, ModelSpec, recipe_defaults
from paraplan.specs.training import (
    DEPRECATED_DEEPEP_SMS_FLAG,
    DEPRECATED_SMS_FLAG,
    DTYPE_CHOICES,
    KNOB_FLAG_ALIASES,
    KNOB_FLAGS,
    MAX_SMS,
    NCCLEP_MESSAGE,
    OFFLOAD_MODULES,
    TE_CROSS_ENTROPY_MESSAGE,
)

_DATA = Path(__file__).parent
"""Where ``megatron_flags.txt`` and ``megatron_dests.tsv`` lie (beside this module)."""

Values = dict[str, tuple[str, ...]]

_INT_FIELDS: Final = {
    "--num-layers": "num_layers", "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "ffn_hidden_size", "--num-attention-heads": "num_attention_heads",
    "--kv-channels": "kv_channels", "--max-position-embeddings": "max_position_embeddings",
    "--make-vocab-size-divisible-by": "make_vocab_size_divisible_by",
    "--num-experts": "num_experts", "--moe-router-topk": "moe_router_topk",
    "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
    "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
    "--q-lora-rank": "q_lora_rank", "--kv-lora-rank": "kv_lora_rank",
    "--qk-head-dim": "qk_head_dim", "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
    "--v-head-dim": "v_head_dim", "--mtp-num-layers": "mtp_num_layers",
    "--vocab-size": "vocab_size", "--padded-vocab-size": "padded_vocab_size",
}
_BOOL_FIELDS: Final = {
    "--swiglu": ("swiglu", True), "--disable-bias-linear": ("add_bias_linear", False),
    "--untie-embeddings-and-output-weights": ("untie_embeddings_and_output_weights", True),
    "--add-qkv-bias": ("add_qkv_bias", True), "--qk-layernorm": ("qk_layernorm", True),
    "--moe-shared-expert-gate": ("moe_shared_expert_gate", True),
    "--multi-latent-attention": ("multi_latent_attention", True),
    "--quick-geglu": ("quick_geglu", True),
}
_OTHER_FIELDS: Final = {
    "--position-embedding-type": ("position_embedding_type", str),
    "--normalization": ("normalization", str), "--moe-layer-freq": ("moe_layer_freq", str),
    "--hidden-dropout": ("hidden_dropout", float), "--attention-dropout": ("attention_dropout", float),
    "--window-size": ("window_size", str), "--window-attn-skip-freq": ("window_attn_skip_freq", str),
    "--softmax-type": ("softmax_type", str),
}
_TOKENIZER_VOCAB: Final = (  # (substring of --tokenizer-model, lower case) -> vocabulary
    ("llama-3", 128256), ("llama3", 128256), ("llama-2", 32000), ("llama2", 32000),
    ("mixtral", 32000), ("mistral", 32000), ("qwen", 151936), ("deepseek", 129280),
    ("gpt2", 50257),
)
_VP_FLAGS: Final = ("--num-layers-per-virtual-pipeline-stage",
                    "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout")


@cache
def known_flags() -> frozenset[str]:
    """Every flag name (aliases included) Megatron-LM main @ d98e8a6 defines."""
    text = _DATA.joinpath("megatron_flags.txt").read_text("utf-8")
    return frozenset(line.strip() for line in text.splitlines()
                     if line.strip() and not line.startswith("#"))


MULTI_VALUE_FLAGS: Final = frozenset((
    "--cp-comm-type", "--cuda-graph-modules", "--cuda-graph-scope", "--data-path",
    "--ddp-param-name-patterns-for-fp32-local-accumulation", "--gtp-remat-opt-in-modules",
    "--hierarchical-context-parallel-sizes", "--high-priority-stream-groups", "--iterations-to-skip",
    "--moe-aux-loss-coeff", "--moe-router-load-balancing-type", "--mrope-section", "--offload-modules",
    "--profile-ranks", "--rampup-batch-size", "--recompute-modules", "--retriever-report-topk-accuracies",
    "--rl-inference-parsers", "--spec", "--test-data-path", "--tokenizer-special-tokens", "--train-data-path",
    "--valid-data-path", "--validation-set-names"))
"""The Megatron-LM flags that take several words (nargs ``+``, ``*`` or 3 in megatron_lm_flags_main_d98e8a6.tsv);
every other valued flag takes one, and argparse leaves a second word as a positional argument, which
``pretrain_gpt.py`` refuses ("unrecognized arguments")."""


@cache
def switch_flags() -> frozenset[str]:
    """The flags Megatron-LM defines that take no value (nargs 0: store_true, store_false, BooleanOptional; aliases
    included; megatron_switches.txt): its argparse refuses a word after one ("unrecognized arguments: true") and
    ``--flag=value`` ("ignored explicit argument")."""
    text = _DATA.joinpath("megatron_switches.txt").read_text("utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


@cache
def _dests() -> dict[str, tuple[str, str, str]]:
    """dest -> (flag, argparse action, default) of every Megatron-LM argument (megatron_dests.tsv)."""
    text = _DATA.joinpath("megatron_dests.tsv").read_text("utf-8")
    out: dict[str, tuple[str, str, str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            dest, flag, action, default = [*line.split("\t"), "", "", ""][:4]
            out[dest] = (flag, action, default)
    return out


def argv_from_dump(arguments: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> list[str]:
    """A command line equivalent to a log's argument dump (``_print_args``: dest names and printed
    values after ``validate_args``): switches on where a store_true is True or a store_false is
    False, ``--flag value`` for set values (lists printed as ``[a, b]`` become several words);
    ``None`` and derived values without a flag (data_parallel_size, ...) are left out."""
    dests = _dests()
    words: list[str] = []
    for dest, value in arguments:
        if dest not in dests or value in ("None", ""):
            continue
        flag, action, _ = dests[dest]
        if action == "StoreTrue":
            words += [flag] if value == "True" else []
        elif action == "StoreFalse":
            words += [flag] if value == "False" else []
        elif action == "BooleanOptional":
            words += [flag] if value == "True" else [f"--no-{flag[2:]}"] if value == "False" else []
        elif value.startswith("[") and value.endswith("]") and dest != "moe_layer_freq":
            items = [v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip()]
            words += [flag, *items] if items else []
        else:
            words += [flag, value]
    return words


def _is_flag(word: str) -> bool:
    return word.startswith("--") or (len(word) > 1 and word[0] == "-" and word[1].isalpha())


def split_flags(args: tuple[str, ...] | list[str]) -> tuple[Values, list[str], list[str]]:
    """({flag: values} with the last occurrence winning, unknown flags, stray words). The words after a flag are its
    values, also after a switch (``switch_flags``), so that a reader can name them: Megatron refuses them there
    (``read_flags``' SWITCH_WITH_VALUE)."""
    values: Values = {}
    unknown: list[str] = []
    stray: list[str] = []
    known = known_flags()
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not _is_flag(word):
            stray.append(word)
            continue
        flag, eq, first = word.partition("=")
        vals = [first] if eq else []
        while not eq and i < len(args) and not _is_flag(args[i]):
            vals.append(args[i])
            i += 1
        values[flag] = tuple(vals)
        if flag not in known and flag not in unknown:
            unknown.append(flag)
    return values, unknown, stray


@dataclass(frozen=True, slots=True)
class MegatronFlags:
    """The specs a Megatron argument list describes, and what had to be assumed."""

    model: ModelSpec
    layout_fields: dict[str, Any]
    """ParallelLayout keyword arguments except dp (which needs the world size)."""
    training_fields: dict[str, Any]
    """TrainingSpec keyword arguments; global_batch_size None = micro-batch x DP."""
    values: Values
    unknown_flags: tuple[str, ...]
    defaults_applied: tuple[str, ...]
    notes: tuple[str, ...]
    problems: tuple[tuple[str, str], ...]
    """(code, Megatron's message) for argument combinations Megatron rejects."""


class _Reader:
    def __init__(self, values: Values, base_dir: str | None = None,
                 files: Mapping[str, str] | None = None) -> None:
        self.v = values
        self.base_dir = base_dir
        self.files = dict(files or {})
        """path -> text of the files the job's container holds that are not on this machine (a ConfigMap)."""
        self.defaults: list[str] = []
        self.notes: list[str] = []
        self.problems: list[tuple[str, str]] = []
        self.script = False
        """Reading a launch script or argument list (``read_flags``), not ``--knob`` words."""

    def has(self, flag: str) -> bool:
        return flag in self.v

    def text(self, flag: str) -> str | None:
        vals = self.v.get(flag)
        return vals[0] if vals else None

    def int(self, flag: str, default: int | None = None, why: str = "") -> int | None:
        raw = self.text(flag)
        if raw is None:
            if why:
                self.default(flag, "" if default is None else str(default), why)
            return default
        try:
            return int(raw)
        except ValueError:
            if "$(" in raw or "`" in raw:  # never run: check reads the script, it does not execute it
                raise SpecError(f"{flag} {brief(raw)} is not a literal value (command substitution); "
                                "write the number in the script") from None
            raise SpecError(f"{flag} {brief(raw)} is not an integer (an unresolved shell variable? "
                            "set it in the script)") from None

    def default(self, flag: str, value: str, why: str = "Megatron's default") -> None:
        self.defaults.append(f"{flag} not set: {why}" + (f" ({value})" if value else ""))


def _model_fields(r: _Reader) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, key in _INT_FIELDS.items():
        value = r.int(flag)
        if value is not None:
            out[key] = value
    for flag, (key, on) in _BOOL_FIELDS.items():
        if r.has(flag):
            out[key] = on
    for flag, (key, kind) in _OTHER_FIELDS.items():
        raw = r.text(flag)
        if raw is not None:
            try:
                out[key] = kind(raw)
            except ValueError:
                raise SpecError(f"{flag} {brief(raw)} is not a number") from None
    _recipe_fields(r, out)
    _attention_fields(r, out)
    _model_defaults(r, out)
    return out


def _recipe_fields(r: _Reader, out: dict[str, Any]) -> None:
    """The recipe flags (``RECIPE_FLAGS``), typed by the ModelSpec field they set."""
    defaults = recipe_defaults()
    for key, flag, _ in RECIPE_FLAGS:
        if not r.has(flag):
            continue
        default = defaults[key]
        if isinstance(default, bool):
            out[key] = not default  # a bare switch sets the field away from its default (--no-... for True)
            continue
        raw = r.text(flag)
        if raw is None:
            raise SpecError(f"{flag} needs a value")
        if isinstance(default, str) or key == "moe_router_dtype":
            out[key] = raw
        elif isinstance(default, int) or key in ("moe_router_num_groups", "moe_router_group_topk"):
            out[key] = r.int(flag)
        else:
            try:
                out[key] = float(raw)
            except ValueError:
                raise SpecError(f"{flag} {brief(raw)} is not a number") from None


def _attention_fields(r: _Reader, out: dict[str, Any]) -> None:
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads"):
        if flag not in r.v:
            raise SpecError(f"{flag} is missing ({flag[2:].replace('-', '_')} argument is None): "
                            "Megatron requires it")
    if r.has("--use-rotary-position-embeddings"):
        out.setdefault("position_embedding_type", "rope")
    if r.has("--no-position-embedding"):
        out["position_embedding_type"] = "none"
    if r.has("--multi-latent-attention") and out.get("position_embedding_type") == "rope":
        out["position_embedding_type"] = r.text("--rope-type") or "yarn"  # MLA's rope_type (default yarn)
    gqa = r.has("--group-query-attention")
    out["group_query_attention"] = gqa
    if gqa and "num_query_groups" not in out:
        out["num_query_groups"] = r.int("--num-query-groups", 1, "Megatron's CLI default (MQA)")
    elif gqa:
        out["num_query_groups"] = r.int("--num-query-groups")
    elif r.has("--num-query-groups"):
        r.notes.append("--num-query-groups is ignored without --group-query-attention (MHA)")


def _model_defaults(r: _Reader, out: dict[str, Any]) -> None:
    if "vocab_size" not in out and "padded_vocab_size" not in out:
        model_name = (r.text("--tokenizer-model") or "").lower()
        if r.text("--tokenizer-type") == "GPT2BPETokenizer" or r.has("--merge-file"):
            model_name = "gpt2"
        guess = next((v for key, v in _TOKENIZER_VOCAB if key in model_name), None)
        out["vocab_size"] = guess or 32000
        r.default("--vocab-size", str(out["vocab_size"]), "the vocabulary comes from the tokenizer; "
                  + ("taken from the tokenizer name" if guess else "assumed"))
    for flag, value in (("--ffn-hidden-size", "4 x hidden; int(8 x hidden / 3 / 64) x 64 with "
                         "--swiglu"), ("--position-embedding-type", "learned_absolute"),
                        ("--normalization", "LayerNorm"), ("--hidden-dropout", "0.1"),
                        ("--attention-dropout", "0.1"), ("--make-vocab-size-divisible-by", "128")):
        if not r.has(flag):
            r.default(flag, value)
    if not r.has("--group-query-attention") and not r.has("--multi-latent-attention"):
        r.default("--group-query-attention", "multi-head attention, one KV head per query head")
    if out.get("num_experts"):
        for flag, value in (("--moe-router-topk", "2"), ("--moe-ffn-hidden-size", "= ffn"),
                            ("--expert-model-parallel-size", "1"),
                            ("--expert-tensor-parallel-size", "= TP")):
            if not r.has(flag):
                r.default(flag, value)


def _vp(r: _Reader, num_layers: int, pp: int, lay: dict[str, Any]) -> int:
    set_ = [f for f in _VP_FLAGS if r.has(f)]
    if len(set_) > 1:
        r.problems.append(("VP_FLAGS_CONFLICT", "No more than one of the following arguments can "
                           "be set at the same time: " + ", ".join(_VP_FLAGS)))
    if r.has("--pipeline-model-parallel-layout"):
        return _pipeline_layout(r, r.text("--pipeline-model-parallel-layout") or "", num_layers, pp, lay)
    if r.has("--num-virtual-stages-per-pipeline-rank"):
        return r.int("--num-virtual-stages-per-pipeline-rank") or 1
    per_vstage = r.int("--num-layers-per-virtual-pipeline-stage")
    if per_vstage is None:
        return 1
    if lay["first_stage_layers"] or lay["last_stage_layers"]:
        r.problems.append(("UNEVEN_PP_NEEDS_VSTAGES", "please use "
                           "--num-virtual-stages-per-pipeline-rank to specify virtual pipeline "
                           "parallel degree when enable uneven pipeline parallelism"))
        return 1
    total = num_layers + int(lay["account_for_embedding"]) + int(lay["account_for_loss"])
    if total % pp:
        r.problems.append(("LAYERS_NOT_DIVISIBLE_BY_PP", "number of layers of the model must be "
                           "divisible pipeline model parallel size"))
        return 1
    if (total // pp) % per_vstage:
        r.problems.append(("LAYERS_NOT_DIVISIBLE_BY_VP", "number of layers per pipeline stage must"
                           " be divisible number of layers per virtual pipeline stage"))
        return 1
    return total // pp // per_vstage


MAX_LAYOUT_CHARS: Final = 2**20
"""Longest ``--pipeline-model-parallel-layout`` once its ``X*N`` repeats are expanded (a million layer
letters, ten times specs.model.MAX_NUM_LAYERS): '(t*99999)*99999' was a MemoryError."""


def _repeat(m: re.Match[str], budget: list[int]) -> str:
    count = int(m.group(2)) if len(m.group(2)) <= 7 else MAX_LAYOUT_CHARS + 1
    budget[0] += len(m.group(1)) * count
    if budget[0] > MAX_LAYOUT_CHARS:
        raise SpecError(f"--pipeline-model-parallel-layout: expands to more than {MAX_LAYOUT_CHARS:,} layer "
                        "letters (the limit)")
    return m.group(1) * count


def layout_stage_counts(text: str) -> tuple[int, ...] | None:
    """Decoder layers per virtual stage of a ``--pipeline-model-parallel-layout`` string, read as
    megatron-core's ``PipelineParallelLayerLayout.parse_str_to_list`` does (None if malformed)."""
    text = text.replace(",", "")
    budget = [len(text)]  # characters the expansion has produced, bounded by MAX_LAYOUT_CHARS
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: _repeat(m, budget), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: _repeat(m, budget), text)
    stages = text.split("|")
    if any(set(stage) - set("ELtm") for stage in stages):
        return None
    return tuple(stage.count("t") for stage in stages)


def _pipeline_layout(r: _Reader, text: str, num_layers: int, pp: int, lay: dict[str, Any]) -> int:
    counts = layout_stage_counts(text)
    if counts is None:
        r.problems.append(("PIPELINE_LAYOUT_CHARS", f"Invalid layer character in {text!r}, known layer "
                           "characters: ['E', 'L', 't', 'm']"))
        return 1
    if len(counts) % pp:
        r.problems.append(("PIPELINE_LAYOUT_LENGTH", "The length of pipeline_model_parallel_layout must be "
                           f"divisible by pipeline_model_parallel_size (num_stages={len(counts)}, "
                           f"args.pipeline_model_parallel_size={pp})"))
        return 1
    if sum(counts) != num_layers:
        r.problems.append(("PIPELINE_LAYOUT_LAYERS", f"Number of decoder layers {sum(counts)}must match "
                           f"num_layers {num_layers}"))
    if lay["first_stage_layers"] or lay["last_stage_layers"] or lay["account_for_embedding"] \
            or lay["account_for_loss"]:
        r.problems.append(("PIPELINE_LAYOUT_CONFLICT", "pipeline_model_parallel_layout cannot be set with "
                           "other pipeline layout arguments."))
    lay["pipeline_layout"] = counts
    return len(counts) // pp


def _recompute(r: _Reader, lay: dict[str, Any]) -> None:
    gran = r.text("--recompute-granularity") or ("selective" if r.has("--recompute-activations")
                                                 else None)
    lay["recompute"] = gran or "none"
    if gran is None:
        r.default("--recompute-granularity", "no activation recomputation")
    method = r.text("--recompute-method")
    if gran == "selective":
        mods = r.v.get("--recompute-modules") or ()
        if not mods:
            r.default("--recompute-modules", "core_attn")
        kept = tuple(m for m in mods if m in RECOMPUTE_MODULES)
        if len(kept) < len(mods):
            r.notes.append("recompute modules not modelled: "
                           + ", ".join(m for m in mods if m not in RECOMPUTE_MODULES))
        lay["recompute_modules"] = kept or ("core_attn",)
        if method:
            r.problems.append(("RECOMPUTE_METHOD_SELECTIVE", "recompute method is not yet supported"
                               " for selective recomputing granularity"))
        if r.has("--recompute-num-layers"):  # TC: __post_init__
            r.problems.append(("RECOMPUTE_NUM_LAYERS_SELECTIVE", "When using recompute_granularity: "
                               "selective recompute_num_layers must be None."))
    elif gran == "full":
        if method not in ("uniform", "block"):
            r.problems.append(("RECOMPUTE_METHOD", 'Using recompute_granularity: full so '
                               'recompute_method must be "block" or "uniform"'))
        elif method == "block":
            lay["recompute_method"] = "block"
        lay["recompute_num_layers"] = r.int("--recompute-num-layers") or 1
        if not r.has("--recompute-num-layers"):  # TC: __post_init__ (range checked by launch rules)
            r.problems.append(("RECOMPUTE_NUM_LAYERS", "When using recompute_granularity: full "
                               "recompute_num_layers must be between 1 and num_layers_per_pipeline_rank "
                               "(--recompute-num-layers is not set)"))


def _layout_fields(r: _Reader, num_layers: int, moe: bool) -> dict[str, Any]:
    sizes = (("tp", "--tensor-model-parallel-size"), ("pp", "--pipeline-model-parallel-size"),
             ("cp", "--context-parallel-size"))
    lay: dict[str, Any] = {k: r.int(f, 1, "Megatron's default") for k, f in sizes}
    lay["ep"] = r.int("--expert-model-parallel-size", 1)
    lay["etp"] = r.int("--expert-tensor-parallel-size", 0)
    lay["mbs"] = r.int("--micro-batch-size", 1, "Megatron requires it; assumed")
    if not r.has("--micro-batch-size"):
        r.problems.append(("MICRO_BATCH_SIZE_MISSING", "micro_batch_size argument is None"))
    lay["first_stage_layers"] = r.int("--decoder-first-pipeline-num-layers", 0)
    lay["last_stage_layers"] = r.int("--decoder-last-pipeline-num-layers", 0)
    lay["account_for_embedding"] = r.has("--account-for-embedding-in-pipeline-split")
    lay["account_for_loss"] = r.has("--account-for-loss-in-pipeline-split")
    lay["vp"] = _vp(r, num_layers, lay["pp"], lay)
    _recompute(r, lay)
    switches = (("sequence_parallel", "--sequence-parallel"),
                ("distributed_optimizer", "--use-distributed-optimizer"),
                ("overlap_grad_reduce", "--overlap-grad-reduce"),
                ("overlap_param_gather", "--overlap-param-gather"),
                ("tp_comm_overlap", "--tp-comm-overlap"))
    for key, flag in switches:
        lay[key] = r.has(flag)
        if not lay[key] and key != "tp_comm_overlap" and (key != "sequence_parallel"
                                                          or lay["tp"] > 1):
            r.default(flag, "off")
    if r.has("--overlap-moe-expert-parallel-comm"):  # Megatron's combined 1F1B (paraplan.schedules)
        lay["schedule"] = "combined_1f1b"
    elif r.has("--delay-wgrad-compute"):  # TC: __post_init__
        r.problems.append(("DELAY_WGRAD_NEEDS_EP_OVERLAP", "overlap_moe_expert_parallel_comm must be enabled "
                           "when enabling delay_wgrad_compute"))
    lay["fsdp"] = r.has("--use-megatron-fsdp") or r.has("--use-torch-fsdp2")
    if r.has("--use-torch-fsdp2"):
        r.notes.append("--use-torch-fsdp2 is modelled as Megatron-FSDP (optim_grads_params)")
        _torch_fsdp2(r, lay)
    if r.has("--overlap-param-gather-with-optimizer-step"):
        if lay["vp"] <= 1:
            r.problems.append(("OVERLAP_PARAM_GATHER_WITH_OPTIMIZER_STEP_NEEDS_VPP",
                               "--overlap-param-gather-with-optimizer-step only supported with interleaved "
                               "pipeline parallelism"))
        if not (lay["distributed_optimizer"] and lay["overlap_param_gather"]):
            r.problems.append(("OVERLAP_PARAM_GATHER_WITH_OPTIMIZER_STEP_NEEDS_DIST_OPT",
                               "--overlap-param-gather-with-optimizer-step only supported with distributed "
                               "optimizer and --overlap-param-gather"))
    strategy = r.text("--data-parallel-sharding-strategy")
    if lay["fsdp"] and strategy not in (None, "optim_grads_params"):
        r.notes.append(f"--data-parallel-sharding-strategy {strategy} is modelled as "
                       "optim_grads_params")
    if not moe and (r.has("--expert-model-parallel-size") or r.has("--expert-tensor-parallel-size")):
        r.notes.append("expert parallel flags on a dense model")
    return lay


def _torch_fsdp2(r: _Reader, lay: dict[str, Any]) -> None:
    """torch FSDP2's own requirements (ecosystem.md 1.4, FSDP variants)."""
    for ok, what in ((lay["pp"] == 1, "pipeline parallelism (PP must be 1)"),
                     (lay["ep"] == 1, "expert parallelism (EP must be 1)"),
                     (not lay["distributed_optimizer"], "--use-distributed-optimizer"),
                     (not r.has("--fp16"), "--fp16")):
        if not ok:
            r.problems.append(("TORCH_FSDP2", f"--use-torch-fsdp2 is not supported with {what}"))


def _precision_problems(r: _Reader) -> None:
    """Precision flags Megatron rejects together (ecosystem.md 1.4 Precision) and removed flags."""
    if r.has("--fp16") and r.has("--bf16"):  # TC: __post_init__
        r.problems.append(("FP16_AND_BF16", "Only one of self.fp16: True and self.bf16 True should be True."))
    if r.has("--fp4-format") and r.has("--fp8-format"):  # A: validate_args
        r.problems.append(("FP4_AND_FP8", "--fp4-format and --fp8-format cannot be used simultaneously. "
                           "Please choose one."))
    for flag, message in (("--batch-size", "--batch-size argument is no longer valid, use --micro-batch-size "
                                           "instead"),
                          ("--checkpoint-activations", "--checkpoint-activations is no longer valid, use "
                                                       "--recompute-activations, or, for more control, "
                                                       "--recompute-granularity and --recompute-method."),
                          ("--model-parallel-size", "--model-parallel-size is no longer valid, use "
                                                    "--tensor-model-parallel-size instead")):
        if r.has(flag):  # A: validate_args (removed arguments)
            r.problems.append(("REMOVED_FLAG", message))


def _training_fields(r: _Reader, model: ModelSpec) -> dict[str, Any]:
    seq = r.int("--seq-length")
    if seq is None:
        seq = model.max_position_embeddings
        if seq is None:
            raise SpecError("--seq-length is missing (and no --max-position-embeddings)")
        r.default("--seq-length", str(seq), "taken from --max-position-embeddings")
    _precision_problems(r)
    if r.has("--fp4-format") and not r.has("--fp8-format"):
        fmt = r.text("--fp4-format")
        if fmt != "e2m1":  # arguments.py: choices=['e2m1']
            raise SpecError(f"--fp4-format must be e2m1, got {brief(fmt)}")
        precision = "fp4"
    elif r.has("--fp8-format"):
        precision = "fp8"
    elif r.has("--bf16"):
        precision = "bf16"
    elif r.has("--fp16"):
        precision = "fp16"
    else:
        precision = "bf16"
        r.notes.append("fp32 (no --bf16/--fp16) training is estimated as bf16")
    gbs = r.int("--global-batch-size", None, "micro-batch size x data-parallel size")
    backend = r.text("--attention-backend")
    out = {"seq_len": seq, "global_batch_size": gbs, "precision": precision,
           "attention_backend": "unfused" if backend in ("unfused", "local") else "flash"}
    out.update(_memory_knobs(r, precision))
    if model.is_moe and "moe_token_dispatcher_type" not in out:  # TC: moe_token_dispatcher_type = "allgather"
        out["moe_token_dispatcher_type"] = "allgather"
        r.default("--moe-token-dispatcher-type", "allgather", "Megatron-LM's default")
    return out


def _memory_knobs(r: _Reader, precision: str) -> dict[str, Any]:
    """The TrainingSpec memory knobs (``KNOB_FLAGS``) set in the arguments; unset ones keep Megatron's defaults."""
    out: dict[str, Any] = _deprecated_sms_knob(r)
    for key, flag in KNOB_FLAGS.items():
        if not r.has(flag):
            continue
        if key in ("cp_comm_type", "cpu_offloading_num_layers", "offload_modules"):
            out[key] = _cp_comm_type(r.v.get(flag) or ()) if key == "cp_comm_type" else _offload_value(r, flag)
        elif key in DTYPE_CHOICES:
            raw = r.text(flag)
            if raw not in DTYPE_CHOICES[key]:
                raise SpecError(NCCLEP_MESSAGE if (key, raw) == ("moe_flex_dispatcher_backend", "ncclep")
                                else f"{flag} must be one of {', '.join(DTYPE_CHOICES[key])}, got {_got(raw)}")
            out[key] = raw
        elif key in ("cuda_graph_modules", "gradient_accumulation_fusion", "tp_comm_overlap_ag", "tp_comm_overlap_rs",
                     "tp_comm_overlap_cfg", "tp_comm_overlap_rs_dgrad"):
            continue  # _cuda_graph_knobs, _grad_accumulation_knob, _tp_comm_knobs
        elif key in _INT_KNOBS:
            raw = r.text(flag) or ""
            try:
                out[key] = int(raw)
            except ValueError:
                raise SpecError(f"{flag} {_got(raw)} is not an integer") from None
        elif key in ("optimizer_offload_fraction", "moe_expert_capacity_factor", "moe_hybridep_num_sms",
                     "moe_expert_rank_capacity_factor", "moe_paged_stash_buffer_size_factor_cuda",
                     "moe_paged_stash_buffer_size_factor_cpu"):
            out[key] = _number_knob(r, key, flag)
        else:
            out[key] = True
    if precision != "fp8":
        for key in ("fp8_recipe", "fp8_param_gather"):
            if out.pop(key, None) is not None:
                r.notes.append(f"{KNOB_FLAGS[key]} is ignored without --fp8-format")
    if r.has("--use-megatron-fsdp") and (r.has("--use-nccl-ub") or r.has("--megatron-fsdp-max-pool-double-buffer")):
        out["fsdp_double_buffer"] = True  # validate_args sets args.fsdp_double_buffer for both
    out.update(_cuda_graph_knobs(r, out.get("cuda_graph_impl", "none")))
    out.update(_grad_accumulation_knob(r))
    out.update(_tp_comm_knobs(r))
    _low_precision_knobs(r, out, precision)
    _knob_problems(r, out)
    _drop_ignored(r, out)
    return out


def _drop_ignored(r: _Reader, out: dict[str, Any]) -> None:
    """Knobs Megatron ignores without the flag they refine: noted and dropped from ``out``."""
    if out.get("offload_modules") and not out.get("fine_grained_activation_offloading"):
        r.notes.append("--offload-modules is ignored without --fine-grained-activation-offloading")
        del out["offload_modules"]
    if not out.get("cross_entropy_loss_fusion") and out.pop("cross_entropy_fusion_impl", None) is not None:
        r.notes.append("--cross-entropy-fusion-impl is ignored without --cross-entropy-loss-fusion")
    if not out.get("defer_embedding_wgrad_compute") and out.pop("wgrad_deferral_limit", None) is not None:
        r.notes.append("--wgrad-deferral-limit is ignored without --defer-embedding-wgrad-compute")
    if not out.get("manual_gc") and out.pop("manual_gc_interval", None) is not None:
        r.notes.append("--manual-gc-interval is ignored without --manual-gc")
    if not out.get("optimizer_cpu_offload") and r.has("--optimizer-offload-fraction"):
        r.notes.append("--optimizer-offload-fraction is ignored without --optimizer-cpu-offload")
    if out.get("moe_token_dispatcher_type", "alltoall") != "flex":
        for key in ("moe_flex_dispatcher_backend", "moe_hybridep_num_sms", "moe_permute_fusion_into_hybridep"):
            if out.pop(key, None) is not None:
                r.notes.append(f"{KNOB_FLAGS[key]} is ignored without --moe-token-dispatcher-type flex")
    elif out.get("moe_flex_dispatcher_backend", "deepep") != "hybridep" and out.pop(
            "moe_permute_fusion_into_hybridep", None) is not None:  # only _HybridEPManager reads it
        r.notes.append("--moe-permute-fusion-into-hybridep is ignored without --moe-flex-dispatcher-backend hybridep")
    stash_factors = ("moe_paged_stash_buffer_size_factor_cuda", "moe_paged_stash_buffer_size_factor_cpu")
    for key in stash_factors if not out.get("moe_paged_stash") else ():  # only allocate_stash_buffers reads them
        if out.pop(key, None) is not None:
            r.notes.append(f"{KNOB_FLAGS[key]} is ignored without --moe-paged-stash")



def _deprecated_sms_knob(r: _Reader) -> dict[str, Any]:
    """``--moe-hybridep-num-sms`` (``DEPRECATED_SMS_FLAG``) or ``--moe-deepep-num-sms``
    (``DEPRECATED_DEEPEP_SMS_FLAG``) as ``moe_hybridep_num_sms`` where ``--moe-flex-dispatcher-num-sms`` is not given
    (TransformerConfig.__post_init__ routes either; the new flag wins; both at different values is refused, as
    Megatron's "Conflicting deprecated SM-count knobs" ValueError)."""
    given = [f for f in (DEPRECATED_DEEPEP_SMS_FLAG, DEPRECATED_SMS_FLAG) if r.has(f)]
    if not given or r.has(KNOB_FLAGS["moe_hybridep_num_sms"]):
        return {}
    values = {f: _number_knob(r, "moe_hybridep_num_sms", f) for f in given}
    if len(set(values.values())) > 1:
        raise SpecError("Conflicting deprecated SM-count knobs " + ", ".join(f"{f} {v}" for f, v in values.items())
                        + f"; set a single {KNOB_FLAGS['moe_hybridep_num_sms']} instead")
    return {"moe_hybridep_num_sms": values[given[0]]}


def _grad_accumulation_knob(r: _Reader) -> dict[str, Any]:
    """``--no-gradient-accumulation-fusion`` (a StoreFalse flag) as ``gradient_accumulation_fusion=False``, with
    Megatron-FSDP as without (not one of its required flags: launch.megatron.FSDP_REQUIRED_FLAGS)."""
    if not r.has("--no-gradient-accumulation-fusion"):
        return {}
    return {"gradient_accumulation_fusion": False}


TP_COMM_NOT_MODELLED: Final = ("--no-tp-comm-bulk-dgrad",
                                "--disable-tp-comm-bulk-dgrad", "--no-tp-comm-bulk-wgrad",
                                "--disable-tp-comm-bulk-wgrad", "--no-tp-comm-split-ag", "--disable-tp-comm-split-ag",
                                "--no-tp-comm-split-rs", "--disable-tp-comm-split-rs")
"""Userbuffers settings read but not modelled: the estimate keeps TE's pairs (``initialize_ub``, with the
``--tp-comm-overlap-cfg`` file's methods and SMs when given) and says so in a note."""


def _tp_comm_knobs(r: _Reader) -> dict[str, Any]:
    """``--no-tp-comm-overlap-ag`` / ``--no-tp-comm-overlap-rs`` (StoreFalse; ``--disable-...`` their aliases) as
    ``tp_comm_overlap_ag`` / ``tp_comm_overlap_rs`` False (``--knob no-tp-comm-overlap-ag`` too),
    ``--tp-comm-overlap-rs-dgrad`` as ``tp_comm_overlap_rs_dgrad`` True; a note for the
    userbuffers flags not modelled (``TP_COMM_NOT_MODELLED``) and for any of them without ``--tp-comm-overlap``."""
    out: dict[str, Any] = {}
    for key, pair in (("tp_comm_overlap_ag", "ag"), ("tp_comm_overlap_rs", "rs")):
        if r.has(f"--no-tp-comm-overlap-{pair}") or r.has(f"--disable-tp-comm-overlap-{pair}"):
            out[key] = False
    if r.has(KNOB_FLAGS["tp_comm_overlap_rs_dgrad"]):  # StoreTrue: TE's ub_overlap_rs_dgrad
        out["tp_comm_overlap_rs_dgrad"] = True
    given = [f for f in TP_COMM_NOT_MODELLED if r.has(f)]
    if not r.has("--tp-comm-overlap"):
        raw = r.text("--tp-comm-overlap-cfg") or ""
        if r.has("--tp-comm-overlap-cfg") and (raw in _packaged_ub() or raw in r.files or Path(raw).is_file()):
            cfg = _tp_comm_cfg(r)  # kept (``--knob``, launch writes it back)
            if cfg is not None:
                out["tp_comm_overlap_cfg"] = cfg
        if out or given or r.has("--tp-comm-overlap-cfg"):  # kept as given (launch writes them back): they change
            r.notes.append("userbuffers flags are ignored without --tp-comm-overlap")  # nothing without userbuffers
        return out  # a cfg path that is no file is not opened (Megatron-LM reads it only to initialize userbuffers)
    if r.has("--tp-comm-overlap-cfg"):
        cfg = _tp_comm_cfg(r)
        if cfg is not None:
            out["tp_comm_overlap_cfg"] = cfg
    if given:
        r.notes.append(f"not modelled: {', '.join(given)} (userbuffers costed with Transformer Engine's pairs, "
                       "methods and SMs)")
    return out


def _packaged_ub() -> dict[str, Any]:
    from paraplan.specs.userbuffers import packaged

    return packaged()


def _tp_comm_cfg(r: _Reader) -> str | None:
    """``--tp-comm-overlap-cfg PATH``: the YAML file TE's ``initialize_ub`` reads (Megatron-LM
    training/initialize.py ``_initialize_tp_communicators``: ``yaml.safe_load``, on every rank at start-up; its
    ``validate_args`` never opens it). Looked for beside the script first (a relative path, or the file name under
    an unresolved shell expansion such as ``${LAUNCH_DIR:-.}/...``), then as given; a file found is checked
    (``userbuffers.read_yaml_cfg``: it parses and names TE's GEMMs and settings; one SpecError line when not) and
    kept by its path. A path the job's container holds (``r.files``: a manifest's ConfigMap) is read from there and
    kept as compact JSON. A value that is no file but one of Megatron-Bridge's named configs (``--knob
    tp-comm-overlap-cfg=NAME``) is taken by name, with a note (Megatron-LM itself needs the file; launch files write
    one). Any other path (on the cluster only, under ``${VAR}``) cannot be read here: a note, and None (costed with
    TE's defaults)."""
    from paraplan.specs.userbuffers import canonical, packaged, read_yaml_cfg, yaml_cfg

    raw = r.text("--tp-comm-overlap-cfg") or ""
    if raw in r.files:
        r.notes.append(f"--tp-comm-overlap-cfg {brief(raw)}: read from the manifest's ConfigMap")
        return canonical(yaml_cfg(r.files[raw], f"--tp-comm-overlap-cfg {raw} (the manifest's ConfigMap)"))
    if raw in packaged() and not Path(raw).exists():
        if r.script:  # Megatron-LM opens the value as a file on every rank at start-up
            r.problems.append(("TP_COMM_OVERLAP_CFG_NOT_A_FILE", f"--tp-comm-overlap-cfg {raw}: Megatron-LM opens "
                               "it as a YAML file at start-up (training/initialize.py _initialize_tp_communicators: "
                               "FileNotFoundError); it is the name of a Megatron-Bridge userbuffers config, which "
                               "`paraplan launch --knob tp-comm-overlap-cfg=NAME` writes as tp_comm_overlap_cfg.yaml"))
        else:
            r.notes.append(f"--tp-comm-overlap-cfg {raw}: no such file, read as Megatron-Bridge's named userbuffers "
                           "config (Megatron-LM reads a YAML file: launch files write one)")
        return raw
    head, _, fname = raw.rpartition("/")
    tries: list[Path] = []
    if r.base_dir is not None and raw and not Path(raw).is_absolute():
        tries.append(Path(r.base_dir) / (fname if "$" in head else raw))
    if "$" not in raw:
        tries.append(Path(raw))
    found = next((p for p in tries if raw and p.is_file()), None)
    if found is None:
        r.notes.append(f"could not read --tp-comm-overlap-cfg {brief(raw)} here: costed with Transformer Engine's "
                       "default userbuffers settings")
        return None
    read_yaml_cfg(str(found))
    if str(found) != raw:
        r.notes.append(f"--tp-comm-overlap-cfg {brief(raw)}: read {found} (the script's directory)")
    return str(found)


def _got(raw: str | None) -> str:
    """A flag's value quoted for an error line; "no value" when the flag was given bare."""
    return "no value" if not raw else brief(raw)


def _number_knob(r: _Reader, key: str, flag: str) -> float | int | None:
    """A numeric knob's value: the SMs an integer; a negative capacity factor is dropless (TC: __post_init__)."""
    raw = r.text(flag) or ""
    if key == "moe_hybridep_num_sms":  # the flag given named (a deprecated spelling too), not the field
        digits = raw.isascii() and raw.isdigit() and len(raw.lstrip("0")) <= len(str(MAX_SMS))  # int() bounded
        if not digits or not 1 <= int(raw) <= MAX_SMS:
            raise SpecError(f"{flag} must be an integer from 1 to {MAX_SMS}, got {_got(raw)}")
        return int(raw)
    try:
        value = float(raw)
    except ValueError:
        raise SpecError(f"{flag} {_got(raw)} is not a number") from None
    return None if key == "moe_expert_capacity_factor" and value < 0 else value


def _cuda_graph_knobs(r: _Reader, impl: str) -> dict[str, Any]:
    """``--cuda-graph-impl`` / ``--cuda-graph-modules`` as Megatron-LM reads them (arguments.py ``validate_args``,
    transformer/cuda_graph_config.py): ``--enable-cuda-graph`` is local and ``--external-cuda-graph``
    transformer_engine (deprecated); ``--cuda-graph-scope`` is the deprecated name of ``--cuda-graph-modules``; the
    module ``full`` is the whole layer and ``full_iteration`` means ``--cuda-graph-impl full_iteration``
    (``specs.training.cuda_graph_scope``)."""
    from paraplan.specs.training import CUDA_GRAPH_MODULES, cuda_graph_scope

    out: dict[str, Any] = {}
    for flag, value in (("--enable-cuda-graph", "local"), ("--external-cuda-graph", "transformer_engine")):
        if r.has(flag):
            if r.has("--cuda-graph-impl"):  # A: validate_args
                raise SpecError(f"Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl "
                                f"(got {flag})")
            impl = out["cuda_graph_impl"] = value
    modules_flag = "--cuda-graph-modules"
    if r.has("--cuda-graph-scope"):
        if r.has(modules_flag):  # A: validate_args
            raise SpecError("--cuda-graph-scope and --cuda-graph-modules cannot be used together.")
        modules_flag = "--cuda-graph-scope"
    if not r.has(modules_flag):
        return out
    # one module a word (nargs='+', type CudaGraphModule[word]: arguments.py _parse_cuda_graph_modules_arg), so
    # 'attn,mlp' is refused as Megatron's argparse does; --knob splits its comma lists itself (cli.options)
    words = list(r.v[modules_flag])
    if comma := next((w for w in words if "," in w), None):
        raise SpecError(f"{modules_flag} must be among {', '.join(CUDA_GRAPH_MODULES)}, full or full_iteration, "
                        f"one a word, got {brief(comma)}")
    new_impl, modules = cuda_graph_scope(impl, words, modules_flag)
    if new_impl == "none":
        r.notes.append(f"{modules_flag} has no effect without --cuda-graph-impl")
        return out
    out.update({"cuda_graph_impl": new_impl} if new_impl == "full_iteration" else {"cuda_graph_modules": modules})
    return out


def _offload_value(r: _Reader, flag: str) -> int | tuple[str, ...] | None:
    """``--cpu-offloading-num-layers N`` (an integer) or ``--offload-modules M ...`` (``OFFLOAD_MODULES``)."""
    if flag == "--cpu-offloading-num-layers":
        return r.int(flag)
    mods = r.v.get(flag) or ()
    bad_mods = [m for m in mods if m not in OFFLOAD_MODULES]
    if bad_mods:
        raise SpecError(f"{flag}: {brief(bad_mods[0])} is not one of {', '.join(OFFLOAD_MODULES)}")
    return tuple(mods)
def _cp_comm_type(values: tuple[str, ...]) -> str:
    """``--cp-comm-type`` (nargs '+': one value, or one per layer): the one value every layer uses; a2a+p2p
    (hierarchical CP) and different values per layer are refused in one line (not modelled)."""
    flag, choices = KNOB_FLAGS["cp_comm_type"], DTYPE_CHOICES["cp_comm_type"]
    kinds = sorted(set(values))
    if "a2a+p2p" in kinds:
        raise SpecError(f"{flag} a2a+p2p (hierarchical context parallelism) is not modelled; use one of "
                        f"{', '.join(choices)}")
    if "allgather" in kinds:  # TE attn_forward_func_with_cp compares with "all_gather"
        raise SpecError(f"{flag} allgather: Transformer Engine spells it all_gather; use one of {', '.join(choices)}")
    if len(kinds) != 1 or kinds[0] not in choices:
        got = " ".join(values) if values else "nothing"
        raise SpecError(f"{flag} must be one of {', '.join(choices)} for every layer, got {brief(got)}")
    return kinds[0]


def _low_precision_knobs(r: _Reader, out: dict[str, Any], precision: str) -> None:
    """Drop the FP4 knobs without --fp4-format (Megatron refuses --fp4-param-gather then) and the bf16
    first/last layers without FP8 or FP4 (ignored by Megatron), saying so."""
    if precision != "fp4":
        for key in ("fp4_recipe", "fp4_param_gather"):
            if key == "fp4_param_gather" and out.get(key):  # A: validate_args
                r.problems.append(("FP4_PARAM_GATHER_NEEDS_FP4", "--fp4-param-gather must be used together with "
                                   "--fp4-format."))
            out.pop(key, None)
    if precision not in ("fp8", "fp4"):
        for key in ("first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            if out.pop(key, None) is not None:
                r.notes.append(f"{KNOB_FLAGS[key]} is ignored without --fp8-format or --fp4-format")


_INT_KNOBS: Final = ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "manual_gc_interval",
                     "wgrad_deferral_limit")
"""Integer-valued knobs (``type=int`` in arguments.py)."""


OPTION_FLAGS: Final = {
    "--tp-comm-overlap": "--tp-comm-overlap", "--tensor-model-parallel-size": "--tp",
    "--pipeline-model-parallel-size": "--pp", "--num-layers-per-virtual-pipeline-stage": "--vp",
    "--num-virtual-stages-per-pipeline-rank": "--vp", "--context-parallel-size": "--cp",
    "--expert-model-parallel-size": "--ep", "--micro-batch-size": "--mbs", "--global-batch-size": "--gbs",
    "--seq-length": "--seq-len", "--recompute-granularity": "--recompute", "--recompute-modules": "--recompute-modules",
    "--attention-backend": "--attention-backend", "--bf16": "--precision", "--fp16": "--precision",
    "--fp8-format": "--precision", "--fp4-format": "--precision",
}
"""Megatron-LM flags that are not ``--knob`` items: paraplan's own option (of estimate and plan) sets them."""


def memory_knobs_from_words(words: list[str], precision: str, notes: list[str] | None = None) -> dict[str, Any]:
    """TrainingSpec knob fields from Megatron flag words (the CLI's ``--knob``), refusing in one line what
    Megatron rejects (its assert's words) and FP8 knobs without FP8. A value may be a comma list (``attn,mlp``),
    as ``--knob`` takes it; in a Megatron command line (``read_flags``) it is one word each, as argparse reads it."""
    words = [w for word in words for w in ([word] if word.startswith("--") else word.split(",")) if w]
    values, unknown, _ = split_flags(words)
    _one_value_each(values)
    off = _switch_values(values)
    allowed = set(KNOB_FLAGS.values()) | {flag for aliases in KNOB_FLAG_ALIASES.values() for flag in aliases}
    for flag in [*unknown, *values]:
        if flag in OPTION_FLAGS:
            raise SpecError(f"--knob {flag[2:]}: not a knob; paraplan's {OPTION_FLAGS[flag]} sets it "
                            "(estimate, plan)")
        if flag not in allowed:
            raise SpecError(f"--knob {flag[2:]}: not a knob; one of "
                            f"{', '.join(sorted(f[2:] for f in allowed))}; "
                            "paraplan's own: attention-kernel=current|fa2, nvfp4-quantize-kernel=fused|split")
    if precision != "fp8":
        for key in ("fp8_recipe", "fp8_param_gather"):
            if KNOB_FLAGS[key] in values:
                raise SpecError(f"--knob {KNOB_FLAGS[key][2:]} needs --precision fp8")
    if precision != "fp4":
        for key in ("fp4_recipe", "fp4_param_gather"):
            if KNOB_FLAGS[key] in values:
                raise SpecError(f"--knob {KNOB_FLAGS[key][2:]} needs --precision fp4")
    if precision not in ("fp8", "fp4"):
        for key in ("first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            if KNOB_FLAGS[key] in values:
                raise SpecError(f"--knob {KNOB_FLAGS[key][2:]} needs --precision fp8 or fp4")
    # the layout's rule is launch_violations'; a --knob userbuffers setting is read as under --tp-comm-overlap
    r = _Reader({**values, "--use-distributed-optimizer": (), "--tp-comm-overlap": ()})
    out = _memory_knobs(r, precision)
    _knob_ub_found(r, out)
    (notes if notes is not None else []).extend(note for note in r.notes if "has no effect" in note)
    # Megatron-LM's refusal of TE's cross-entropy fusion applies where its launch files are written
    # (launch.megatron.megatron_args) and to its scripts (check); Megatron-Core and -Bridge run it
    problems = [(code, message) for code, message in r.problems if code != "TE_CROSS_ENTROPY_FUSION"]
    if problems:
        raise SpecError(problems[0][1])
    return {**out, **off}


def _knob_ub_found(r: _Reader, out: dict[str, Any]) -> None:
    """``--knob tp-comm-overlap-cfg=X`` asks for X: a file here or a named config, else one SpecError line."""
    if r.has("--tp-comm-overlap-cfg") and "tp_comm_overlap_cfg" not in out:
        from paraplan.specs.userbuffers import packaged

        raise SpecError(f"--knob tp-comm-overlap-cfg {_got(r.text('--tp-comm-overlap-cfg'))}: no such file (nor one "
                        f"of Megatron-Bridge's {len(packaged())} named userbuffers configs, e.g. "
                        f"{next(iter(packaged()))})")


def _one_value_each(values: Values) -> None:
    """``--knob a=x,y`` refused in one line unless Megatron's argparse takes a list for ``--a`` (nargs + or *,
    ``MULTI_VALUE_FLAGS``): ``moe-token-dispatcher-type=flex,moe-flex-dispatcher-backend=hybridep`` would otherwise
    apply flex alone (switches' words are ``_switch_values``')."""
    for flag, vals in values.items():
        if len(vals) > 1 and flag not in MULTI_VALUE_FLAGS and flag not in switch_flags():
            raise SpecError(f"--knob {flag[2:]} takes one value, got {len(vals)} ({brief(','.join(vals))}); "
                            "give each knob its own --knob")


def _switch_values(values: Values) -> dict[str, Any]:
    """``--knob`` switches given true or false (``manual-gc=false``): true is the bare flag; false leaves the flag out
    of ``values`` and is returned as the knob's value without the flag (so it wins over a recipe's); any other value
    is refused in one line."""
    from dataclasses import fields

    from paraplan.specs.training import TrainingSpec

    without_flag = {f.name: f.default for f in fields(TrainingSpec)}
    key_of = {flag: key for key, flag in KNOB_FLAGS.items()}
    off: dict[str, Any] = {}
    for flag in [f for f, vals in values.items() if vals and f in switch_flags() and f in key_of]:
        word = " ".join(values[flag]).lower()
        if word not in ("true", "false"):
            raise SpecError(f"--knob {flag[2:]} is a switch: give it without a value, =true or =false, got "
                            f"{brief(','.join(values[flag]))}")
        if word == "true":
            values[flag] = ()
        else:
            del values[flag]
            off[key_of[flag]] = without_flag[key_of[flag]]
    return off


def _knob_problems(r: _Reader, out: dict[str, Any]) -> None:
    """Megatron's asserts on the memory knobs (arguments.py validate_args)."""
    if out.get("fp8_param_gather") and not r.has("--use-distributed-optimizer") \
            and not (r.has("--use-megatron-fsdp") or r.has("--use-torch-fsdp2")):  # A: validate_args
        r.problems.append(("FP8_PARAM_GATHER_NEEDS_DIST_OPT", "--fp8-param-gather only supported with distributed "
                           "optimizer, torch fsdp2, megatron fsdp, or inference mode"))
    if out.get("optimizer_cpu_offload"):  # A: validate_args (optimizer CPU offload check)
        if not out.get("use_precision_aware_optimizer"):
            r.problems.append(("OPTIMIZER_CPU_OFFLOAD_NEEDS_PRECISION_AWARE",
                               "The optimizer cpu offload must be used in conjunction with "
                               "`--use-precision-aware-optimizer`, as the hybrid device optimizer reuses the code "
                               "path of this flag."))
            out["use_precision_aware_optimizer"] = True
        if out.get("fp8_param_gather") and out.get("fp8_recipe", "delayed") != "delayed":
            r.problems.append(("OPTIMIZER_CPU_OFFLOAD_FP8_RECIPE", "When `--fp8-param-gather` is enabled, the "
                               "optimizer cpu offload must be used in conjunction with `--fp8-recipe delayed`."))
    if out.get("first_last_layers_bf16") and r.has("--fp8-format") \
            and out.get("fp8_recipe", "delayed") == "delayed":  # TC: __post_init__
        r.problems.append(("FIRST_LAST_BF16_DELAYED", "Delayed scaling does not support first / last layer in BF16."))
        out.pop("first_last_layers_bf16")
    if out.get("cross_entropy_loss_fusion") and out.get("cross_entropy_fusion_impl") == "te":  # A: validate_args
        r.problems.append(("TE_CROSS_ENTROPY_FUSION", TE_CROSS_ENTROPY_MESSAGE))


def read_flags(args: tuple[str, ...] | list[str], *, name: str = "custom",
               source: str = "", base_dir: str | None = None,
               files: Mapping[str, str] | None = None) -> MegatronFlags:
    """Interpret a Megatron argument list (see the module docstring); ``base_dir``: the script's directory (a
    ``--tp-comm-overlap-cfg`` path under an unresolved shell expansion is looked for there); ``files``: path ->
    text of files the job's container holds (a manifest's ConfigMap)."""
    values, unknown, stray = split_flags(args)
    r = _Reader(values, base_dir, files)
    r.script = True
    stray += [w for f, vals in values.items() if f in known_flags() and f not in switch_flags()
              and f not in MULTI_VALUE_FLAGS for w in vals[1:]]  # argparse: one word each, the rest positional
    if stray:  # pretrain_gpt.py defines no positional argument: parse_args exits on any
        r.problems.append(("UNRECOGNIZED_ARGUMENTS", "unrecognized arguments: " + brief(" ".join(stray[:5]))
                           + " (Megatron-LM's parse_args: a word that is no flag's value; a bash -c string's $0?)"))
    for flag in sorted(f for f, vals in values.items() if vals and f in switch_flags()):  # argparse parse_args
        r.problems.append(("SWITCH_WITH_VALUE", f"{flag} takes no value: Megatron-LM's parse_args refuses "
                           f"{brief(' '.join(values[flag]))} after it (unrecognized arguments); drop the word, "
                           f"or the flag to leave it off"))
    fields = _model_fields(r)
    model = model_from_megatron_args(fields, name=name, source=source)
    if model.max_position_embeddings is None:
        r.problems.append(("MAX_POSITIONS_MISSING", "max_position_embeddings argument is None"))
    lay = _layout_fields(r, model.num_layers, model.is_moe)
    training = _training_fields(r, model)
    return MegatronFlags(model=model, layout_fields=lay, training_fields=training, values=values,
                         unknown_flags=tuple(unknown), defaults_applied=tuple(r.defaults),
                         notes=tuple(r.notes), problems=tuple(r.problems))
