"""How accurate int8 can be: onnxruntime's quantization recipes against the fp32 model.

#15 asks for top-1 agreement with fp32 of at least 99% over 1,000 inputs. Nightshift's int8
build computes what onnxruntime's own int8 execution of the same QDQ file computes (the
seventh session: BERT-base 87.6% against onnxruntime's 87.7%), so the recipe that wrote the
file decides the accuracy, not the kernels. This script measures that with onnxruntime
alone, on the same random inputs as ``tune``'s and ``bench``'s accuracy columns
(``ModelSpec.random_inputs(seed=1 + i)``, :func:`tuner.precision.accuracy.compare`):

- ``noise E``: the fp32 outputs plus Gaussian noise of ``E`` times each output's largest
  magnitude: how much error the top-1 metric of this model tolerates at all;
- ``all``: ``tuner.precision.quantize``'s recipe (QDQ, per-channel int8 weights, uint8
  activations, min/max over ``--calibration`` inputs) on every operator onnxruntime
  quantizes (``tune --quantize-ops all``; the default until the nineteenth session);
- ``ops=A+B``: only those ONNX operator types quantized (``tune --quantize-ops A,B``;
  ``ops=Conv+Gemm+MatMul`` is ``tune``'s default now);
- ``... calN``: calibrated on N inputs instead;
- ``dynamic``: ``quantize_dynamic`` (each activation's scale computed at run time), a
  reference row: Nightshift does not import it (no QDQ chain to rewrite).

Each row gives the max relative error, the top-1 agreement and onnxruntime's latency on
the int8 file (2 threads, median of ``--latency-runs`` runs; a sanity figure, not a peer
comparison: benchmarks/precision_vs_peers.py does that with TVM beside).

    .venv/bin/python benchmarks/archive/int8_recipes.py --models bert-base resnet50 --inputs 200 \\
        --recipes all ops=MatMul ops=MatMul+Conv "ops=MatMul cal128" dynamic
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from tuner.bench import peer_model
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.precision.accuracy import compare
from tuner.precision.quantize import DEFAULT_CALIBRATION, parse_ops, quantize_onnx

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import machine, write_result

RESULTS = Path(__file__).parent / "results"
logger = logging.getLogger(__name__)
console = Console()


def _session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _make(recipe: str, fp32: Path, spec, out: Path, calibration: int) -> Path:
    """The int8 file of ``recipe`` (see the module's docstring), written to ``out``."""
    if recipe == "dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(fp32), str(out), per_channel=True, weight_type=QuantType.QInt8)
        return out
    ops, n = None, calibration
    for part in recipe.split():
        if part.startswith("ops="):
            ops = parse_ops(part[4:].replace("+", ","))
        elif part.startswith("cal"):
            n = int(part[3:])
        elif part != "all":
            raise SystemExit(f"unknown recipe part {part!r}")
    return quantize_onnx(fp32, out, spec, n, op_types=ops)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["bert-base", "resnet50"])
    p.add_argument("--recipes", nargs="+", default=["all", "ops=MatMul", "ops=MatMul+Conv", "dynamic"])
    p.add_argument("--noise", nargs="*", type=float, default=[1e-3, 2e-3, 5e-3, 1e-2])
    p.add_argument("--inputs", type=int, default=200, help="random inputs the accuracy is measured on")
    p.add_argument("--calibration", type=int, default=DEFAULT_CALIBRATION)
    p.add_argument("--latency-runs", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "int8_recipes.json")
    args = p.parse_args()
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for name in args.models:
        spec = load_model(name)
        names = [i.name for i in spec.inputs]
        inputs = [dict(zip(names, spec.random_inputs(seed=1 + i), strict=True)) for i in range(args.inputs)]
        with tempfile.TemporaryDirectory(prefix="nightshift-int8-recipes-") as tmp:
            workdir = Path(tmp)
            fp32 = peer_model(spec, name, workdir).onnx_path
            if fp32 is None:
                raise SystemExit(f"{name}: cannot export it to ONNX here")
            with console.status(f"{name}: fp32 on {args.inputs} inputs"):
                ref_session = _session(fp32, args.threads)
                reference = [ref_session.run(None, x) for x in inputs]
            rng = np.random.default_rng(0)
            for e in args.noise:
                noisy = [[r + rng.normal(0.0, e * float(np.abs(r).max()), r.shape).astype(r.dtype) for r in outs]
                         for outs in reference]  # fmt: skip
                rows.append({"model": name, "recipe": f"noise {e:g}", **compare(reference, noisy).to_json()})
            for i, recipe in enumerate(args.recipes):
                with console.status(f"{name}: {recipe}"):
                    t0 = time.perf_counter()
                    path = _make(recipe, fp32, spec, workdir / f"{name}-int8-{i}.onnx", args.calibration)
                    made_s = time.perf_counter() - t0
                    session = _session(path, args.threads)
                    acc = compare(reference, [session.run(None, x) for x in inputs])
                    times = []
                    for _ in range(args.latency_runs):
                        t0 = time.perf_counter()
                        session.run(None, inputs[0])
                        times.append(time.perf_counter() - t0)
                rows.append({"model": name, "recipe": recipe, **acc.to_json(), "quantize_s": round(made_s, 1),
                             "onnxruntime_int8_ms": round(statistics.median(times) * 1e3, 2)})  # fmt: skip
                console.print(f"{name} {recipe}: {acc.describe()}")
    table = Table(title=f"int8 recipes vs fp32 (onnxruntime, {args.inputs} inputs)")
    for col in ("model", "recipe", "max rel. error", "top-1 agreement", "onnxruntime int8 ms"):
        table.add_column(col)
    for r in rows:
        top1 = "n/a" if r["top1_agreement"] is None else f"{r['top1_agreement']:.2%}"
        table.add_row(r["model"], r["recipe"], f"{r['max_rel_error']:.2e}", top1, str(r.get("onnxruntime_int8_ms", "")))
    console.print(table)
    import onnxruntime

    write_result(args.out, "int8_recipes", {
        "machine": machine(parse_device("cpu"), load_before, threads=args.threads),
        "onnxruntime": onnxruntime.__version__, "inputs": args.inputs, "calibration": args.calibration, "rows": rows,
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
