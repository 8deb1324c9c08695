"""Write an operator's output over an input that dies with it, as oneDNN's sum post-op does.

ResNet's residual convs read the block's input (the residual) and write an output of the
same shape and dtype, after which the residual is dead. With a separate output buffer the
function streams three tensors (data, residual, output: 3.6 MB for a 56x56x256 bf16 conv,
more than a Zen 4 core's L2), and in the model those convs took up to 1.8x their tuned
times. Written in place, the output's lines are the residual's, already read.

:func:`write_in_place` runs on the compiled model after the database's schedules are applied
(the tasks and their records are unchanged): a ``call_tir`` becomes a ``call_tir_inplace``
over an argument when the argument is not used after the call, has the output's shape and
dtype, and the scheduled function reads it only in the one statement that writes the
output, at the indices it writes. Each element is then read before it is overwritten, by
the same statement, whatever the loops around it.
"""

from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import TensorLoad  # a TIR buffer load (tvm.tirx.BufferLoad makes one)
from tvm.tirx.stmt import BufferStore

logger = logging.getLogger(__name__)


def _reads_only_where_it_writes(func: tvm.tirx.PrimFunc, index: int) -> bool:
    """Whether param ``index`` is read only inside the single store to the output (the last
    param), at the store's own indices."""
    source, out = func.params[index], func.params[-1]
    stores: list[BufferStore] = []
    loads = 0
    others = 0

    def visit(node: object) -> None:
        nonlocal loads, others
        if isinstance(node, BufferStore):
            if node.buffer.same_as(out):
                stores.append(node)
            elif node.buffer.same_as(source):
                others += 1
        elif isinstance(node, TensorLoad):
            if node.source.same_as(source):
                loads += 1
            elif node.source.same_as(out):
                others += 1  # the output read back: an accumulation, not a final store

    tvm_ffi.structural_walk(func.body, visit)
    if len(stores) != 1 or others or not loads:
        return False
    store = stores[0]
    matching = 0

    def inside(node: object) -> None:
        nonlocal matching
        if isinstance(node, TensorLoad) and node.source.same_as(source):
            same = len(node.indices) == len(store.indices) and all(
                tvm_ffi.structural_equal(a, b) for a, b in zip(node.indices, store.indices, strict=True))
            matching += int(same)

    tvm_ffi.structural_walk(store.value, inside)
    return matching == loads


def _last_uses(main: relax.Function) -> dict[relax.Var, int]:
    """For each variable, the index of the last binding that uses it (main's output: never)."""
    last: dict[relax.Var, int] = {}
    bindings = [b for block in main.body.blocks for b in block.bindings]
    for i, binding in enumerate(bindings):
        def visit(expr: relax.Expr, i: int = i) -> None:
            if isinstance(expr, relax.Var):
                last[expr] = i

        relax.analysis.post_order_visit(binding.value, visit)

    def never(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Var):
            last[expr] = len(bindings)

    relax.analysis.post_order_visit(main.body.body, never)
    return last


def _same_tensor_type(a: relax.Expr, b: object) -> bool:
    ta = getattr(a, "ty", None)
    return isinstance(ta, relax.TensorType) and isinstance(b, relax.TensorType) and tvm_ffi.structural_equal(ta, b)


@tvm.transform.module_pass(opt_level=0, name="WriteInPlace")
def write_in_place(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Turn each eligible ``call_tir`` of ``main`` into a ``call_tir_inplace`` (see the module)."""
    main = mod["main"]
    call_tir = tvm.ir.Op.get("relax.call_tir")
    bound: dict[relax.Var, relax.Expr] = {}
    last = _last_uses(main)
    bb = relax.BlockBuilder(mod)
    position = 0
    blocks = []
    changed = 0
    for block in main.body.blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value
            new = None
            if isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call) and value.op.same_as(call_tir):
                new = _in_place(bb, mod, value, bound, last, position)
            bindings.append(relax.VarBinding(binding.var, new) if new is not None else binding)
            changed += new is not None
            if isinstance(binding, relax.VarBinding):
                bound[binding.var] = value
            position += 1
        blocks.append(type(block)(bindings))
    if not changed:
        return mod
    logger.debug("%d operators write their output in place of an input", changed)
    bb.update_func(mod.get_global_var("main"), relax.Function(
        main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure, main.attrs))  # fmt: skip
    return bb.get()


def _in_place(bb: relax.BlockBuilder, mod: tvm.IRModule, call: relax.Call, bound: dict[relax.Var, relax.Expr],
              last: dict[relax.Var, int], position: int) -> relax.Call | None:
    func = mod[call.args[0]]
    args = list(call.args[1].fields)
    out_ty = call.ty_args[0] if len(call.ty_args) == 1 else None
    if not isinstance(func, tvm.tirx.PrimFunc) or len(func.params) != len(args) + 1:
        return None
    for i, arg in enumerate(args):
        producer = bound.get(arg) if isinstance(arg, relax.Var) else None
        # Bound in main (not a parameter the caller owns), by an operator that is not a
        # reshape (lowered later to a view of a tensor that may still be live).
        if not (isinstance(producer, relax.Call) and producer.op.same_as(call.op)):
            continue
        made_by = mod[producer.args[0]]
        if relax.analysis.has_reshape_pattern(made_by) or last.get(arg) != position:
            continue
        if sum(a.same_as(arg) for a in args) != 1 or not _same_tensor_type(arg, out_ty):
            continue
        if not _reads_only_where_it_writes(func, i):
            continue
        gvar = bb.add_func(func.specialize({func.params[-1]: func.params[i]}), f"{call.args[0].name_hint}_in_place")
        return relax.call_tir_inplace(gvar, args, i, out_ty)
    return None
