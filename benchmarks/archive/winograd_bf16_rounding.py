"""How far a bf16 Winograd conv errs, against the direct bf16 conv, per tile size.

A 3x3 conv of ReLU'd Gaussian data (He-initialized weights), computed in float64 from
float32 values as the reference, then:

- ``direct bf16``: data and weights rounded to bf16, products summed exactly (what
  ``vdpbf16ps`` with float32 sums computes, up to the sums' own rounding);
- ``winograd fp32 transforms``: the same bf16 values through F(m, 3) without further rounding
  (``--layout NCHWc:w4`` in a bf16 model, :mod:`tuner.winograd`);
- ``winograd bf16 GEMM``: the transformed data ``V`` and weights ``U`` rounded to bf16 too (the
  GEMMs on ``vdpbf16ps``, :func:`tuner.winograd.transform_weight_dot`).

Each figure is the largest absolute difference from the reference over the largest
reference value, the measure ``precision_vs_peers.py`` reports for whole models. numpy only:
this is arithmetic, not timing.

    .venv/bin/python benchmarks/archive/winograd_bf16_rounding.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
sys.path.append(str(Path(__file__).resolve().parents[1]))
from result_file import write_result

from tuner.graph.winograd import TILES, matrices

RESULTS = Path(__file__).resolve().parent / "results" / "winograd_bf16_rounding.json"


def _bf16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def direct(d: np.ndarray, g: np.ndarray) -> np.ndarray:
    """A 3x3 conv of padded ``d`` (C, H+2, W+2) by ``g`` (K, C, 3, 3), valid."""
    h, w = d.shape[1] - 2, d.shape[2] - 2
    return sum(np.einsum("kc,chw->khw", g[:, :, i, j], d[:, i:i + h, j:j + w]) for i in range(3) for j in range(3))


def winograd(d: np.ndarray, g: np.ndarray, m: int, *, round_transforms: bool) -> np.ndarray:
    """The same conv by F(m, 3); ``round_transforms``: V and U rounded to bf16."""
    a_mat, b_mat, g_mat = matrices(m)
    alpha = m + 2
    u = np.einsum("ek,ockl,nl->enoc", g_mat, g, g_mat)
    if round_transforms:
        u = _bf16(u)
    h, w = d.shape[1] - 2, d.shape[2] - 2
    out = np.zeros((g.shape[0], h, w))
    for ty in range(0, h, m):
        for tx in range(0, w, m):
            v = np.einsum("re,crs,sn->enc", b_mat, d[:, ty:ty + alpha, tx:tx + alpha], b_mat)
            if round_transforms:
                v = _bf16(v)
            y = np.einsum("ev,oen,nw->ovw", a_mat, np.einsum("enc,enoc->oen", v, u), a_mat)
            out[:, ty:ty + m, tx:tx + m] = y
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--channels", type=int, nargs="+", default=[64, 256])
    p.add_argument("--size", type=int, default=16, help="output map side (a multiple of 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    rows = []
    for channels in args.channels:
        rng = np.random.default_rng(args.seed)
        d = np.maximum(rng.standard_normal((channels, args.size + 2, args.size + 2)), 0)
        g = rng.standard_normal((channels, channels, 3, 3)) * np.sqrt(2 / (9 * channels))
        ref = direct(d.astype(np.float32).astype(np.float64), g.astype(np.float32).astype(np.float64))

        def error(x: np.ndarray, ref: np.ndarray = ref) -> float:
            return float(np.abs(x - ref).max() / np.abs(ref).max())

        row = {"channels": channels, "size": args.size, "direct_bf16": error(direct(_bf16(d), _bf16(g)))}
        for m in TILES:
            row[f"winograd_f{m}_fp32_transforms"] = error(winograd(_bf16(d), _bf16(g), m, round_transforms=False))
            row[f"winograd_f{m}_bf16_gemm"] = error(winograd(_bf16(d), _bf16(g), m, round_transforms=True))
        rows.append(row)
        print(", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    write_result(args.out, "winograd_bf16_rounding", {"rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
