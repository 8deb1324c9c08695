"""LLVM code generation of a compiled model, one LLVM module per function.

TVM builds all of a model's scheduled functions as one LLVM module (``target.build.llvm``).
For the bf16 models that module takes superlinear time. On a 2-core Zen 5 (2026-11-26,
``benchmarks/compile_profile.py --copies 16``), 16 copies of one tensorized bf16 conv (256
``vdpbf16ps`` calls each) took 118 s together against 0.43 s for one. ResNet-50 bf16's 44
functions took 31.3 s as one module against 4.1 s one by one, while fp32's functions cost the
same either way. The hot code is in TVM's stripped LLVM and is not named here. Building each
function as its own LLVM module and importing them into the first bounds that cost by the
largest function.

The split is for CPU builds of public functions only, and only inside :func:`per_function`:
a function finds the packed functions it calls through its own module's imports, so host
code that launches GPU kernels, or calls a library imported into the first module, must stay
in one module (a private subroutine, likewise, must stay with its caller). The functions of
the other modules are found through the first one's imports (``get_function(name,
query_imports=True)``, as the Relax VM looks its kernels up); an exported library links them
all into one shared object.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import tvm
import tvm_ffi

logger = logging.getLogger(__name__)

_BUILD = "target.build.llvm"
_lock = threading.Lock()
_depth = 0
_original: tvm_ffi.Function | None = None
_whole = threading.local()  # builds in single_module() on this thread: TVM's one module


def _splittable(mod: tvm.IRModule) -> bool:
    funcs = list(mod.functions.values())
    return len(funcs) > 1 and all(
        isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "global_symbol" in f.attrs for f in funcs
    )


def build_per_function(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Module:
    """``target.build.llvm`` of ``mod``, each function in its own LLVM module (imported into
    the first); a module :func:`per_function` may not split is built whole."""
    assert _original is not None
    if getattr(_whole, "depth", 0) or not _splittable(mod):
        return _original(mod, target)
    libs = [_original(tvm.IRModule({gv: f}, attrs=mod.attrs), target) for gv, f in mod.functions.items()]
    for lib in libs[1:]:
        libs[0].import_module(lib)
    logger.debug("built %d functions as separate LLVM modules", len(libs))
    return libs[0]


@contextlib.contextmanager
def per_function() -> Iterator[None]:
    """Within: every LLVM build of this process (CPU code) makes one LLVM module per function.

    Nested and concurrent uses share one registration; TVM's own build is back when the last
    one ends.
    """
    global _depth, _original
    with _lock:
        if _depth == 0:
            _original = tvm_ffi.get_global_func(_BUILD)
            tvm_ffi.register_global_func(_BUILD, build_per_function, override=True)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                tvm_ffi.register_global_func(_BUILD, _original, override=True)


@contextlib.contextmanager
def single_module() -> Iterator[None]:
    """Within, on this thread: TVM's own build (one LLVM module), for comparisons."""
    _whole.depth = getattr(_whole, "depth", 0) + 1
    try:
        yield
    finally:
        _whole.depth -= 1
