"""Megatron's userbuffers pair switches (``--no-tp-comm-overlap-ag``, ``--no-tp-comm-overlap-rs``, as
megatron/core/extensions/transformer_engine.py passes them to TE's ``ub_overlap_ag`` / ``ub_overlap_rs``) and PEFT
(frozen column weights: no wgrad GEMM for the bulk reduce-scatter to hide behind), by hand from the pair times;
the userbuffers flags paraplan does not model give a note, never silence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cli.options import knob_fields
from paraplan.estimate.time import tp
from paraplan.estimate.time.compute import gemm_s
from paraplan.estimate.time.layer import dense_mlp_time
from paraplan.launch.bridge import choose_recipe, overrides
from paraplan.launch.megatron import argv, megatron_args
from paraplan.layout import ParallelLayout
from paraplan.recipes.catalogue import bridge_recipes
from paraplan.recipes.knobs import not_modelled
from paraplan.specs.cluster import make_cluster
from paraplan.specs.load import load_gpu, load_model
from paraplan.specs.megatron_flags import read_flags
from paraplan.specs.training import TrainingSpec
from tests.launch.test_bridge import _knob_spec

LLAMA = load_model("llama3-70b")
H100 = load_gpu("h100-80gb")
TP4 = ParallelLayout(tp=4, pp=1, dp=2, mbs=1, recompute="none", sequence_parallel=True,
                     distributed_optimizer=True, tp_comm_overlap=True)
TRAINING = TrainingSpec(seq_len=8192, global_batch_size=16)


def _pairs() -> dict[str, float]:
    """The MLP block's five pair exposures under TE's defaults (tests/golden/test_tp_comm_overlap.py's by-hand
    terms) and the plain collective time."""
    cluster = make_cluster(H100, 8, 8)
    T, h, f = 8192, LLAMA.hidden_size, LLAMA.ffn
    eff = H100.efficiency
    coll = 3 / 4 * 2 * T * h / (H100.nvlink_bytes_per_s * eff.nvlink_bus_frac) + 2 * eff.collective_latency_s
    fc1 = gemm_s(cluster, "bf16", T, 2 * f / 4, h)
    fc2 = gemm_s(cluster, "bf16", T, h, f / 4)
    fc2_dgrad = gemm_s(cluster, "bf16", T, f / 4, h)
    share = 16 / 132
    slowed = fc2 / (1 - share)
    return {"coll": coll, "ag_fwd": max(0.0, 3 * (coll / 3 - fc1 / 4)),
            "rs_fwd": coll / 4 + 3 * max(0.0, (coll - slowed) / 4) + slowed - fc2,
            "ag_dgrad": max(0.0, 3 * (coll / 3 - fc2_dgrad / 4)),
            # TE's bulk default set_sm_margin: the GEMM on SMs - 16 for its whole run
            "bulk": max(0.0, coll - fc1 / (1 - share)) + fc1 / (1 - share) - fc1}


@pytest.mark.parametrize(("knobs", "fwd", "bwd"), [
    ({}, ("ag_fwd", "rs_fwd"), ("ag_dgrad", "bulk", "bulk")),
    ({"tp_comm_overlap_ag": False}, ("coll", "rs_fwd"), ("coll", "bulk", "bulk")),
    ({"tp_comm_overlap_rs": False}, ("ag_fwd", "coll"), ("ag_dgrad", "bulk", "bulk")),
    ({"peft": True}, ("ag_fwd", "rs_fwd"), ("ag_dgrad", "bulk", "coll")),
])
def test_mlp_block_pairs_by_hand(knobs: dict[str, bool], fwd: tuple[str, ...], bwd: tuple[str, ...]) -> None:
    """A switched-off pair runs as a plain collective before/after its GEMM (TE ``gather_along_first_dim`` /
    ``reduce_scatter_along_first_dim``): all of it shows; under PEFT the input-gradient reduce-scatter has no
    wgrad GEMM to hide behind."""
    p = _pairs()
    cluster = make_cluster(H100, 8, 8)
    mlp = dense_mlp_time(LLAMA, cluster, replace(TRAINING, **knobs), TP4, ffn=LLAMA.ffn)
    assert float(mlp.tp_fwd_exposed_s) == pytest.approx(sum(p[k] for k in fwd), rel=1e-9)
    assert float(mlp.tp_exposed_s) == pytest.approx(sum(p[k] for k in fwd + bwd), rel=1e-9)
    assert float(mlp.tp_link_s) == pytest.approx(5 * p["coll"], rel=1e-9)


def test_switches_never_hide_more() -> None:
    cluster = make_cluster(H100, 8, 8)
    base = float(dense_mlp_time(LLAMA, cluster, TRAINING, TP4, ffn=LLAMA.ffn).tp_exposed_s)
    # (not PEFT: its frozen weights drop the wgrad GEMM, and with it the SM margin the bulk reduce-scatter costs)
    for knobs in ({"tp_comm_overlap_ag": False}, {"tp_comm_overlap_rs": False}):
        got = float(dense_mlp_time(LLAMA, cluster, replace(TRAINING, **knobs), TP4, ffn=LLAMA.ffn).tp_exposed_s)
        assert got >= base
    # without userbuffers the switches change nothing
    plain = replace(TP4, tp_comm_overlap=False)
    assert float(dense_mlp_time(LLAMA, cluster, replace(TRAINING, tp_comm_overlap_ag=False), plain,
                                ffn=LLAMA.ffn).tp_exposed_s) == float(
        dense_mlp_time(LLAMA, cluster, TRAINING, plain, ffn=LLAMA.ffn).tp_exposed_s)
    assert tp.bulk_exposed_s(1.0, 2.0, 0.1) < 1.0


FLAGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--tensor-model-parallel-size 2 --sequence-parallel").split()


@pytest.mark.parametrize("spelling", ["no", "disable"])
def test_read_from_megatron_args_and_written_back(spelling: str) -> None:
    got = read_flags([*FLAGS, "--tp-comm-overlap", f"--{spelling}-tp-comm-overlap-ag",
                      f"--{spelling}-tp-comm-overlap-rs"])
    assert (got.training_fields["tp_comm_overlap_ag"], got.training_fields["tp_comm_overlap_rs"]) == (False, False)
    assert not [n for n in got.notes if "userbuffers" in n]
    lay = ParallelLayout(tp=2, pp=1, dp=4, mbs=1, recompute="none", sequence_parallel=True, tp_comm_overlap=True)
    words = argv(megatron_args(LLAMA, lay, replace(TRAINING, tp_comm_overlap_ag=False)), resolve=True)
    assert "--no-tp-comm-overlap-ag" in words and "--no-tp-comm-overlap-rs" not in words
    assert not {"--no-tp-comm-overlap-ag", "--no-tp-comm-overlap-rs"} & set(
        argv(megatron_args(LLAMA, lay, TRAINING), resolve=True))
    assert knob_fields(["no-tp-comm-overlap-rs"], "bf16") == {"tp_comm_overlap_rs": False}
    items = dict(overrides((spec := _knob_spec(tp_comm_overlap_rs=False)), choose_recipe(spec)))
    assert items["model.tp_comm_overlap_rs"] is False and items["model.tp_comm_overlap_ag"] is True  # both written


def test_unmodelled_userbuffers_flags_are_noted() -> None:
    got = read_flags([*FLAGS, "--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad", "--no-tp-comm-bulk-wgrad"])
    note = next(n for n in got.notes if n.startswith("not modelled:"))
    assert "--no-tp-comm-bulk-wgrad" in note
    assert "--tp-comm-overlap-cfg" not in note  # modelled: tests/golden/test_ub_configs.py
    assert "--tp-comm-overlap-rs-dgrad" not in note and got.training_fields["tp_comm_overlap_rs_dgrad"] is True
    plain = read_flags([*FLAGS, "--no-tp-comm-overlap-ag", "--tp-comm-overlap-cfg", "ub.yaml"])
    assert plain.training_fields["tp_comm_overlap_ag"] is False  # kept as written; nothing to switch off
    assert "tp_comm_overlap_cfg" not in plain.training_fields  # no file, and Megatron-LM never opens it here
    assert "userbuffers flags are ignored without --tp-comm-overlap" in plain.notes


def test_recipes_naming_a_userbuffers_config_apply_it() -> None:
    """Bridge's named configs (training/comm_overlap.py) go into the TrainingSpec (their methods and SMs are
    costed); one the packaged data lacks stays listed as not modelled."""
    from paraplan.recipes.knobs import training_knobs
    from paraplan.specs.userbuffers import packaged

    named = [r for r in bridge_recipes() if r.get("tp_comm_overlap") is True and r.get("tp_comm_overlap_cfg")]
    assert len(named) == 30
    for r in named:
        assert not any(s.startswith("tp_comm_overlap_cfg") for s in not_modelled(r))
        assert training_knobs(r, "bf16")["tp_comm_overlap_cfg"] == r.get("tp_comm_overlap_cfg") in packaged()
    unknown = replace(named[0], fields={**named[0].fields, "tp_comm_overlap_cfg": "userbuffers_bf16_x_tp9"})
    assert "tp_comm_overlap_cfg=userbuffers_bf16_x_tp9" in not_modelled(unknown)
    assert "tp_comm_overlap_cfg" not in training_knobs(unknown, "bf16")
    plain = [r for r in bridge_recipes() if not r.get("tp_comm_overlap_cfg")]
    assert plain and not any(s.startswith("tp_comm_overlap_cfg") for r in plain for s in not_modelled(r))
