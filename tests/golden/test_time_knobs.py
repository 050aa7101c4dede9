"""Time knobs of NVIDIA's recipes, by hand from Megatron-LM d98e8a6: ``--overlap-param-gather-with-optimizer-step``
(optimizer/__init__.py splits out the first model chunk; optimizer.py ``ChainedOptimizer._step`` dispatches its
parameter all-gather right after its step, behind the other chunks' steps)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.estimate.time.dp import exposed_and_link_s, gather_behind_optimizer_s
from paraplan.estimator import estimate
from paraplan.launch.megatron import argv, launch_violations, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.recipes.catalogue import bridge_recipes
from paraplan.recipes.knobs import training_knobs
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import memory_knobs_from_words, read_flags
from paraplan.specs.training import TrainingSpec

LLAMA = load_model("llama3-70b")
H100 = load_gpu("h100-80gb")
VP5 = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                     distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True)
ON = TrainingSpec(seq_len=8192, global_batch_size=256, overlap_param_gather_with_optimizer_step=True)
OFF = replace(ON, overlap_param_gather_with_optimizer_step=False)


@pytest.mark.parametrize(("gather", "opt", "hidden"), [
    (1.0, 10.0, 1.0 / 5),      # the first chunk's gather (1/5) fits behind 4/5 of a long optimizer step
    (1.0, 0.1, 0.1 * 4 / 5),   # a short step hides only 4/5 of itself
    (0.0, 1.0, 0.0),
])
def test_gather_behind_optimizer_golden(gather: float, opt: float, hidden: float) -> None:
    assert float(gather_behind_optimizer_s(VP5, gather, opt, ON)) == pytest.approx(hidden)
    assert float(gather_behind_optimizer_s(VP5, gather, opt, OFF)) == 0.0


@pytest.mark.parametrize("layout", [replace(VP5, vp=1), replace(VP5, overlap_param_gather=False),
                                    replace(VP5, distributed_optimizer=False, overlap_param_gather=False)])
def test_gather_behind_optimizer_needs_its_conditions(layout: ParallelLayout) -> None:
    assert float(gather_behind_optimizer_s(layout, 1.0, 10.0, ON)) == 0.0


def test_exposed_gather_shrinks_by_what_the_optimizer_hides() -> None:
    # gather 1 s, hidden 0.3 s behind the first forward (hide 0.9 s / 3): exposed 0.7 s; 0.2 s more behind the step
    base, _ = exposed_and_link_s(VP5, 0.0, 1.0, 0.9, 8)
    knob, link = exposed_and_link_s(VP5, 0.0, 1.0, 0.9, 8, behind_optimizer_s=0.2)
    assert (float(base), float(knob), float(link)) == pytest.approx((0.7, 0.5, 1.0))


def test_step_faster_by_the_hidden_gather_when_it_is_exposed() -> None:
    """Llama-3-8B on 64 H100, TP1 PP2 VP2 DP32, seq 1024, 2 micro-batches: the gather is exposed and longer than
    the optimizer step, so the knob hides (v - 1) / v = 1/2 of the step's time more."""
    cluster = make_cluster(H100, 64, 8)
    lay = replace(VP5, tp=1, pp=2, vp=2, dp=32, sequence_parallel=False)
    on = TrainingSpec(seq_len=1024, global_batch_size=64, overlap_param_gather_with_optimizer_step=True)
    model = load_model("llama3-8b")
    a = estimate(model, cluster, replace(on, overlap_param_gather_with_optimizer_step=False), lay).time
    b = estimate(model, cluster, on, lay).time
    assert float(a.exposed_comm_s["dp"]) > float(a.optimizer_s)
    assert float(a.step_s - b.step_s) == pytest.approx(float(a.optimizer_s) / 2)
    assert float(a.exposed_comm_s["dp"] - b.exposed_comm_s["dp"]) == pytest.approx(float(a.optimizer_s) / 2)


FLAGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
         "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2").split()


def test_read_from_megatron_args_and_cli_words() -> None:
    flags = read_flags([*FLAGS, "--overlap-param-gather-with-optimizer-step"])
    assert flags.training_fields["overlap_param_gather_with_optimizer_step"] is True
    assert "overlap_param_gather_with_optimizer_step" not in read_flags(FLAGS).training_fields
    assert memory_knobs_from_words(["--overlap-param-gather-with-optimizer-step"], "bf16") == {
        "overlap_param_gather_with_optimizer_step": True}


def test_megatron_rules() -> None:
    assert not [c for c, _ in launch_violations(LLAMA, VP5, ON) if c.startswith("OVERLAP_PARAM_GATHER_WITH")]
    codes = {c for c, _ in launch_violations(LLAMA, replace(VP5, vp=1, overlap_param_gather=False), ON)}
    assert {"OVERLAP_PARAM_GATHER_WITH_OPT_STEP_NEEDS_OVERLAP", "OVERLAP_PARAM_GATHER_WITH_OPT_STEP_NEEDS_VP"} <= codes
    # Megatron-LM refuses it with distributed checkpoints, the only formats launch writes: its files leave it out,
    # saying so over the checkpoint flags; Megatron-Bridge has no such rule
    groups = megatron_args(LLAMA, VP5, ON)
    assert "--overlap-param-gather-with-optimizer-step" not in argv(groups, resolve=True)
    assert "not supported with distributed checkpointing" in groups[-1].title and "\n" not in groups[-1].title
    assert "--overlap-param-gather-with-optimizer-step" in argv(megatron_args(LLAMA, VP5, ON, megatron_lm=False))
    assert "--overlap-param-gather-with-optimizer-step" not in argv(megatron_args(LLAMA, VP5, OFF), resolve=True)


def test_recipe_column_applied_only_where_it_acts() -> None:
    rows = [r for r in bridge_recipes() if r.get("overlap_param_gather_with_optimizer_step") is True]
    on = [r for r in rows if r.get("overlap_param_gather") is True]
    off = [r for r in rows if r.get("overlap_param_gather") is False]
    assert on and off
    assert training_knobs(on[0], "bf16").get("overlap_param_gather_with_optimizer_step") is True
    assert "overlap_param_gather_with_optimizer_step" not in training_knobs(off[0], "bf16")


# Selective recompute by layer kind (Megatron-Core): mla_up_proj re-runs MLA's q and kv up projections
# (multi_latent_attention.py ``qkv_up_proj_and_rope_apply``), shared_experts the shared expert (moe_layer.py).
DSV3 = load_model("deepseek-v3")


def _dsv3_recompute(modules: tuple[str, ...], *, moe: bool) -> tuple[float, float, float]:
    from paraplan.estimate.time.compute import gemm_s
    from paraplan.estimate.time.layer import layer_time, recompute_s

    cluster = make_cluster(H100, 64, 8)
    lay = ParallelLayout(tp=2, pp=1, dp=32, ep=8, etp=1, mbs=1, recompute="selective", recompute_modules=modules,
                         sequence_parallel=True)
    t = TrainingSpec(seq_len=4096, global_batch_size=64)
    lt = layer_time(DSV3, cluster, t, lay, moe=moe)
    tokens, a = 4096.0, DSV3.num_attention_heads
    # by hand: q up (T x 1536)(1536 x a*192/2) and kv up (T x 512)(512 x a*256/2), bf16, forward only
    up = (gemm_s(cluster, False, tokens, a * (128 + 64) / 2, 1536)
          + gemm_s(cluster, False, tokens, a * (128 + 128) / 2, 512))
    # shared expert (SwiGLU, f = 2048): fc1 (T x 7168)(7168 x 2*2048/2), fc2 (T x 2048/2)(2048/2 x 7168)
    shared = gemm_s(cluster, False, tokens, 2 * 2048 / 2, 7168) + gemm_s(cluster, False, tokens, 7168, 2048 / 2)
    return float(recompute_s(lt, lay, modules, cluster.gpu.efficiency, moe=moe)), float(up), float(shared)


def test_mla_up_proj_recompute_golden() -> None:
    got, up, _ = _dsv3_recompute(("mla_up_proj",), moe=True)
    assert got == pytest.approx(up) and up > 0
    got_dense, _, _ = _dsv3_recompute(("mla_up_proj",), moe=False)  # every layer kind has MLA
    assert got_dense == pytest.approx(up)


def test_shared_experts_recompute_golden() -> None:
    got, _, shared = _dsv3_recompute(("shared_experts",), moe=True)
    assert got == pytest.approx(shared) and shared > 0
    assert _dsv3_recompute(("shared_experts",), moe=False)[0] == 0.0  # dense layers have no shared expert
    with_moe, _, _ = _dsv3_recompute(("moe", "shared_experts"), moe=True)
    moe_only, _, _ = _dsv3_recompute(("moe",), moe=True)
    assert with_moe == pytest.approx(moe_only)  # the moe module already re-runs the shared expert


# Full recompute, block method (megatron/core/recompute.py ``checkpointed_forward``): in each model chunk only the
# first recompute_num_layers layers are checkpointed (one input each) and re-run; the others keep their activations.
FULL = ParallelLayout(tp=4, pp=8, vp=5, dp=2, mbs=1, recompute="full", sequence_parallel=True)


def _full(method: str, n: int = 1):  # type: ignore[no-untyped-def]
    return estimate(LLAMA, make_cluster(H100, 64, 8), OFF, replace(FULL, recompute_method=method,
                                                                     recompute_num_layers=n))


def test_block_recompute_memory_and_time_golden() -> None:
    from paraplan.estimate import activations as act
    from paraplan.estimate.memory import activation_context

    uniform, block = _full("uniform"), _full("block")
    ctx = activation_context(LLAMA, OFF, FULL)
    one_input = float(act.layer_input_bytes(LLAMA, ctx))
    kept = float(act.layer_bytes_no_full_recompute(LLAMA, ctx, moe=False))
    # stage 0: 10 layers, 2 per chunk, 47 chunk micro-batches in flight; block N=1 keeps 1 input + 1 whole layer
    # per chunk where uniform keeps 2 inputs
    s_u, s_b = uniform.stages[0], block.stages[0]
    assert int(s_b.in_flight) == 47
    assert float(s_b.memory.activations_bytes - s_u.memory.activations_bytes) == pytest.approx(
        47 * (kept - one_input), rel=1e-9)
    # time: half of the layers re-run
    assert float(block.time.recompute_s) == pytest.approx(float(uniform.time.recompute_s) / 2)
    assert float(block.throughput.hfu) < float(uniform.throughput.hfu)


def test_block_covering_the_chunk_is_uniform_one() -> None:
    a, b = _full("uniform", 1), _full("block", 2)  # 2 layers per chunk: block 2 checkpoints every layer
    assert float(b.peak_bytes) == pytest.approx(float(a.peak_bytes))
    assert float(b.time.step_s) == pytest.approx(float(a.time.step_s))


def test_block_method_read_written_and_from_recipes() -> None:
    words = argv(megatron_args(LLAMA, replace(FULL, recompute_method="block", recompute_num_layers=2), OFF),
                 resolve=True)
    assert words[words.index("--recompute-method") + 1] == "block"
    lay = read_flags(words).layout_fields
    assert (lay["recompute_method"], lay["recompute_num_layers"]) == ("block", 2)
    from paraplan.recipes.knobs import layout_fields

    r = next(x for x in bridge_recipes() if x.get("recompute_method") == "block")
    fields, notes = layout_fields(r)
    assert fields["recompute_method"] == "block" and not any("block" in n for n in notes)


def test_block_method_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from paraplan.cli import main

    base = ["estimate", "-m", "llama3-70b", "-g", "h100-80gb", "--num-gpus", "64", "--seq-len", "8192", "--gbs",
            "256", "--tp", "4", "--pp", "8", "--vp", "5", "--format", "json"]
    assert main([*base, "--recompute", "full", "--recompute-method", "block"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert (cfg["recompute_method"], cfg["recompute_num_layers"]) == ("block", 1)
    assert main([*base, "--recompute", "selective", "--recompute-method", "block"]) == 1
    err = capsys.readouterr().err
    assert "--recompute-method and --recompute selective contradict" in err and err.count("\n") == 1
    assert main([*base, "--recompute", "full", "--recompute-method", "blocks"]) == 1
    assert "--recompute-method: expected one of uniform, block, got 'blocks'" in capsys.readouterr().err


# --no-gradient-accumulation-fusion (distributed_data_parallel.py ``_make_backward_post_hook``): the wgrad GEMMs
# write a bf16 .grad (2 B) that ``main_grad.add_`` reads (2 B) with the fp32 main gradient read and written (4 + 4).
def test_unfused_grad_accumulation_golden() -> None:
    from paraplan.estimate.time.compute import hbm_rate

    cluster = make_cluster(H100, 64, 8)
    lay = replace(VP5, overlap_param_gather=False, overlap_grad_reduce=False)
    fused = estimate(LLAMA, cluster, OFF, lay)
    unfused = estimate(LLAMA, cluster, replace(OFF, gradient_accumulation_fusion=False), lay)
    bf16 = estimate(LLAMA, cluster, replace(OFF, gradient_accumulation_fusion=False, grad_reduce_in_bf16=True), lay)
    slow = int(fused.time.slowest_stage)
    assert int(unfused.time.slowest_stage) == slow
    params = float(fused.stages[slow].params.total)
    m = 256 // (2 * 1)  # GBS / (DP x mbs)
    per_mb = (2 + 2 + 4 + 4) * params / hbm_rate(cluster)
    assert float(unfused.time.compute_s - fused.time.compute_s) == pytest.approx(m * per_mb)
    assert float(unfused.time.step_s) > float(fused.time.step_s)
    # bf16 main gradients: 2 + 2 + 2 + 2 bytes
    assert float(bf16.time.compute_s - fused.time.compute_s) == pytest.approx(m * per_mb * 8 / 12, rel=1e-6)


def test_grad_accumulation_fusion_read_written_and_from_recipes() -> None:
    assert read_flags([*FLAGS, "--no-gradient-accumulation-fusion"]).training_fields[
        "gradient_accumulation_fusion"] is False
    assert "gradient_accumulation_fusion" not in read_flags(FLAGS).training_fields
    assert memory_knobs_from_words(["--no-gradient-accumulation-fusion"], "bf16") == {
        "gradient_accumulation_fusion": False}
    t = replace(OFF, gradient_accumulation_fusion=False)
    words = argv(megatron_args(LLAMA, VP5, t), resolve=True)
    assert words.count("--no-gradient-accumulation-fusion") == 1
    assert TrainingSpec(**read_flags(words).training_fields).gradient_accumulation_fusion is False
    fsdp = ParallelLayout(tp=4, pp=1, dp=16, mbs=1, recompute="none", sequence_parallel=True, fsdp=True,
                          distributed_optimizer=False)
    assert argv(megatron_args(LLAMA, fsdp, t), resolve=True).count("--no-gradient-accumulation-fusion") == 1
    # Megatron-FSDP is no exception (Megatron only warns, arguments.py validate_args): fusion stays on unless the
    # knob turns it off, and the flag read back from an FSDP script is the knob
    assert "--no-gradient-accumulation-fusion" not in argv(megatron_args(LLAMA, fsdp, OFF), resolve=True)
    fsdp_words = argv(megatron_args(LLAMA, fsdp, t), resolve=True)
    assert "--use-megatron-fsdp" in fsdp_words
    assert read_flags(fsdp_words).training_fields["gradient_accumulation_fusion"] is False
    assert "gradient_accumulation_fusion" not in read_flags(argv(megatron_args(LLAMA, fsdp, OFF),
                                                                  resolve=True)).training_fields
    assert "--no-gradient-accumulation-fusion" not in argv(megatron_args(LLAMA, VP5, OFF), resolve=True)
    rows = [r for r in bridge_recipes() if r.get("gradient_accumulation_fusion") is False]
    assert rows and training_knobs(rows[0], "bf16")["gradient_accumulation_fusion"] is False


# Megatron-FSDP (optim_grads_params) forces both overlap switches on: MegatronFSDP.__init__ sets
# ddp_config.overlap_param_gather = overlap_grad_reduce = True (megatron_fsdp.py ~328-337), so turning them off
# changes nothing there (and the estimate says so), while the distributed optimizer exposes its collectives.
def test_fsdp_overlap_switches_are_forced_on_as_megatron_fsdp_does() -> None:
    cluster = make_cluster(H100, 64, 8)
    fsdp = ParallelLayout(tp=1, pp=1, dp=64, mbs=1, recompute="full", sequence_parallel=False, fsdp=True,
                          distributed_optimizer=False, overlap_grad_reduce=True, overlap_param_gather=True)
    off = replace(fsdp, overlap_grad_reduce=False, overlap_param_gather=False)
    t = replace(OFF, global_batch_size=512)
    on_est, off_est = estimate(LLAMA, cluster, t, fsdp), estimate(LLAMA, cluster, t, off)
    assert float(off_est.time.step_s) == float(on_est.time.step_s)
    notes = [n for n in off_est.notes if "Megatron-FSDP" in n and "no effect" in n]
    assert len(notes) == 1 and "--overlap-grad-reduce and --overlap-param-gather" in notes[0]
    assert not [n for n in on_est.notes if "no effect" in n]
    only_grad = estimate(LLAMA, cluster, t, replace(fsdp, overlap_grad_reduce=False))
    assert next(n for n in only_grad.notes if "no effect" in n).startswith("--overlap-grad-reduce off")
    dist = replace(fsdp, fsdp=False, distributed_optimizer=True)
    dist_off = replace(dist, overlap_grad_reduce=False, overlap_param_gather=False)
    dist_off_est = estimate(LLAMA, cluster, t, dist_off)
    assert float(dist_off_est.time.step_s) > float(estimate(LLAMA, cluster, t, dist).time.step_s)
    assert not [n for n in dist_off_est.notes if "no effect" in n]
