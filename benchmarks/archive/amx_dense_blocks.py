"""A bf16 dense layer on AMX tiles with its weight packed in column blocks against row-major pairs.

Up to the thirtieth session ``tuner.precision.bf16.pack_weight`` packed a ``[K, N]`` weight
as ``[K/2, N, 2]``: an AMX B tile's 16 rows lay ``4N`` bytes apart (12 KB for BERT's 3072
columns), each on its own 4 KB page. Since the thirty-first it packs ``[N/b, K/2, b, 2]``
(``b`` = 64 columns where they divide N): a tile's rows are ``4b`` = 256 bytes apart and a
block is one contiguous stream along the reduction. This takes BERT-base's four dense shapes
(sequence 128, with their epilogues) in both layouts, draws ``--points`` points of the
``x86-dense-amx-bf16`` space for each, checks each against the unscheduled task and times
it cold (``cache_flush_cpu_non_first_arg``: the weight comes from memory, as in a model
whose 170 MB of bf16 weights do not fit the cache) and warm, one point of each layout after
the other so that the machine's noise hits both alike; PyTorch's bf16 ``linear`` + the same
epilogue (oneDNN) runs on the same threads, warm, for reference.

    .venv/bin/python benchmarks/archive/amx_dense_blocks.py --points 24 --out benchmarks/archive/results/amx_dense_blocks.json

``--kind x86-dense-bf16`` draws the AVX512_BF16 template's points instead (``vdpbf16ps``,
16 columns a register), whose loads the layout changes too.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import numpy as np
import tvm
from dense_packing import SEQ, SHAPES, with_epilogue
from op_ceiling import build_checked, cpu_threads, time_call
import sys  # the maintained helpers stay in benchmarks/, one folder up
sys.path.append(str(Path(__file__).resolve().parents[1]))
from result_file import machine, write_result
from tvm import te

from search_spaces.template_space import TemplateSpace
from tuner.measure.verify import reference
from tuner.precision.bf16 import packed_matmul, packed_shape

logger = logging.getLogger("amx_dense_blocks")
KIND = "x86-dense-amx-bf16"
LAYOUTS = ("rows", "blocks")


def _rows_matmul(a: te.Tensor, w: te.Tensor) -> te.Tensor:
    """``a @ W`` for W packed ``[K/2, N, 2]``, the layout up to the thirtieth session."""
    groups, n, e = (int(d) for d in w.shape)
    ko, ki = te.reduce_axis((0, groups), "ko"), te.reduce_axis((0, e), "ki")
    return te.compute((*a.shape[:-1], n), lambda *i: te.sum(
        a[(*i[:-1], ko * e + ki)].astype("float32") * w[ko, i[-1], ki].astype("float32"), axis=[ko, ki]),
        name="matmul_bf16")  # fmt: skip


def build(k: int, n: int, epilogue: str, layout: str) -> tvm.IRModule:
    """BERT's dense layer as ``tuner.precision.bf16`` writes it, its weight in ``layout``."""
    a = te.placeholder((1, SEQ, k), name="A", dtype="bfloat16")
    bias = te.placeholder((n,), name="bias")
    if layout == "rows":
        w = te.placeholder((k // 2, n, 2), name="W", dtype="bfloat16")
        c = _rows_matmul(a, w)
    else:
        w = te.placeholder(packed_shape(k, n), name="W", dtype="bfloat16")
        c = packed_matmul(a, w)
    return with_epilogue(c, [a, w, bias], epilogue)


def _time(mod: tvm.IRModule, target: tvm.target.Target, ref, rounds: int) -> dict:
    try:
        checked = build_checked(mod, target, ref, tvm.cpu(0))
    except Exception as err:  # a failed build is a result
        return {"error": str(err).splitlines()[-1][:200]}
    if checked is None:
        return {"error": "wrong result"}
    lib, arrays = checked
    cold = lib.mod.time_evaluator("main", tvm.cpu(0), number=1, repeat=rounds,
                                  f_preproc="cache_flush_cpu_non_first_arg")
    warm = lib.mod.time_evaluator("main", tvm.cpu(0), number=1, repeat=rounds)
    return {"cold_ms": float(np.median(cold(*arrays).results)) * 1e3,
            "warm_ms": float(np.median(warm(*arrays).results)) * 1e3}


def _torch(epilogue: str, k: int, n: int, rng: np.random.Generator) -> float:
    import torch

    f = torch.nn.functional
    x = torch.from_numpy(rng.standard_normal((1, SEQ, k)).astype(np.float32)).bfloat16()
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).bfloat16()
    b = torch.zeros(n, dtype=torch.bfloat16)
    skip = torch.zeros((1, SEQ, n), dtype=torch.float32)
    call = {"gelu": lambda: f.gelu(f.linear(x, w, b).float()),
            "residual": lambda: f.linear(x, w, b).float() + skip}.get(epilogue, lambda: f.linear(x, w, b).float())
    return time_call(call) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=20, help="timed runs of each point, cold and warm")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", default=KIND, choices=[KIND, "x86-dense-bf16"],
                        help="the template whose points are drawn (x86-dense-bf16: the AVX512_BF16 one)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/archive/results/amx_dense_blocks.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    load_before = os.getloadavg()
    device, threads = cpu_threads()
    target = device.target
    rows = []
    for name in args.shapes:
        k, n, epilogue, calls = SHAPES[name]
        mods = {lay: build(k, n, epilogue, lay) for lay in LAYOUTS}
        spaces = {lay: TemplateSpace(m, target, args.kind) for lay, m in mods.items()}
        refs = {lay: reference(m, target) for lay, m in mods.items()}
        rng = np.random.default_rng(args.seed)
        drawn = {lay: [spaces[lay].sample(rng) for _ in range(args.points)] for lay in LAYOUTS}
        results: dict[str, list[dict]] = {lay: [] for lay in LAYOUTS}
        for i in range(args.points):
            for lay in LAYOUTS:
                point = drawn[lay][i]
                r = _time(spaces[lay].apply(point).mod, target, refs[lay], args.rounds)
                results[lay].append({"values": spaces[lay].values(point), **r})
            logger.info("%s %d/%d: %s", name, i + 1, args.points,
                        {lay: f"{r[-1].get('cold_ms', float('nan')):.3f} ms" for lay, r in results.items()})
        flops = 2.0 * SEQ * k * n
        entry = {"shape": name, "k": k, "n": n, "epilogue": epilogue, "calls_in_bert": calls,
                 "torch_bf16_warm_ms": _torch(epilogue, k, n, rng), "layouts": {}}
        for lay, rs in results.items():
            ok = [r for r in rs if "cold_ms" in r]
            best = min(ok, key=lambda r: r["cold_ms"])
            entry["layouts"][lay] = {
                "best_cold_ms": best["cold_ms"], "best_cold_gflops": flops / best["cold_ms"] / 1e6,
                "best_values": best["values"], "best_warm_ms": min(r["warm_ms"] for r in ok),
                "median_cold_ms": float(np.median([r["cold_ms"] for r in ok])), "failed": len(rs) - len(ok),
                "points": rs,
            }  # fmt: skip
        lays = entry["layouts"]
        entry["blocks_over_rows_best_cold"] = lays["blocks"]["best_cold_ms"] / lays["rows"]["best_cold_ms"]
        entry["blocks_over_rows_best_warm"] = lays["blocks"]["best_warm_ms"] / lays["rows"]["best_warm_ms"]
        rows.append(entry)
        write_result(args.out, "amx_dense_blocks", {**machine(device, load_before, threads=threads), "kind": args.kind,
                                                    "points": args.points, "rounds": args.rounds, "shapes": rows})
    print(f"{'shape':18s} {'rows cold':>10s} {'blocks cold':>12s} {'ratio':>6s} {'rows warm':>10s} "
          f"{'blocks warm':>12s} {'ratio':>6s} {'torch warm':>11s}")
    for e in rows:
        r, b = e["layouts"]["rows"], e["layouts"]["blocks"]
        print(f"{e['shape']:18s} {r['best_cold_ms']:10.3f} {b['best_cold_ms']:12.3f} "
              f"{e['blocks_over_rows_best_cold']:6.2f} {r['best_warm_ms']:10.3f} {b['best_warm_ms']:12.3f} "
              f"{e['blocks_over_rows_best_warm']:6.2f} "
              f"{e['torch_bf16_warm_ms']:11.3f}")


if __name__ == "__main__":
    main()
