"""``cuda-dense-tensorcore``: a float16/bfloat16 matmul (+ elementwise epilogue) on tensor cores.

The task is any block ``C[S, I, J] += A[S, I, K] * B[S, K, J]`` (B also as ``[S, J, K]``),
found by its access pattern, never by a model's name: a dense layer as Relax legalizes it, a
batched matmul, ``topi.nn.dense``'s transposed weight. The block is normalized as TVM's
dlight ``MatmulTensorization`` does it (``reindex`` + ``transform_layout`` to one batch,
row, column and reduction axis), then scheduled with its structure and these knobs:

- a thread block computes ``warp_m x warp_n`` warps, each ``frag_m x frag_n`` WMMA
  fragments of 16 x 16 (``wmma::mma_sync``, ``load_matrix_sync``, ``fill_fragment``);
- each reduction step stages ``chunk_k`` x 16 columns of A and B in dynamic shared memory,
  fetched by every thread of the block in vectors of ``vector`` elements (16 bytes at 8:
  ``uint4``), rows padded by 8 elements against bank conflicts;
- ``stages`` > 1 software-pipelines the reduction loop (``software_pipeline_stage``/
  ``order``: the next tiles are fetched while the current ones are multiplied), with
  ``async_copy`` the fetch is ``cp.async`` (sm_80 and later) instead of loads and stores;
- the accumulators go through shared memory to the epilogue (bias, GELU...), which stores
  the output in vectors.

Shapes must be whole 16 x 16 x 16 tiles (BERT's 128 tokens, 768 and 3072 features are) and
a block tile must divide them; other tasks stay with the sketch space.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import tvm
import tvm_ffi
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob
from search_spaces.templates.registry import Template, register_template

logger = logging.getLogger(__name__)

NAME = "cuda-dense-tensorcore"
_TILE = 16  # WMMA's m16n16k16
_WARP = 32
# Row padding of the shared tiles, in elements: A and B (dlight's), the accumulators'.
_PAD_IN = 8
_PAD_OUT = 4
_IN_DTYPES = {"float16": 70, "bfloat16": 80}  # smallest SM version with WMMA for it
_OUT_DTYPES = {"float16": ("float16",), "bfloat16": ("float32",)}
_ACCUMULATE = {"float16": ("float16", "float32"), "bfloat16": ("float32",)}
_DEFAULT_SHARED = 49152


def sm_version(target: tvm.target.Target) -> int:
    """The SM version of a CUDA target's ``arch`` (``sm_90`` -> 90), 0 when it has none."""
    arch = str(target.attrs["arch"]) if "arch" in target.attrs else ""
    m = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    return int(m.group(1)) if m else 0


def _gemm(mod: tvm.IRModule) -> dict[str, Any] | None:
    """The matmul's shape and dtypes when ``mod`` is one tensor-core-compatible matmul with
    elementwise blocks around it, else None."""
    from tvm.s_tir.dlight.gpu.matmul import IterKind, detect_iter_traits, get_reduction_blocks

    sch = Schedule(mod)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    found = get_reduction_blocks(sch, blocks)
    if not found:
        return None
    block = sch.get(found[0])
    traits = detect_iter_traits(block)
    if traits is None:
        return None
    a, b = (str(r.source.dtype) for r in block.reads)
    out = str(block.writes[0].source.dtype)
    if a != b or a not in _IN_DTYPES or out not in _ACCUMULATE[a]:
        return None
    extent = {IterKind.kIter_S: 1, IterKind.kIter_I: 1, IterKind.kIter_J: 1, IterKind.kIter_K: 1}
    kinds = {}
    for iv, trait in zip(block.iter_vars, traits[3], strict=True):
        if not isinstance(trait.extent, tvm.tirx.IntImm):
            return None  # dynamic shapes: not here
        kinds[iv.var] = trait.kind
        if trait.kind in extent:
            extent[trait.kind] *= int(trait.extent)

    def inner_kind(region: Any) -> Any:
        var = region[-1].min
        return next((k for v, k in kinds.items() if v.same_as(var)), None)

    # A read along its columns (K innermost); a transposed A would be gathered element-wise.
    if inner_kind(block.reads[0].region) != IterKind.kIter_K:
        return None
    m, n, k = extent[IterKind.kIter_I], extent[IterKind.kIter_J], extent[IterKind.kIter_K]
    if m % _TILE or n % _TILE or k % _TILE:
        return None
    trans_b = inner_kind(block.reads[1].region) == IterKind.kIter_K
    return {"m": m, "n": n, "k": k, "in": a, "out": out, "trans_b": trans_b}


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "cuda":
        return None
    gemm = _gemm(mod)
    sm = sm_version(target)
    if gemm is None or sm < _IN_DTYPES[gemm["in"]]:
        return None
    if not _schedulable(mod):
        return None
    return (
        Knob("warp_m", "choice", (1, 2, 4)),
        Knob("warp_n", "choice", (1, 2, 4)),
        Knob("frag_m", "choice", (1, 2, 4)),
        Knob("frag_n", "choice", (1, 2, 4)),
        Knob("chunk_k", "choice", (1, 2, 4)),
        # Elements per vector of the cooperative fetch and the epilogue's store (8 fp16: 16 bytes).
        Knob("vector", "choice", (2, 4, 8)),
        Knob("stages", "choice", (1, 2, 3)),
        # cp.async exists from sm_80 on.
        Knob("async_copy", "choice", (0, 1) if sm >= 80 else (0,)),
        # Fixed by the task; knobs so the constraint can read them.
        Knob("shape", "choice", ((gemm["m"], gemm["n"], gemm["k"]),)),
        Knob("bytes", "choice", ((tvm.DataType(gemm["in"]).bits // 8, tvm.DataType(gemm["out"]).bits // 8),)),
    )


def shared_bytes(values: dict[str, Any]) -> int:
    """Dynamic shared memory of a point: the A and B tiles of every stage, or the
    accumulator tile written after the loop, whichever is larger (TVM merges dynamic
    shared allocations whose lifetimes do not overlap)."""
    bm = values["warp_m"] * values["frag_m"] * _TILE
    bn = values["warp_n"] * values["frag_n"] * _TILE
    bk = values["chunk_k"] * _TILE
    in_bytes, out_bytes = values["bytes"]
    # B's tile is [bk, bn] or [bn, bk]: the larger padded form bounds both.
    ab = (bm * (bk + _PAD_IN) + max(bk * (bn + _PAD_IN), bn * (bk + _PAD_IN))) * in_bytes
    return max(ab * max(values["stages"], 1), bm * (bn + _PAD_OUT) * out_bytes)


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    m, n, k = values["shape"]
    bm = values["warp_m"] * values["frag_m"] * _TILE
    bn = values["warp_n"] * values["frag_n"] * _TILE
    bk = values["chunk_k"] * _TILE
    if m % bm or n % bn or k % bk:
        return f"block tile {bm} x {bn} x {bk} does not divide the {m} x {n} x {k} matmul"
    threads = values["warp_m"] * values["warp_n"] * _WARP
    if threads > limits.gpu.get("max_threads_per_block", 1024):
        return f"{threads} threads per block"
    share = threads * values["vector"]
    if (bm * bk) % share or (bn * bk) % share:
        return f"a {bm} x {bk} or {bk} x {bn} tile is not whole vectors of {values['vector']} for {threads} threads"
    if values["async_copy"] and values["stages"] == 1:
        return "an asynchronous copy without a pipeline waits at once (the same point as async_copy 0)"
    need = shared_bytes(values)
    have = limits.gpu.get("max_shared_memory_per_block", _DEFAULT_SHARED)
    if need > have:
        return f"{need} bytes of shared memory, over the {have} a block may have"
    return None


def _starts(choices: dict[str, tuple], limits: Limits) -> list[dict[str, Any]]:
    """Tiles in the manner of CUTLASS's float16 kernels (64 x 64 to 128 x 64 blocks of 4
    warps, 32-wide k chunks, 16-byte vectors, cp.async in 2-3 stages where the GPU has it),
    measured before any search; unmeasured on a GPU as yet. Those the task's shape or the
    shared memory refuse are dropped by the space."""
    copy = max(choices["async_copy"])
    out = []
    for wm, wn, fm, fn, ck, stages in ((2, 2, 2, 2, 2, 2), (2, 2, 2, 2, 2, 3), (2, 2, 4, 2, 2, 2), (2, 2, 2, 1, 2, 2),
                                       (1, 2, 2, 2, 4, 2), (2, 1, 2, 2, 4, 2)):  # fmt: skip
        out.append({"warp_m": wm, "warp_n": wn, "frag_m": fm, "frag_n": fn, "chunk_k": ck, "vector": 8,
                    "stages": stages, "async_copy": copy})
    return out


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    from tvm.s_tir.dlight.gpu.matmul import (
        IterKind,
        auto_inline_consumer_chain,
        auto_inline_producers,
        detect_iter_traits,
        get_reduction_blocks,
        make_iter_fusion_index_map,
    )

    gemm = _gemm(sch.mod)
    if gemm is None:
        raise ValueError("not a tensor-core matmul")
    intrin = intrinsics(gemm["in"], gemm["out"], gemm["trans_b"])
    wm, wn, fm, fn = values["warp_m"], values["warp_n"], values["frag_m"], values["frag_n"]
    vector, stages = values["vector"], values["stages"]
    bat, row, col, red = IterKind.kIter_S, IterKind.kIter_I, IterKind.kIter_J, IterKind.kIter_K

    # Normalize to C[S, I, J] += A[S, I, K] * B[S, K, J] (or B[S, J, K]), as dlight does.
    [main] = get_reduction_blocks(sch, sch.get_child_blocks(sch.get_sblock("root")))
    reindex = [sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1)), sch.reindex(main, ("write", 0))]
    a_traits, b_traits, c_traits, block_traits = detect_iter_traits(sch.get(main))
    sch.transform_layout(reindex[0], ("write", 0), make_iter_fusion_index_map(a_traits, [bat, row, red]))
    sch.transform_layout(reindex[1], ("write", 0),
                         make_iter_fusion_index_map(b_traits, [bat, col, red] if gemm["trans_b"] else [bat, red, col]))
    sch.transform_layout(reindex[2], ("read", 0), make_iter_fusion_index_map(c_traits, [bat, row, col]))
    sch.transform_block_layout(main, make_iter_fusion_index_map(block_traits, [bat, row, col, red]))

    batch, i, j, k = sch.get_loops(main)
    i, i_tc = sch.split(i, [None, _TILE])
    j, j_tc = sch.split(j, [None, _TILE])
    k, k_tc = sch.split(k, [None, _TILE])
    sch.reorder(i, j, k, i_tc, j_tc, k_tc)
    inner, outer = main, sch.blockize(i_tc)
    i0, i1, i2 = sch.split(i, [None, wm, fm])
    j0, j1, j2 = sch.split(j, [None, wn, fn])
    k0, k1 = sch.split(k, [None, values["chunk_k"]])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    sch.bind(batch, "blockIdx.z")
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    warp = sch.fuse(i1, j1)
    sch.bind(warp, "threadIdx.y")

    def fetch(index: int) -> Any:
        # Every thread of the block copies vectors of the tile into shared memory.
        block = sch.cache_read(outer, index, "shared.dyn")
        sch.compute_at(block, k0)
        fused = sch.fuse(*sch.get_loops(block)[-2:])
        _, ty, tx, vec = sch.split(fused, [None, wm * wn, _WARP, vector])
        sch.bind(tx, "threadIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.vectorize(vec)
        sch.storage_align(block, 0, axis=-2, factor=16, offset=_PAD_IN)
        auto_inline_producers(sch, block)
        return block

    fetch(0)
    fetch(1)
    frags = [sch.cache_read(outer, 0, "wmma.matrix_a"), sch.cache_read(outer, 1, "wmma.matrix_b")]
    for frag in frags:
        sch.compute_at(frag, k1)
    to_global = sch.cache_write(outer, 0, "shared.dyn")
    sch.storage_align(to_global, 0, -2, 16, _PAD_OUT)
    store = sch.cache_write(outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(store, warp)
    sch.reverse_compute_at(to_global, warp)
    init = sch.get_child_blocks(sch.decompose_reduction(outer, k0))[0]

    for frag, key in zip([*frags, store], ("load_a", "load_b", "store"), strict=True):
        r, c = sch.get_loops(frag)[-2:]
        r0, r1 = sch.split(r, [None, _TILE])
        c0, c1 = sch.split(c, [None, _TILE])
        sch.reorder(r0, c0, r1, c1)
        sch.unroll(r0)
        sch.unroll(c0)
        sch.tensorize(r1, intrin[key])
    sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
    sch.tensorize(sch.get_loops(inner)[-3], intrin["compute"])

    auto_inline_consumer_chain(sch, to_global)
    fused = sch.fuse(*sch.get_loops(to_global)[-2:])
    _, tx, vec = sch.split(fused, [None, _WARP, vector])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)

    if stages > 1:
        # k0's body: the fetch of A, the fetch of B, the fragment loop over k1.
        sch.annotate(k0, "software_pipeline_stage", [0, 0, stages - 1])
        sch.annotate(k0, "software_pipeline_order", [0, 1, 2])
        if values["async_copy"]:
            sch.annotate(k0, "software_pipeline_async_stages", [0])
    logger.debug("scheduled a %s matmul with %s", gemm["in"], values)


def _schedulable(mod: tvm.IRModule) -> bool:
    """Whether the smallest point schedules (the epilogue inlines, the intrinsics match):
    a task the template recognizes but cannot schedule is not offered to it."""
    return _schedules(_ByStructure(mod))


@functools.cache
def _schedules(key: _ByStructure) -> bool:
    values = {"warp_m": 1, "warp_n": 1, "frag_m": 1, "frag_n": 1, "chunk_k": 1, "vector": 2, "stages": 1,
              "async_copy": 0}
    try:
        _schedule(Schedule(key.mod), values, Limits())
    except (RuntimeError, ValueError, AssertionError) as err:
        logger.debug("%s does not schedule this task: %s", NAME, str(err).splitlines()[-1:])
        return False
    return True


class _ByStructure:
    """A module keyed by its structural hash, for the cache of :func:`_schedules`."""

    def __init__(self, mod: tvm.IRModule) -> None:
        self.mod = mod
        self._hash = int(tvm_ffi.structural_hash(mod))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByStructure) and bool(tvm_ffi.structural_equal(self.mod, other.mod))


@functools.cache
def intrinsics(in_dtype: str, out_dtype: str, trans_b: bool) -> dict[str, str]:
    """The WMMA intrinsics of a matmul, by role (``load_a``, ``load_b``, ``compute``,
    ``init``, ``store``): TVM's for float16; for bfloat16, registered here from TVM's
    generators (TVM 0.27 registers none)."""
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin import cuda

    if in_dtype == "float16":
        return cuda.get_wmma_intrin_group("shared.dyn", "shared.dyn", "float16", out_dtype, trans_b)
    t = "_trans" if trans_b else ""
    names = {"load_a": "nightshift_wmma_load_16x16x16_bf16_a_shared_dyn",
             "load_b": f"nightshift_wmma_load_16x16x16_bf16_b{t}_shared_dyn",
             "compute": f"nightshift_wmma_sync_16x16x16_bf16bf16f32{t}",
             "init": cuda.WMMA_FILL_16x16x16_F32_INTRIN,
             "store": cuda.WMMA_STORE_16x16x16_F32_SHARED_DYN_INTRIN}  # fmt: skip
    made = {"load_a": cuda.get_wmma_load_intrin(16, 16, 16, "bfloat16", "shared.dyn", False, False),
            "load_b": cuda.get_wmma_load_intrin(16, 16, 16, "bfloat16", "shared.dyn", True, trans_b),
            "compute": cuda.get_wmma_sync_intrin(16, 16, 16, "bfloat16", "float32", trans_b)}  # fmt: skip
    for role, (desc, impl) in made.items():
        TensorIntrin.register(names[role], desc, impl, override=True)
    return names


CUDA_DENSE_TENSORCORE = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    starts=_starts,
    description="float16/bfloat16 matmul + epilogue on tensor cores (WMMA), vector fetch, pipelined (CUDA)",
))  # fmt: skip
