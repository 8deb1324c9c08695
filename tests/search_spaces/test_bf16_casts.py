"""Casts to bfloat16 on vcvtneps2bf16 where the CPU has AVX512_BF16 (search_spaces.x86.bf16_casts)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from conftest import needs_bf16, target
from tvm import te, tirx
from tvm.s_tir import Schedule

from search_spaces import lowering
from search_spaces.x86 import bf16_casts

_SIZE = 4096
# A Sapphire Rapids has AVX512_BF16; a Skylake server has AVX-512 without it.
_WITH_BF16 = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
_WITHOUT_BF16 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})


def _cast_kernel(lanes: int, *, gather: bool = False) -> tvm.IRModule:
    """``y = bfloat16(2 x)`` over 4096 floats, ``lanes`` wide (every other element of the
    input's two halves, interleaved, with ``gather``)."""
    x = te.placeholder((_SIZE,), name="x")

    def element(i):
        return x[(i % 2) * (_SIZE // 2) + i // 2] if gather else x[i]

    y = te.compute((_SIZE,), lambda i: (element(i) * 2.0).astype("bfloat16"), name="y")
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([x, y])}))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    _, inner = sch.split(loop, [None, lanes])
    if lanes > 1:
        sch.vectorize(inner)
    return sch.mod


def _asm(mod: tvm.IRModule, tgt: tvm.target.Target) -> str:
    lowering.install()
    return tvm.compile(mod, target=tgt).mod.inspect_source("asm")


def _inputs() -> np.ndarray:
    values = np.random.default_rng(0).standard_normal(_SIZE).astype(np.float32) * 100
    # Ties to even, signed zeros, infinities, the largest float, NaN and a value that rounds up.
    values[:8] = [0.0, -0.0, np.inf, -np.inf, 1.00390625, 1.01171875, 3.0e38, np.nan]
    return values


@pytest.mark.parametrize("lanes", [8, 16, 32, 64])
def test_vector_casts_use_the_instruction_for_sapphire_rapids(lanes):
    assert "vcvtneps2bf16" in _asm(_cast_kernel(lanes), _WITH_BF16)


@pytest.mark.parametrize(("lanes", "gather", "tgt"), [(16, False, _WITHOUT_BF16), (4, False, _WITH_BF16),
                                                      (1, False, _WITH_BF16), (16, True, _WITH_BF16)])
def test_tvm_lowers_the_rest(lanes, gather, tgt):
    """No AVX512_BF16, a lane count the instruction has no form for, scalars, and a source
    loaded lane by lane (slower in pieces, measured) keep TVM's integer rounding."""
    asm = _asm(_cast_kernel(lanes, gather=gather), tgt)
    assert "vcvtneps2bf16" not in asm
    assert "vpsrld" in asm or "shrl" in asm


@needs_bf16
@pytest.mark.parametrize(("lanes", "gather"), [(8, False), (16, False), (64, False), (16, True), (1, False)])
def test_the_bits_are_numpys_bfloat16(lanes, gather):
    """Round to nearest even, as ml_dtypes and TVM's own lowering round; the instruction
    flushes denormal inputs, none of which are here."""
    lib = tvm.compile(_cast_kernel(lanes, gather=gather), target=target("llvm"))
    x = _inputs()
    y = tvm.runtime.empty((_SIZE,), "bfloat16")
    lib["main"](tvm.runtime.tensor(x), y)
    with np.errstate(over="ignore"):  # 3e38 doubled is infinite, in both
        doubled = x * 2 if not gather else (x * 2).reshape(2, -1).T.reshape(-1)
    got, want = y.numpy().view(np.uint16), doubled.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(doubled)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(y.numpy()[nan].astype(np.float32)).all()


def test_only_tvms_rounding_is_recognized():
    bits = tirx.reinterpret("uint32x16", tirx.Var("f", tvm.ir.PrimType("float32x16")))

    def rounding(bias: int, shift: int = 16) -> tirx.Cast:
        one, sixteen = tirx.Broadcast(tirx.const(1, "uint32"), 16), tirx.Broadcast(tirx.const(shift, "uint32"), 16)
        lowest = (bits >> sixteen) & one
        return tirx.Cast("uint16x16", (bits + (lowest + tirx.Broadcast(tirx.const(bias, "uint32"), 16))) >> sixteen)

    assert bf16_casts.rounded_source(rounding(0x7FFF)) is not None
    assert bf16_casts.rounded_source(rounding(0x8000)) is None  # round half up: another cast
    assert bf16_casts.rounded_source(rounding(0x7FFF, shift=8)) is None
