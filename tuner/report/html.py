"""The morning report: one self-contained HTML page (inline CSS, SVG and script, no network).

The script is plain and inline: it sorts and filters the tables and zooms the charts. The
page reads the same without it; its figures and exports are written here, in Python.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from tuner.report.data import JobData, TaskData
from tuner.report.svg import PALETTE, Axes, Series, bar_chart, line_chart

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;
color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{font-size:13px;margin:0 0 2px;font-weight:600}
.meta{color:#555}.note{color:#666;font-size:12px}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 9px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f6}td.l,th.l{text-align:left}
.grid{display:flex;flex-wrap:wrap;gap:14px}.task{border:1px solid #e4e4e4;border-radius:4px;padding:8px}
.kpi{display:inline-block;margin:6px 22px 6px 0}.kpi b{font-size:20px;display:block}
.state-dead,.state-failed{color:#c00;font-weight:600}.state-done{color:#080}
svg text{font-family:system-ui,Helvetica,Arial,sans-serif;fill:#333}
table.sortable th{cursor:pointer;user-select:none}table.sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable th[aria-sort=descending]::after{content:" \\25BC"}tr.off td{color:#999}
.tools{margin:4px 0 8px}.tools input{margin-right:14px}a.export{margin-right:12px}
.zbar{font-size:11px;margin:2px 0}.zbar button{font-size:11px;padding:0 6px;margin-right:3px}
svg.chart{cursor:crosshair}
"""

logger = logging.getLogger(__name__)

# Sorting, filtering and zooming; no library, nothing fetched. A cell's data-v is its value
# (empty: none, sorted last either way); a cell without one sorts by its text.
_SCRIPT = """
(function () {
  function key(cell) {
    var v = cell.getAttribute('data-v');
    if (v === null) return cell.textContent.trim().toLowerCase();
    return v === '' ? null : parseFloat(v);
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.title = 'click to sort';
      th.addEventListener('click', function () {
        var asc = th.getAttribute('aria-sort') !== 'ascending';
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[col]), y = key(b.cells[col]);
          if (x === null || y === null) return (x === null) - (y === null);
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  document.querySelectorAll('.tools').forEach(function (tools) {
    var table = document.getElementById(tools.getAttribute('data-table'));
    var text = tools.querySelector('input[type=search]'), plan = tools.querySelector('input[type=checkbox]');
    function apply() {
      var words = text.value.trim().toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
        var hide = (words && r.cells[0].textContent.toLowerCase().indexOf(words) < 0) ||
                   (plan && plan.checked && r.classList.contains('off'));
        r.style.display = hide ? 'none' : '';
      });
    }
    text.addEventListener('input', apply);
    if (plan) plan.addEventListener('change', apply);
  });
  // Zoom: +/- about the centre, or drag a box; reset restores the whole chart.
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var full = svg.getAttribute('viewBox').split(' ').map(Number), box = full.slice();
    function set(b) { box = b; svg.setAttribute('viewBox', b.join(' ')); }
    function scale(f) {
      var cx = box[0] + box[2] / 2, cy = box[1] + box[3] / 2;
      set([cx - box[2] * f / 2, cy - box[3] * f / 2, box[2] * f, box[3] * f]);
    }
    var bar = document.createElement('div');
    bar.className = 'zbar';
    [['+', function () { scale(1 / 1.5); }], ['\u2212', function () { scale(1.5); }],
     ['reset', function () { set(full.slice()); }]].forEach(function (b) {
      var button = document.createElement('button');
      button.type = 'button';
      button.textContent = b[0];
      button.setAttribute('data-zoom', b[0] === 'reset' ? 'reset' : b[0] === '+' ? 'in' : 'out');
      button.addEventListener('click', b[1]);
      bar.appendChild(button);
    });
    svg.parentNode.insertBefore(bar, svg);
    var start = null, rect = null;
    function at(e) {
      var pt = svg.createSVGPoint();
      pt.x = e.clientX; pt.y = e.clientY;
      return pt.matrixTransform(svg.getScreenCTM().inverse());
    }
    svg.addEventListener('mousedown', function (e) {
      start = at(e);
      rect = document.createElementNS('http://www.w3.org/2000/svg', 'rect');
      rect.setAttribute('fill', 'rgba(31,119,180,0.15)');
      svg.appendChild(rect);
      e.preventDefault();
    });
    svg.addEventListener('mousemove', function (e) {
      if (!start) return;
      var p = at(e);
      rect.setAttribute('x', Math.min(p.x, start.x)); rect.setAttribute('y', Math.min(p.y, start.y));
      rect.setAttribute('width', Math.abs(p.x - start.x)); rect.setAttribute('height', Math.abs(p.y - start.y));
    });
    function end(e) {
      if (!start) return;
      var p = at(e), w = Math.abs(p.x - start.x), h = Math.abs(p.y - start.y);
      svg.removeChild(rect);
      if (w > 4 && h > 4) set([Math.min(p.x, start.x), Math.min(p.y, start.y), w, h]);
      start = null;
    }
    svg.addEventListener('mouseup', end);
    svg.addEventListener('mouseleave', function (e) { if (start) end(e); });
  });
})();
"""


def _ms(sec: float | None) -> str:
    return "–" if sec is None else f"{sec * 1e3:,.3f}"


def _dur(sec: float | None) -> str:
    if sec is None:
        return "–"
    sec = float(sec)
    if sec < 90:
        return f"{sec:.0f} s"
    if sec < 5400:
        return f"{sec / 60:.1f} min"
    return f"{sec / 3600:.2f} h"


def render(data: JobData, *, bench: list[dict[str, Any]] = (), artifact: dict[str, Any] | None = None,  # type: ignore[assignment]
           now: datetime | None = None, compare: Sequence[JobData] = ()) -> str:
    """The report page of ``data``, with end-to-end latencies from ``bench`` results
    (``nightshift bench --json``) and the ``artifact``'s metadata where given, and, with
    ``compare``, a comparison of the job with those (their curves and each task's best)."""
    now = now or datetime.now(UTC)
    job = data.job
    state = job.shown_state(now)
    title = f"Nightshift job {job.label}: {job.model} on {job.device}"
    body = [f"<h1>{escape(title)}</h1>",
            f'<div class="meta">device {escape(job.device_arch)} (fingerprint {escape(job.fingerprint)}), '
            f"host {escape(job.host or '?')}; started {job.created_at:%Y-%m-%d %H:%M} UTC; "
            f'state <span class="state-{state}">{escape(state)}</span>; report written {now:%Y-%m-%d %H:%M} UTC</div>']
    body.append(_kpis(data))
    body.append(_end_to_end(data, bench, artifact))
    body.append(_task_table(data))
    if compare:
        body.append(_comparison(data, list(compare)))
    body.append(_curves(data))
    body.append(_time(data))
    body.append(_errors(data))
    body.append(_exports(data, list(compare)))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + f"\n<script>{_SCRIPT}</script>\n</body></html>\n")  # fmt: skip


def _plan_note(data: JobData) -> str:
    """Which tasks the estimate, the shares and the curve count."""
    if data.plan_from:
        return (f"the compiled plan's operators, from {data.plan_from}; tasks of the layouts it did not take "
                "are greyed and count for nothing")
    if any(t.plans for t in data.tasks):
        return ("each conv once (its fastest layout variant) and the other operators of the layout plan the "
                "job's bests favour; pass the artifact (--artifact) to count exactly the compiled plan's tasks")
    return ("every task of the job, the layout variants of one conv once (the fastest); pass the artifact "
            "(--artifact) to count exactly the compiled plan's tasks")


def _kpis(data: JobData) -> str:
    job = data.job
    trials = f"{job.trials_done:,} / {job.trials_total:,}" if job.trials_total else f"{job.trials_done:,}"
    budget = f" of {_dur(job.time_budget_sec)}" if job.time_budget_sec else ""
    items = [("trials", trials), ("records", f"{data.num_records:,}"), ("tuning time", _dur(data.time.wall) + budget),
             ("failed candidates", f"{sum(data.errors.values()):,}"), ("tasks", str(len(data.tasks)))]
    before, now = data.estimated_latency("before"), data.estimated_latency("now")
    if now is not None:
        items.append(("estimated end to end (Σ weight × best over the plan)", f"{now * 1e3:,.3f} ms"))
    if before and now is not None:
        # One ratio direction everywhere: latency as a multiple of the reference's, lower is better.
        items.append(("of the estimate before this job (lower is better)", f"{now / before:.2f}x"))
    return "".join(f'<div class="kpi"><b>{escape(v)}</b>{escape(k)}</div>' for k, v in items)


def _artifact_latency(artifact: dict[str, Any]) -> str:
    """The artifact's latency with its spread and method, and as a multiple of each baseline
    ``tune`` timed (lower is better)."""
    stats = artifact.get("latency") or {}
    text = f"tuned artifact: {float(artifact['latency_ms']):.3f} ms"
    if stats.get("p25_ms") is not None:
        text += f" (IQR {stats['p25_ms']:.3f}-{stats['p75_ms']:.3f} ms; {stats.get('method', '')})"
    ratios = [f"{b['ratio']:.2f}x of {b.get('label') or key}"
              for key, b in (artifact.get("baselines") or {}).items()
              if isinstance(b, dict) and b.get("ratio") is not None]  # fmt: skip
    if ratios:
        text += "; " + "; ".join(ratios) + " (lower is better)"
    return escape(text)


def _end_to_end(data: JobData, bench: list[dict[str, Any]], artifact: dict[str, Any] | None) -> str:
    rows: list[tuple[str, float, str]] = []
    notes = []
    if artifact is not None:
        if artifact.get("untuned_latency_ms") is not None:
            rows.append(("untuned (TVM default)", float(artifact["untuned_latency_ms"]), PALETTE[7]))
        baselines = artifact.get("baselines") or {}
        for key, color in (("tvm-fallback", PALETTE[7]), ("peer", PALETTE[3])):
            b = baselines.get(key)
            if isinstance(b, dict) and b.get("median_ms") is not None:
                rows.append((str(b.get("label") or key), float(b["median_ms"]), color))
        rows.append(("tuned artifact", float(artifact["latency_ms"]), PALETTE[0]))
        notes.append(_artifact_latency(artifact))
        v = artifact.get("verification") or {}
        ok = "passed" if v.get("ok") else "FAILED"
        err = v.get("max_error")
        notes.append(f"artifact {escape(str(artifact.get('library', '')))}: output verification {ok} against "
                     f"{escape(str(v.get('reference')))} (max scaled error "
                     f"{'inf' if err is None else f'{err:.1e}'}); operators "
                     + ", ".join(f"{escape(k)} {n}" for k, n in (artifact.get("operators") or {}).items()))
        if artifact.get("device", {}).get("fingerprint") not in (None, data.job.fingerprint):
            notes.append("the artifact was built for another device than the job's")
    for result in bench:
        fp = (result.get("device") or {}).get("fingerprint")
        mark = "" if fp in (None, data.job.fingerprint) else " (other device)"
        for e in result.get("entries", []):
            if e.get("status") != "ok" or e.get("median_ms") is None:
                continue
            color = PALETTE[0] if e.get("kind") == "tvm" and e.get("key") == "tvm" else (
                PALETTE[7] if e.get("kind") == "tvm" else PALETTE[3])
            rows.append((f"{e.get('label') or e.get('key')}{mark}", float(e["median_ms"]), color))
            if e.get("kind") == "tvm" and e.get("per_round_ratio_to_fastest_peer") is not None:
                notes.append(f"{escape(str(e.get('label') or e.get('key')))}: "
                             f"{e['per_round_ratio_to_fastest_peer']:.2f}x of "
                             f"{escape(str(result.get('fastest_peer')))} round by round, faster in "
                             f"{e.get('rounds_faster_than_fastest_peer')} of "
                             f"{result.get('rounds')} rounds")  # fmt: skip
        notes.append(f"nightshift bench: {escape(str(result.get('model')))}, {result.get('threads')} threads, "
                     f"medians of {result.get('rounds')} interleaved rounds; ratios are x of the fastest peer, "
                     "lower is better")
    est_before, est_now = data.estimated_latency("before"), data.estimated_latency("now")
    if est_before is not None:
        rows.append(("estimated, before this job", est_before * 1e3, PALETTE[5]))
    if est_now is not None:
        rows.append(("estimated, now", est_now * 1e3, PALETTE[2]))
    out = ["<h2>End-to-end latency</h2>"]
    if rows:
        out.append(bar_chart(rows, unit="ms"))
    else:
        out.append('<p class="note">No end-to-end figures: pass the artifact (--artifact) or '
                   "nightshift bench --json results (--bench).</p>")
    if est_now is not None:
        out.append('<p class="note">Estimated: Σ over tasks of weight × best kernel latency in the database; '
                   "kernel time only (no VM overhead, no copies).</p>")
    out.extend(f'<p class="note">{n}</p>' for n in notes)
    curve = _estimate_curve(data)
    if curve:
        out.append(curve)
    return "\n".join(out)


def _estimate_curve(data: JobData) -> str:
    """Σ weight × best-so-far over the plan's operators against wall time, from when every one
    has a best: the same operators and tasks as the header's estimate."""
    points = data.estimate_curve()
    if not points:
        missing = data.unmeasured_operators
        why = (f"{missing} operator{'s' if missing != 1 else ''} of the plan never measured on the device"
               if missing else "no task weights")
        return f'<p class="note">No estimated end-to-end curve: {why}.</p>'
    axes = Axes("wall time since the job started (min)", "estimated latency (ms)", width=560, height=230,
                title="estimated end-to-end latency")  # fmt: skip
    end, now = points[-1][1], data.estimated_latency("now")
    note = f"It ends at {end * 1e3:,.3f} ms"
    if now is not None and not math.isclose(end, now, rel_tol=1e-9):
        note += (f"; the header's {now * 1e3:,.3f} ms also counts records written since by other jobs")
    else:
        note += ", the header's estimate"
    return ("<h3>Estimated end-to-end latency while tuning</h3>"
            + line_chart([Series("Σ weight × best", [x / 60 for x, _ in points], [y * 1e3 for _, y in points],
                                 PALETTE[2], dots=True)], axes)
            + f'<p class="note">{escape(note)}: Σ over {_plan_note(data)}.</p>')


def _num(value: float | None, text: str) -> str:
    """A table cell whose ``data-v`` is the value the script sorts by (empty: none)."""
    return f'<td data-v="{"" if value is None else repr(float(value))}">{text}</td>'


def _status(t: TaskData, shares: dict[str, float]) -> str:
    if not t.in_plan:
        return "other layout"
    if t.workload_key in shares:
        return "counted"
    return "no record" if t.best_now is None else "slower layout variant"


def _task_rows(data: JobData) -> list[dict[str, Any]]:
    """The task table's rows as plain values (what the page shows and exports)."""
    shares = data.shares()
    return [{"task": t.name, "workload_key": t.workload_key, "plan": _status(t, shares), "weight": t.weight,
             "trials": len(t.records), "failed": t.errors, "best_before_ms": _msv(t.best_before),
             "best_job_ms": _msv(t.best_job), "best_ms": _msv(t.best_now), "gflops": t.gflops,
             "share": shares.get(t.workload_key)} for t in data.tasks]  # fmt: skip


def _msv(sec: float | None) -> float | None:
    return None if sec is None else sec * 1e3


def _task_table(data: JobData) -> str:
    weights = (f"weights from {escape(data.weights_from)}" if data.weights_from else
               "task weights unknown (the job did not store them; pass --artifact): each counted once")
    rows = _task_rows(data)
    missing = data.unmeasured_operators
    unmeasured = (f" {missing} operator{'s' if missing != 1 else ''} of the plan "
                  f"{'have' if missing != 1 else 'has'} no record yet (TVM's default schedule): the shares "
                  "are of the measured ones." if missing else "")  # fmt: skip
    out = ["<h2>Tasks</h2>", f'<p class="note">Best: this device\'s best record in the database (what the '
           f"compiler uses); share: weight × best over Σ weight × best of {escape(_plan_note(data))}, so the "
           f"shares add up to 100%; {weights}.{escape(unmeasured)} Click a column's header to sort.</p>",
           '<div class="tools" data-table="tasks"><input type="search" placeholder="filter by task name" '
           'aria-label="filter tasks by name">'
           + ('<label><input type="checkbox"> only the plan\'s tasks</label>' if data.plan_from else "")
           + "</div>",
           '<table class="tasks sortable" id="tasks"><thead><tr><th class="l">task</th><th class="l">plan</th>'
           "<th>weight</th><th>trials</th><th>failed</th><th>best before (ms)</th><th>best this job (ms)</th>"
           "<th>best (ms)</th><th>GFLOPS</th><th>share of end to end</th></tr></thead><tbody>"]
    for r in rows:
        share, gflops = r["share"], r["gflops"]
        off = ' class="off"' if r["plan"] == "other layout" else ""
        out.append(f'<tr{off}><td class="l" title="{escape(r["workload_key"])}">{escape(r["task"])}</td>'
                   f'<td class="l">{escape(r["plan"])}</td>'
                   + _num(r["weight"], "?" if r["weight"] is None else f"{r['weight']:g}")
                   + _num(r["trials"], str(r["trials"])) + _num(r["failed"], str(r["failed"]))
                   + "".join(_num(r[k], _ms(None if r[k] is None else r[k] / 1e3))
                             for k in ("best_before_ms", "best_job_ms", "best_ms"))
                   + _num(gflops, "–" if gflops is None else f"{gflops:,.1f}")
                   + _num(None if share is None else share * 100, "–" if share is None else f"{share:.1%}")
                   + "</tr>")  # fmt: skip
    out.append("</tbody></table>")
    return "\n".join(out)


def _comparison_data(data: JobData, others: list[JobData]) -> dict[str, Any]:
    """The comparison's figures: each job's curve over the operators every job measured, and each
    task's best per job with its ratio to the first job's (lower is better)."""
    jobs = [data, *others]
    # Two jobs of one name (the newest by name, an older by id) need their ids to tell them apart.
    names = [j.job.label for j in jobs]
    labels = [f"{n} (#{j.job.id})" if names.count(n) > 1 else n for n, j in zip(names, jobs, strict=True)]
    # Each job's own records: a later job's curve would otherwise start from the earlier one's bests.
    costs = [j.operator_costs("job") for j in jobs]
    common = [op for op in costs[0] if all(c.get(op) is not None for c in costs)]
    base = labels[0]
    curves = [{"job": label, "points": [[at, sec * 1e3] for at, sec in j.estimate_curve(common, own=True)]}
              for label, j in zip(labels, jobs, strict=True)] if common else []  # fmt: skip
    tasks: dict[str, dict[str, Any]] = {}
    for n, (label, j) in enumerate(zip(labels, jobs, strict=True)):
        for t in j.tasks:
            row = tasks.setdefault(t.workload_key, {"task": t.name, "workload_key": t.workload_key, "best_ms": {},
                                                    "x_of_first": {}})  # fmt: skip
            row["best_ms"][label] = _msv(t.best_job)
            first = row["best_ms"].get(base)
            if n and first and t.best_job is not None:
                row["x_of_first"][label] = t.best_job * 1e3 / first
    ends = {c["job"]: c["points"][-1][1] if c["points"] else None for c in curves}
    return {"first": base, "jobs": labels, "operators": len(common),
            "plan_operators": len(costs[0]), "curves": curves, "end_ms": ends, "tasks": list(tasks.values())}


def _comparison(data: JobData, others: list[JobData]) -> str:
    cmp = _comparison_data(data, others)
    base, labels = cmp["first"], cmp["jobs"]
    out = ["<h2>Comparison of jobs</h2>"]
    if cmp["curves"]:
        axes = Axes("wall time since each job started (min)", "Σ weight × best (ms)", width=560, height=240,
                    title="jobs compared")  # fmt: skip
        series = [Series(c["job"], [p[0] / 60 for p in c["points"]], [p[1] for p in c["points"]],
                         PALETTE[n % len(PALETTE)], dots=True) for n, c in enumerate(cmp["curves"])]  # fmt: skip
        out.append('<div class="compare-curves">' + line_chart(series, axes) + "</div>")
        ends = "; ".join(f"{escape(k)} {v:,.3f} ms" + (f" ({v / cmp['end_ms'][base]:.2f}x of {escape(base)})"
                                                      if k != base and v and cmp["end_ms"][base] else "")
                         for k, v in cmp["end_ms"].items() if v is not None)  # fmt: skip
        out.append(f'<p class="note">One curve per job: Σ weight × best so far over the {cmp["operators"]} of '
                   f"{cmp['plan_operators']} operators of {escape(base)}'s plan that every job measured, from each "
                   "job's own records (not the database's bests before it), against "
                   f"the time since each job started. At the end: {ends} (lower is better).</p>")
    else:
        out.append(f'<p class="note">No common curve: no operator of {escape(base)}\'s plan was measured by '
                   "every job.</p>")
    heads = "".join(f"<th>{escape(k)} best (ms)</th>" + (f"<th>x of {escape(base)}</th>" if k != base else "")
                    for k in labels)  # fmt: skip
    out.append('<p class="note">Each task\'s best among each job\'s own records, and as a multiple of '
               f"{escape(base)}'s (lower is better). Click a column's header to sort.</p>"
               '<table class="compare sortable" id="compare"><thead><tr><th class="l">task</th>'
               f"{heads}</tr></thead><tbody>")
    for r in cmp["tasks"]:
        cells = []
        for k in labels:
            best = r["best_ms"].get(k)
            cells.append(_num(best, _ms(None if best is None else best / 1e3)))
            if k != base:
                x = r["x_of_first"].get(k)
                cells.append(_num(x, "–" if x is None else f"{x:.2f}x"))
        out.append(f'<tr><td class="l" title="{escape(r["workload_key"])}">{escape(r["task"])}</td>'
                   + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _data_url(kind: str, text: str) -> str:
    return f"data:{kind};charset=utf-8;base64,{base64.b64encode(text.encode()).decode('ascii')}"


def _exports(data: JobData, others: list[JobData]) -> str:
    """Download links for what the page shows, as JSON and CSV, inside the page (data: URLs)."""
    job = data.job
    rows = _task_rows(data)
    payload: dict[str, Any] = {
        "job": {"id": job.id, "name": job.name, "label": job.label, "model": job.model, "device": job.device,
                "state": job.shown_state()},
        "plan": data.plan_from or "the job's tasks, layout variants of a conv once",
        "estimated_ms": {"before": _msv(data.estimated_latency("before")), "now": _msv(data.estimated_latency("now"))},
        "curve": [[at, sec * 1e3] for at, sec in data.estimate_curve()],
        "tasks": rows,
    }  # fmt: skip
    if others:
        payload["comparison"] = _comparison_data(data, others)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["task"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in job.label)
    links = [("json", "application/json", json.dumps(payload, indent=1, default=str), "JSON (everything shown)"),
             ("csv", "text/csv", buf.getvalue(), "CSV (task table)")]
    if others:
        cmp = payload["comparison"]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["task", "workload_key", *[f"{k} best (ms)" for k in cmp["jobs"]],
                    *[f"{k} x of {cmp['first']}" for k in cmp["jobs"][1:]]])
        for r in cmp["tasks"]:
            w.writerow([r["task"], r["workload_key"], *[r["best_ms"].get(k, "") for k in cmp["jobs"]],
                        *[r["x_of_first"].get(k, "") for k in cmp["jobs"][1:]]])
        links.append(("compare.csv", "text/csv", buf.getvalue(), "CSV (comparison)"))
    logger.debug("export links: %s", ", ".join(name for name, *_ in links))
    return "<h2>Export</h2><p>" + "".join(
        f'<a class="export" data-format="{ext}" download="{escape(stem)}.{ext}" href="{_data_url(kind, text)}">'
        f"{escape(label)}</a>" for ext, kind, text, label in links) + "</p>"


def _task_series(t: TaskData, use_time: bool) -> list[Series]:
    xs, ys, bx, by = [], [], [], []
    best = math.inf
    for n, m in enumerate(t.records, start=1):
        x = m.at_sec / 60 if use_time else n
        if m.mean_sec is None:
            continue
        xs.append(x)
        ys.append(m.mean_sec * 1e3)
        if m.mean_sec < best:
            best = m.mean_sec
            bx.append(x)
            by.append(best * 1e3)
    series = [Series("measured", xs, ys, PALETTE[0], line=False, dots=True),
              Series("best so far", bx, by, PALETTE[1])]
    if t.best_before is not None and xs:
        end = max(xs)
        series.append(Series("best before job", [0.0, end], [t.best_before * 1e3] * 2, PALETTE[7], step=False,
                             dashed=True))  # fmt: skip
    return series


def _curves(data: JobData) -> str:
    out = ["<h2>Tuning curves</h2>",
           '<p class="note">Per task: every successful measurement of this job (blue dots) and the best so far '
           "(red line), against the job's trials on the task and against wall time (log scale); grey dashes: the "
           "database's best on this device before the job started.</p>", '<div class="grid">']
    for t in data.tasks:
        if not t.records:
            continue
        label = f"{t.name} ({len(t.records)} trials, {t.errors} failed)"
        common = {"log_y": True, "legend": False, "width": 270, "height": 200}
        by_trial = line_chart(_task_series(t, False), Axes("trial", "latency (ms, log)", title=f"{t.name} vs trials",
                                                           **common))  # fmt: skip
        by_time = line_chart(_task_series(t, True), Axes("wall time since the job started (min)", "latency (ms, log)",
                                                         title=f"{t.name} vs time", **common))  # fmt: skip
        out.append(f'<div class="task"><h3 title="{escape(t.workload_key)}">{escape(label)}</h3>'
                   f"{by_trial}{by_time}</div>")
    out.append("</div>")
    return "\n".join(out)


def _time(data: JobData) -> str:
    t = data.time
    timing = "timing (device busy per candidate)" if not t.timing_is_lower_bound else "timing (kernel runs only)"
    rows = [("tuning wall time", t.wall, PALETTE[7]), ("builds (CPU-seconds)", t.build, PALETTE[3]),
            (timing, t.timing, PALETTE[0]), ("search, queueing, idle", t.rest, PALETTE[2])]
    note = ("Builds run in parallel on the cluster's CPUs and overlap the timings, so their CPU-seconds can "
            "exceed the wall time; the rest (wall − timing − builds) is a lower bound of the time spent searching, "
            "waiting and idle.")
    if t.timing_is_lower_bound:
        note += " The records hold no per-candidate wall time of timing; the timing bar sums the kernel runs only."
    return "<h2>Where the time went</h2>" + bar_chart(rows, unit="s") + f'<p class="note">{escape(note)}</p>'


def _errors(data: JobData) -> str:
    out = ["<h2>Failed candidates by class</h2>"]
    if not data.errors:
        out.append("<p>None: every candidate built, ran and matched its reference.</p>")
        return "\n".join(out)
    out.append('<table class="errors"><tr><th class="l">error class</th><th>candidates</th><th>share</th></tr>')
    total = data.num_records or 1
    for cls, n in data.errors.most_common():
        out.append(f'<tr><td class="l">{escape(cls)}</td><td>{n}</td><td>{n / total:.1%}</td></tr>')
    out.append("</table>")
    per_task = [(t.name, {c: sum(1 for m in t.records if m.error_class == c) for c in data.errors})
                for t in data.tasks if t.errors]  # fmt: skip
    out.append('<table class="errors"><tr><th class="l">task</th>'
               + "".join(f"<th>{escape(c)}</th>" for c in data.errors) + "</tr>")
    for name, counts in per_task:
        out.append(f'<tr><td class="l">{escape(name)}</td>' + "".join(f"<td>{counts[c]}</td>" for c in data.errors)
                   + "</tr>")
    out.append("</table>")
    return "\n".join(out)
