"""What an LLVM CPU target has, asked of LLVM once per target: the one object that ISA questions
go through (vector width, bf16 and int8 dot products, AMX tiles), instead of feature strings
spelled out at each branch.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from search_spaces.constraints import is_x86, vector_bits

if TYPE_CHECKING:
    import tvm

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
_CACHE: dict[str, CpuFeatures] = {}

#: LLVM's names of the features the spaces, layouts and precisions ask about.
BF16_DOT = "avx512bf16"
VNNI = ("avx512vnni", "avxvnni")
AMX_TILE = "amx-tile"
AMX_BF16 = "amx-bf16"
AMX_INT8 = "amx-int8"


@dataclass(eq=False)
class CpuFeatures:
    """The features of one target, each asked of LLVM on first use and kept.

    Build it with :meth:`of`; a target that is not an LLVM CPU has none.
    """

    target: tvm.target.Target
    _known: dict[str, bool | None] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, target: tvm.target.Target) -> CpuFeatures:
        """The features of ``target`` (one object per distinct target)."""
        key = str(target)
        with _LOCK:
            found = _CACHE.get(key)
            if found is None:
                found = _CACHE[key] = cls(target)
        return found

    def has(self, feature: str) -> bool:
        """Whether the target has the LLVM CPU ``feature`` (``avx512bf16``, ``amx-tile``, ...)."""
        return bool(self._ask(feature))

    @property
    def resolvable(self) -> bool:
        """Whether LLVM can answer for the target at all (an mcpu it does not know cannot)."""
        return self._ask("sse2") is not None or str(self.target.kind.name) != "llvm"

    def _ask(self, feature: str) -> bool | None:
        """The answer, kept; None where LLVM cannot resolve the target."""
        if feature in self._known:
            return self._known[feature]
        from tvm.target import codegen

        answer: bool | None
        if str(self.target.kind.name) != "llvm":
            answer = False
        else:
            try:
                answer = bool(codegen.target_has_features(feature, self.target))
            except (RuntimeError, ValueError):  # an mcpu LLVM does not know
                answer = None
        self._known[feature] = answer
        return answer

    @property
    def mcpu(self) -> str:
        """LLVM's name of the CPU (empty for the host target without one)."""
        return str(self.target.attrs.get("mcpu", "")) if str(self.target.kind.name) == "llvm" else ""

    @property
    def x86(self) -> bool:
        """Whether it is an x86 CPU."""
        return is_x86(self.target)

    @property
    def vector_bits(self) -> int:
        """The widest vector register, in bits (at least 128)."""
        return vector_bits(self.target) if str(self.target.kind.name) == "llvm" else 128

    @property
    def amd(self) -> bool:
        """Whether LLVM names an AMD Zen core."""
        return self.mcpu.startswith("znver")

    @property
    def bf16_dot(self) -> bool:
        """``vdpbf16ps`` (AVX512_BF16)."""
        return self.has(BF16_DOT)

    @property
    def amx_bf16(self) -> bool:
        """AMX tiles with ``tdpbf16ps``."""
        return self.has(AMX_TILE) and self.has(AMX_BF16)

    @property
    def amx_int8(self) -> bool:
        """AMX tiles with ``tdpbusd``."""
        return self.has(AMX_TILE) and self.has(AMX_INT8)

    @property
    def exact_int8_dot(self) -> bool:
        """An int8 dot product that adds uint8 x int8 products in int32 directly (VNNI, AMX)."""
        return any(self.has(f) for f in VNNI) or self.has(AMX_INT8)

    @property
    def int8_weight_bits(self) -> int:
        """8 where the int8 dot product is exact; 7 where it adds pairs of products in int16 first
        (AVX2's and AVX-512BW's ``vpmaddubsw``), which 8-bit weights can saturate."""
        return 8 if self.exact_int8_dot or not self.resolvable else 7
