"""A campaign report as one self-contained HTML file (a CI artifact a team can open).

Sections: the campaign's counts; its failures with their layouts and reproduction
commands; every check of the variant in order with its count (never-hit ones flagged);
validation gaps; the error budget (|got - ref| / bound per output and dtype: how close
the target runs to the tolerance); throughput and compile time over the campaign.

The last two come from ``history``: one record per example,
``{"t": seconds since the start, "examples": n, "budget": {"out/float32": r, ...},
"compile": bool}`` (optional ``"job"``: records of parallel jobs). Plots are drawn with
matplotlib's Agg canvas (no pyplot, no global backend change) and embedded as base64 PNG;
styles are inline; the page loads nothing from anywhere.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import itertools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kda_fuzz.corpus.atomic import write_atomic
from kda_fuzz.names import label as family_label
from kda_fuzz.report.progress import (
    check_counts,
    contract_of,
    family_rows,
    first_finding,
    found_after,
    layout_of,
    reproduce,
    time_shares,
)

FILE_NAME = "kda-fuzz-report.html"
RATIO_FLOOR = 1e-12  # ratios below (exact results) are drawn at the floor

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1100px;
color:#1d1d1f;line-height:1.45;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;
margin-top:2em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f6}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.never td{background:#fff4d6}
.banner{padding:.6em 1em;border-radius:6px;font-weight:600;margin:1em 0}
.bad{background:#fde2e1;color:#8a1010}.good{background:#dff5e3;color:#0d5c22}
.warn{color:#8a5a00;font-weight:600}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;white-space:pre-wrap;
word-break:break-word;font-size:.9em}
.failure{border:1px solid #f1b0ad;border-radius:6px;padding:.2em 1em;margin:1em 0}
img{max-width:100%;height:auto}.muted{color:#666}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _png(fig: Any) -> str:
    """The figure as an ``<img>`` with a base64 PNG (no metadata: nothing but pixels)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


# ------------------------------------------------------------------ sections


def _summary(report: Any, history: Sequence[dict[str, Any]] | None) -> str:
    rate = report.examples / max(report.seconds, 1e-9)
    rows = [
        ("contract", f"{report.contract} / {report.variant} variant"),
        ("targets", ", ".join(report.targets)),
        ("examples", f"{report.examples} in {report.seconds:.1f} s ({rate:.1f}/s)"),
        ("valid / broken", f"{report.valid_cases} / {report.broken_cases}"),
        ("valid not judged", f"{report.skipped} (result overflows its dtype)"),
        *((label, text or "none") for label, text in family_rows(report)),
        ("time", time_shares(report) or "not recorded"),
        ("failures", str(len(report.failures))),
        ("first finding", first_finding(report) or "none"),
        ("saved corpus files", ", ".join(report.saved) or "none"),
        ("history records", str(len(history)) if history else "none"),
    ]
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    n = len(report.failures)
    banner = (f'<div class="banner bad">{n} failure{"s" if n != 1 else ""} found</div>' if n
              else '<div class="banner good">no failure found</div>')
    return f"{banner}<table>{body}</table>"


def _failures(report: Any) -> str:
    if not report.failures:
        return "<p>No failure in this campaign.</p>"
    parts = []
    for i, f in enumerate(report.failures, 1):
        seen = getattr(f, "count", 1)
        items = [f"<h3>{i}. {_e(f.verdict.kind)}: {_e(f.verdict.what)} "
                 f"<span class='muted'>on {_e(f.target)}"
                 + (f", seen in {seen} examples" if seen > 1 else "") + "</span></h3>",
                 f"<pre>{_e(f.verdict.summary())}</pre>",
                 f"<p><b>Layout</b></p><pre>{_e(layout_of(f.case))}</pre>"]
        if getattr(f, "found_seconds", None) is not None:
            items.append(f"<p><b>Found</b>: {_e(found_after(f))} from the start</p>")
        if f.saved:
            items.append(f"<p><b>Saved</b>: <code>{_e(f.saved)}</code></p>")
            line = reproduce(f, report.variant, report.contract)
            items.append("<p><b>Reproduce</b></p><pre>" + _e(line) + "</pre>")
        elif getattr(f, "note", ""):
            items.append(f"<p class='warn'>{_e(f.note)}</p>")
        else:
            items.append("<p class='warn'>Not saved (campaign run with --no-save).</p>")
        parts.append(f"<div class='failure'>{''.join(items)}</div>")
    return "".join(parts)


def _messages(report: Any) -> dict[str, str]:
    try:
        contract = contract_of(report)
        out = {str(c.number): c.message or "any ValueError (the contract does not word it)"
               for c in contract.checks_for(report.variant)}
        out.update({f"hole:{h.name}": f"contract hole: any ValueError (checked after "
                                      f"check {h.after})" for h in contract.holes})
        return out
    except ValueError:
        return {}


def _checks(report: Any) -> str:
    counts = check_counts(report)
    if not counts:
        return "<p>No check known for this contract.</p>"
    never = [k for k, n in counts if not n]
    fig = _figure(11, 3.2)
    ax = fig.add_subplot()
    labels = ["hole" if k.startswith("hole:") else k for k, _ in counts]
    ax.bar(range(len(counts)), [n for _, n in counts],
           color=["#4c72b0" if n else "#e0a000" for _, n in counts])
    for i, (_, n) in enumerate(counts):
        if not n:
            ax.plot(i, 0, marker="x", color="#c03030", markersize=9, mew=2)
    ax.set_xticks(range(len(counts)), labels, fontsize=8)
    for tick, (_, n) in zip(ax.get_xticklabels(), counts):
        if not n:
            tick.set_color("#c03030")
    ax.set_ylabel("broken layouts")
    ax.set_title("cases rejected by each check (x: never hit)")
    msgs = _messages(report)
    rows = "".join(
        f"<tr class='{'never' if not n else ''}'><td>{_e(k)}</td><td class='num'>{n}</td>"
        f"<td>{'<b>never hit</b>' if not n else ''}</td><td><code>{_e(msgs.get(k, ''))}"
        "</code></td></tr>" for k, n in counts)
    head = (f"<p class='warn'>Never hit: {_e(', '.join(never))}</p>" if never
            else "<p>Every check was hit.</p>")
    return (head + _png(fig) + "<table><tr><th>check</th><th>hits</th><th></th>"
            f"<th>message</th></tr>{rows}</table>")


def _gaps(report: Any) -> str:
    if not report.validation_gaps:
        return "<p>None: every broken layout drawn was rejected by the contract.</p>"
    rows = "".join(f"<tr><td>{_e(k)}</td><td class='num'>{n}</td></tr>"
                   for k, n in sorted(report.validation_gaps.items()))
    return ("<p>Broken layouts the contract accepts: findings about the contract, not "
            f"target failures.</p><table><tr><th>breakage</th><th>cases</th></tr>{rows}"
            "</table>")


def _variants(report: Any) -> str:
    seen = getattr(report, "variants", None) or {}
    if not seen:
        return ("<p>No compiled variant was seen (a target of plain torch code, an eager "
                "mode, or no valid case ran).</p>")
    parts = []
    for target, by_label in sorted(seen.items()):
        rows = "".join(
            f"<tr><td><code>{_e(label)}</code></td><td class='num'>{r.count}</td>"
            f"<td>{_e(r.layout)}</td><td><code>{_e(r.detail)}</code></td></tr>"
            for label, r in sorted(by_label.items(), key=lambda kv: (-kv[1].count, kv[0])))
        parts.append(f"<h3>{_e(target)}</h3><table><tr><th>variant</th><th>examples</th>"
                     f"<th>smallest layout that reached it</th><th>detail</th></tr>{rows}"
                     "</table>")
    unrun = report.unrun_variants() if hasattr(report, "unrun_variants") else []
    if unrun:
        parts.append("<p class='warn'>Not run: " + "<br>".join(_e(u) for u in unrun) + "</p>")
    runs = getattr(report, "config_runs", 0)
    skips = getattr(report, "config_skips", {}) or {}
    if runs or skips:
        causes = "".join(f"<li>{n} x {_e(c)}</li>" for c, n in sorted(
            skips.items(), key=lambda kv: -kv[1]))
        parts.append(f"<p>Other kernel configs: {getattr(report, 'config_checks', 0)} valid "
                     f"case(s), {runs} run(s) judged, {sum(skips.values())} skipped (they do "
                     f"not compile or run here)</p>" + (f"<ul>{causes}</ul>" if causes else ""))
    return "".join(parts)


def _budgets(history: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for rec in history:
        for key, r in (rec.get("budget") or {}).items():
            out.setdefault(key, []).append(float(r))
    return out


def _budget(history: Sequence[dict[str, Any]] | None) -> str:
    data = _budgets(history or ())
    if not data:
        return ("<p class='muted'>No error budget recorded (the campaign kept no "
                "per-example history, or judged no valid layout).</p>")
    outputs = sorted({k.split("/")[0] for k in data})
    fig = _figure(11, 3.4)
    finite = [r for rs in data.values() for r in rs if math.isfinite(r)]
    hi = max([1.0, *finite])
    lo = math.log10(RATIO_FLOOR)
    bins = [lo + i * (math.log10(hi) + 0.5 - lo) / 48 for i in range(49)]
    for j, output in enumerate(outputs, 1):
        ax = fig.add_subplot(1, len(outputs), j)
        for key in sorted(k for k in data if k.split("/")[0] == output):
            logs = [math.log10(min(max(r, RATIO_FLOOR), hi)) if math.isfinite(r)
                    else math.log10(hi) for r in data[key]]
            ax.hist(logs, bins=bins, histtype="step", linewidth=1.8,
                    label=f"{key.split('/', 1)[-1]} ({len(logs)})")
        ax.axvline(0.0, color="#c03030", linestyle="--", linewidth=1.5)
        ax.text(0.0, ax.get_ylim()[1] * 0.95, " bound", color="#c03030", va="top", fontsize=8)
        ax.set_title(f"{output}: largest |got - ref| / bound per case")
        ax.set_xlabel("log10(ratio)   (0 = at the tolerance; exact results at "
                      f"{lo:.0f})", fontsize=8)
        ax.set_ylabel("valid cases")
        ax.legend(fontsize=8)
    rows = []
    for key in sorted(data):
        rs = sorted(data[key])
        worst = rs[-1]
        rows.append(f"<tr class='{'never' if worst > 0.1 else ''}'><td>{_e(key)}</td>"
                    f"<td class='num'>{len(rs)}</td><td class='num'>{rs[len(rs) // 2]:.3g}</td>"
                    f"<td class='num'>{worst:.3g}</td></tr>")
    return ("<p>For each judged valid layout, the largest ratio of the error to its bound, "
            "per output and stored dtype. A correct float32 kernel sits orders of magnitude "
            "left of the dashed line; a distribution crowding it means the kernel runs close "
            "to the tolerance (a worst ratio above 0.1 is highlighted).</p>" + _png(fig)
            + "<table><tr><th>output/dtype</th><th>cases</th><th>median ratio</th>"
            f"<th>worst ratio</th></tr>{''.join(rows)}</table>")


def _durations(history: Sequence[dict[str, Any]]) -> list[tuple[float, float, bool, float]]:
    """(t, seconds the example took, compiled, seconds compiling) per record, per job when
    records say (records without ``compile_seconds``: the whole example)."""
    last: dict[Any, float] = {}
    out = []
    for rec in sorted(history, key=lambda r: float(r.get("t", 0.0))):
        t, job = float(rec.get("t", 0.0)), rec.get("job", 0)
        took = max(0.0, t - last.get(job, 0.0))
        compiled = bool(rec.get("compile"))
        out.append((t, took, compiled, float(rec.get("compile_seconds", took if compiled else 0))))
        last[job] = t
    return out


def _throughput(report: Any, history: Sequence[dict[str, Any]] | None) -> str:
    if not history:
        return ("<p class='muted'>No per-example history recorded; the campaign ran "
                f"{report.examples} examples in {report.seconds:.1f} s.</p>")
    recs = sorted(history, key=lambda r: float(r.get("t", 0.0)))
    ts = [float(r.get("t", 0.0)) for r in recs]
    ns = [int(r.get("examples", i + 1)) for i, r in enumerate(recs)]
    durs = _durations(recs)
    compiles = [(t, cs) for t, _, c, cs in durs if c]
    compile_s = sum(d for _, d in compiles)
    total = max(ts[-1], report.seconds, 1e-9)
    fig = _figure(11, 3.4)
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(ts, ns, color="#4c72b0", linewidth=1.6)
    if compiles:
        idx = [i for i, (_, _, c, _) in enumerate(durs) if c]
        ax.plot([ts[i] for i in idx], [ns[i] for i in idx], "o", color="#c03030",
                markersize=4, label=f"compile ({len(idx)})")
        ax.legend(fontsize=8)
    ax.set_xlabel("seconds")
    ax.set_ylabel("examples done")
    ax.set_title("progress")
    ax2 = fig.add_subplot(1, 2, 2)
    window = max(1.0, total / 30)
    edges = [i * window for i in range(int(total / window) + 2)]
    spans = list(itertools.pairwise(edges))
    rate = [sum(1 for t in ts if a <= t < b) / window for a, b in spans]
    comp = [sum(d for t, d in compiles if a <= t < b) / window for a, b in spans]
    mids = [a + window / 2 for a in edges[:-1]]
    ax2.plot(mids, rate, color="#4c72b0", linewidth=1.6, label="examples/s")
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("examples/s")
    ax3 = ax2.twinx()
    ax3.fill_between(mids, [100 * c for c in comp], color="#c03030", alpha=0.25, step="mid",
                     label="% of time compiling")
    ax3.set_ylim(0, 105)
    ax3.set_ylabel("% compiling", color="#c03030")
    ax2.set_title(f"throughput ({window:.0f} s windows)")
    note = ("" if not any("job" in r for r in recs) else
            " Durations are measured per job.")
    return (f"<p>{len(recs)} examples recorded over {total:.1f} s "
            f"({len(recs) / total:.1f}/s); {len(compiles)} compiled "
            f"({compile_s:.1f} s, {100 * compile_s / total:.0f} % of the time).{note}</p>"
            + _png(fig))


# ------------------------------------------------------------------ page


def render_report(report: Any, history: Sequence[dict[str, Any]] | None = None) -> str:
    """The report's HTML text (see :func:`write_report`)."""
    if history is None:
        history = getattr(report, "history", None)
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    try:
        from importlib.metadata import version

        ver = version("kda-fuzz")
    except Exception:  # not installed (a source checkout)
        ver = "source"
    title = f"kda-fuzz {family_label(report.contract, report.variant)}: {', '.join(report.targets)}"
    sections = [
        ("summary", "Campaign", _summary(report, history)),
        ("failures", "Failures", _failures(report)),
        ("checks", "Checks hit", _checks(report)),
        ("gaps", "Validation gaps", _gaps(report)),
        ("variants", "Kernel variants", _variants(report)),
        ("budget", "Error budget", _budget(history)),
        ("throughput", "Throughput and compile time", _throughput(report, history)),
    ]
    nav = " · ".join(f"<a href='#{k}'>{_e(t)}</a>" for k, t, _ in sections)
    body = "".join(f"<section id='{k}'><h2>{_e(t)}</h2>{s}</section>" for k, t, s in sections)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width'><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{_e(title)}</h1>"
            f"<p class='muted'>generated {now} by kda-fuzz {_e(ver)}</p><p>{nav}</p>{body}"
            "</body></html>\n")


def write_report(report: Any, directory: str | os.PathLike[str], *,
                 history: Sequence[dict[str, Any]] | None = None,
                 name: str = FILE_NAME) -> Path:
    """Write the campaign ``report`` (a ``results.Report``) as one self-contained HTML file
    ``directory/name`` (atomically; the folder is created) and return its path.
    ``history`` defaults to ``report.history`` when the report has one."""
    return write_atomic(Path(directory) / name, render_report(report, history))
