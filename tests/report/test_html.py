"""The HTML page: self-contained (plotly.js once, no external scripts), every chart, the run's diagnosis,
stable bytes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
from markupsafe import escape

from paraplan.errors import SpecError
from paraplan.ingest import parse_text
from paraplan.report import (
    Chart,
    build_context,
    charts,
    plotly_js,
    render_html,
    write_report,
    write_text_atomic,
)
from paraplan.search import Plan
from paraplan.tune import compare, diagnose
from tests.report.conftest import LOG

STUB = "/* plotly stub */ window.Plotly = {newPlot: function () {}};"


@pytest.fixture(scope="module")
def html_8b(plan_8b: Plan) -> str:
    return render_html(build_context(plan_8b, log=parse_text(LOG, source="train.log")))


def _figures(html: str) -> dict[str, dict[str, object]]:
    m = re.search(r"var figures = (\{.*?\n\});\n", html, re.S)
    assert m is not None
    return dict(json.loads(m.group(1).replace("<\\/", "</")))


def test_plotly_js_is_embedded_exactly_once(html_8b: str) -> None:
    bundle = plotly_js()
    assert len(bundle) > 1_000_000
    assert html_8b.count(bundle) == 1
    assert html_8b.count("plotly.js v") == 1


def test_no_external_resources(html_8b: str) -> None:
    assert not re.search(r"<script[^>]*\bsrc\s*=", html_8b, re.I)
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?https?:", html_8b, re.I)
    assert not re.search(r"<(img|iframe)[^>]*\bsrc\s*=\s*[\"']?https?:", html_8b, re.I)
    assert "cdn.plot.ly" not in html_8b.replace(plotly_js(), "")


def test_every_chart_has_a_div_and_a_figure_with_data(plan_8b: Plan, html_8b: str) -> None:
    ctx = build_context(plan_8b, log=parse_text(LOG, source="train.log"))
    ids = [c.id for c in charts(ctx)]
    assert ids[:5] == ["chart-landscape", "chart-rejections", "chart-memory", "chart-time", "chart-schedule-0"]
    assert ids[-1] == "chart-measured" and all(i.startswith("chart-schedule-") for i in ids[5:-1])
    figures = _figures(html_8b)
    assert list(figures) == ids
    for chart_id in ids:
        assert html_8b.count(f'<div id="{chart_id}" class="chart"') == 1
        data = figures[chart_id]["data"]
        assert isinstance(data, list) and data and all(trace.get("x") for trace in data)


def test_text_sections(plan_8b: Plan, html_8b: str) -> None:
    for code in ("BINDING_MEMORY", "DOMINANT_TIME", "SEARCH"):
        assert f'<code class="tag">{code}</code>' in html_8b
    assert "llama3-8b" in html_8b and "global batch size" in html_8b and "h100-80gb" in html_8b
    assert plan_8b.candidates[0].layout.short() in html_8b
    assert "Predicted vs measured" in html_8b and "train.log" in html_8b


def _section(html: str, section_id: str) -> str:
    m = re.search(rf'<section id="{section_id}">(.*?)</section>', html, re.S)
    assert m is not None
    return m.group(1)


def test_the_diagnosis_section_shows_paraplan_tune_s_findings(plan_8b: Plan, html_8b: str) -> None:
    log = parse_text(LOG, source="train.log")
    section = _section(html_8b, "diagnosis")
    findings = diagnose(compare(plan_8b.candidates[0], log))
    items = re.findall(r'<li><code class="tag">([A-Z_]+)</code>(.*?)</li>', section, re.S)
    assert items == [(f.code, str(escape(f.text))) for f in findings]
    assert items[-1][0] == "NEXT_LAYOUT" and "Launch: paraplan launch" in items[-1][1]
    for name in ("step time (s)", "throughput (tokens/s/GPU)", "MFU (%)", "peak memory (max allocated) (GiB)"):
        assert f"<td>{name}</td>" in section
    assert "Peak memory per pipeline stage" in section and "64.5 GiB" in section  # rank 0: 66000 MB
    assert "measured within" not in html_8b  # the report's old ad-hoc diagnosis is gone
    assert '<a href="#diagnosis">diagnosis</a>' in html_8b


def test_the_measured_chart_has_step_time_throughput_mfu_and_memory(html_8b: str) -> None:
    fig = _figures(html_8b)["chart-measured"]
    titles = [a["text"] for a in fig["layout"]["annotations"]]  # type: ignore[index]
    assert titles[:4] == ["step time (s)", "tokens/s/GPU", "MFU (%)", "memory per stage (GiB)"]
    data = fig["data"]
    assert isinstance(data, list) and len(data) == 8
    assert data[7]["x"] == ["s0", "s1"] and data[7]["customdata"] == ["0", "8"]


def test_without_per_rank_memory_the_memory_panel_is_left_out(plan_8b: Plan) -> None:
    log = parse_text(" iteration 10/100 | elapsed time per iteration (ms): 4125.0 |\n"
                     " iteration 20/100 | elapsed time per iteration (ms): 4000.0 |\n", source="short.log")
    html = render_html(build_context(plan_8b, log=log), plotly_bundle=STUB)
    fig = _figures(html)["chart-measured"]
    assert [a["text"] for a in fig["layout"]["annotations"]] == [  # type: ignore[index]
        "step time (s)", "tokens/s/GPU", "MFU (%)"]
    assert "no per-rank memory report" in html
    assert "Peak memory per pipeline stage" not in _section(html, "diagnosis")


@pytest.mark.parametrize("with_log", [False, True])
def test_the_same_inputs_give_the_same_bytes(plan_8b: Plan, with_log: bool) -> None:
    def render() -> str:
        log = parse_text(LOG, source="train.log") if with_log else None
        return render_html(build_context(plan_8b, log=log), plotly_bundle=STUB)

    one, two = render(), render()
    assert one == two
    page = one.replace(STUB, "")
    assert not re.search(r"\b20\d\d-\d\d-\d\d", page)  # no dates
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-", page)  # no uuids


def test_script_closing_text_cannot_break_out(plan_8b: Plan) -> None:
    ctx = build_context(plan_8b)
    bad = "</script><script>alert(1)</script>"
    fig = go.Figure(go.Bar(x=[1], y=[bad]), layout={"title": {"text": bad}})
    item = Chart("chart-evil", bad, bad, fig)
    html = render_html(ctx, [item], plotly_bundle=STUB + "// </script>")
    assert html.count("</script>") == 2  # the bundle's element and the figures' element
    assert "&lt;/script&gt;" in html  # title and caption escaped as text
    assert _figures(html)["chart-evil"]["layout"]["title"]["text"] == bad  # type: ignore[index]


def test_write_report_is_atomic(plan_8b: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "sub" / "report.html"
    size = write_report(build_context(plan_8b), out)
    assert out.stat().st_size == size > 1_000_000
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    before = out.read_bytes()

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(SpecError, match=r"cannot write \(disk full\)"):
        write_text_atomic(out, "partial", force=True)
    assert out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.html"]
