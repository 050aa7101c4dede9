"""CUDA graphs (``--cuda-graph-impl``, ``--cuda-graph-modules``): graph pool memory and the kernel launches removed,
by hand from Megatron-LM d98e8a6 (megatron/core/transformer/cuda_graphs.py ``TECudaGraphHelper``, module.py and
transformer_layer.py ``get_layer_static_inputs``, transformer_config.py ``__post_init__``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import SpecError
from paraplan.estimate.time.layer import MOE_ROUTER_LAUNCH_FRAC, layer_time
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, launch_violations, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import memory_knobs_from_words, read_flags
from paraplan.specs.training import TrainingSpec

from ..property.test_memory_props import run, setups

MiB = 2**20
LLAMA = load_model("llama3-70b")
H100 = load_gpu("h100-80gb")
LAYOUT = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True)


def _t(**kw: object) -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch_size=256, **kw)  # type: ignore[arg-type]


def _stage0(training: TrainingSpec):  # type: ignore[no-untyped-def]
    return estimate(LLAMA, make_cluster(H100, 64, 8), training, LAYOUT).stages[0]


# Stage 0 of Llama-3-70B, TP4 (SP) PP8 VP5, mbs 1, seq 8192, 128 micro-batches: Megatron's interleaved warm-up
# holds (pp - 1) * 2 + (vp - 1) * pp + 1 = 14 + 32 + 1 = 47 chunk micro-batches; 10 layers, 2 per chunk.
# Static hidden state: 8192 / 4 tokens x 8192 x 2 B = 32 MiB; TE's causal mask: 8192 x 8192 x 1 B = 64 MiB.
@pytest.mark.parametrize(("kw", "pool_mib"), [
    ({}, 0.0),
    ({"cuda_graph_impl": "full_iteration"}, 0.0),
    # TE, whole layer: 47 x 2 live (layer, micro-batch) sets x (32 + 64) MiB + one static output grad (32 MiB)
    ({"cuda_graph_impl": "transformer_engine"}, 47 * 2 * 96 + 32),
    # TE, dense MLP only: no mask
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("mlp",)}, 47 * 2 * 32 + 32),
    # local, whole layer: a layer's graph reads the previous graph's output; one input per chunk micro-batch
    ({"cuda_graph_impl": "local"}, 47 * 32),
    # local, attention only: every captured layer clones its input
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ("attn",)}, 47 * 2 * 32),
])
def test_graph_pool_golden(kw: dict[str, object], pool_mib: float) -> None:
    base, knob = _stage0(_t()), _stage0(_t(**kw))
    assert int(knob.in_flight) == 47
    assert float(knob.other.cuda_graph_bytes) == pytest.approx(pool_mib * MiB)
    assert float(knob.memory.total_bytes - base.memory.total_bytes) == pytest.approx(pool_mib * MiB)


def test_graph_pool_larger_with_pp() -> None:
    """Without PP, TE captures one micro-batch (num_microbatches = 1); with PP every in-flight one has its graph."""
    t = _t(cuda_graph_impl="transformer_engine")
    flat = ParallelLayout(tp=8, pp=1, dp=8, mbs=1, recompute="full", sequence_parallel=True)
    one = estimate(LLAMA, make_cluster(H100, 64, 8), t, flat).stages[0]
    assert int(one.in_flight) == 1
    per_layer = (8192 / 8 * 8192 * 2 + 8192 * 8192) / MiB  # 16 MiB hidden + 64 MiB mask
    assert float(one.other.cuda_graph_bytes) / MiB == pytest.approx(80 * per_layer + 16)
    assert float(_stage0(t).other.cuda_graph_bytes) > float(one.other.cuda_graph_bytes) / 8  # 10 vs 80 layers


def _layer(training: TrainingSpec, model_name: str = "gpt2", moe: bool = False):  # type: ignore[no-untyped-def]
    model = load_model(model_name)
    cluster = make_cluster(H100, 8, 8)
    lay = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, recompute="none")
    return layer_time(model, cluster, training, lay, moe=moe), cluster.gpu.efficiency.layer_overhead_s


@pytest.mark.parametrize(("kw", "issued"), [
    ({}, 1.0),
    ({"cuda_graph_impl": "full_iteration"}, 0.0),
    ({"cuda_graph_impl": "local"}, 0.0),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn",)}, 0.5),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("mlp",)}, 0.5),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "mlp")}, 0.0),
    ({"cuda_graph_impl": "none", "cuda_graph_modules": ("attn", "mlp")}, 1.0),  # no effect without an impl
])
def test_dense_launches_removed(kw: dict[str, object], issued: float) -> None:
    """Each half-layer (attention, MLP) issues half of ``layer_overhead_s``; a captured half issues none."""
    lt, overhead = _layer(TrainingSpec(seq_len=512, global_batch_size=8, **kw))  # type: ignore[arg-type]
    assert float(lt.overhead_s) == pytest.approx(issued * overhead)


def test_moe_router_launches_removed() -> None:
    t = TrainingSpec(seq_len=512, global_batch_size=8, cuda_graph_impl="transformer_engine",
                     cuda_graph_modules=("attn", "moe_router", "moe_preprocess"))
    base, overhead = _layer(TrainingSpec(seq_len=512, global_batch_size=8), "qwen3-30b-a3b", moe=True)
    lt, _ = _layer(t, "qwen3-30b-a3b", moe=True)
    assert float(base.overhead_s) == pytest.approx(overhead)
    assert float(lt.overhead_s) == pytest.approx(0.5 * overhead * (1 - MOE_ROUTER_LAUNCH_FRAC))
    assert float(lt.host_sync_s) == float(base.host_sync_s)  # syncs stay (the dispatcher's, not captured)


def test_launch_bound_layer_runs_at_gpu_speed_when_captured() -> None:
    base, _ = _layer(TrainingSpec(seq_len=128, global_batch_size=8))
    lt, _ = _layer(TrainingSpec(seq_len=128, global_batch_size=8, cuda_graph_impl="local"))
    assert float(base.overhead_s) > float(base.gpu_s)  # GPT-2 at 128 tokens: the host is the bottleneck
    assert float(base.compute_s) == pytest.approx(float(base.overhead_s) + float(base.host_sync_s))
    assert float(lt.compute_s) == pytest.approx(float(lt.gpu_s) + float(lt.host_sync_s))


@settings(max_examples=30, deadline=None)
@given(setups(), st.sampled_from(["local", "transformer_engine", "full_iteration"]),
       st.sets(st.sampled_from(["attn", "mlp", "moe_router"])))
def test_cuda_graphs_never_slow_a_step(s: tuple, impl: str, mods: set[str]) -> None:
    model, layout, training = s
    graphs = replace(training, cuda_graph_impl=impl,
                     cuda_graph_modules=() if impl == "full_iteration" else tuple(sorted(mods)))
    before, after = run(model, layout, training), run(model, layout, graphs)
    assert float(after.time.step_s) <= float(before.time.step_s) * (1 + 1e-12)
    assert all(float(a.memory.total_bytes) >= float(b.memory.total_bytes) * (1 - 1e-12)
               for a, b in zip(after.stages, before.stages, strict=True))


@pytest.mark.parametrize(("kw", "message"), [
    ({"cuda_graph_impl": "cupti"}, "cuda_graph_impl must be one of none, local, transformer_engine, full_iteration"),
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ("attention",)}, "cuda_graph_modules must be a list of"),
    ({"cuda_graph_impl": "full_iteration", "cuda_graph_modules": ("attn",)}, "must be empty when"),
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ("moe", "moe_router")}, "both moe and moe_router"),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("moe_preprocess",)}, "only supported with"),
])
def test_bad_graph_knobs_one_line(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as err:
        _t(**kw)
    assert message in str(err.value) and "\n" not in str(err.value)


FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--use-distributed-optimizer").split()


@pytest.mark.parametrize(("words", "fields"), [
    (["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn", "moe_router", "moe_preprocess"],
     {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "moe_router", "moe_preprocess")}),
    (["--cuda-graph-impl", "local", "--cuda-graph-scope", "attn"],  # the deprecated name
     {"cuda_graph_impl": "local", "cuda_graph_modules": ("attn",)}),
    (["--cuda-graph-impl", "local", "--cuda-graph-modules", "full_iteration"], {"cuda_graph_impl": "full_iteration"}),
    (["--cuda-graph-impl", "local", "--cuda-graph-modules", "full"],
     {"cuda_graph_impl": "local", "cuda_graph_modules": ()}),
    (["--enable-cuda-graph"], {"cuda_graph_impl": "local"}),
    (["--external-cuda-graph"], {"cuda_graph_impl": "transformer_engine"}),
    ([], {}),
])
def test_graph_knobs_read_from_megatron_args(words: list[str], fields: dict[str, object]) -> None:
    t = read_flags([*FLAGS, *words]).training_fields
    assert {k: t[k] for k in ("cuda_graph_impl", "cuda_graph_modules") if k in t} == fields


@pytest.mark.parametrize(("words", "message"), [
    (["--cuda-graph-impl", "local", "--cuda-graph-modules", "attention"], "--cuda-graph-modules must be among"),
    (["--cuda-graph-modules", "attn", "--cuda-graph-scope", "attn"], "cannot be used together"),
    (["--enable-cuda-graph", "--cuda-graph-impl", "local"], "Do not use --enable-cuda-graph"),
    (["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "full_iteration"], "cannot be combined"),
    # argparse's type is CudaGraphModule[word] (arguments.py _parse_cuda_graph_modules_arg): KeyError 'attn,mlp'
    (["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn,mlp"], "one a word, got 'attn,mlp'"),
])
def test_bad_graph_args_one_line(words: list[str], message: str) -> None:
    with pytest.raises(SpecError) as err:
        read_flags([*FLAGS, *words])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_graph_knobs_from_cli_words() -> None:
    assert memory_knobs_from_words(["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules",
                                    "attn,mlp"], "bf16") == {"cuda_graph_impl": "transformer_engine",
                                                              "cuda_graph_modules": ("attn", "mlp")}


@pytest.mark.parametrize("kw", [
    {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "mlp")},
    {"cuda_graph_impl": "local"},
    {"cuda_graph_impl": "full_iteration"},
])
def test_graph_knobs_written_back_and_read_again(kw: dict[str, object]) -> None:
    training = _t(**kw)
    words = argv(megatron_args(LLAMA, LAYOUT, training), resolve=True)
    assert words[words.index("--cuda-graph-impl") + 1] == kw["cuda_graph_impl"]
    flags = read_flags(words)
    assert not flags.problems
    back = TrainingSpec(**flags.training_fields)
    assert (back.cuda_graph_impl, back.cuda_graph_modules) == (training.cuda_graph_impl, training.cuda_graph_modules)


def test_default_writes_no_graph_flags() -> None:
    words = argv(megatron_args(LLAMA, LAYOUT, _t()), resolve=True)
    assert not {"--cuda-graph-impl", "--cuda-graph-modules"} & set(words)


def test_megatron_graph_rules_need_the_model() -> None:
    dense = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="full", sequence_parallel=True)
    codes = {c for c, _ in launch_violations(LLAMA, dense, _t(cuda_graph_impl="local",
                                                               cuda_graph_modules=("moe_router",)))}
    assert codes == {"CUDA_GRAPH_MOE_NEEDS_MOE", "CUDA_GRAPH_FULL_RECOMPUTE"}
    assert not {c for c, _ in launch_violations(LLAMA, dense, _t(cuda_graph_impl="full_iteration"))
                if c.startswith("CUDA_GRAPH")}
    qwen = load_model("qwen3-30b-a3b")
    lay = ParallelLayout(tp=1, pp=1, dp=8, ep=8, etp=1, mbs=1, recompute="none")
    codes = {c for c, _ in launch_violations(qwen, lay, _t(cuda_graph_impl="local", cuda_graph_modules=("mlp",)))}
    assert "CUDA_GRAPH_MLP_NEEDS_DENSE" in codes
    assert np.all([c != "CUDA_GRAPH_MOE_NEEDS_MOE" for c in codes])
