"""The morning report: one self-contained HTML page (inline CSS and SVG, no script, no network)."""

from __future__ import annotations

import math
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
           now: datetime | None = None) -> str:
    """The report page of ``data``, with end-to-end latencies from ``bench`` results
    (``nightshift bench --json``) and the ``artifact``'s metadata where given."""
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
    body.append(_curves(data))
    body.append(_time(data))
    body.append(_errors(data))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")  # fmt: skip


def _kpis(data: JobData) -> str:
    job = data.job
    trials = f"{job.trials_done:,} / {job.trials_total:,}" if job.trials_total else f"{job.trials_done:,}"
    budget = f" of {_dur(job.time_budget_sec)}" if job.time_budget_sec else ""
    items = [("trials", trials), ("records", f"{data.num_records:,}"), ("tuning time", _dur(data.time.wall) + budget),
             ("failed candidates", f"{sum(data.errors.values()):,}"), ("tasks", str(len(data.tasks)))]
    before, now = data.estimated_latency("before"), data.estimated_latency("now")
    if now is not None:
        items.append(("estimated end to end (Σ weight × best)", f"{now * 1e3:,.3f} ms"))
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
    """Σ weight × best-so-far against wall time, from when every task has a best."""
    tasks = [t for t in data.tasks if t.weight is not None and (t.best_before is not None or t.best_job is not None)]
    if not tasks or len(tasks) != len(data.tasks):
        return ""
    events = sorted((m.at_sec, k, m.mean_sec) for k, t in enumerate(tasks) for m in t.records if m.mean_sec)
    best: list[float | None] = [t.best_before for t in tasks]
    xs, ys = [], []
    for at, k, sec in events:
        if best[k] is None or sec < best[k]:  # type: ignore[operator]
            best[k] = sec
        if all(b is not None for b in best):
            xs.append(at / 60)
            ys.append(sum(t.weight * b for t, b in zip(tasks, best, strict=True)) * 1e3)  # type: ignore[operator]
    if not xs:
        return ""
    axes = Axes("wall time since the job started (min)", "estimated latency (ms)", width=560, height=230,
                title="estimated end-to-end latency")  # fmt: skip
    return "<h3>Estimated end-to-end latency while tuning</h3>" + line_chart(
        [Series("Σ weight × best", xs, ys, PALETTE[2])], axes)


def _task_table(data: JobData) -> str:
    # Layout variants of one conv are alternatives: the estimate counts the faster one only.
    total = data.estimated_latency("now") or sum((t.weight or 1.0) * (t.best_now or 0.0) for t in data.tasks)
    weights = (f"weights from {escape(data.weights_from)}" if data.weights_from else
               "task weights unknown (the job did not store them; pass --artifact): each counted once")
    out = ["<h2>Tasks</h2>", f'<p class="note">Best: this device\'s best record in the database (what the '
           f"compiler uses); share: weight × best over the sum; {weights}.</p>",
           '<table class="tasks"><tr><th class="l">task</th><th>weight</th><th>trials</th><th>failed</th>'
           "<th>best before (ms)</th><th>best this job (ms)</th><th>best (ms)</th><th>GFLOPS</th>"
           "<th>share of end to end</th></tr>"]
    for t in data.tasks:
        share = (t.weight or 1.0) * (t.best_now or 0.0) / total if total else None
        out.append(f'<tr><td class="l" title="{escape(t.workload_key)}">{escape(t.name)}</td>'
                   f"<td>{'?' if t.weight is None else f'{t.weight:g}'}</td><td>{len(t.records)}</td>"
                   f"<td>{t.errors}</td><td>{_ms(t.best_before)}</td><td>{_ms(t.best_job)}</td>"
                   f"<td>{_ms(t.best_now)}</td><td>{'–' if t.gflops is None else f'{t.gflops:,.1f}'}</td>"
                   f"<td>{'–' if share is None else f'{share:.1%}'}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


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
