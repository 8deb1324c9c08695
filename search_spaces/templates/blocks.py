"""What the templates read off a task's schedule: its blocks and their iteration kinds."""

from __future__ import annotations

from typing import Any

from tvm.s_tir import Schedule


def root_blocks(sch: Schedule) -> list[Any]:
    """The blocks directly under the root, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def iter_kinds(sch: Schedule, block: Any) -> str:
    """A block's iteration variables as a string: ``S`` spatial, ``R`` reduction, ``?`` other."""
    return "".join("S" if int(iv.iter_type) == 0 else "R" if int(iv.iter_type) == 2 else "?"
                   for iv in sch.get(block).iter_vars)  # fmt: skip


def loop_extents(sch: Schedule, block: Any) -> list[int]:
    """The extents of the loops around ``block``, outermost first."""
    return [int(sch.get(loop).extent) for loop in sch.get_loops(block)]


def elementwise_tail(sch: Schedule, block: Any, spatial: int) -> list[str] | None:
    """Names of the blocks after ``block``, or None when one of them is not elementwise over
    ``block``'s ``spatial`` outer loops (then it could not be computed at the register tile)."""
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    tail = names[names.index(sch.get(block).name_hint) + 1:]
    out_shape = loop_extents(sch, block)[:spatial]
    for name in tail:
        b = sch.get_sblock(name)
        if iter_kinds(sch, b) != "S" * spatial or loop_extents(sch, b) != out_shape:
            return None
    return tail


def elementwise_prologue(sch: Schedule, block: Any, keep: tuple[str, ...] = ()) -> list[str] | None:
    """Names of the blocks before ``block`` other than ``keep``, to be inlined into the
    epilogue that reads them (int8 models dequantize a residual in the operator's task,
    before it), or None when one of them reduces or feeds ``block`` itself (its operands
    must stay buffers that a tensor intrinsic or a vector load can read)."""
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    before = [n for n in names[:names.index(sch.get(block).name_hint)] if n not in keep]
    operands = [r.source for r in sch.get(block).reads]
    for name in before:
        b = sch.get_sblock(name)
        feeds = any(w.source.same_as(o) for w in sch.get(b).writes for o in operands)
        if feeds or "R" in iter_kinds(sch, b):
            return None
    return before


def accumulate_locally(sch: Schedule, name: str, tail: list[str]) -> tuple[Any, Any]:
    """Give block ``name`` a compact local buffer of accumulators, which LLVM keeps in
    registers, and return it with the block that stores the tile: the last block of its
    (already inlined) elementwise ``tail``, or a new cache-write block when it writes the
    function's output itself."""
    block = sch.get_sblock(name)
    if tail:
        sch.set_scope(block, 0, "local")
        return block, sch.get_sblock(tail[-1])
    return block, sch.cache_write(block, 0, "local")
