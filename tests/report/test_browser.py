"""The report in a real browser: headless Debian Chromium driven by Playwright (no browser download).

Needs ``apt-get install chromium`` and ``pip install playwright``; skipped otherwise. Writes
screenshots to tests/report/out/ (git-ignored).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
OUT = Path(__file__).parent / "out"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed"),
]


def _write_report(tmp_path: Path, argv: list[str], log: str | None) -> Path:
    import paraplan.cli.report  # noqa: F401  (registers the command)
    from paraplan.cli import main

    out = tmp_path / "report.html"
    extra: list[str] = []
    if log is not None:
        log_path = tmp_path / "train.log"
        log_path.write_text(log, encoding="utf-8")
        extra = ["--log", str(log_path)]
    assert main(["report", *argv, *extra, "-o", str(out)]) == 0
    return out


def _load(tmp_path: Path, report: Path, screenshot: Path) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    external: list[str] = []
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=ARGS,
            viewport={"width": 1400, "height": 900})
        try:
            def offline(route: Any) -> None:  # file: and data: only; anything else is recorded and refused
                if route.request.url.startswith(("file:", "data:", "blob:")):
                    route.continue_()
                else:
                    external.append(route.request.url)
                    route.abort()

            ctx.route("**/*", offline)
            page = ctx.new_page()
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(report.resolve().as_uri(), wait_until="load")
            expected = page.evaluate("document.querySelectorAll('div.chart').length")
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length === {expected}",
                                   timeout=30_000)
            info: dict[str, Any] = page.evaluate("""() => {
                const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
                return {charts: document.querySelectorAll('div.chart').length, plots: plots.length,
                        data: plots.map(p => [p.id, (p.data || []).length,
                                              (p.data || []).reduce((n, t) => n + ((t.x || []).length || 0), 0)]),
                        drawn: plots.map(p => p.querySelectorAll('.main-svg').length),
                        diagnosis: Array.from(document.querySelectorAll('#diagnosis li code.tag'))
                            .map(e => e.textContent),
                        subplots: plots.map(p => p.querySelectorAll('.cartesianlayer > .subplot').length)};
            }""")
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
            for i, el in enumerate(page.query_selector_all("div.chart")):
                el.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-chart{i}.png")))
        finally:
            ctx.close()
    info["errors"] = errors
    info["external"] = external
    return info


def _check(info: dict[str, Any]) -> None:
    assert info["errors"] == []
    assert info["external"] == []
    assert info["plots"] == info["charts"] >= 5
    for chart_id, traces, points in info["data"]:
        assert traces > 0, chart_id
        assert points > 0, chart_id
    assert all(n > 0 for n in info["drawn"])


def test_report_renders_in_chromium(tmp_path: Path) -> None:
    from tests.report.conftest import LOG

    report = _write_report(tmp_path, ["-m", "llama3-8b", "-g", "h100-80gb", "-n", "16", "-s", "4096", "--gbs",
                                      "256", "--pp", "2,4", "--top", "3"], LOG)
    info = _load(tmp_path, report, OUT / "report.png")
    _check(info)
    ids = [d[0] for d in info["data"]]
    assert "chart-measured" in ids and "chart-schedule-0" in ids
    # step time, tokens/s/GPU, MFU and memory per stage (the log reports ranks 0 and 8)
    assert info["subplots"][ids.index("chart-measured")] == 4
    assert info["diagnosis"][0] == "STEP_TIME" and info["diagnosis"][-1] == "NEXT_LAYOUT"
    assert (OUT / "report.png").stat().st_size > 10_000


def test_interleaved_report_renders_in_chromium(tmp_path: Path) -> None:
    report = _write_report(tmp_path, ["-m", "llama3-70b", "-g", "h100-80gb", "-n", "64", "-s", "8192", "--gbs",
                                      "512", "--top", "4"], None)
    info = _load(tmp_path, report, OUT / "report-70b.png")
    _check(info)
    assert info["diagnosis"] == []  # no --log, no diagnosis section
