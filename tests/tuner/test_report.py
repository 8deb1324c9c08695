"""nightshift report: one self-contained HTML page from a real job, checked in headless Chromium."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import sqlite3
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from morning_job import TRIALS, one_line_error, run, tiny_job

# A real job's report and the browser: tens of seconds.
pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The tiny job's report, with its artifact and a real two-round ``nightshift bench`` beside it."""
    job = tiny_job(tmp_path_factory)
    bench = run("nightshift", "bench", "--model", "tiny", "--db", "t.db", "--json", "bench.json", "--rounds", "2",
                "--peers", "onnxruntime", cwd=job)  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    proc = run("nightshift", "report", "--db", "t.db", "--job", "1", "-o", "report.html", "--artifact", "tiny.so",
               "--bench", "bench.json", cwd=job)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{TRIALS} records" in proc.stdout
    return job / "report.html"


@pytest.fixture(scope="module")
def compared(report) -> Path:
    """A second job on a copy of the database (the first job's candidates timed 1.5x slower,
    written through the database's own API: no tuning) and the report comparing the two."""
    from sqlalchemy import select

    from tuner.db import NewRecord, TuningDatabase
    from tuner.db.schema import JobRow

    folder = report.parent / "compare"
    folder.mkdir(exist_ok=True)
    shutil.copy(report.parent / "t.db", folder / "t.db")
    shutil.copy(report.parent / "tiny.so", folder / "tiny.so")
    shutil.copy(report.parent / "tiny.json", folder / "tiny.json")
    db = TuningDatabase(str(folder / "t.db"))
    with db.session(write=False) as s:
        first = s.scalar(select(JobRow).where(JobRow.id == 1))
        device_id, config = first.device_id, json.loads(first.config)
    with sqlite3.connect(folder / "t.db") as conn:
        rows = conn.execute("SELECT w.key, r.record_json, r.mean_sec, r.timing FROM records r JOIN workloads w "
                            "ON w.id = r.workload_id WHERE r.job_id = 1 AND r.mean_sec IS NOT NULL").fetchall()
    job_id = db.start_job("tiny", device_id, config | {"name": "slower"}, len(rows), name="slower")
    db.add_records(device_id, job_id, [NewRecord(key, f'{{"kind":"copy","n":{n}}}', trace, [mean * 1.5],
                                                 build_sec=0.1, run_wall_sec=0.01, timing=timing)
                                       for n, (key, trace, mean, timing) in enumerate(rows)])  # fmt: skip
    db.update_job(job_id, trials_done=len(rows), state="done")
    db.close()
    proc = run("nightshift", "report", "--db", "t.db", "--job", "1", "--job", "slower", "-o", "compare.html",
               "--artifact", "tiny.so", cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compared with slower" in proc.stdout
    return folder / "compare.html"


def test_page_is_self_contained_and_has_every_section(report):
    html = report.read_text()
    # Nothing to fetch: one inline script, no stylesheets, images or frames; the only links are
    # the exports' data: URLs and the only URL is SVG's namespace.
    assert not re.search(r"<link|<img|<iframe|src=|@import|url\(", html)
    assert re.findall(r"<script[^>]*>", html) == ["<script>"]
    assert all(h.startswith("data:") for h in re.findall(r'href="([^"]*)"', html))
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}
    for section in ("End-to-end latency", "Tasks", "Tuning curves", "Where the time went",
                    "Failed candidates by class", "Export"):
        assert f"<h2>{section}</h2>" in html
    meta = json.loads((report.parent / "tiny.json").read_text())
    for task in meta["tasks"]:
        assert task["name"] in html
    assert "weights from the job&#x27;s configuration" in html
    # Before/after and the peer, from the artifact and the bench results.
    assert "untuned (TVM default)" in html and "tuned artifact" in html and "ONNX Runtime" in html
    assert "output verification passed against untuned TVM build" in html
    bench = json.loads((report.parent / "bench.json").read_text())
    tvm = next(e for e in bench["entries"] if e["key"] == "tvm")
    assert (f"{tvm['per_round_ratio_to_fastest_peer']:.2f}x of onnxruntime round by round, faster in "
            f"{tvm['rounds_faster_than_fastest_peer']} of 2 rounds") in html
    # The artifact's latency with its spread and method, as a multiple of each baseline (lower is better).
    assert " ms; median of " in html and "x of fallback build (0 trials)" in html and "(lower is better)" in html


def test_figures_are_the_databases(report):
    from tuner.db import TuningDatabase
    from tuner.report import find_job, job_data

    db = TuningDatabase(str(report.parent / "t.db"))
    job = find_job(db, "1")
    data = job_data(db, job, artifact=json.loads((report.parent / "tiny.json").read_text()))
    assert data.num_records == TRIALS and job.trials_done == TRIALS and job.shown_state() == "done"
    assert data.weights_from == "the job's configuration" and all(t.weight for t in data.tasks)
    # The compiled plan is the artifact's tasks: the others are the layouts it did not take.
    plan = {t["workload_key"] for t in json.loads((report.parent / "tiny.json").read_text())["tasks"]}
    assert {t.workload_key for t in data.tasks if t.in_plan} == plan
    assert sum(data.shares().values()) == pytest.approx(1.0) and set(data.shares()) <= plan
    # The curve is the header's estimate over the same plan: it ends where the estimate does.
    curve = data.estimate_curve()
    if data.estimated_latency("end") is not None:
        assert curve[-1][1] == pytest.approx(data.estimated_latency("end"))
    else:
        assert curve == [] and data.unmeasured_operators > 0
    with sqlite3.connect(report.parent / "t.db") as conn:
        rows = conn.execute("SELECT w.key, min(r.mean_sec), count(r.id) FROM records r JOIN workloads w "
                            "ON w.id = r.workload_id WHERE r.job_id = 1 GROUP BY w.key").fetchall()  # fmt: skip
    for key, best, n in rows:
        task = next(t for t in data.tasks if t.workload_key == key)
        assert len(task.records) == n
        if best is not None:
            assert task.best_job == pytest.approx(best) and task.best_now == pytest.approx(best)
    # Times are in order within the job; the wall time covers every record.
    ats = [m.at_sec for t in data.tasks for m in t.records]
    assert min(ats) >= 0 and data.time.wall >= max(ats) - 1e-6 and data.time.build > 0
    # Σ weight × best needs a best for every task of the plan; with 8 trials some may have none yet.
    if all(t.best_now is not None for t in data.tasks if t.in_plan):
        assert data.estimated_latency("now") == pytest.approx(sum(t.weight * t.best_now for t in data.tasks
                                                                  if t.in_plan))
    else:
        assert data.estimated_latency("now") is None


def test_failed_candidates_are_counted_by_class(report, tmp_path):
    """A failed record of the job (written through the database's own API) shows in the errors table."""
    from tuner.db import NewRecord, TuningDatabase
    from tuner.report import find_job, job_data, render

    shutil.copy(report.parent / "t.db", tmp_path / "t.db")
    db = TuningDatabase(str(tmp_path / "t.db"))
    job = find_job(db, "1")
    data = job_data(db, job)
    key = data.tasks[0].workload_key
    with db.session(write=False) as s:
        from sqlalchemy import select

        from tuner.db.schema import JobRow

        device_id = s.scalar(select(JobRow.device_id).where(JobRow.id == job.id))
    # An empty trace that passes the write gate ("{}" is not a record and is stored as refused_trace).
    failed = NewRecord(key, '{"kind":"sketch","sketch":0,"decisions":[123]}', "[[[], []], null, null, null]", [],
                       error_class="build_error", error_msg="test", build_sec=0.5)  # fmt: skip
    db.add_records(device_id, job.id, [failed])
    data = job_data(db, job)
    assert data.errors == {"build_error": 1}
    html = render(data)
    assert '<td class="l">build_error</td><td>1</td>' in html
    assert "weights from the job&#x27;s configuration" in html  # no artifact given: the job stores them


def test_bad_options_are_one_line_and_exit_2(report):
    cwd = report.parent
    (cwd / "notbench.json").write_text('{"x": 1}')
    cases = [
        (["--job", "no-such-job"], "no job named 'no-such-job'"),
        (["--job", "1", "--bench", "missing.json"], "--bench missing.json"),
        (["--job", "1", "--bench", "notbench.json"], "not the output of nightshift bench"),
        (["--job", "1", "--artifact", "missing.so"], "no artifact"),
    ]
    for args, expect in cases:
        proc = run("nightshift", "report", "--db", "t.db", *args, "-o", "r.html", cwd=cwd)
        assert expect in one_line_error(proc), args
    proc = run("nightshift", "report", "--db", "t.db", "--job", "1", "-o", "no/dir/r.html", cwd=cwd)
    assert "does not exist" in one_line_error(proc)


def _png(data: bytes) -> np.ndarray:
    """Decode an 8-bit RGB or RGBA PNG (what Chromium writes) into an (h, w, 3) array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + width * bpp)
    out = np.zeros((height, width * bpp), dtype=np.int32)
    prev = np.zeros(width * bpp, dtype=np.int32)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) % 256
        else:  # Sub, Average, Paeth depend on the pixel to the left: per pixel
            cur = np.zeros_like(line)
            for x in range(0, len(line), bpp):
                a = cur[x - bpp:x] if x else np.zeros(bpp, dtype=np.int32)
                b, c = prev[x:x + bpp], (prev[x - bpp:x] if x else np.zeros(bpp, dtype=np.int32))
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
                    pred = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
                cur[x:x + bpp] = (line[x:x + bpp] + pred) % 256
        out[y], prev = cur, cur
    return out.reshape(height, width, bpp)[:, :, :3]


def _cells(driver, table: str, col: int) -> list[float | None]:
    """The ``data-v`` of column ``col`` (1-based) of the visible rows of ``table``, in page order."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'))"
        ".filter(r => r.style.display !== 'none').map(r => { const v = r.cells[arguments[1] - 1]"
        ".getAttribute('data-v'); return v === '' ? null : parseFloat(v); });", table, col)  # fmt: skip


def _exported(driver) -> dict[str, str]:
    """Each export link's format and decoded content (its data: URL)."""
    import base64

    from selenium.webdriver.common.by import By

    out = {}
    for a in driver.find_elements(By.CSS_SELECTOR, "a.export"):
        href = a.get_attribute("href")
        head, _, body = href.partition(",")
        assert head.startswith("data:") and head.endswith(";base64") and a.get_attribute("download"), head
        out[a.get_attribute("data-format")] = base64.b64decode(body).decode()
    return out


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
def test_opens_in_headless_chromium_without_errors_with_curves(report, compared, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,900", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(report.as_uri())
        assert driver.title.startswith("Nightshift job tiny-cpu: tiny")
        severe = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert severe == []
        # One best-so-far curve per task with a successful record, in each of the two charts.
        with sqlite3.connect(report.parent / "t.db") as conn:
            (measured,) = conn.execute("SELECT count(DISTINCT workload_id) FROM records WHERE job_id = 1 "
                                       "AND mean_sec IS NOT NULL").fetchone()  # fmt: skip
        assert measured >= 2
        curves = driver.find_elements(By.CSS_SELECTOR, ".task svg path.curve")
        assert len(curves) == 2 * measured
        drawn = 0
        for c in curves:
            assert re.match(r"M[\d.]+,[\d.]+(H[\d.]+V[\d.]+)*H[\d.]+$", c.get_attribute("d"))
            box = driver.execute_script("const b = arguments[0].getBBox(); return [b.width, b.height];", c)
            # Laid out and drawn; a task measured once, at the chart's last x, is a single point.
            drawn += box[0] + box[1] > 0
        assert drawn >= len(curves) // 2
        dots = driver.find_elements(By.CSS_SELECTOR, ".task svg circle")
        assert len(dots) >= TRIALS // 2
        # One row per task the job tuned (under --layout auto, every conv in each layout: more
        # than the compiled plan's tasks, which the artifact lists).
        with sqlite3.connect(report.parent / "t.db") as conn:
            (config,) = conn.execute("SELECT config FROM jobs WHERE id = 1").fetchone()
        rows = driver.find_elements(By.CSS_SELECTOR, "table.tasks tr")
        assert len(rows) == 1 + len(json.loads(config)["tasks"])
        meta = json.loads((report.parent / "tiny.json").read_text())
        assert {t["workload_key"] for t in meta["tasks"]} <= {t["workload_key"] for t in json.loads(config)["tasks"]}
        # The shares are of the compiled plan only: they add up to 100%; the other layouts' rows have none.
        heads = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "table.tasks thead th")]
        share_col, best_col, plan_col = (heads.index(h) + 1 for h in ("share of end to end", "best (ms)", "plan"))
        shares = [v for v in _cells(driver, "table.tasks", share_col) if v is not None]
        assert sum(shares) == pytest.approx(100.0, abs=0.1) and shares
        plans = [r.text for r in driver.find_elements(By.CSS_SELECTOR, f"table.tasks tbody td:nth-child({plan_col})")]
        assert len(shares) == plans.count("counted") and "other layout" in plans
        # Clicking a header sorts the rows by it (empty cells last), a second click the other way.
        header = driver.find_elements(By.CSS_SELECTOR, "table.tasks thead th")[best_col - 1]
        for order in ("ascending", "descending"):
            header.click()
            assert header.get_attribute("aria-sort") == order
            col = _cells(driver, "table.tasks", best_col)
            known = [v for v in col if v is not None]
            assert known == sorted(known, reverse=order == "descending") and col[:len(known)] == known
        names = driver.find_elements(By.CSS_SELECTOR, "table.tasks thead th")[0]
        names.click()
        shown = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "table.tasks tbody td:first-child")]
        assert shown == sorted(shown, key=str.lower)
        # The filter hides the rows whose name does not match.
        driver.find_element(By.CSS_SELECTOR, ".tools input[type=search]").send_keys("mean")
        assert 0 < len(_cells(driver, "table.tasks", 1)) < len(rows) - 1
        # A chart zooms in (+), and reset restores its whole view box.
        svg = driver.find_element(By.CSS_SELECTOR, ".task svg.chart")
        full = svg.get_dom_attribute("viewBox")
        driver.find_element(By.CSS_SELECTOR, ".task .zbar button[data-zoom=in]").click()
        zoomed = [float(v) for v in svg.get_dom_attribute("viewBox").split()]
        assert zoomed[2] < float(full.split()[2]) and zoomed[0] > 0
        driver.find_element(By.CSS_SELECTOR, ".task .zbar button[data-zoom=reset]").click()
        assert svg.get_dom_attribute("viewBox") == full
        # The exports are what the table shows: JSON and CSV, in data: URLs.
        exported = _exported(driver)
        page = json.loads(exported["json"])
        assert len(page["tasks"]) == len(rows) - 1
        assert sum(t["share"] for t in page["tasks"] if t["share"] is not None) == pytest.approx(1.0)
        table = list(csv.DictReader(io.StringIO(exported["csv"])))
        assert [r["workload_key"] for r in table] == [t["workload_key"] for t in page["tasks"]]
        # The curves on screen: scroll to them and check the screenshot.
        driver.execute_script("document.querySelector('.task').scrollIntoView();")
        width, height, ratio = driver.execute_script("return [innerWidth, innerHeight, devicePixelRatio];")
        shot = driver.get_screenshot_as_png()
        assert [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
        # Two jobs compared: one curve per job on the same axes, each task's best per job with
        # the ratio to the first (the second job's candidates were timed 1.5x slower).
        driver.get(compared.as_uri())
        assert [h.text for h in driver.find_elements(By.TAG_NAME, "h2")].count("Comparison of jobs") == 1
        assert len(driver.find_elements(By.CSS_SELECTOR, ".compare-curves svg path.curve")) == 2
        heads = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "table.compare thead th")]
        assert heads[1:] == ["tiny-cpu best (ms)", "slower best (ms)", "x of tiny-cpu"]
        ratios = [v for v in _cells(driver, "table.compare", 4) if v is not None]
        assert len(ratios) == measured and ratios == pytest.approx([1.5] * measured)
        driver.find_elements(By.CSS_SELECTOR, "table.compare thead th")[3].click()
        assert _cells(driver, "table.compare", 4)[:measured] == sorted(ratios)
        exported = _exported(driver)
        cmp = json.loads(exported["json"])["comparison"]
        assert cmp["jobs"] == ["tiny-cpu", "slower"]
        # Each curve from its job's own records: the slower job's ends 1.5x the first's.
        assert cmp["end_ms"]["slower"] == pytest.approx(1.5 * cmp["end_ms"]["tiny-cpu"])
        assert "(1.50x of tiny-cpu)" in driver.find_element(By.CSS_SELECTOR, ".compare-curves + p").text
        assert len(list(csv.reader(io.StringIO(exported["compare.csv"])))) == 1 + len(rows) - 1
        assert [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    finally:
        driver.quit()
    (tmp_path / "report.png").write_bytes(shot)
    img = _png(shot)
    assert img.shape == (round(height * ratio), round(width * ratio), 3)
    inked = np.any(img < 235, axis=2).mean()
    assert 0.02 < inked < 0.6, inked  # text, axes and curves on a white page: neither blank nor a solid fill
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 20
    # The best-so-far curves' red (#d62728) is on screen.
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    assert np.sum((r > 180) & (g < 80) & (b < 80)) > 50


def test_estimate_counts_layout_variants_of_one_conv_once():
    """Σ weight × best takes, of a conv tuned in two layouts, the faster variant only."""
    from collections import Counter

    from tuner.report.data import JobData, TaskData, TimeSpent

    tasks = [TaskData("k0", "conv_nchw8c", 1e9, 3, "c0", best_now=2e-3, best_before=None),
             TaskData("k1", "conv_nchw", 1e9, 3, "c0", best_now=5e-3, best_before=4e-3),
             TaskData("k2", "dense", 1e8, 1, best_now=1e-3, best_before=1e-3)]  # fmt: skip
    # The job's identity plays no part in the estimate.
    data = JobData(None, tasks, Counter(), TimeSpent(1.0, 0.0, 0.0, False), "test")  # type: ignore[arg-type]
    assert data.estimated_latency("now") == pytest.approx(3 * 2e-3 + 1e-3)
    assert data.estimated_latency("before") == pytest.approx(3 * 4e-3 + 1e-3)
    tasks[1].best_before = None
    assert data.estimated_latency("before") is None
