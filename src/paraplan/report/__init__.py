"""HTML report of a plan: one self-contained file (plotly.js embedded, no CDN), deterministic bytes.

    plan (+ run logs) --build.build_context--> ReportContext --charts.charts--> figures
                      --render_html--> HTML --write_report--> file (temp file + rename)

The page opens offline and can be archived with a run: plotly.js is inlined once, every figure is
``Plotly.newPlot`` on a fixed element id, and nothing depends on the clock or random ids.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from paraplan.fileio import write_text_atomic
from paraplan.report.build import ReportContext, build_context
from paraplan.report.charts import Chart, charts

TEMPLATE = "report.html.j2"


def _script_safe(text: str) -> str:
    """Text that cannot close the surrounding <script> element or open an HTML comment."""
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def plotly_js() -> str:
    """The plotly.js bundle that ships with the installed plotly package."""
    from plotly.offline import get_plotlyjs

    return _script_safe(str(get_plotlyjs()))


def figures_json(items: list[Chart]) -> str:
    """``{element id: {data, layout}}`` as a JavaScript literal safe inside <script>."""
    body = ",\n".join(f"{json.dumps(c.id)}: {c.figure.to_json()}" for c in items)
    return _script_safe("{\n" + body + "\n}")


def significant(value: float) -> str:
    """A number for a table cell: thousands separators above 1000, else 4 significant digits."""
    v = float(value)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def render_html(ctx: ReportContext, items: list[Chart] | None = None, *, plotly_bundle: str | None = None) -> str:
    """The report page. ``plotly_bundle`` replaces the embedded plotly.js (tests pass a stub)."""
    import jinja2
    from markupsafe import Markup

    items = charts(ctx) if items is None else items
    source = resources.files("paraplan.report").joinpath("templates", TEMPLATE).read_text(encoding="utf-8")
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = lambda v, fmt=",.0f": format(float(v), fmt)
    env.filters["sig"] = significant
    template = env.from_string(source)
    bundle = plotly_js() if plotly_bundle is None else _script_safe(plotly_bundle)
    return template.render(ctx=ctx, charts=items, plotly_js=Markup(bundle), figures=Markup(figures_json(items)))


def write_report(ctx: ReportContext, path: str | Path, *, force: bool = False) -> int:
    """Render and write the report atomically (an existing file only with ``force``); returns its size in bytes."""
    html = render_html(ctx)
    write_text_atomic(path, html, force=force)
    return len(html.encode("utf-8"))


__all__ = ["Chart", "ReportContext", "build_context", "charts", "figures_json", "render_html", "write_report"]
