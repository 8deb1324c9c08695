"""The one object ISA questions go through (``search_spaces.x86.features.CpuFeatures``), on
CPUs named by their LLVM mcpu, so the answers do not depend on the machine the tests run on."""

from __future__ import annotations

import pytest
import tvm

from search_spaces.x86.features import CpuFeatures


def _cpu(mcpu: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "mtriple": "x86_64-linux-gnu", "num-cores": 2})


@pytest.mark.parametrize(("mcpu", "bits", "bf16_dot", "amx_bf16", "weight_bits", "amd"), [
    ("znver3", 256, False, False, 7, True),  # AVX2 only: vpmaddubsw adds pairs in int16
    ("cooperlake", 512, True, False, 8, False),  # AVX512_BF16 and VNNI, no AMX
    ("sapphirerapids", 512, True, True, 8, False),
    ("haswell", 256, False, False, 7, False),
])  # fmt: skip
def test_features_of_named_cpus(mcpu, bits, bf16_dot, amx_bf16, weight_bits, amd):
    f = CpuFeatures.of(_cpu(mcpu))
    assert f.x86 and f.mcpu == mcpu
    assert (f.vector_bits, f.bf16_dot, f.amx_bf16, f.int8_weight_bits, f.amd) == (bits, bf16_dot, amx_bf16,
                                                                                  weight_bits, amd)  # fmt: skip
    assert f.amx_int8 == amx_bf16  # both come with Sapphire Rapids' tiles


def test_one_object_per_target_and_none_for_a_gpu():
    assert CpuFeatures.of(_cpu("znver3")) is CpuFeatures.of(_cpu("znver3"))
    gpu = CpuFeatures.of(tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    assert not gpu.has("avx2") and not gpu.x86 and gpu.vector_bits == 128 and gpu.mcpu == ""
