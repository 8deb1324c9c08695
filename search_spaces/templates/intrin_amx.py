"""Intel AMX tile intrinsics: ``tdpbf16ps`` (AMX-BF16) and ``tdpbusd`` (AMX-INT8) on a
register tile of up to 2 x 2 accumulator tiles of 16 x 16 float32 (int32).

An AMX accumulator lives in a tile register (``tmm0``-``tmm7``), not in memory, across the
whole reduction, as oneDNN's brgemm kernels keep it. Three tensor intrinsics per tile shape
(``tm`` x ``tn`` tiles of 16 x 16) do that in TIR:

- ``init``: the accumulators' zero-initialization (the block ``decompose_reduction`` makes);
  its implementation configures the tiles (``ldtilecfg``) and zeroes the accumulator tiles.
- ``update``: one step of the reduction, 32 bfloat16 (64 uint8) reduction elements: loads
  the A tiles (rows of the activations) and the B tiles (the packed weight, whose pairs
  (quadruples) of reduction elements are adjacent, ``[K/e, N, e]``, exactly AMX's layout of
  B) and accumulates ``tm * tn`` tile products into the tile registers.
- ``store``: a copy of the accumulators (a ``cache_read`` block) whose implementation
  stores the tile registers to memory.

The descriptions say what each step computes on the accumulator buffer; the
implementations keep it in the tile registers, which is sound because the three are
scheduled in sequence inside one thread's loop body (init, every update, store), as the
template ``x86-dense-amx`` does.

The instructions need the process to ask Linux for the tile data state once
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``), or they fault: the ``init``
helper makes that system call the first time it runs, so a compiled model is
self-contained wherever it is loaded. The helpers are LLVM IR (tile registers are
immediates), linked into the module through ``pragma_import_llvm`` as
:mod:`search_spaces.templates.intrin_x86` links its ``vdpbf16ps`` helper.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

#: Rows and accumulator columns of one tile; bytes per tile row.
TILE = 16
TILE_BYTES = 64
#: Tile registers.
TILE_REGISTERS = 8
#: Register tiles (tm, tn) whose accumulator, A and B tiles fit the 8 tile registers.
SHAPES = tuple((tm, tn) for tm in (1, 2, 3) for tn in (1, 2, 3) if tm * tn + tm + tn <= TILE_REGISTERS)
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

    def intrin(self, kind: str, tm: int, tn: int) -> str:
        """The tensor intrinsic's registered name (``kind``: init, update, store)."""
        return f"nightshift_amx_{self.name}_{kind}_{tm}x{tn}"


AMX_BF16 = AmxInstruction("bf16", "tdpbf16ps", ("bfloat16", "bfloat16"), 2, "float32", "amx-bf16")
AMX_INT8 = AmxInstruction("u8s8", "tdpbusd", ("uint8", "int8"), 4, "int32", "amx-int8")
#: By the (A, B) dtypes an operator reads.
AMX_DOTS = {d.dtypes: d for d in (AMX_BF16, AMX_INT8)}

_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def _tile_config() -> str:
    """The 64-byte ``ldtilecfg`` operand: palette 1, every tile 16 rows of 64 bytes."""
    cfg = [0] * 64
    cfg[0] = 1
    for t in range(TILE_REGISTERS):
        cfg[16 + 2 * t] = TILE_BYTES
        cfg[48 + t] = TILE
    return "".join(f"\\{b:02X}" for b in cfg)


def _c_tiles(tm: int, tn: int) -> list[tuple[int, int, int]]:
    """(register, row, column) of each accumulator tile; A tiles follow, then B tiles."""
    return [(i * tn + j, i, j) for i in range(tm) for j in range(tn)]


def _helpers(inst: AmxInstruction, tm: int, tn: int) -> tuple[str, str, str, str]:
    """Names of the init, update and store helpers, and their LLVM IR."""
    shape = f"{tm}x{tn}"
    init, update, store = (f"nightshift_amx_{k}_{shape}" for k in ("init", f"{inst.name}", "store"))
    c_tiles = _c_tiles(tm, tn)
    a_reg, b_reg = tm * tn, tm * tn + tm
    zero = "\n".join(f"  call void @llvm.x86.tilezero(i8 {r})" for r, _, _ in c_tiles)
    loads_b = "\n".join(
        f"  %b{j} = getelementptr i8, ptr %b, i64 {j * TILE_BYTES}\n"
        f"  call void @llvm.x86.tileloadd64(i8 {b_reg + j}, ptr %b{j}, i64 %sb)" for j in range(tn))
    body = []
    for i in range(tm):
        body.append(f"  %ao{i} = mul i64 %sa, {i * TILE}\n  %a{i} = getelementptr i8, ptr %a, i64 %ao{i}\n"
                    f"  call void @llvm.x86.tileloadd64(i8 {a_reg + i}, ptr %a{i}, i64 %sa)")
        body += [f"  call void @llvm.x86.{inst.llvm}(i8 {i * tn + j}, i8 {a_reg + i}, i8 {b_reg + j})"
                 for j in range(tn)]
    stores = "\n".join(
        f"  %co{r} = mul i64 %sc, {i * TILE}\n  %cr{r} = getelementptr i8, ptr %c, i64 %co{r}\n"
        f"  %c{r} = getelementptr i8, ptr %cr{r}, i64 {j * TILE_BYTES}\n"
        f"  call void @llvm.x86.tilestored64(i8 {r}, ptr %c{r}, i64 %sc)" for r, i, j in c_tiles)
    ir = f"""
@nightshift_amx_cfg = linkonce_odr constant [64 x i8] c"{_tile_config()}", align 64
@nightshift_amx_ready = linkonce_odr global i32 0, align 4
declare i64 @syscall(i64, ...)
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.tilezero(i8 immarg)
declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)
declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)
declare void @llvm.x86.{inst.llvm}(i8 immarg, i8 immarg, i8 immarg)

define linkonce_odr i32 @{init}() {{
entry:
  %ready = load atomic i32, ptr @nightshift_amx_ready monotonic, align 4
  %has = icmp ne i32 %ready, 0
  br i1 %has, label %config, label %ask
ask:
  %perm = call i64 (i64, ...) @syscall(i64 {_SYS_ARCH_PRCTL}, i64 {_ARCH_REQ_XCOMP_PERM}, i64 {_XFEATURE_XTILEDATA})
  store atomic i32 1, ptr @nightshift_amx_ready monotonic, align 4
  br label %config
config:
  call void @llvm.x86.ldtilecfg(ptr @nightshift_amx_cfg)
{zero}
  ret i32 0
}}

define linkonce_odr i32 @{update}(ptr %a, i64 %sa, ptr %b, i64 %sb) alwaysinline {{
entry:
{loads_b}
{chr(10).join(body)}
  ret i32 0
}}

define linkonce_odr i32 @{store}(ptr %c, i64 %sc) {{
entry:
{stores}
  ret i32 0
}}
"""
    return init, update, store, ir


def _intrinsics(inst: AmxInstruction, tm: int, tn: int) -> dict[str, tuple]:
    """(description, implementation) of the init, update and store intrinsics."""
    m, n, e, k = tm * TILE, tn * TILE, inst.elements, TILE
    a_dtype, b_dtype = inst.dtypes
    acc = inst.acc
    init_fn, update_fn, store_fn, ir = _helpers(inst, tm, tn)
    acc_bytes, a_bytes, b_bytes = 4, inst_bytes(a_dtype), inst_bytes(b_dtype)

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
                    "int32", update_fn,
                    T.address_of(A[0, 0]), T.int64(sa) * T.int64(a_bytes),
                    T.address_of(B[0, 0, 0]), T.int64(sb0) * T.int64(b_bytes),
                ))

    @T.prim_func(s_tir=True)
    def store_desc(c: T.handle, d: T.handle) -> None:
        C = T.match_buffer(c, (m, n), acc, offset_factor=1, scope="local")
        sd = T.int32()
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
        C = T.match_buffer(c, (m, n), acc, offset_factor=1, scope="local")
        sd = T.int32()
        D = T.match_buffer(d, (m, n), acc, offset_factor=1, scope="local", strides=[sd, 1])
        with T.sblock("root"):
            T.reads(C[0:m, 0:n])
            T.writes(D[0:m, 0:n])
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("int32", store_fn, D.access_ptr("w"), T.int64(sd) * T.int64(acc_bytes)))

    return {
        inst.intrin("init", tm, tn): (init_desc, init_impl),
        inst.intrin("update", tm, tn): (update_desc, update_impl),
        inst.intrin("store", tm, tn): (store_desc, store_impl),
    }


def inst_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (bfloat16, uint8, int8)."""
    return 2 if dtype == "bfloat16" else 1


@cache
def register_amx_intrinsics() -> None:
    """Register every AMX intrinsic (once per process: TensorIntrin names are global, and
    records of ``x86-dense-amx`` replay a tensorize by the intrinsic's name)."""
    from search_spaces.preload import quick_tvmscript

    with quick_tvmscript():
        intrinsics = [_intrinsics(inst, tm, tn) for inst in (AMX_BF16, AMX_INT8) for tm, tn in SHAPES]
    for group in intrinsics:
        for name, (desc, impl) in group.items():
            TensorIntrin.register(name, desc, impl, override=True)
