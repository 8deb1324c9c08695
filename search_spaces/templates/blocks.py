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
