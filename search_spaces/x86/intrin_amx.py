"""Intel AMX tile intrinsics: ``tdpbf16ps`` (AMX-BF16) and ``tdpbusd`` (AMX-INT8) on a
register tile of up to 2 x 2 accumulator tiles of up to 16 rows x 16 float32 (int32).

An AMX accumulator lives in a tile register (``tmm0``-``tmm7``), not in memory, across the
whole reduction, as oneDNN's brgemm kernels keep it. Three tensor intrinsics per tile shape
(:class:`TileShape`) do that in TIR:

- ``init``: the accumulators' zero-initialization (the block ``decompose_reduction`` makes);
  its implementation configures the tiles and zeroes the accumulator tiles. The thread's
  tile configuration is read back (``sttilecfg``) and loaded only when it differs
  (``ldtilecfg``): on an Emerald Rapids, 18 against 149 TSC cycles per call, where two tile
  loads and a ``tdpbf16ps`` take 14 (``benchmarks/amx_tile_config.py``). It is checked, not
  assumed: another kernel, or another runtime on the same thread, may have changed it.
- ``update``: one step of the reduction (a matmul's: 32 bfloat16 or 64 uint8 elements, a
  whole 64-byte A row; a conv's: one input channel block at one kernel tap): loads the A
  tiles (rows of the activations) and the B tiles (the packed weight, whose pairs
  (quadruples) of reduction elements are adjacent, ``[N/b, K/e, b, e]``: each row of a block
  is a row of AMX's layout of B) and accumulates ``tm * tn`` tile products into the tile registers.
- ``store``: a copy of the accumulators (a ``cache_read`` block) whose implementation
  stores the tile registers to memory.

The descriptions say what each step computes on the accumulator buffer; the
implementations keep it in the tile registers, which is sound because the three are
scheduled in sequence inside one thread's loop body (init, every update, store), as the
templates ``x86-dense-amx-*`` and ``x86-conv2d-amx`` do.

The instructions need the process to ask Linux for the tile data state once
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``), or they fault: the ``init``
helper makes that system call the first time it runs, so a compiled model is
self-contained wherever it is loaded. The helpers are LLVM IR (tile registers are
immediates), linked into the module through ``pragma_import_llvm`` as
:mod:`search_spaces.x86.intrin` links its ``vdpbf16ps`` helper.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import tvm
import tvm_ffi
from tvm.s_tir import Schedule, TensorIntrin
from tvm.script import tirx as T

from search_spaces.x86.intrin import target_has

#: Rows and accumulator columns of one tile; bytes per tile row.
TILE = 16
TILE_BYTES = 64
#: Tile registers.
TILE_REGISTERS = 8
#: Register tiles (tm, tn) whose accumulator, A and B tiles fit the 8 tile registers.
SHAPES = tuple((tm, tn) for tm in (1, 2, 3) for tn in (1, 2, 3) if tm * tn + tm + tn <= TILE_REGISTERS)
#: How many updates ahead a matmul's update may prefetch B (0: none).
PREFETCH_STEPS = (0, 1, 2, 4)
#: LLVM feature of the tile instructions.
AMX_TILE_FEATURE = "amx-tile"


@dataclass(frozen=True)
class AmxInstruction:
    """One AMX dot-product instruction: A (``dtypes[0]``) rows times packed B (``dtypes[1]``)
    with ``elements`` reduction elements per 32-bit lane, into ``acc`` accumulators."""

    name: str
    llvm: str
    dtypes: tuple[str, str]
    elements: int
    acc: str
    feature: str

    @property
    def step(self) -> int:
        """Reduction elements per ``update``: one 64-byte tile row of A."""
        return TILE * self.elements

    def intrin(self, kind: str, shape: TileShape) -> str:
        """The tensor intrinsic's registered name (``kind``: init, update, store)."""
        return f"nightshift_amx_{self.name}_{kind}_{shape.tag(self)}"


AMX_BF16 = AmxInstruction("bf16", "tdpbf16ps", ("bfloat16", "bfloat16"), 2, "float32", "amx-bf16")
AMX_INT8 = AmxInstruction("u8s8", "tdpbusd", ("uint8", "int8"), 4, "int32", "amx-int8")
#: By the (A, B) dtypes an operator reads.
AMX_DOTS = {d.dtypes: d for d in (AMX_BF16, AMX_INT8)}

#: Helpers around a function whose kernels use the tiles (:func:`keep_caller_tile_config`).
SAVE, RESTORE = "nightshift_amx_save_caller_config", "nightshift_amx_restore_caller_config"
_INIT_PREFIX = "nightshift_amx_init_"

_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@dataclass(frozen=True)
class TileShape:
    """A register tile: ``tm`` x ``tn`` accumulator tiles of ``rows`` x 16, each reduction
    step ``k`` elements (``k * bytes`` of each A row, ``k / elements`` rows of B)."""

    tm: int
    tn: int
    rows: int = TILE
    k: int = 0  # 0: a whole 64-byte A row
    #: Updates ahead whose B tile rows an update prefetches (0: none; a matmul's only).
    prefetch: int = 0

    def step(self, inst: AmxInstruction) -> int:
        """Reduction elements per update."""
        return self.k or inst.step

    def tag(self, inst: AmxInstruction) -> str:
        return (f"{self.tm}x{self.tn}" + (f"_r{self.rows}_k{self.k}" if (self.rows, self.k) != (TILE, 0) else "")
                + (f"_p{self.prefetch}" if self.prefetch else ""))


#: A conv tile: pixels of one output row (rows; ResNet's and MobileNet's rows are multiples
#: of 7 or 8), tn output channel blocks, one input channel block per step: 16 channels
#: (NCHW16c), or a wide block that fills the whole 64-byte A row (32 bfloat16 or 64 uint8
#: channels, :func:`conv_blocks`), in which each tile multiply does 2x (4x) the work for
#: the same cycles (``benchmarks/amx_conv_steps.py``).
CONV_ROWS = (7, 8, 14, 16)
CONV_BLOCK = 16


def conv_blocks(inst: AmxInstruction) -> tuple[int, ...]:
    """Input channel blocks a conv's A rows may hold for ``inst``: 16 and the whole row."""
    return (CONV_BLOCK, inst.step)


def _conv_shapes(inst: AmxInstruction) -> tuple[TileShape, ...]:
    return tuple(TileShape(1, tn, rows, k) for k in conv_blocks(inst) for rows in CONV_ROWS for tn in (1, 2, 3))
#: Conv strides an update reads A's pixels at (ResNet's downsampling convs are stride 2).
CONV_STRIDES = (1, 2)


def _tile_config(shape: TileShape, inst: AmxInstruction) -> tuple[str, str]:
    """The global's name and the 64-byte ``ldtilecfg`` operand (palette 1): accumulator and A
    tiles of ``rows`` rows, A rows of ``step`` elements, B tiles of ``step / elements`` rows."""
    a_bytes = shape.step(inst) * inst_bytes(inst.dtypes[0])
    b_rows = shape.step(inst) // inst.elements
    cfg = [0] * 64
    cfg[0] = 1
    c_tiles, a_tiles = shape.tm * shape.tn, shape.tm
    for t in range(TILE_REGISTERS):
        colsb, rows = (TILE_BYTES, shape.rows) if t < c_tiles else (
            (a_bytes, shape.rows) if t < c_tiles + a_tiles else (TILE_BYTES, b_rows))
        cfg[16 + 2 * t] = colsb
        cfg[48 + t] = rows
    name = f"nightshift_amx_cfg_r{shape.rows}_a{a_bytes}_b{b_rows}_c{c_tiles}_{a_tiles}"
    return name, "".join(f"\\{b:02X}" for b in cfg)


def _helpers(inst: AmxInstruction, shape: TileShape) -> tuple[str, str, str, str]:
    """Names of the init, update and store helpers, and their LLVM IR.

    update(a, sa, b, sb, sbj): A tile ``i`` at ``a + 16 i sa`` (rows ``sa`` bytes apart), B
    tile ``j`` at ``b + j sbj`` (rows ``sb`` apart); store(c, sc, scj): accumulator (i, j) at
    ``c + 16 i sc + j scj``.
    """
    tm, tn = shape.tm, shape.tn
    cfg_name, cfg = _tile_config(shape, inst)
    tag = shape.tag(inst)
    init, update, store = (f"nightshift_amx_{k}_{tag}" for k in ("init", inst.name, "store"))
    c_tiles = [(i * tn + j, i, j) for i in range(tm) for j in range(tn)]
    a_reg, b_reg = tm * tn, tm * tn + tm
    zero = "\n".join(f"  call void @llvm.x86.tilezero(i8 {r})" for r, _, _ in c_tiles)
    loads_b = "\n".join(
        f"  %bo{j} = mul i64 %sbj, {j}\n  %b{j} = getelementptr i8, ptr %b, i64 %bo{j}\n"
        f"  call void @llvm.x86.tileloadd64(i8 {b_reg + j}, ptr %b{j}, i64 %sb)" for j in range(tn))
    # B's rows ``prefetch`` updates ahead, so that a weight streamed from memory arrives
    # while the tiles multiply (a column block of the packed weight is one stream); the
    # BERT-base bf16 job on an AMX Xeon took 2 for every dense layer.
    loads_b += "".join(
        f"\n  %pf{j}_{r} = mul i64 %sb, {shape.prefetch * (shape.step(inst) // inst.elements) + r}"
        f"\n  %pa{j}_{r} = getelementptr i8, ptr %b{j}, i64 %pf{j}_{r}"
        f"\n  call void @llvm.prefetch.p0(ptr %pa{j}_{r}, i32 0, i32 3, i32 1)"
        for j in range(tn) for r in range(shape.step(inst) // inst.elements) if shape.prefetch)
    body = []
    for i in range(tm):
        body.append(f"  %ao{i} = mul i64 %sa, {i * TILE}\n  %a{i} = getelementptr i8, ptr %a, i64 %ao{i}\n"
                    f"  call void @llvm.x86.tileloadd64(i8 {a_reg + i}, ptr %a{i}, i64 %sa)")
        body += [f"  call void @llvm.x86.{inst.llvm}(i8 {i * tn + j}, i8 {a_reg + i}, i8 {b_reg + j})"
                 for j in range(tn)]
    stores = "\n".join(
        f"  %co{r} = mul i64 %sc, {i * TILE}\n  %cj{r} = mul i64 %scj, {j}\n"
        f"  %cr{r} = getelementptr i8, ptr %c, i64 %co{r}\n  %c{r} = getelementptr i8, ptr %cr{r}, i64 %cj{r}\n"
        f"  call void @llvm.x86.tilestored64(i8 {r}, ptr %c{r}, i64 %sc)" for r, i, j in c_tiles)
    ir = f"""
@{cfg_name} = linkonce_odr constant [64 x i8] c"{cfg}", align 64
@nightshift_amx_ready = linkonce_odr global i32 0, align 4
declare i64 @syscall(i64, ...)
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.sttilecfg(ptr)
declare void @llvm.x86.tilerelease()
declare i1 @llvm.vector.reduce.or.v8i1(<8 x i1>)
declare void @llvm.x86.tilezero(i8 immarg)
declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)
declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)
declare void @llvm.x86.{inst.llvm}(i8 immarg, i8 immarg, i8 immarg)
declare void @llvm.prefetch.p0(ptr, i32 immarg, i32 immarg, i32 immarg)

define linkonce_odr void @nightshift_amx_ask() {{
entry:
  %ready = load atomic i32, ptr @nightshift_amx_ready monotonic, align 4
  %has = icmp ne i32 %ready, 0
  br i1 %has, label %done, label %ask
ask:
  %perm = call i64 (i64, ...) @syscall(i64 {_SYS_ARCH_PRCTL}, i64 {_ARCH_REQ_XCOMP_PERM}, i64 {_XFEATURE_XTILEDATA})
  store atomic i32 1, ptr @nightshift_amx_ready monotonic, align 4
  br label %done
done:
  ret void
}}

define linkonce_odr i32 @{init}() {{
entry:
  call void @nightshift_amx_ask()
  %current = alloca <8 x i64>, align 64
  call void @llvm.x86.sttilecfg(ptr %current)
  %have = load <8 x i64>, ptr %current, align 64
  %want = load <8 x i64>, ptr @{cfg_name}, align 64
  %differs = icmp ne <8 x i64> %have, %want
  %stale = call i1 @llvm.vector.reduce.or.v8i1(<8 x i1> %differs)
  br i1 %stale, label %load, label %zero
load:
  call void @llvm.x86.ldtilecfg(ptr @{cfg_name})
  br label %zero
zero:
{zero}
  ret i32 0
}}

define linkonce_odr i32 @{SAVE}(ptr %caller) {{
entry:
  call void @nightshift_amx_ask()
  call void @llvm.x86.sttilecfg(ptr %caller)
  ret i32 0
}}

define linkonce_odr i32 @{RESTORE}(ptr %caller) {{
entry:
  %current = alloca <8 x i64>, align 64
  call void @llvm.x86.sttilecfg(ptr %current)
  %have = load <8 x i64>, ptr %current, align 64
  %want = load <8 x i64>, ptr %caller, align 8
  %differs = icmp ne <8 x i64> %have, %want
  %stale = call i1 @llvm.vector.reduce.or.v8i1(<8 x i1> %differs)
  br i1 %stale, label %put, label %done
put:
  %first = extractelement <8 x i64> %want, i64 0
  %palette = trunc i64 %first to i8
  %unset = icmp eq i8 %palette, 0
  br i1 %unset, label %release, label %load
release:
  call void @llvm.x86.tilerelease()
  br label %done
load:
  call void @llvm.x86.ldtilecfg(ptr %caller)
  br label %done
done:
  ret i32 0
}}

define linkonce_odr i32 @{update}(ptr %a, i64 %sa, ptr %b, i64 %sb, i64 %sbj) alwaysinline {{
entry:
{loads_b}
{chr(10).join(body)}
  ret i32 0
}}

define linkonce_odr i32 @{store}(ptr %c, i64 %sc, i64 %scj) {{
entry:
{stores}
  ret i32 0
}}
"""
    return init, update, store, ir


def _init_store(inst: AmxInstruction, c_shape: tuple[int, ...], ir: str, init_fn: str,
                store_fn: str) -> tuple[tuple, tuple]:
    """(desc, impl) of the init and store intrinsics for an accumulator of ``c_shape``: (m, n)
    for a matmul (tile j 16 columns on), (tn, m, 16) for a conv (tile j one channel block on)."""
    acc = inst.acc
    if len(c_shape) == 2:
        m, n = c_shape

        @T.prim_func(s_tir=True)
        def init_desc(c: T.handle) -> None:
            C = T.match_buffer(c, (m, n), acc, offset_factor=1, scope="local")
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:m, 0:n])
                for i, j in T.grid(m, n):
                    with T.sblock("init"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        C[vi, vj] = T.cast(0, acc)

        @T.prim_func(s_tir=True)
        def init_impl(c: T.handle) -> None:
            C = T.match_buffer(c, (m, n), acc, offset_factor=1, scope="local")
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:m, 0:n])
                with T.attr(0, "pragma_import_llvm", ir):
                    T.evaluate(T.call_extern("int32", init_fn))

        @T.prim_func(s_tir=True)
        def store_desc(c: T.handle, d: T.handle) -> None:
            sd = T.int32()
            C = T.match_buffer(c, (m, n), acc, offset_factor=1, scope="local")
            D = T.match_buffer(d, (m, n), acc, offset_factor=1, scope="local", strides=[sd, 1])
            with T.sblock("root"):
                T.reads(C[0:m, 0:n])
                T.writes(D[0:m, 0:n])
                for i, j in T.grid(m, n):
                    with T.sblock("store"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        D[vi, vj] = C[vi, vj]

        @T.prim_func(s_tir=True)
        def store_impl(c: T.handle, d: T.handle) -> None:
            sd = T.int32()
            C = T.match_buffer(c, (m, n), acc, offset_factor=1, scope="local")
            D = T.match_buffer(d, (m, n), acc, offset_factor=1, scope="local", strides=[sd, 1])
            with T.sblock("root"):
                T.reads(C[0:m, 0:n])
                T.writes(D[0:m, 0:n])
                with T.attr(0, "pragma_import_llvm", ir):
                    T.evaluate(T.call_extern("int32", store_fn, D.access_ptr("w"), T.int64(sd) * T.int64(4),
                                             T.int64(TILE_BYTES)))
    else:
        # (tn, 1, m, lanes): the conv's output row is a unit dimension between the channel
        # blocks and the pixels, which TVM's tensorize compares dimension for dimension.
        tn, _, m, lanes = c_shape

        @T.prim_func(s_tir=True)
        def init_desc(c: T.handle) -> None:
            C = T.match_buffer(c, (tn, 1, m, lanes), acc, offset_factor=1, scope="local")
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:tn, 0:1, 0:m, 0:lanes])
                for t, i, j in T.grid(tn, m, lanes):
                    with T.sblock("init"):
                        vt, vi, vj = T.axis.remap("SSS", [t, i, j])
                        C[vt, 0, vi, vj] = T.cast(0, acc)

        @T.prim_func(s_tir=True)
        def init_impl(c: T.handle) -> None:
            C = T.match_buffer(c, (tn, 1, m, lanes), acc, offset_factor=1, scope="local")
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:tn, 0:1, 0:m, 0:lanes])
                with T.attr(0, "pragma_import_llvm", ir):
                    T.evaluate(T.call_extern("int32", init_fn))

        @T.prim_func(s_tir=True)
        def store_desc(c: T.handle, d: T.handle) -> None:
            sd0, sd1, sd2 = T.int32(), T.int32(), T.int32()
            C = T.match_buffer(c, (tn, 1, m, lanes), acc, offset_factor=1, scope="local")
            D = T.match_buffer(d, (tn, 1, m, lanes), acc, offset_factor=1, scope="local", strides=[sd0, sd1, sd2, 1])
            with T.sblock("root"):
                T.reads(C[0:tn, 0:1, 0:m, 0:lanes])
                T.writes(D[0:tn, 0:1, 0:m, 0:lanes])
                for t, i, j in T.grid(tn, m, lanes):
                    with T.sblock("store"):
                        vt, vi, vj = T.axis.remap("SSS", [t, i, j])
                        D[vt, 0, vi, vj] = C[vt, 0, vi, vj]

        @T.prim_func(s_tir=True)
        def store_impl(c: T.handle, d: T.handle) -> None:
            sd0, sd1, sd2 = T.int32(), T.int32(), T.int32()
            C = T.match_buffer(c, (tn, 1, m, lanes), acc, offset_factor=1, scope="local")
            D = T.match_buffer(d, (tn, 1, m, lanes), acc, offset_factor=1, scope="local", strides=[sd0, sd1, sd2, 1])
            with T.sblock("root"):
                T.reads(C[0:tn, 0:1, 0:m, 0:lanes])
                T.writes(D[0:tn, 0:1, 0:m, 0:lanes])
                with T.attr(0, "pragma_import_llvm", ir):
                    T.evaluate(T.call_extern("int32", store_fn, D.access_ptr("w"), T.int64(sd2) * T.int64(4),
                                             T.int64(sd0) * T.int64(4)))

    return (init_desc, init_impl), (store_desc, store_impl)


def _dense_intrinsics(inst: AmxInstruction, shape: TileShape) -> dict[str, tuple]:
    """(description, implementation) of the init, update and store intrinsics of a matmul
    ``C[m, n] += A[m, k] B[k / e, n, e]`` tile."""
    m, n, e, k = shape.tm * shape.rows, shape.tn * TILE, inst.elements, shape.step(inst) // inst.elements
    a_dtype, b_dtype = inst.dtypes
    acc = inst.acc
    init_fn, update_fn, store_fn, ir = _helpers(inst, shape)
    a_bytes, b_bytes = inst_bytes(a_dtype), inst_bytes(b_dtype)

    @T.prim_func(s_tir=True)
    def update_desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb0, sb1 = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (m, k * e), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (k, n, e), b_dtype, offset_factor=1, strides=[sb0, sb1, 1])
        C = T.match_buffer(c, (m, n), acc, offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:m, 0:n], A[0:m, 0:k * e], B[0:k, 0:n, 0:e])
            T.writes(C[0:m, 0:n])
            for i, j, r, q in T.grid(m, n, k, e):
                with T.sblock("update"):
                    vi, vj, vr, vq = T.axis.remap("SSRR", [i, j, r, q])
                    C[vi, vj] = C[vi, vj] + T.cast(A[vi, vr * e + vq], acc) * T.cast(B[vr, vj, vq], acc)

    @T.prim_func(s_tir=True)
    def update_impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb0, sb1 = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (m, k * e), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (k, n, e), b_dtype, offset_factor=1, strides=[sb0, sb1, 1])
        C = T.match_buffer(c, (m, n), acc, offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:m, 0:n], A[0:m, 0:k * e], B[0:k, 0:n, 0:e])
            T.writes(C[0:m, 0:n])
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern(
                    "int32", update_fn, T.address_of(A[0, 0]), T.int64(sa) * T.int64(a_bytes),
                    T.address_of(B[0, 0, 0]), T.int64(sb0) * T.int64(b_bytes), T.int64(TILE_BYTES),
                ))

    init, store = _init_store(inst, (m, n), ir, init_fn, store_fn)
    return {inst.intrin("init", shape): init, inst.intrin("update", shape): (update_desc, update_impl),
            inst.intrin("store", shape): store}


def _conv_intrinsics(inst: AmxInstruction, shape: TileShape) -> dict[str, tuple]:
    """The init and store intrinsics of a conv tile, and its update for each of
    :data:`CONV_STRIDES` (:func:`_conv_update`)."""
    init_fn, update_fn, store_fn, ir = _helpers(inst, shape)
    init, store = _init_store(inst, (shape.tn, 1, shape.rows, TILE), ir, init_fn, store_fn)
    out = {inst.intrin("init", shape): init, inst.intrin("store", shape): store}
    for stride in CONV_STRIDES:
        out[conv_update(inst, shape, stride)] = _conv_update(inst, shape, stride, ir, update_fn)
    return out


def conv_update(inst: AmxInstruction, shape: TileShape, stride: int) -> str:
    """The registered name of a conv tile's update intrinsic for ``stride``."""
    return inst.intrin("update", shape) + (f"_s{stride}" if stride != 1 else "")


def _conv_update(inst: AmxInstruction, shape: TileShape, stride: int, ir: str, update_fn: str) -> tuple:
    """(description, implementation) of the update of a blocked conv tile: ``tn`` output
    channel blocks x ``rows`` pixels of one output row,
    ``C[t, i, c] += A[i, g e + l] B[t, g, c, l]`` over one input channel block (``k``
    channels, ``k / e`` groups) at one kernel tap. A's pixels are ``stride`` input pixels
    apart, so its tile rows are ``stride * sa`` elements apart."""
    tn, m, e = shape.tn, shape.rows, inst.elements
    g = shape.step(inst) // e
    a_dtype, b_dtype = inst.dtypes
    acc = inst.acc
    span = stride * (m - 1) + 1  # input pixels the tile's rows reach over
    a_bytes, b_bytes = inst_bytes(a_dtype), inst_bytes(b_dtype)

    @T.prim_func(s_tir=True)
    def update_desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb0, sb1, sb2, sb3, sb4, sb5 = (T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32(),
                                            T.int32())
        A = T.match_buffer(a, (span, g * e), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (tn, 1, 1, 1, g, TILE, e), b_dtype, offset_factor=1,
                           strides=[sb0, sb1, sb2, sb3, sb4, sb5, 1])
        C = T.match_buffer(c, (tn, 1, m, TILE), acc, offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:tn, 0:1, 0:m, 0:TILE], A[0:span, 0:g * e], B[0:tn, 0:1, 0:1, 0:1, 0:g, 0:TILE, 0:e])
            T.writes(C[0:tn, 0:1, 0:m, 0:TILE])
            for t, i, c, r, q in T.grid(tn, m, TILE, g, e):
                with T.sblock("update"):
                    vt, vi, vc, vr, vq = T.axis.remap("SSSRR", [t, i, c, r, q])
                    C[vt, 0, vi, vc] = C[vt, 0, vi, vc] + T.cast(A[vi * stride, vr * e + vq], acc) * T.cast(
                        B[vt, 0, 0, 0, vr, vc, vq], acc)

    @T.prim_func(s_tir=True)
    def update_impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb0, sb1, sb2, sb3, sb4, sb5 = (T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32(),
                                            T.int32())
        A = T.match_buffer(a, (span, g * e), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (tn, 1, 1, 1, g, TILE, e), b_dtype, offset_factor=1,
                           strides=[sb0, sb1, sb2, sb3, sb4, sb5, 1])
        C = T.match_buffer(c, (tn, 1, m, TILE), acc, offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:tn, 0:1, 0:m, 0:TILE], A[0:span, 0:g * e], B[0:tn, 0:1, 0:1, 0:1, 0:g, 0:TILE, 0:e])
            T.writes(C[0:tn, 0:1, 0:m, 0:TILE])
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern(
                    "int32", update_fn, T.address_of(A[0, 0]), T.int64(sa) * T.int64(stride * a_bytes),
                    T.address_of(B[0, 0, 0, 0, 0, 0, 0]), T.int64(sb4) * T.int64(b_bytes),
                    T.int64(sb0) * T.int64(b_bytes),
                ))

    return update_desc, update_impl


def target_has_amx(target: tvm.target.Target, inst: AmxInstruction) -> bool:
    """Whether ``target`` has AMX tiles and ``inst``'s tile multiply."""
    return target_has(target, AMX_TILE_FEATURE) and target_has(target, inst.feature)


def copy_accumulators(sch: Schedule, block: Any, store: Any) -> Any:
    """A local copy of ``block``'s accumulators that ``store`` (the epilogue) reads instead:
    the block the ``store`` intrinsic tensorizes, where the tile registers go to memory."""
    acc = sch.get(block).writes[0].source
    index = next(k for k, r in enumerate(sch.get(store).reads) if r.source.same_as(acc))
    return sch.cache_read(store, index, "local")


def inst_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (bfloat16, uint8, int8)."""
    return 2 if dtype == "bfloat16" else 1


def _uses_tiles(func: tvm.tirx.PrimFunc) -> bool:
    found = False
    extern = tvm.ir.Op.get("tirx.call_extern")

    def visit(call: tvm.ir.Call) -> tvm.ir.Call:
        nonlocal found
        found = found or (call.op.same_as(extern) and str(call.args[0].value).startswith(_INIT_PREFIX))
        return call

    tvm_ffi.structural_map(func.body, (tvm.ir.Call, visit))
    return found


def keep_caller_tile_config(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every function whose kernels configure the AMX tiles saving the calling
    thread's tile configuration on entry and putting it back on exit (``tilerelease`` where
    it had none).

    Another runtime in the process may configure the tiles of a thread once and keep using
    them: ONNX Runtime's int8 kernels on an Emerald Rapids faulted (SIGILL) when a
    Nightshift model had run on the same thread in between, with its own configuration
    loaded. The calling thread is the only one both share (TVM's other workers are its own);
    the save and restore cost two configuration reads and a load per call.
    """
    wrapped = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and _uses_tiles(func):
            saved = tvm.tirx.decl_buffer((8,), "int64", name="amx_caller_config", scope="local")
            ptr = saved.access_ptr("rw")
            around = [tvm.tirx.Evaluate(tvm.tirx.call_extern("int32", name, ptr)) for name in (SAVE, RESTORE)]
            wrapped[gv] = func.with_body(tvm.tirx.SeqStmt([tvm.tirx.AllocBuffer(saved), around[0], func.body,
                                                           around[1]]))  # fmt: skip
    if not wrapped:
        return mod  # the same object: the pipeline then lowers it exactly as before
    funcs = {gv: wrapped.get(gv, func) for gv, func in mod.functions_items()}
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


@cache
def register_amx_intrinsics() -> None:
    """Register every AMX intrinsic (once per process: TensorIntrin names are global, and
    records of ``x86-dense-amx`` replay a tensorize by the intrinsic's name)."""
    from search_spaces.quick_import import quick_tvmscript

    with quick_tvmscript():
        intrinsics = [_dense_intrinsics(inst, TileShape(tm, tn, prefetch=d)) for inst in (AMX_BF16, AMX_INT8)
                      for tm, tn in SHAPES for d in PREFETCH_STEPS]
        intrinsics += [_conv_intrinsics(inst, shape) for inst in (AMX_BF16, AMX_INT8) for shape in _conv_shapes(inst)]
    for group in intrinsics:
        for name, (desc, impl) in group.items():
            TensorIntrin.register(name, desc, impl, override=True)
