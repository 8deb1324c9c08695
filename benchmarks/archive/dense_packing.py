"""Packed dense weights against row-major ones: BERT-base's dense layers under x86-dense.

Since the eleventh session ``tuner.layout`` legalizes a float32 matmul by a constant weight
with the weight packed as ``[N/b, K, b]`` (``b`` four vectors: 32 columns on AVX2, 64 on
AVX-512), folded at compile time. Before, the weight stayed ``[K, N]`` and the template could
only copy a panel at run time (its ``pack_b`` knob). This runs both on BERT-base's four dense
shapes (sequence 128, with the epilogues they are fused with), in one process, one round at
a time so that the machine's noise hits every variant alike:

- ``packed``: a point drawn from the packed task's x86-dense space;
- ``plain``: a point drawn from the row-major task's own space (all its panels, ``pack_b``
  both ways);
- ``plain_same_tile``: the packed point's tile on the row-major task, copying panels at run
  time (``pack_b`` 1) where its loop order allows, the closest the old layout comes to the
  packed one;
- PyTorch's ``linear`` (+ the same epilogue) on the same inputs, for reference.

Writes benchmarks/archive/results/dense_packing.json (``--output``).

    .venv/bin/python benchmarks/archive/dense_packing.py --points 16
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tvm
from op_ceiling import cpu_threads, time_call
import sys  # the maintained helpers stay in benchmarks/, one folder up
sys.path.append(str(Path(__file__).resolve().parents[1]))
from space_vs_metaschedule import measure
from tvm import te, topi

from search_spaces.base import Point
from search_spaces.template_space import TemplateSpace
from tuner.measure.verify import reference
from tuner.graph.layout.plan import dense_block, vector_lanes
from tuner.graph.layout.ops import matmul_packed

logger = logging.getLogger("dense_packing")
RESULTS = Path(__file__).parent / "results" / "dense_packing.json"
SEQ = 128
# BERT-base's dense tasks (nightshift tasks --model bert-base): (K, N, epilogue, calls).
SHAPES = {
    "ffn_in_gelu": (768, 3072, "gelu", 12),
    "ffn_out_residual": (3072, 768, "residual", 12),
    "qkv": (768, 768, "bias", 36),
    "attn_out_residual": (768, 768, "residual", 12),
}


def _gelu(x: te.Tensor) -> te.Tensor:
    half = tvm.tirx.const(0.5, "float32")
    return x * (half + topi.fast_erf(x * tvm.tirx.const(0.5**0.5, "float32")) * half)


def build(k: int, n: int, epilogue: str, block: int | None) -> tvm.IRModule:
    """The task as ``tuner.layout`` gives it (``block``: packed) or as Relax legalizes it."""
    a = te.placeholder((1, SEQ, k), name="A")
    bias = te.placeholder((n,), name="bias")
    if block:
        w = te.placeholder((n // block, k, block), name="W")
        c = matmul_packed(a, w)
    else:
        w = te.placeholder((k, n), name="W")
        r = te.reduce_axis((0, k), name="k")
        c = te.compute((1, SEQ, n), lambda z, i, j: te.sum(a[z, i, r] * w[r, j], axis=r), name="matmul")
    return with_epilogue(c, [a, w, bias], epilogue)


def with_epilogue(c: te.Tensor, args: list[te.Tensor], epilogue: str) -> tvm.IRModule:
    """The task of ``c`` + bias (``args[-1]``) and BERT's ``epilogue`` (gelu, residual, bias)."""
    out = topi.add(c, args[-1])
    if epilogue == "gelu":
        out = _gelu(out)
    elif epilogue == "residual":
        skip = te.placeholder(c.shape, name="skip")
        out = topi.add(out, skip)
        args = [*args, skip]
    return tvm.IRModule({"main": te.create_prim_func([*args, out])})


def torch_call(epilogue: str, inputs: list[np.ndarray], block: int) -> Callable[[], object]:
    """PyTorch's linear + epilogue on the packed variant's inputs (unpacked for it)."""
    import torch

    f = torch.nn.functional
    x = torch.from_numpy(inputs[0])
    packed = inputs[1]
    w = torch.from_numpy(np.ascontiguousarray(packed.transpose(0, 2, 1).reshape(-1, packed.shape[1])))
    b = torch.from_numpy(inputs[2])
    if epilogue == "gelu":
        return lambda: f.gelu(f.linear(x, w, b))
    if epilogue == "residual":
        skip = torch.from_numpy(inputs[3])
        return lambda: f.linear(x, w, b) + skip
    return lambda: f.linear(x, w, b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=16)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block", type=int, default=None,
                        help="columns per packed block (default: tuner.layout.dense_block's, four vectors)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    device, threads = cpu_threads()
    target = device.target
    lanes = vector_lanes(target)
    report: dict = {
        "benchmark": "dense_packing", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "dense_packing.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "output"),
        "device": device.description, "target": device.target_config, "threads": threads, "lanes": lanes,
        "points": args.points, "tvm": tvm.__version__, "torch": torch.__version__,
        "load_before": list(os.getloadavg()), "shapes": [],
    }
    for name in args.shapes:
        k, n, epilogue, calls = SHAPES[name]
        block = args.block or dense_block(n, lanes)
        assert block is not None and n % block == 0 and block % lanes == 0, (name, n, lanes, block)
        mods = {"packed": build(k, n, epilogue, block), "plain": build(k, n, epilogue, None)}
        spaces = {v: TemplateSpace(m, target, "x86-dense") for v, m in mods.items()}
        refs = {v: reference(m, target) for v, m in mods.items()}
        torch_fn = torch_call(epilogue, refs["packed"].inputs, block)
        rng = np.random.default_rng(args.seed)
        drawn = {v: [spaces[v].sample(rng) for _ in range(args.points)] for v in mods}
        times: dict[str, list[float | None]] = {"packed": [], "plain": [], "plain_same_tile": []}
        torch_sec: list[float] = []
        for i in range(args.points):
            packed_values = spaces["packed"].values(drawn["packed"][i])
            # Copying panels at run time where the constraint allows it (panels outermost).
            same = next(q for q in (Point(0, tuple(pack_b if kn.name == "pack_b" else packed_values[kn.name]
                                                   for kn in spaces["plain"].knobs(0)))
                                    for pack_b in (1, 0))
                        if spaces["plain"].static_violation(q) is None)  # fmt: skip
            for variant, space, point in (("packed", spaces["packed"], drawn["packed"][i]),
                                          ("plain", spaces["plain"], drawn["plain"][i]),
                                          ("plain_same_tile", spaces["plain"], same)):  # fmt: skip
                ref = refs["plain" if variant.startswith("plain") else "packed"]
                r = measure(space.apply(point).mod, target, ref, float("inf"))
                times[variant].append(r.get("sec"))
            torch_sec.append(time_call(torch_fn))
            logger.info("%s %d/%d: %s", name, i + 1, args.points,
                        {v: f"{t[-1] * 1e3:.3f} ms" if t[-1] else "failed" for v, t in times.items()})
        flops = 2.0 * SEQ * k * n
        entry: dict = {"shape": name, "k": k, "n": n, "epilogue": epilogue, "calls_in_bert": calls, "block": block,
                       "torch_median_ms": float(np.median(torch_sec)) * 1e3, "variants": {}}
        for variant, ts in times.items():
            ok = [t for t in ts if t is not None]
            best = min(ok) if ok else None
            entry["variants"][variant] = {
                "best_ms": best * 1e3 if best else None,
                "best_gflops": flops / best / 1e9 if best else None,
                "median_ms": float(np.median(ok)) * 1e3 if ok else None,
                "failed": len(ts) - len(ok),
            }
        # Paired: the same tile packed at compile time vs copied at run time.
        pairs = [p / q for p, q in zip(times["packed"], times["plain_same_tile"], strict=True) if p and q]
        entry["packed_over_plain_same_tile_median"] = float(np.median(pairs)) if pairs else None
        best = {v: entry["variants"][v]["best_ms"] for v in times}
        entry["packed_best_over_plain_best"] = (best["packed"] / min(best["plain"], best["plain_same_tile"])
                                                if best["packed"] and best["plain"] and best["plain_same_tile"]
                                                else None)  # fmt: skip
        entry["packed_best_over_torch_median"] = best["packed"] / entry["torch_median_ms"] if best["packed"] else None
        report["shapes"].append(entry)
        logger.info("%s", json.dumps(entry, indent=1))
        report["load_after"] = list(os.getloadavg())
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
