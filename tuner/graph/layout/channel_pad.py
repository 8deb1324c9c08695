"""Padding a conv's output channels to whole vector blocks, and carrying the padding forward.

A blocked layout (``NCHW16c``) vectorizes a conv over its output channel block. A conv whose
channel count the block does not divide takes the largest power of two that divides it
(:func:`~tuner.graph.layout.plan.channel_block`): 58 channels (ShuffleNet-V2's first stage)
give ``NCHW2c``, two lanes of sixteen, 116 give ``NCHW4c`` and 120 give
``NCHW8c``. oneDNN pads such channels to whole blocks instead (its ``nChw16c`` rounds 58 up to
64); :func:`pad_channels` does the same in the graph before ``ConvertLayout``:

- a conv planned blocked whose output channels are poorly divided (:func:`padded_channels`)
  gets zero output filters up to the next multiple of the block;
- the padding is carried forward through what treats channels one by one (bias adds and
  other binary operators with a per-channel constant, whose constant gets neutral values, or
  with a scalar one, such as hard-swish's ``+ 3``, ``max``, ``min`` and ``/ 6``;
  ReLU and the other activations; pooling; depthwise convs, whose padded filters are zero;
  operators of two tensors padded alike), and absorbed by a conv that reads it (zero input
  filters for the padded channels);
- anything else reads the tensor cut back to its channels (``strided_slice``, as a function of
  its own so that ``ConvertLayout`` brings its input to NCHW first: a slice inside a
  channel block has no blocked form).

The padded channels hold finite values (zero filters, neutral constants, finite activations
of finite inputs) that only zero filters read, so the outputs are the unpadded graph's.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from tuner.graph.layout.plan import _CONV2D, block_of, is_depthwise

logger = logging.getLogger(__name__)

#: Extra work a padded conv may do: at most an eighth more channels (58 to 64 is 10%).
MAX_OVERHEAD = 1 / 8

#: Activations that map finite values to finite values one element at a time.
_UNARY = frozenset({"relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
                    "relax.nn.gelu_tanh", "relax.clip", "relax.astype", "relax.negative", "relax.abs"})  # fmt: skip

#: Binary operators and the value a padded channel of a per-channel constant operand takes.
_BINARY = {"relax.add": 0.0, "relax.subtract": 0.0, "relax.multiply": 0.0, "relax.divide": 1.0,
           "relax.maximum": 0.0, "relax.minimum": 0.0}  # fmt: skip

#: Operators that reduce or pool within each channel (NCHW, channel axis 1 kept).
_POOLS = frozenset({"relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d"})


def padded_channels(channels: int, block: int) -> int | None:
    """The channel count a conv's ``channels`` outputs are padded to for ``block``-channel
    blocks, or None where they stay: already whole blocks, at most one block, or more than
    :data:`MAX_OVERHEAD` extra work (24 and 40 channels stay in ``NCHW8c`` on 16-lane vectors:
    a third and a fifth more work would cost more than the half-used registers)."""
    if block <= 1 or channels <= block or channels % block == 0:
        return None
    padded = -(-channels // block) * block
    return padded if padded - channels <= MAX_OVERHEAD * channels else None


def pad_channels(mod: tvm.IRModule, layouts: list[str]) -> tuple[tvm.IRModule, int]:
    """``mod`` with the output channels of each conv planned blocked (``layouts[i]`` for conv
    ``i`` in binding order, the plan's indices) padded where :func:`padded_channels` says so,
    and the number of convs padded. Convs keep their order, one binding each."""
    mutator = _PadChannels(mod, layouts)
    func = mutator.visit_expr(mod["main"])
    if not mutator.padded_convs:
        return mod, 0
    mutator.builder_.update_func(mod.get_global_var("main"), func)
    out = mutator.builder_.get()
    out = relax.transform.DeadCodeElimination(["main"])(out)
    logger.debug("padded the output channels of %d convs", mutator.padded_convs)
    return out, mutator.padded_convs


def _const(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, Constant) else None


def _pad_axis(value: np.ndarray, axis: int, to: int, fill: float = 0.0) -> np.ndarray:
    widths = [(0, 0)] * value.ndim
    widths[axis] = (0, to - value.shape[axis])
    return np.pad(value, widths, constant_values=fill)


def _conv(call: relax.Call, data: relax.Expr, weight: np.ndarray, groups: int) -> relax.Expr:
    at = call.attrs
    return relax.op.nn.conv2d(
        data, relax.const(weight, str(call.args[1].ty.dtype)), strides=at.strides, padding=at.padding,
        dilation=at.dilation, groups=groups, data_layout=str(at.data_layout), kernel_layout=str(at.kernel_layout),
        out_layout=str(at.out_layout) if at.out_layout else None, out_dtype=str(at.out_dtype) if at.out_dtype else None,
    )  # fmt: skip


@relax.expr_functor.mutator
class _PadChannels(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, layouts: list[str]) -> None:
        super().__init__(mod)
        self.layouts = layouts
        self.conv_index = 0
        self.padded_convs = 0
        # A variable of the graph whose value is held padded: its padded variable and its
        # own channel count. Readers that cannot take the padding get a cut copy, made once.
        self.padded: dict[relax.Var, tuple[relax.Var, int]] = {}
        self.cut: set[relax.Var] = set()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        result = None
        if isinstance(binding.var, relax.DataflowVar) and isinstance(value, relax.Call) \
                and isinstance(value.op, tvm.ir.Op):  # fmt: skip
            result = self._padded(value)
        if result is None:
            self._cut_reads(value)
            super().visit_var_binding_(binding)
            return
        expr, channels = result
        if channels is None:  # rewritten (a conv reading padded channels), not padded
            self.set_var_remap(binding.var, self.builder_.emit(expr))
        else:
            self.padded[binding.var] = (self.builder_.emit(expr), channels)

    def _cut_reads(self, value: relax.Expr) -> None:
        """Give every padded variable ``value`` reads its cut copy."""
        reads: list[relax.Var] = []
        relax.analysis.post_order_visit(value, lambda e: reads.append(e) if isinstance(e, relax.Var) else None)
        for var in reads:
            if var in self.padded and var not in self.cut:
                from tvm import topi

                padded, channels = self.padded[var]
                cut = self.builder_.call_te(lambda x, c=channels: topi.strided_slice(x, [0], [c], [1], axes=[1]),
                                            padded, primfunc_name_hint="channel_cut")  # fmt: skip
                self.set_var_remap(var, self.builder_.emit(cut))
                self.cut.add(var)

    def _pad(self, data: relax.Expr, channels: int, to: int) -> relax.Var:
        """``data`` with zero channels appended up to ``to``."""
        from tvm import topi

        return self.builder_.emit(self.builder_.call_te(
            lambda x: topi.nn.pad(x, [0, 0, 0, 0], [0, to - channels, 0, 0], 0.0), data,
            primfunc_name_hint="channel_pad"))  # fmt: skip

    def _arg(self, expr: relax.Expr) -> relax.Expr:
        return self.visit_expr(expr)

    def _padded(self, call: relax.Call) -> tuple[relax.Expr, int | None] | None:
        """The padded form of ``call`` and its own channel count (None: rewritten to read
        padded channels, its output not padded), or None to keep it as is."""
        name = call.op.name
        if name == _CONV2D:
            index = self.conv_index
            self.conv_index += 1
            return self._padded_conv(call, index)
        args = call.args
        if name in _UNARY and args and isinstance(args[0], relax.Var) and args[0] in self.padded:
            padded, channels = self.padded[args[0]]
            return relax.Call(call.op, [padded, *map(self._arg, args[1:])], call.attrs), channels
        if name in _POOLS and args[0] in self.padded and str(getattr(call.attrs, "layout", "NCHW")) == "NCHW":
            padded, channels = self.padded[args[0]]
            return relax.Call(call.op, [padded], call.attrs), channels
        spatial = call.attrs.axis is not None and all(int(a) in (2, 3, -1, -2) for a in call.attrs.axis) \
            if name == "relax.mean" else False  # fmt: skip
        if spatial and args[0] in self.padded and len(args[0].ty.shape.values) == 4:
            padded, channels = self.padded[args[0]]
            return relax.Call(call.op, [padded], call.attrs), channels
        if name in _BINARY and len(args) == 2:
            return self._padded_binary(call, _BINARY[name])
        return None

    def _padded_binary(self, call: relax.Call, fill: float) -> tuple[relax.Expr, int] | None:
        a, b = call.args
        if a in self.padded and b in self.padded:
            (pa, ca), (pb, cb) = self.padded[a], self.padded[b]
            same = ca == cb and [int(d) for d in pa.ty.shape.values] == [int(d) for d in pb.ty.shape.values]
            return (relax.Call(call.op, [pa, pb], call.attrs), ca) if same else None
        for var, other, first in ((a, b, True), (b, a, False)):
            if var not in self.padded or (call.op.name == "relax.divide" and not first):
                continue  # a padded divisor could be 0
            value = _const(other)
            padded, channels = self.padded[var]
            if value is not None and value.size == 1 and value.ndim <= 4:
                # A scalar applies to every channel alike (hard-swish's + 3, max, min and / 6).
                const = self._arg(other)
                return relax.Call(call.op, [padded, const] if first else [const, padded], call.attrs), channels
            if value is None or value.ndim != 4 or value.shape[0] != 1 or value.shape[2:] != (1, 1) \
                    or value.shape[1] not in (1, channels):  # fmt: skip
                return None
            if value.shape[1] == channels:
                value = _pad_axis(value, 1, int(padded.ty.shape.values[1]), fill)
            const = relax.const(value, str(other.ty.dtype))
            return relax.Call(call.op, [padded, const] if first else [const, padded], call.attrs), channels
        return None

    def _padded_conv(self, call: relax.Call, index: int) -> tuple[relax.Expr, int | None] | None:
        at = call.attrs
        weight = _const(call.args[1])
        data = call.args[0]
        if weight is None or str(at.data_layout) != "NCHW" or str(at.kernel_layout) != "OIHW":
            return None
        block = block_of(self.layouts[index]) if index < len(self.layouts) else None
        out_ch, groups = weight.shape[0], int(at.groups)
        if is_depthwise(call):
            target = self.padded[data][0].ty.shape.values[1] if data in self.padded else None
            if target is None:
                to = padded_channels(out_ch, block or 0)
                if to is None:
                    return None
                padded_in = self._pad(self._arg(data), out_ch, to)
            else:
                to, padded_in = int(target), self.padded[data][0]
            self.padded_convs += 1
            return _conv(call, padded_in, _pad_axis(weight, 0, to), to), out_ch
        if groups != 1:
            return None
        new_data, in_ch = self._arg(data), weight.shape[1]
        if data in self.padded:
            new_data = self.padded[data][0]
            weight = _pad_axis(weight, 1, int(new_data.ty.shape.values[1]))
        elif (in_to := padded_channels(in_ch, block or 0)) is not None:
            # Input blocks of a few channels (29 chunks of 2) read the input strided: padded in
            # front of the conv (with the layout transform it fuses with), the conv reads whole blocks.
            new_data = self._pad(new_data, in_ch, in_to)
            weight = _pad_axis(weight, 1, in_to)
        to = padded_channels(out_ch, block or 0)
        if to is None:
            if new_data.same_as(self._arg(data)):
                return None
            return _conv(call, new_data, weight, 1), None  # reads padded channels, writes its own
        self.padded_convs += 1
        return _conv(call, new_data, _pad_axis(weight, 0, to), 1), out_ch
