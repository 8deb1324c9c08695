"""Devices: parse ``--device``, build the TVM target and a stable device fingerprint.

The fingerprint keys the tuning database: two machines share tuning records only when their
fingerprints match (same CPU model, ISA flags and core count; or same GPU name, SM version).
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import psutil
import tvm

from tuner.errors import UnknownDeviceError
from tuner.host import host_cpu_flags
from tuner.threads import size_thread_pool

logger = logging.getLogger(__name__)

# ISA flags that change code generation or speed; the rest of /proc/cpuinfo is noise that
# would split one machine type into many fingerprints (e.g. "hypervisor", microcode bugs).
_ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
    "avx512cd", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8",
    "amx_bf16", "avx_vnni", "neon", "asimd", "sve", "sve2",
)  # fmt: skip
# /proc/cpuinfo's x86 flags and LLVM's names for the same features. LLVM names the host CPU
# by its family and model, and a hypervisor may hide what that model has (an AMD Zen 4 guest
# without AVX-512: mcpu znver4, no avx512f flag); code built for the name then dies on SIGILL.
# It may also report a model older than the CPU (a Xeon with AMX as model 167, which LLVM
# names rocketlake: no AMX, no avx512bf16); code built for the name then leaves them unused.
_LLVM_FEATURES = (
    ("avx", "avx"), ("avx2", "avx2"), ("fma", "fma"), ("f16c", "f16c"),
    ("avx512f", "avx512f"), ("avx512bw", "avx512bw"), ("avx512dq", "avx512dq"),
    ("avx512vl", "avx512vl"), ("avx512cd", "avx512cd"), ("avx512ifma", "avx512ifma"),
    ("avx512vbmi", "avx512vbmi"), ("avx512_vbmi2", "avx512vbmi2"), ("avx512_vnni", "avx512vnni"),
    ("avx512_bitalg", "avx512bitalg"), ("avx512_vpopcntdq", "avx512vpopcntdq"),
    ("avx512_bf16", "avx512bf16"), ("avx512_fp16", "avx512fp16"), ("avx_vnni", "avxvnni"),
    ("amx_tile", "amx-tile"), ("amx_int8", "amx-int8"), ("amx_bf16", "amx-bf16"),
)  # fmt: skip


@dataclass(frozen=True)
class Device:
    """A device that candidates are built for and timed on.

    Attributes:
        kind: ``"cpu"`` or ``"cuda"``.
        index: device index (GPU ordinal; 0 for the host CPU).
        target: the TVM target as its JSON dict form.
        description: human-readable fields (CPU model, flags, cores; GPU name, SM, driver).
        present: whether the device is on this machine (False when cross-building).
    """

    kind: str
    index: int
    target_config: dict[str, Any]
    description: dict[str, Any] = field(hash=False, compare=False)
    present: bool = True

    @property
    def target(self) -> tvm.target.Target:
        """The TVM target for this device."""
        return tvm.target.Target(self.target_config)

    @property
    def name(self) -> str:
        """``cpu`` or ``cuda:N``."""
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.index}"

    @property
    def arch(self) -> str:
        """Architecture family: the LLVM mcpu or the CUDA sm version."""
        return str(self.target_config.get("mcpu") or self.target_config.get("arch"))

    @property
    def fingerprint(self) -> str:
        """A stable 16-hex-digit hash of what determines a schedule's speed on this device."""
        keys = ("model", "isa_flags", "cores") if self.kind == "cpu" else ("gpu", "arch")
        ident = {k: self.description.get(k) for k in keys} | {"kind": self.kind}
        blob = json.dumps(ident, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def tvm_device(self) -> tvm.runtime.Device:
        """The runtime device handle (``tvm.cpu(0)`` or ``tvm.cuda(N)``)."""
        return tvm.cpu(0) if self.kind == "cpu" else tvm.cuda(self.index)

    def use_threads(self) -> None:
        """Run this process's TVM kernels on the target's ``num-cores`` threads (CPU only).

        Without ``TVM_NUM_THREADS``, TVM's thread pool takes half the logical CPUs on x86
        (it assumes hyper-threading): one thread on a 2-core machine, while candidates were
        tuned and timed on ``num-cores`` threads. Call before running a compiled model.
        """
        cores = int(self.target_config.get("num-cores", 0))
        if self.kind != "cpu" or cores <= 0:
            return
        size_thread_pool(cores)


def parse_device(spec: str, *, target_arch: str | None = None, num_cores: int | None = None) -> Device:
    """Parse ``cpu``, ``llvm``, ``cuda``, ``cuda:N`` or ``gpu:N`` into a Device.

    Args:
        spec: the ``--device`` string.
        target_arch: for CUDA, an ``sm_XX`` to cross-build for when no GPU is present (or to
            override the detected one); for CPU, an LLVM ``mcpu`` to build for instead of
            the host's.
        num_cores: CPU threads to tune for; defaults to the host's physical cores.

    Raises:
        UnknownDeviceError: the string names no supported device, or the GPU is absent and no
            ``target_arch`` was given.
    """
    text = spec.strip().lower()
    if text in ("cpu", "llvm", "host"):
        return _cpu_device(target_arch, num_cores)
    m = re.fullmatch(r"(?:cuda|gpu)(?::(\d+))?", text)
    if m:
        return _cuda_device(int(m.group(1) or 0), target_arch)
    raise UnknownDeviceError(
        f"unknown device {spec!r}: use 'cpu' or 'cuda:N' (e.g. --device cuda:0)"
    )


def _cpu_device(mcpu: str | None, num_cores: int | None) -> Device:
    from tvm.target import codegen

    info = host_cpu_info()
    if mcpu is not None and not codegen.llvm_is_valid_cpu(mcpu, codegen.llvm_get_system_triple()):
        raise UnknownDeviceError(f"--target-arch {mcpu!r} is not a CPU that LLVM knows")
    cores = num_cores or info["cores"]
    config: dict[str, Any] = {"kind": "llvm", "mcpu": mcpu or info["mcpu"], "num-cores": int(cores)}
    hidden = [] if mcpu is not None else hidden_features(config, host_cpu_flags())
    unnamed = [] if mcpu is not None else unnamed_features(config, host_cpu_flags())
    if hidden:
        logger.info("LLVM names this CPU %s, but it lacks %s: building without them", config["mcpu"], ", ".join(hidden))
    if unnamed:
        logger.info("LLVM names this CPU %s, which lacks %s that it has: building with them",
                    config["mcpu"], ", ".join(unnamed))
    if hidden or unnamed:
        config["mattr"] = [f"-{f}" for f in hidden] + [f"+{f}" for f in unnamed]
    desc = dict(info) | {"cores": int(cores)}
    return Device(kind="cpu", index=0, target_config=config, description=desc)


@cache
def host_cpu_info() -> dict[str, Any]:
    """The host CPU's model, LLVM mcpu, ISA flags and physical core count.

    Under TVM's runtime alone (a device actor) the mcpu is None: it is LLVM's to tell, and the
    fingerprint does not depend on it.
    """
    from tvm.target import codegen

    try:
        mcpu: str | None = str(codegen.llvm_get_system_cpu())
    except AttributeError:  # runtime-only import: no LLVM
        mcpu = None
    model, flags = platform.processor() or platform.machine(), set(host_cpu_flags())
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
                break
    return {
        "model": model,
        "mcpu": mcpu,
        "isa_flags": sorted(f for f in _ISA_FLAGS if f in flags),
        "cores": psutil.cpu_count(logical=False) or psutil.cpu_count() or 1,
        "machine": platform.machine(),
    }


def hidden_features(config: dict[str, Any], cpu_flags: Iterable[str]) -> list[str]:
    """LLVM features that ``config``'s mcpu implies but the CPU's flags do not list.

    Empty where the flags are unknown (no /proc/cpuinfo, not x86) or LLVM does not know the mcpu.
    """
    return _features_differing(config, cpu_flags, listed=False)


def unnamed_features(config: dict[str, Any], cpu_flags: Iterable[str]) -> list[str]:
    """LLVM features that the CPU's flags list but ``config``'s mcpu does not imply.

    Empty where the flags are unknown (no /proc/cpuinfo, not x86) or LLVM does not know the mcpu.
    """
    return _features_differing(config, cpu_flags, listed=True)


def _features_differing(config: dict[str, Any], cpu_flags: Iterable[str], *, listed: bool) -> list[str]:
    """The LLVM features whose flag the CPU lists (``listed``) or not, where the mcpu says otherwise."""
    from tvm.target import codegen

    flags = set(cpu_flags)
    if not flags or not config.get("mcpu") or ("avx" not in flags and "sse2" not in flags):
        return []
    try:
        target = tvm.target.Target(config)
        return [llvm for flag, llvm in _LLVM_FEATURES
                if (flag in flags) == listed and bool(codegen.target_has_features(llvm, target)) != listed]  # fmt: skip
    except (RuntimeError, ValueError):
        return []


def _cuda_device(index: int, arch: str | None) -> Device:
    if arch is not None and not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise UnknownDeviceError(f"--target-arch {arch!r} is not a CUDA arch; use e.g. sm_90")
    gpu = _query_gpu(index)
    if gpu is None and arch is None:
        raise UnknownDeviceError(
            f"no CUDA GPU {index} on this machine; pass --target-arch sm_XX to cross-build "
            "for one, or use --device cpu"
        )
    desc: dict[str, Any] = dict(gpu or {})
    arch = arch or desc["arch"]
    desc.setdefault("gpu", f"unknown ({arch})")
    desc["arch"] = arch
    config: dict[str, Any] = {"kind": "cuda", "arch": arch}
    for key in ("max_num_threads", "max_shared_memory_per_block", "thread_warp_size"):
        if key in desc:
            config[key] = desc[key]
    return Device(kind="cuda", index=index, target_config=config, description=desc, present=gpu is not None)


def _query_gpu(index: int) -> dict[str, Any] | None:
    """The GPU's name, SM version, limits, driver and CUDA versions, or None if absent."""
    from tuner.cuda_runtime import gpu_identity

    return gpu_identity(index)
