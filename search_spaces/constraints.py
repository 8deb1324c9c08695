"""Limits that keep every point of a space buildable, taken from the target.

Three bounds are checked before anything is built: the explicit-unroll step on CPUs (long
unrolled bodies are what made MetaSchedule's LLVM builds time out), the vector width (at
most a few of the ISA's vector registers), and on CUDA the threads per block and shared
memory per block (enforced by TVM's ``VerifyGPUCode`` postprocessor, which reads them from
the target, so the target must carry them).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import tvm

logger = logging.getLogger(__name__)

# What every CUDA GPU since sm_50 reports (cudaDeviceProp): 1024 threads per block, 48 KiB
# of static shared memory per block, warps of 32, 64 Ki registers per block. A target
# built from a present GPU carries the queried values instead (tuner.device).
_CUDA_DEFAULTS: dict[str, int] = {
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 49152,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}


@dataclass(frozen=True)
class Limits:
    """Bounds applied to the knob domains of a space.

    Attributes:
        max_unroll_step: largest explicit-unroll step kept in a CPU space's unroll knob.
        vector_bits: the ISA's vector register width (512 for AVX-512).
        max_vector_registers: widest vectorized loop, in registers of fp32 lanes.
        num_cores: CPU threads the target runs on (parallel extents are multiples of it).
        gpu: the CUDA limits the target carries (empty on CPUs).
    """

    max_unroll_step: int = 64
    vector_bits: int = 128
    max_vector_registers: int = 4
    num_cores: int = 1
    gpu: dict[str, int] = field(default_factory=dict)

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers of an x86 CPU: 32 zmm with AVX-512, 16 ymm/xmm below."""
        return 32 if self.vector_bits >= 512 else 16

    @property
    def max_vector_lanes(self) -> int:
        """Widest vectorized loop, in fp32 lanes."""
        return self.vector_bits // 32 * self.max_vector_registers

    def parallel_choices(self, default: int) -> tuple[int, ...]:
        """Parallel-extent values: jobs per core from 1 to 64, and TVM's own default."""
        return tuple(sorted({self.num_cores * j for j in (1, 4, 16, 64)} | {default}))

    def vectorize_choices(self, default: int) -> tuple[int, ...]:
        """Vector-width values: 1 to ``max_vector_registers`` registers of fp32 lanes, and
        TVM's default when it is within the bound."""
        lanes = self.vector_bits // 32
        values = {lanes * r for r in range(1, self.max_vector_registers + 1) if r & (r - 1) == 0}
        if default <= self.max_vector_lanes:
            values.add(default)
        return tuple(sorted(values))


def limits_for(target: tvm.target.Target) -> Limits:
    """The limits of a target: its ISA's vector width and cores, or its GPU limits."""
    kind = str(target.kind.name)
    if kind == "cuda":
        gpu = {k: int(target.attrs[k]) for k in _CUDA_DEFAULTS if k in target.attrs}
        # GPU unrolling is cheap to compile and TVM's candidates go to 1024; keep them all.
        return Limits(max_unroll_step=1 << 30, gpu=gpu)
    cores = int(target.attrs["num-cores"]) if "num-cores" in target.attrs else 1
    return Limits(vector_bits=vector_bits(target), num_cores=max(cores, 1))


def vector_bits(target: tvm.target.Target) -> int:
    """The widest vector register of an LLVM target's ISA, in bits (at least 128)."""
    from tvm.target import codegen

    if is_x86(target):
        # TVM 0.27's llvm_get_vector_width says 512 for every x86 mcpu, AVX2-only ones (haswell,
        # znver3) included: ask LLVM about the features instead.
        for feature, bits in (("avx512f", 512), ("avx", 256)):
            if codegen.target_has_features(feature, target):
                return bits
        return 128
    try:
        return max(int(codegen.llvm_get_vector_width(target)), 128)
    except (RuntimeError, ValueError, AttributeError):
        return 128


def is_x86(target: tvm.target.Target) -> bool:
    """Whether an LLVM target is an x86 CPU (a host target, with no triple, is this machine)."""
    if str(target.kind.name) != "llvm":
        return False
    triple = str(target.attrs["mtriple"]) if "mtriple" in target.attrs else ""
    if triple:
        return triple.startswith(("x86_64", "i686", "i386"))
    import platform

    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def target_with_limits(target: tvm.target.Target) -> tvm.target.Target:
    """``target``, with CUDA's per-block limits added where it lacks them.

    TVM's CUDA sketch rules and ``VerifyGPUCode`` refuse a target without
    ``max_threads_per_block`` and ``max_shared_memory_per_block``; a cross-build target
    (``--target-arch sm_90`` without a GPU) has neither.
    """
    if str(target.kind.name) != "cuda":
        return target
    config: dict[str, Any] = dict(target.export())
    missing = {k: v for k, v in _CUDA_DEFAULTS.items() if k not in config}
    if not missing:
        return target
    arch = str(config.get("arch", ""))
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        logger.warning("CUDA target without an sm_XX arch; assuming the common per-block limits")
    config.update(missing)
    config.pop("tag", None)
    config["keys"] = list(config.get("keys", ()))
    return tvm.target.Target(config)
