"""The summary table of the maintained whole-model benchmarks, from their latest JSON.

Reads ``benchmarks/results/*.json`` of the benchmarks that time a whole model against its
peers (``e2e_vs_peers``, ``precision_vs_peers``, ``cuda_e2e``, ``model_suite``), keeps the latest row per
(benchmark, model, precision, device kind) by the ``date`` inside the file (the file's
modification time where it has none), and rewrites the block between
``<!-- summary:start -->`` and ``<!-- summary:end -->`` in ``benchmarks/README.md`` (one row
per benchmark, model, precision and device kind) and ``docs/performance.md`` (the latest of
those per model, precision and device kind, with the command that produced it). The model
suite's files also get a table of their own between ``<!-- suite:start -->`` and
``<!-- suite:end -->`` in ``benchmarks/README.md``: every model of each file, against each peer,
with its output check and tuning time, and the file's geometric mean. ``time_to_quality``'s
files get theirs between ``<!-- ttq:start -->`` and ``<!-- ttq:end -->``: per model and arm, the
ratio to the faster peer and the tuning minutes at each budget.

The ratio is TVM's median over the faster peer's at the same precision (for int8 every peer
ran the same QDQ file, whatever precision its row names): below 1.00x TVM is faster. A
device kind is LLVM's ``mcpu`` with the device fingerprint (the feature set), or the GPU.

    .venv/bin/python benchmarks/summary.py           # rewrite both tables
    .venv/bin/python benchmarks/summary.py --check   # exit 1 when either table is stale
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from result_file import run_commands

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "benchmarks" / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
START, END = "<!-- summary:start -->", "<!-- summary:end -->"
SUITE_START, SUITE_END = "<!-- suite:start -->", "<!-- suite:end -->"
TTQ_START, TTQ_END = "<!-- ttq:start -->", "<!-- ttq:end -->"
BENCHMARKS = ("e2e_vs_peers", "precision_vs_peers", "cuda_e2e", "model_suite")

MODELS = {"resnet50": "ResNet-50", "bert-base": "BERT-base", "mobilenet_v2": "MobileNet-V2"}
# "openvino-f32" is OpenVINO run with INFERENCE_PRECISION_HINT f32 (its default is bf16 on CPUs with
# AVX512_BF16 or AMX); "openvino" is its default precision, named from the entry's own precision field.
PEERS = {
    "onnxruntime": "ONNX Runtime",
    "openvino-f32": "OpenVINO f32",
    "torch": "PyTorch",
    "torch.compile": "torch.compile",
    "torch-bf16": "PyTorch bf16",
}


@dataclass(frozen=True)
class Row:
    """One model at one precision on one device, as one result file timed it."""

    benchmark: str
    model: str
    precision: str
    device_key: tuple[str, ...]
    device: str
    device_words: str
    trials: str
    tvm_ms: float
    peer: str
    peer_ms: float
    date: str
    order: str
    file: str
    command: str

    @property
    def ratio(self) -> float:
        """TVM's time over the faster peer's: below 1 TVM is faster."""
        return self.tvm_ms / self.peer_ms


def precision_name(value: Any) -> str:
    """``f32``, ``fp32`` and a missing precision (the older files) all read ``fp32``."""
    return "fp32" if value in (None, "", "f32", "fp32") else str(value)


def benchmark_of(path: Path, doc: Any) -> str | None:
    """The maintained benchmark that wrote ``doc``: its ``benchmark`` field, else its file name."""
    named = doc.get("benchmark") if isinstance(doc, dict) else None
    if named in BENCHMARKS:
        return str(named)
    return next((b for b in BENCHMARKS if path.name.startswith(b)), None)


def budget_of(doc: dict[str, Any], stem: str) -> str:
    """The tuning budget of a file: its ``budget`` field (``["--trials", "512"]``,
    ``["--time-budget", "20m"]``), else what its name gives (:func:`trials_of`)."""
    budget = doc.get("budget")
    if isinstance(budget, list) and len(budget) == 2:
        flag, value = str(budget[0]), str(budget[1])
        if flag == "--trials" and value.isdigit():
            return f"{int(value):,}"
        if flag == "--time-budget":
            return trials_of(value) if trials_of(value) != "-" else value
    return trials_of(stem)


def trials_of(stem: str) -> str:
    """The tuning budget a file's name gives (``..._2048_...``, ``_50m``, ``_2h``, ``_converged``)."""
    for token in stem.split("_"):
        if token.isdigit() and int(token) >= 8:
            return f"{int(token):,}"
        if m := re.fullmatch(r"(\d+)(m|min)", token):
            return f"{m.group(1)} min"
        if m := re.fullmatch(r"(\d+)h", token):
            return f"{m.group(1)} h"
        if m := re.fullmatch(r"(\d+)k", token):
            return f"~{m.group(1)},000"
        if token == "converged":
            return "converged"
    return "-"


def features(flags: list[str] | None) -> str:
    """The vector extensions that matter here, in a few words."""
    have = set(flags or ())
    if "amx_tile" in have:
        return "AMX"
    if "avx512_bf16" in have:
        return "AVX-512 bf16"
    if "avx512f" in have:
        return "AVX-512"
    return "AVX2" if "avx2" in have else ""


def vendor(cpu: str) -> str:
    """``Intel(R) Xeon(R) Processor`` reads ``Intel Xeon``."""
    for noise in ("(R)", "(TM)", " Processor", " CPU"):
        cpu = cpu.replace(noise, "")
    return " ".join(cpu.split())


def cpu_device(device: dict[str, Any], cpu: str, flags: dict[str, list[str]]) -> tuple[tuple[str, ...], str, str]:
    """Key, short name and words of a CPU: LLVM's ``mcpu`` and the feature set its fingerprint stands for."""
    arch, fingerprint = str(device.get("arch") or "?"), str(device.get("fingerprint") or "")
    feats = features(flags.get(fingerprint))
    short = f"{arch}, {feats}" if feats else arch
    words = f"{vendor(str(device.get('cpu') or cpu))} (`{arch}`{', ' + feats if feats else ''})"
    return ("cpu", arch, fingerprint), short, words


def ms(value: float) -> str:
    """Milliseconds to three figures or so."""
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def peer_name(entry: dict[str, Any], precision: str) -> str:
    """A peer's short name: the label without the version; on the int8 file, without the precision asked for."""
    key = str(entry.get("key"))
    if precision == "int8" and key in ("openvino", "openvino-f32"):
        return "OpenVINO"
    if key == "openvino":
        return "OpenVINO " + precision_name(entry.get("precision")).replace("fp32", "f32")
    return PEERS.get(key, str(entry.get("label") or key))


def bench_row(bench: dict[str, Any], precision: str) -> tuple[float, str, float] | None:
    """TVM's median, the faster peer at ``precision`` and its median, from one ``nightshift bench`` result."""
    entries = [e for e in bench.get("entries") or () if e.get("status") == "ok" and e.get("median_ms")]
    tvm = next((e for e in entries if e.get("key") == "tvm"), None)
    # int8: every peer ran the QDQ file (their rows name the precision they were asked for, f32).
    # A peer whose output differs from the reference's (agrees false) is no speed reference.
    peers = [e for e in entries if e.get("kind") == "peer" and e.get("agrees") is not False
             and (precision == "int8" or precision_name(e.get("precision")) == precision)]  # fmt: skip
    if tvm is None or not peers:
        return None
    best = min(peers, key=lambda e: float(e["median_ms"]))
    return float(tvm["median_ms"]), peer_name(best, precision), float(best["median_ms"])


def load(results: Path) -> list[Row]:
    """Every row of every maintained result file under ``results`` that has TVM and a peer timed."""
    docs: list[tuple[Path, str, dict[str, Any]]] = []
    for path in sorted(results.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            print(f"{path.name}: skipped ({err})", file=sys.stderr)
            continue
        if isinstance(doc, dict) and (benchmark := benchmark_of(path, doc)):
            docs.append((path, benchmark, doc))
    # Feature sets by fingerprint, from the files that record them (e2e_vs_peers' files do not).
    flags: dict[str, list[str]] = {}
    for _, _, doc in docs:
        for row in doc.get("rows") or ():
            fingerprint = ((row.get("bench") or {}).get("device") or {}).get("fingerprint")
            if fingerprint and doc.get("isa_flags"):
                flags.setdefault(fingerprint, doc["isa_flags"])
    rows: list[Row] = []
    for path, benchmark, doc in docs:
        mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC).isoformat(timespec="seconds")
        date = str(doc.get("date") or "")
        common = {"benchmark": benchmark, "date": date[:10], "order": date or mtime, "file": path.name,
                  "command": str(doc.get("command") or ""), "trials": budget_of(doc, path.stem)}  # fmt: skip
        if benchmark == "cuda_e2e":
            rows.extend(cuda_rows(doc, common))
            continue
        runs = doc.get("models") if benchmark in ("e2e_vs_peers", "model_suite") else doc.get("rows")
        for run in runs if isinstance(runs, list) else ():
            if not isinstance(run, dict):
                continue
            bench = run if benchmark == "e2e_vs_peers" else run.get("bench") or {}
            if benchmark == "model_suite" and not run.get("output_ok", True):
                continue  # a wrong output is no speed
            precision = precision_name(run.get("precision"))
            timed = bench_row(bench, precision)
            if timed is None:
                continue
            key, short, words = cpu_device(bench.get("device") or {}, str(doc.get("cpu") or ""), flags)
            tvm_ms, peer, peer_ms = timed
            model = str(run.get("model"))
            rows.append(Row(model=model, precision=precision, device_key=key, device=short, device_words=words,
                            tvm_ms=tvm_ms, peer=peer, peer_ms=peer_ms, **common))  # fmt: skip
    return rows


def cuda_rows(doc: dict[str, Any], common: dict[str, str]) -> list[Row]:
    """``cuda_e2e.py run``'s file: TVM against PyTorch eager and ``torch.compile``, fp32 with TF32 off."""
    tvm_s = (doc.get("tvm") or {}).get("median_s")
    peers = {"PyTorch": doc.get("torch_eager_s"), "torch.compile": doc.get("torch_compile_s")}
    timed = {k: float(v) for k, v in peers.items() if v}
    if not tvm_s or not timed:
        return []
    gpu = doc.get("gpu") or {}
    name, arch = str(gpu.get("gpu") or "GPU"), str(gpu.get("arch") or doc.get("arch") or "")
    peer = min(timed, key=lambda k: timed[k])
    operators = (doc.get("tvm") or {}).get("operators") or {}
    trials = "untuned" if operators and not operators.get("tuned") else common["trials"]
    return [Row(**{**common, "trials": trials}, model=str(doc.get("model")), precision="fp32",
                device_key=("gpu", name, arch), device=f"{name} ({arch})", device_words=f"{name} (`{arch}`)",
                tvm_ms=float(tvm_s) * 1e3, peer=peer, peer_ms=timed[peer] * 1e3)]  # fmt: skip


def budget_key(row: Row) -> str:
    """The budget that keeps a row of its own: the model suite's two budgets (512 trials and 20 minutes)
    answer two questions, so neither replaces the other; elsewhere the latest budget stands."""
    return row.trials if row.benchmark == "model_suite" else ""


def latest(rows: list[Row], by_benchmark: bool) -> list[Row]:
    """The latest row per (benchmark,) model, precision, device kind and suite budget, in the order the
    tables list them."""
    best: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        key = ((row.benchmark,) if by_benchmark else ()) + (row.model, row.precision, row.device_key, budget_key(row))
        if key not in best or (row.order, row.file) > (best[key].order, best[key].file):
            best[key] = row
    return sorted(best.values(),
                  key=lambda r: (r.benchmark if by_benchmark else "", r.model, r.precision, r.device, budget_key(r)))


def model_name(model: str) -> str:
    """``resnet50`` reads ``ResNet-50``."""
    return MODELS.get(model, model)


def cells(values: tuple[str, ...]) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(values) + " |"


def ratio(row: Row) -> str:
    """The ratio, bold where TVM is the faster."""
    text = f"{row.ratio:.2f}x"
    return f"**{text}**" if round(row.ratio, 2) < 1 else text


def readme_table(rows: list[Row]) -> str:
    """The table of ``benchmarks/README.md``: the latest row per benchmark, model, precision and device."""
    head = ("benchmark", "model", "precision", "device", "trials", "TVM ms", "faster peer", "peer ms", "TVM / peer",
            "date", "file")  # fmt: skip
    lines = [cells(head), "|---|---|---|---|---:|---:|---|---:|---:|---|---|"]
    for r in latest(rows, by_benchmark=True):
        lines.append(cells((r.benchmark, model_name(r.model), r.precision, r.device, r.trials, ms(r.tvm_ms), r.peer,
                            ms(r.peer_ms), ratio(r), r.date or "-", f"`{r.file}`")))  # fmt: skip
    return "\n".join(lines)


def performance_table(rows: list[Row]) -> str:
    """The table of ``docs/performance.md``: the latest row per model, precision and device, in words."""
    chosen = latest(rows, by_benchmark=False)
    commands: list[str] = []
    head = ("model", "precision", "device", "TVM's time against the faster peer", "tuning budget", "measured",
            "command")  # fmt: skip
    lines = [cells(head), "|---|---|---|---|---|---|---|"]
    for r in chosen:
        if r.command not in commands:
            commands.append(r.command)
        cell = f"{ratio(r)}: {ms(r.tvm_ms)} ms against {ms(r.peer_ms)} ms for {r.peer}"
        budget = r.trials if r.trials in ("-", "untuned", "converged") or " " in r.trials else f"{r.trials} trials"
        link = f"[{r.date or r.file}](../benchmarks/results/{r.file})"
        command = f"[{commands.index(r.command) + 1}](#commands)"
        lines.append(cells((model_name(r.model), r.precision, r.device_words, cell, budget, link, command)))
    lines += ["", '<a id="commands"></a>The commands that wrote those files, as each file records it:', ""]
    lines += [f"{i}. `{c or '(not recorded)'}`" for i, c in enumerate(commands, 1)]
    return "\n".join(lines)


def result_docs(results: Path, pattern: str, key: str, kind: type) -> list[tuple[Path, dict[str, Any]]]:
    """The result files under ``results`` matching ``pattern`` whose ``key`` holds a ``kind``,
    newest first (by the ``date`` inside, then the name)."""
    docs = []
    for path in sorted(results.glob(pattern)):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # load() already said so
        if isinstance(doc, dict) and isinstance(doc.get(key), kind):
            docs.append((path, doc))
    return sorted(docs, key=lambda d: (str(d[1].get("date") or ""), d[0].name), reverse=True)


def suite_files(results: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The model suite's result files under ``results``, newest first."""
    return result_docs(results, "model_suite_*.json", "models", list)


def geomean(values: list[float]) -> float | None:
    """The geometric mean, None of nothing."""
    import math

    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def suite_table(path: Path, doc: dict[str, Any]) -> str:
    """One model suite file as a table: per model, TVM's median and its ratio to each peer (timed
    in the same interleaved rounds), the output check, and the tuning job's time and trials."""
    device = ((doc.get("models") or [{}])[0].get("bench") or {}).get("device") or {}
    arch = str(device.get("arch") or "?")
    budget = budget_of(doc, path.stem)
    budget = f"{budget} trials" if budget.replace(",", "").isdigit() else f"budget {budget}"
    title = (f"**`{path.name}`**: {budget}, `{arch}`, "
             f"{str(doc.get('date') or '')[:10]}; {commands_text(doc)}")  # fmt: skip
    head = ("model", "TVM ms", "/ ONNX Runtime", "/ OpenVINO f32", "/ PyTorch", "/ faster peer", "max error",
            "input moves it", "tuning", "trials")  # fmt: skip
    lines = [title, "", cells(head), "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios: list[float] = []
    for run in doc.get("models") or ():
        tune = run.get("tune") or {}
        if tune.get("exit_code") not in (0, None):
            lines.append(cells((str(run.get("model")), "tune failed", *("-",) * 6, f"{tune.get('error') or ''}"[:60],
                                "-")))  # fmt: skip
            continue
        fastest = run.get("ratio_vs_fastest_peer")
        if isinstance(fastest, (int, float)) and run.get("output_ok") is not False:
            ratios.append(float(fastest))

        def r(key: str, run: dict[str, Any] = run) -> str:
            value = run.get(key)
            # A peer whose output differs from the reference's is no speed reference (model_suite.py).
            wrong = key.removeprefix("ratio_vs_") in (run.get("peer_mismatches") or ())
            return (f"{value:.2f}x" + (" (peer wrong)" if wrong else "")) if isinstance(value, (int, float)) else "-"

        def sci(value: Any) -> str:
            return f"{value:.1e}" if isinstance(value, (int, float)) else "-"

        best = r("ratio_vs_fastest_peer")
        if isinstance(fastest, (int, float)) and round(fastest, 2) < 1:
            best = f"**{best}**"
        error = sci(run.get("max_error_vs_reference")) + ("" if run.get("output_ok") is not False else " wrong")
        wall = tune.get("wall_s")
        lines.append(cells((str(run.get("model")), ms(run["tvm_ms"]) if run.get("tvm_ms") else "-",
                            r("ratio_vs_onnxruntime"), r("ratio_vs_openvino-f32"), r("ratio_vs_torch"), best, error,
                            sci(run.get("input_sensitivity")), f"{wall / 60:.1f} min" if wall else "-",
                            str(tune.get("trials") or "-"))))  # fmt: skip
    mean = geomean(ratios)
    summary = doc.get("summary") or {}
    lines += ["", f"{len(ratios)} models timed; geometric mean {mean:.2f}x the faster peer, worst "
              f"{max(ratios):.2f}x; {summary.get('tune_failures', 0)} tuning failures, "
              f"{summary.get('wrong_outputs', 0)} wrong outputs." if mean else "No model timed yet."]  # fmt: skip
    return "\n".join(lines)


def commands_text(doc: dict[str, Any]) -> str:
    """The commands that wrote a result file, oldest first, as Markdown code spans."""
    commands = run_commands(doc)
    return "; then ".join(f"`{c}`" for c in commands) if commands else "`(command not recorded)`"


def suite_tables(results: Path) -> str:
    """Every model suite file's table, newest first."""
    tables = [suite_table(path, doc) for path, doc in suite_files(results)]
    return "\n\n".join(tables) if tables else "No model suite result yet."


def ttq_table(path: Path, doc: dict[str, Any]) -> str:
    """One ``time_to_quality`` file as a table: per model and arm, the mean ratio to the faster
    peer over seeds (their range where there are several) and the tuning minutes at each budget."""
    summary: dict[str, Any] = doc.get("summary") or {}
    every = [row for m in summary.values() for rows in (m.get("arms") or {}).values() for row in rows]
    budgets = sorted({row["budget"] for row in every})
    try:  # the machine's TVM target, a JSON object (result_file.machine)
        arch = str(json.loads((doc.get("machine") or {}).get("target") or "{}").get("mcpu") or "?")
    except ValueError:
        arch = "?"
    title = (f"**`{path.name}`**: `{arch}`, {str(doc.get('date') or '')[:10]}; "
             f"{commands_text(doc)}")  # fmt: skip
    lines = [title, "", cells(("model", "arm", *(f"{b} trials" for b in budgets))),
             "|---|---|" + "---:|" * len(budgets)]  # fmt: skip
    for model, entry in summary.items():
        for arm, rows in (entry.get("arms") or {}).items():
            at = {row["budget"]: row for row in rows}

            def cell(budget: int, at: dict[int, Any] = at) -> str:
                row = at.get(budget)
                if row is None:
                    return "-"
                spread = f" ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})" if row.get("seeds", 1) > 1 else ""
                return f"{row['ratio_mean']:.2f}x{spread}, {row['tuning_min_mean']:.1f} min"

            lines.append(cells((model, arm, *(cell(b) for b in budgets))))
    seeds = max((row.get("seeds", 1) for row in every), default=0)
    lines += ["", f"Latency over the faster of {', '.join(PEERS.get(p, p) for p in doc.get('peers') or ())} "
              f"timed in the same rounds (lower is better), mean of {seeds} seed(s); minutes of tuning."]  # fmt: skip
    return "\n".join(lines)


def ttq_tables(results: Path) -> str:
    """Every ``time_to_quality`` file's table, newest first."""
    docs = [(path, doc) for path, doc in result_docs(results, "time_to_quality_*.json", "summary", dict)
            if doc["summary"]]  # fmt: skip
    return "\n\n".join(ttq_table(path, doc) for path, doc in docs) or "No time-to-quality result yet."


def replace_block(text: str, table: str, start_mark: str = START, end_mark: str = END) -> str | None:
    """``text`` with the block between the markers replaced by ``table``; None without the markers."""
    start, end = text.find(start_mark), text.find(end_mark)
    if start < 0 or end < start:
        return None
    return text[: start + len(start_mark)] + "\n" + table + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the tables (exit 2 where a file has no markers), or with ``--check`` exit 1 when one
    is stale or has no markers."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of result files (default: %(default)s)")
    args = p.parse_args(argv)
    rows = load(args.results)
    stale = missing = False
    blocks = ((README, readme_table(rows), START, END), (README, suite_tables(args.results), SUITE_START, SUITE_END),
              (README, ttq_tables(args.results), TTQ_START, TTQ_END),
              (PERFORMANCE, performance_table(rows), START, END))  # fmt: skip
    for path, table, start_mark, end_mark in blocks:
        text = path.read_text() if path.exists() else ""
        new = replace_block(text, table, start_mark, end_mark)
        if new is None:
            print(f"{path.relative_to(ROOT)}: no {start_mark} ... {end_mark} block", file=sys.stderr)
            missing = True
        elif new != text:
            stale = True
            if args.check:
                print(f"{path.relative_to(ROOT)}: stale; run benchmarks/summary.py", file=sys.stderr)
            else:
                path.write_text(new)
                print(f"{path.relative_to(ROOT)}: table rewritten")
    if args.check:
        return 1 if stale or missing else 0
    return 2 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
