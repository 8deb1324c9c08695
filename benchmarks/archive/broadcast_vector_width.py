"""A squeeze-excitation gate's broadcast multiply, timed at every point of its sketch grid.

One question: how much does the vectorize width matter for an elementwise function whose
output is blocked (NCHW[x]c), and is a vector as wide as the block among the choices? Each
shape is ``x * g`` with ``x`` a blocked feature map and ``g`` one value a channel; every
(parallel, vectorize) point of :class:`search_spaces.sketch.SketchSpace` is built and timed
with TVM's ``time_evaluator`` (best of 5 repeats of 50 runs, on the host's threads). The
space's own :meth:`starts` point is marked. Writes
benchmarks/archive/results/broadcast_vector_width_<arch>.json (``--out``).

    .venv/bin/python benchmarks/archive/broadcast_vector_width.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import te, topi

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # benchmarks/
from result_file import machine, write_result  # noqa: E402

from search_spaces.sketch import SketchSpace  # noqa: E402
from tuner.device import parse_device  # noqa: E402

#: DeepLab-v3's gate multiplies on an AVX-512 CPU: 960 channels in blocks of 16, 120 channels
#: in blocks of 8 and as 8 blocks of 15 (the layout plan's choice for 120 under NCHW16c).
SHAPES = [(1, 60, 33, 33, 16), (1, 15, 65, 65, 8), (1, 8, 65, 65, 15)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    device = parse_device("cpu")
    load_before = os.getloadavg()
    rows = []
    for shape in SHAPES:
        gate = (*shape[:2], 1, 1, shape[4])
        x, g = te.placeholder(shape, name="x"), te.placeholder(gate, name="g")
        mod = tvm.IRModule(
            {"main": te.create_prim_func([x, g, topi.multiply(x, g)]).with_attr("global_symbol", "main")}
        )
        space = SketchSpace(mod, device.target)
        starts = set(space.starts())
        rng = np.random.default_rng(0)
        arrays = [tvm.runtime.tensor(rng.random(s).astype("float32")) for s in (shape, gate)]
        arrays.append(tvm.runtime.tensor(np.zeros(shape, "float32")))
        for point in space.enumerate():
            lib = tvm.compile(space.apply(point).mod, target=device.target)
            lib = getattr(lib, "mod", lib)
            timer = lib.time_evaluator("main", tvm.cpu(), number=50, repeat=5)
            ms = min(timer(*arrays).results) * 1e3
            rows.append(
                {
                    "shape": list(shape),
                    "gate": list(gate),
                    "decisions": list(point.decisions),
                    "knobs": [k.name for k in space.knobs(point.sketch)],
                    "start": point in starts,
                    "ms": ms,
                }
            )
            print(shape, point.decisions, "start" if point in starts else "", f"{ms:.4f} ms")
    out = args.out or Path(__file__).parent / "results" / f"broadcast_vector_width_{device.arch}.json"
    write_result(out, "broadcast_vector_width", {"machine": machine(device, load_before), "points": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
