"""Reduced precision against the peers at the same precision, with accuracy columns.

For each model, three ``nightshift bench`` runs (tuner/bench.py: interleaved rounds, one
random input, the device's ``num-cores`` threads), from the same ``--db``:

- fp32: TVM fp32 against ONNX Runtime, OpenVINO f32 and PyTorch eager;
- bf16: TVM ``--precision bf16`` against OpenVINO at its default precision (bf16 on CPUs
  with AVX512_BF16 or AMX) and PyTorch eager under ``torch.autocast("cpu", torch.bfloat16)``,
  with OpenVINO f32 as the reference row;
- int8: the model exported to ONNX and quantized by onnxruntime's ``quantize_static``
  (QDQ, per-channel int8 weights, uint8 activations, calibrated on ``--calibration`` random
  inputs; ``tuner.precision.quantize``, the file ``tune --model M --precision int8`` tuned);
  TVM ``--precision int8`` against ONNX Runtime and OpenVINO on that same file (their rows
  say f32, the precision they were asked for; they execute the file's int8 kernels).

Every reduced-precision row reports its accuracy against the model's fp32 TVM build over
``--accuracy-inputs`` random inputs (max relative error, top-1 agreement). Writes
benchmarks/results/precision_vs_peers.json; ratios carry over between runs, milliseconds
do not. The CPU features each precision needs are recorded with the device.

    tune --model resnet50 --precision int8 --db tuned.db   # and bf16, fp32; then
    nice -n 10 .venv/bin/python benchmarks/precision_vs_peers.py --db tuned.db --models resnet50 bert-base
    .venv/bin/python benchmarks/precision_vs_peers.py --db empty.db --models tiny --rounds 2   # smallest
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from tuner.app.plan import measured_plan
from tuner.bench import BenchConfig, bench, peer_model, render, unsupported_reason
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.peers import create
from tuner.peers.pytorch import TorchEagerPeer
from tuner.precision import PRECISIONS
from tuner.precision.accuracy import Accuracy, compare, run_outputs
from tuner.precision.quantize import DEFAULT_CALIBRATION, parse_ops, quantized_model

RESULTS = Path(__file__).parent / "results" / "precision_vs_peers.json"
logger = logging.getLogger(__name__)
console = Console()


class TorchBf16Peer(TorchEagerPeer):
    """PyTorch eager under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (oneDNN's bf16 kernels)."""

    name = "torch-bf16"

    def prepare(self, model, threads: int) -> None:
        super().prepare(model, threads)
        self.label = self.label.replace("eager", "eager, bf16 autocast")
        self.precision = "bf16"

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = self._fn(*(torch.from_numpy(x) for x in inputs))
        return [t.float().numpy().copy() for t in (out if isinstance(out, (tuple, list)) else [out])]


def peer_accuracy(spec, device, fp32_build, reduced, run_spec, source: str, peers, num_inputs: int,
                  ) -> dict[str, Accuracy]:  # fmt: skip
    """Accuracy against the fp32 TVM build of ``spec`` over the same ``num_inputs`` random
    inputs: of TVM's reduced build (key ``tvm``; None where the CPU cannot run it) and of
    each peer (by its label) running ``run_spec`` (the QDQ file for int8)."""
    inputs = [spec.random_inputs(seed=1 + i) for i in range(num_inputs)]
    device.use_threads()
    reference = [run_outputs(fp32_build.executable, device, x) for x in inputs]
    out = {}
    if reduced is not None:
        out["tvm"] = compare(reference, [run_outputs(reduced.executable, device, x) for x in inputs])
    threads = int(device.target.attrs.get("num-cores", os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="nightshift-precision-") as tmp:
        model = peer_model(run_spec, source, Path(tmp))
        for entry in peers:
            peer = create(entry)
            try:
                peer.prepare(model, threads)
                out[getattr(peer, "label", peer.name)] = compare(reference, [peer.run(x) for x in inputs])
            except Exception as err:  # a peer that cannot run the model has no accuracy row
                logger.warning("%s: no accuracy: %s", peer.name, err)
    return out


def _write(out: Path, rows: list[dict[str, Any]], device, load_before: tuple[float, ...]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "precision_vs_peers",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["benchmarks/precision_vs_peers.py", *sys.argv[1:]]),
        "host": platform.node(),
        "cpu": device.description.get("model"),
        "isa_flags": device.description.get("isa_flags"),
        "load_average_before_after": [load_before, os.getloadavg()],
        "rows": rows,
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="tuning database (an empty file gives the fallback builds only)")
    p.add_argument("--models", nargs="+", default=["resnet50", "bert-base"])
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--accuracy-inputs", type=int, default=1000, help="0: time only, no accuracy columns")
    p.add_argument("--calibration", type=int, default=DEFAULT_CALIBRATION,
                   help="random inputs the int8 quantizer calibrates on (as tune's --calibration)")
    p.add_argument("--quantize-ops", default=None,
                   help="ONNX operator types the int8 quantizer quantizes (as tune's --quantize-ops; default all)")
    p.add_argument("--num-cores", type=int, default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the ONNX exports and the QDQ models go (kept; an existing {model}_qdq.onnx is "
        "used as it is, so tune that file with --precision int8 first); default: a temporary one",
    )
    args = p.parse_args()
    device = parse_device("cpu", num_cores=args.num_cores)
    # A precision this CPU lacks the instructions for runs its peers alone (TVM's row says why).
    unsupported = {p: why for p in args.precisions if (why := unsupported_reason(p, device))}
    for precision, reason in unsupported.items():
        console.print(f"[yellow]{precision}: {reason}; its peers run without TVM[/]")
    db = TuningDatabase(args.db)
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for name in args.models:
        spec = load_model(name)
        # Every build in the plan `nightshift bench` would compile it with from this database.
        fp32_chosen = measured_plan(spec, device, db)
        fp32_build = compile_model(spec, device, db, plan=fp32_chosen.plan if fp32_chosen else None)
        for precision in args.precisions:
            if precision == "int8":
                qdq = quantized_model(spec, name, args.calibration, op_types=parse_ops(args.quantize_ops))
                run_spec, source, peers = load_model(str(qdq)), str(qdq), ("onnxruntime", "openvino-f32")
            elif precision == "bf16":
                # OpenVINO f32 (INFERENCE_PRECISION_HINT=f32, which tuner.bench sets) is the f32
                # reference the table's ratios and errors are taken to.
                run_spec, source, peers = spec, name, ("openvino-f32", "openvino", TorchBf16Peer())
            else:
                run_spec, source, peers = spec, name, ("onnxruntime", "openvino-f32", "torch")
            if precision == "fp32" or precision in unsupported:
                chosen = fp32_chosen if precision == "fp32" else None
            else:
                chosen = measured_plan(run_spec, device, db, precision)
            # The rows' accuracy is peer_accuracy's (below), not the harness's.
            config = BenchConfig(rounds=args.rounds, peers=peers, precision=precision, accuracy_inputs=0,
                                 plan=chosen.plan if chosen else None, layout_choice=chosen)  # fmt: skip
            with console.status(f"{name} {precision}") as status:
                # None where the CPU cannot run the precision: bench times the peers alone.
                build = fp32_build if precision == "fp32" else None
                if build is None and precision not in unsupported:
                    build = compile_model(run_spec, device, db, precision=precision, plan=config.plan)
                result = bench(run_spec, device, db, source=source, config=config, compiled=build,
                               on_stage=lambda text, n=name: status.update(f"{n}: {text}"))  # fmt: skip
                # Against the fp32 model itself (for int8: not the QDQ graph run in fp32), for
                # TVM's build and for each peer that ran at the reduced precision.
                accuracy: dict[str, Accuracy] = {}
                if precision != "fp32" and args.accuracy_inputs > 0:
                    status.update(f"{name} {precision}: accuracy on {args.accuracy_inputs} inputs")
                    # bf16's first peer is OpenVINO f32, the reference row.
                    reduced_peers = peers[1:] if precision == "bf16" else peers
                    accuracy = peer_accuracy(spec, device, fp32_build, build, run_spec, source, reduced_peers,
                                             args.accuracy_inputs)  # fmt: skip
            console.print(render(result))
            for who, acc in accuracy.items():
                console.print(f"{name} {precision}, {who}: {acc.describe()}")
            rows.append({"model": name, "precision": precision, "model_file": source, "bench": result.to_json(),
                         "accuracy_vs_fp32_model": {k: v.to_json() for k, v in accuracy.items()} or None})  # fmt: skip
            # After every row: a long run that is stopped keeps the rows it finished.
            _write(args.out, rows, device, load_before)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
