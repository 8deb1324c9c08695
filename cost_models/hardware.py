"""A hardware descriptor appended to every store row, so one model serves several devices.

The descriptor is a pure function of the TVM target, which the database stores with every
device (``devices.target``): a record's features can be rebuilt on any machine, and two
devices of one model family get the same descriptor exactly when they build the same code.

CPU: the ISA features LLVM enables for the target (``mcpu`` plus ``mattr``), the widest
vector in bits, the cores used, and the per-core L1d/L2 sizes of the ``mcpu``'s
microarchitecture (fixed by the core design, unlike L3, which varies by SKU and is left out).
CUDA: the SM version, shared memory per block, threads per block and warp size.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm

logger = logging.getLogger(__name__)

# LLVM feature names; the order is the descriptor's layout, so only ever append.
CPU_FEATURES = (
    "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
    "avx512vnni", "avx512bf16", "avx512fp16", "avxvnni", "amx-tile", "amx-int8", "amx-bf16",
    "neon", "sve",
)  # fmt: skip

# Per-core (L1d KiB, L2 KiB) of LLVM's CPU names: what a core design fixes.
_CORE_CACHES: dict[str, tuple[int, int]] = {
    "haswell": (32, 256), "broadwell": (32, 256), "skylake": (32, 256),
    "skylake-avx512": (32, 1024), "cascadelake": (32, 1024), "cooperlake": (32, 1024),
    "icelake-server": (48, 1280), "icelake-client": (48, 512), "tigerlake": (48, 1280),
    "rocketlake": (48, 512), "alderlake": (48, 1280), "raptorlake": (48, 2048),
    "sapphirerapids": (48, 2048), "emeraldrapids": (48, 2048), "graniterapids": (48, 2048),
    "znver1": (32, 512), "znver2": (32, 512), "znver3": (32, 512), "znver4": (32, 1024),
    "znver5": (48, 1024),
}  # fmt: skip

# [is_cpu, is_cuda] + CPU features + [vector bits / 512, cores, L1d KiB, L2 KiB]
# + [SM version, shared KiB per block, threads per block, warp size]
HARDWARE_WIDTH = 2 + len(CPU_FEATURES) + 4 + 4
HARDWARE_NAMES = (
    "hw.cpu", "hw.cuda", *(f"hw.{f}" for f in CPU_FEATURES), "hw.vector_bits", "hw.cores", "hw.l1d_kib",
    "hw.l2_kib", "hw.sm", "hw.shared_kib", "hw.max_threads", "hw.warp",
)  # fmt: skip


def hardware_descriptor(target: tvm.target.Target) -> np.ndarray:
    """``(HARDWARE_WIDTH,)`` float32 descriptor of ``target`` (see the module docstring)."""
    # Cached by the target's text: asking LLVM for 18 features costs ~1 ms, every batch.
    key = str(target)
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = _descriptor(target)
    return found.copy()


_CACHE: dict[str, np.ndarray] = {}


def _descriptor(target: tvm.target.Target) -> np.ndarray:
    out = np.zeros(HARDWARE_WIDTH, dtype=np.float32)
    kind = str(target.kind.name)
    base = 2 + len(CPU_FEATURES)
    if kind == "llvm":
        out[0] = 1.0
        has = _cpu_features(target)
        out[2:base] = has
        bits = 512 if has[CPU_FEATURES.index("avx512f")] else 256 if has[CPU_FEATURES.index("avx")] else 128
        mcpu = str(target.attrs.get("mcpu", "") or "")
        l1, l2 = _CORE_CACHES.get(mcpu, (0, 0))
        out[base : base + 4] = (bits / 512, float(target.attrs.get("num-cores", 0) or 0), l1, l2)
    elif kind == "cuda":
        out[1] = 1.0
        arch = str(target.attrs.get("arch", "") or "")
        sm = float("".join(c for c in arch.removeprefix("sm_") if c.isdigit()) or 0)
        out[base + 4 : base + 8] = (
            sm,
            float(target.attrs.get("max_shared_memory_per_block", 0) or 0) / 1024,
            float(target.attrs.get("max_num_threads", 0) or 0),
            float(target.attrs.get("thread_warp_size", 0) or 0),
        )
    return out


def _cpu_features(target: tvm.target.Target) -> np.ndarray:
    from tvm.target import codegen

    has = np.zeros(len(CPU_FEATURES), dtype=np.float32)
    for i, name in enumerate(CPU_FEATURES):
        try:
            has[i] = float(bool(codegen.target_has_features(name, target)))
        except (RuntimeError, ValueError, AttributeError):
            # A feature LLVM does not know for this triple (neon on x86): absent.
            has[i] = 0.0
    return has
