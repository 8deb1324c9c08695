"""nightshift report: one self-contained HTML page from a real job, checked in headless Chromium."""

from __future__ import annotations

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


def test_page_is_self_contained_and_has_every_section(report):
    html = report.read_text()
    # Nothing to fetch: no scripts, stylesheets, images or links; the only URL is SVG's namespace.
    assert not re.search(r"<script|<link|<img|<iframe|src=|href=|@import|url\(", html)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}
    for section in ("End-to-end latency", "Tasks", "Tuning curves", "Where the time went",
                    "Failed candidates by class"):
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
    # Σ weight × best needs a best for every task; with 8 trials some tasks may have none yet.
    if all(t.best_now is not None for t in data.tasks):
        assert data.estimated_latency("now") == pytest.approx(sum(t.weight * t.best_now for t in data.tasks))
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


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
def test_opens_in_headless_chromium_without_errors_with_curves(report, tmp_path):
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
        # The curves on screen: scroll to them and check the screenshot.
        driver.execute_script("document.querySelector('.task').scrollIntoView();")
        width, height, ratio = driver.execute_script("return [innerWidth, innerHeight, devicePixelRatio];")
        shot = driver.get_screenshot_as_png()
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
