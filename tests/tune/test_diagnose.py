"""diagnose(): the tuning-method rules fire on synthetic runs built to trigger them, with their numbers."""

from __future__ import annotations

import json
import shlex

from paraplan.explain import Finding
from paraplan.ingest import parse_text
from paraplan.tune import compare, diagnose, launch_command, neighbourhood
from tests.tune.helpers import make_estimate, megatron_log


def _codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def _by_code(findings: list[Finding], code: str) -> Finding:
    return next(f for f in findings if f.code == code)


def test_slow_run_with_big_bubble_says_interleave() -> None:
    # PP 4 with only 8 micro-batches: (p-1)/m = 37.5%; measured 30% slower, the timers show the bubble
    est = make_estimate("llama3-8b", 16, 4096, 16, tp=2, pp=4)
    step = 1.3 * float(est.time.step_s)
    cmp = compare(est, parse_text(megatron_log(est, step_s=step, bubble_s=0.35 * step)))
    findings = diagnose(cmp, model_ref="llama3-8b")
    json.dumps([f.as_dict() for f in findings])  # numbers are plain JSON
    bub = _by_code(findings, "BUBBLE")
    assert bub.numbers["bubble_frac"] > 0.3 and bub.numbers["pp"] == 4 and bub.numbers["num_microbatches"] == 8
    assert "(4-1)/(1x8)" in bub.text and "Interleave" in bub.text
    labels = [o["label"] for o in bub.numbers["options"]]
    assert {"VP 2", "VP 4", "VP 8"} <= set(labels)
    assert all(o["gain"] > 0 for o in bub.numbers["options"] if o["label"].startswith("VP"))
    step_f = _by_code(findings, "STEP_TIME")
    assert abs(step_f.numbers["ratio"] - 1.3) < 0.01 and "paraplan calibrate" in step_f.text
    nxt = findings[-1]
    assert nxt.code == "NEXT_LAYOUT" and nxt.numbers["gain"] > 0
    cmd = shlex.split(nxt.numbers["command"])
    assert cmd[:2] == ["paraplan", "launch"] and cmd[cmd.index("--model") + 1] == "llama3-8b"
    assert nxt.numbers["expected_step_s"] > nxt.numbers["predicted_step_s"]  # scaled by the measured x1.3


def test_healthy_run_gives_no_rule_findings() -> None:
    est = make_estimate("llama3-8b", 8, 4096, 64, tp=1)
    cmp = compare(est, parse_text(megatron_log(est)))
    findings = diagnose(cmp)
    assert _codes(findings)[0] == "STEP_TIME" and _codes(findings)[-1] == "NEXT_LAYOUT"
    assert not {"BUBBLE", "TP_COMM", "DP_SYNC_EXPOSED", "MEMORY_ABOVE_PREDICTION", "MEMORY_HEADROOM"} & set(
        _codes(findings))
    assert abs(findings[0].numbers["ratio"] - 1.0) < 0.01 and "calibrate" not in findings[0].text


def test_tp_communication_concentrated() -> None:
    est = make_estimate("llama3-8b", 8, 4096, 64, tp=8)
    findings = diagnose(compare(est, parse_text(megatron_log(est))), search=False)
    tp = _by_code(findings, "TP_COMM")
    assert tp.numbers["tp_inside_nvlink"] is True and tp.numbers["share"] > 0.1
    assert "stays inside the 8-GPU NVLink domain" in tp.text
    labels = [o["label"] for o in tp.numbers["options"]]
    assert labels == ["--tp-comm-overlap", "TP 8 -> 4"]


def test_dp_sync_exposed_names_the_missing_flags() -> None:
    est = make_estimate("llama3-8b", 32, 4096, 256, tp=4, distributed_optimizer=False, overlap_grad_reduce=False,
                        overlap_param_gather=False)
    step = float(est.time.step_s)
    cmp = compare(est, parse_text(megatron_log(est, step_s=step, dp_sync_s=0.2 * step)))
    dp = _by_code(diagnose(cmp, search=False), "DP_SYNC_EXPOSED")
    assert abs(dp.numbers["share"] - 0.2) < 0.01
    assert dp.numbers["missing_flags"] == ["--overlap-grad-reduce", "--use-distributed-optimizer",
                                           "--overlap-param-gather"]
    assert "all-grads-sync timer" in dp.text


def test_measured_memory_above_prediction_is_explained_and_scales_next_layouts() -> None:
    est = make_estimate("llama3-8b", 16, 4096, 64, tp=2, pp=2)
    cmp = compare(est, parse_text(megatron_log(est, mem_factor=1.3)))
    assert abs(cmp.memory_ratio - 1.3) < 1e-3
    gap = _by_code(diagnose(cmp, search=False), "MEMORY_ABOVE_PREDICTION")
    assert abs(gap.numbers["ratio"] - 1.3) < 1e-3 and gap.numbers["fragmentation_bytes"] > 0
    assert "fragmentation" in gap.text and "x1.30" in gap.text


def test_memory_headroom_lowers_tp_or_pp() -> None:
    est = make_estimate("llama3-8b", 16, 4096, 64, tp=4, pp=2)
    findings = diagnose(compare(est, parse_text(megatron_log(est))), search=False)
    room = _by_code(findings, "MEMORY_HEADROOM")
    assert room.numbers["free_frac"] > 0.5
    opts = {o["label"]: o for o in room.numbers["options"]}
    assert set(opts) == {"TP 4 -> 2", "PP 2 -> 1"}
    assert all(o["fits"] for o in opts.values())
    assert opts["TP 4 -> 2"]["layout"].startswith("tp2 pp2 dp4")


def test_next_layout_uses_a_given_plan_and_search_can_be_off() -> None:
    est = make_estimate("llama3-8b", 16, 4096, 16, tp=2, pp=4)
    cmp = compare(est, parse_text(megatron_log(est)))
    found = neighbourhood(cmp)
    assert found is not None and found.candidates
    last = _by_code(diagnose(cmp, found), "NEXT_LAYOUT")
    assert last.numbers["short"] == found.candidates[0].layout.short()
    off = diagnose(cmp, search=False)[-1]
    assert off.code == "NEXT_LAYOUT" and off.numbers["layout"] is None
    assert "no layout search was run" in off.text  # not "no other layout fits"


def test_best_overall_shows_a_layout_several_steps_away() -> None:
    # Llama-3-8B at 512 tokens on 16 H100s with TP 4 and mbs 1: the step-by-step search moves TP, PP and
    # the micro-batch one step at a time; the whole search finds a layout further away (mbs 8) that is
    # faster still, and says so with its launch command.
    est = make_estimate("llama3-8b", 16, 512, 64, tp=4)
    findings = diagnose(compare(est, parse_text(megatron_log(est))))
    nxt, best = _by_code(findings, "NEXT_LAYOUT"), _by_code(findings, "BEST_OVERALL")
    assert best.numbers["short"] != nxt.numbers["short"] and best.numbers["layout"]["mbs"] > 2
    assert [f.code for f in findings][-1] == "NEXT_LAYOUT"
    assert best.numbers["predicted_step_s"] < 0.95 * nxt.numbers["predicted_step_s"]
    assert "paraplan launch" in best.text


def test_launch_command_flags() -> None:
    est = make_estimate("llama3-8b", 16, 4096, 64, tp=2, pp=2, vp=2, sequence_parallel=False,
                        distributed_optimizer=False, overlap_grad_reduce=False, overlap_param_gather=False)
    cmd = shlex.split(launch_command(est, profile="prof.yaml", out="runs/x"))
    assert cmd[cmd.index("--vp") + 1] == "2" and cmd[cmd.index("--gbs") + 1] == "64"
    for flag in ("--no-sequence-parallel", "--no-distributed-optimizer", "--no-overlap-grad-reduce"):
        assert flag in cmd
    assert "--no-overlap-param-gather" not in cmd and "--cp" not in cmd
    assert cmd[-4:] == ["--target", "all", "--out", "runs/x"] and "prof.yaml" in cmd
