"""Two tuning databases of one model, interleaved in the same rounds with the peers.

``nightshift bench`` runs one database against the peers; two runs of it are minutes apart,
and on this shared machine the same database has measured 1.06x and 1.17x OpenVINO's time in
two runs. Here the second database's build is one more entry of the same rounds (a peer that
runs a TVM build), so the two builds and the peers see the same machine. The default peers
are ONNX Runtime and OpenVINO asked for f32 (``openvino-f32``, ``INFERENCE_PRECISION_HINT``
f32; plain ``openvino`` runs its default, bf16 on CPUs with AVX512_BF16, and its row says
so). With ``--precision bf16`` or ``int8`` both builds are that precision (for int8, give
``--model`` the QDQ file ``tune`` quantized the model into, which the peers then run too;
see precision_vs_peers.py) and the peers should run at it too
(``--peers openvino torch-bf16`` for bf16). ``--b-opaque-transforms`` builds B with TVM's own
``layout_transform`` legalization, which nothing fuses with (Nightshift's before 2026-11-26;
give ``--db-b`` the same file to compare the two builds alone). ``--b-widened-attention``
builds B (bf16) with attention's matmuls of two activations as before 2026-11-27: both cast
to bf16 and widened to float32 FMAs, not packed for ``vdpbf16ps``. ``--b-separate-pads``
builds B (bf16) with each conv's padding a function of its own, as before the twenty-fourth
session (tuner.pad_fusion). ``--b-unfolded-scales`` builds B (int8) with each requantize
scale a multiply of its own and every clip kept, as before the twenty-seventh session
(``tuner.precision.qdq.fold_scales``). ``--b-narrow-blocks`` builds B (bf16, int8; an AMX
CPU) as before the twenty-eighth session: every conv reading 16-channel blocks, uint8
padded inside the conv's function and every padding a function of its own
(``tuner.layout.wide_blocks``, ``PAD_APART``, ``tuner.pad_fusion``). ``--b-fp32-attention``
builds B (int8) with the matmuls of two quantized activations (attention's) dequantized to
float32, as before the thirty-second session, not on bf16 dot products.
``--b-unpadded-columns`` builds B (bf16) with a weight whose columns are not whole vectors
(ResNet-50's classifier) packed as one block, as before the thirty-third session.
``--b-narrow-1x1`` builds B (bf16, int8; an AMX CPU) with every stride-1 1x1 conv reading
16-channel blocks, as before the thirty-fourth session (``tuner.layout.sole_readers``).
``--b-shared-narrow-1x1`` builds B (int8; an AMX CPU) with the stride-1 1x1 convs whose data
others read too on 16-channel blocks, as before the thirty-sixth session
(``tuner.layout.SHARED_COPY_GAIN``). ``--b-checked-taps`` builds B (bf16; an AMX CPU) with the
stem's row taps as before the thirty-sixth session: every slot's value behind one bounds
check, no annotation, so that no ``x86-row-taps`` applies and B's own records of that task
do (``tuner.layout.row_taps``). ``--b-tvm-bf16-casts`` builds B (bf16; AVX512_BF16) with
TVM's own integer rounding for every cast to bfloat16, as before the thirty-seventh session
(``search_spaces.bf16_casts``), ``--b-divided-softmax`` with a softmax that divides every
element by its row's sum, as before the same session (``tuner.layout.fast_softmax_last_axis``;
B's records of that softmax apply). ``--b-scalar-nearbyint`` builds B with TVM's own
``nearbyint``, which its vectorizer leaves to scalar loops, as before the thirty-eighth session
(``search_spaces.lowering.llvm_nearbyint``). Writes benchmarks/archive/results/db_ab.json (``--out``).

    .venv/bin/python benchmarks/archive/db_ab.py --db warm.db --db-b cold.db --label-b "cold-tuned" --model resnet50
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import tvm
from rich.console import Console

from tuner.bench import BenchConfig, TvmRunner, bench, render
from tuner.app.plan import measured_plan
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.peers._base import Peer, PeerModel
from tuner.precision import check_device

console = Console()
RESULTS = Path(__file__).parent / "results" / "db_ab.json"
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from precision_vs_peers import TorchBf16Peer  # noqa: E402
from result_file import write_result  # noqa: E402
from two_builds import swapped  # noqa: E402


class OtherDatabase(Peer):
    """The model compiled from another database, run as a peer of the benchmark."""

    name = "tvm-db-b"
    module = "tvm"
    install = "pip install -e ."

    def __init__(self, spec, device, db: TuningDatabase, label: str, precision: str = "fp32",
                 variants: tuple[Callable[[], contextlib.AbstractContextManager], ...] = ()) -> None:  # fmt: skip
        super().__init__()
        self._spec, self._device, self._db, self.label = spec, device, db, label
        self._precision = precision
        self._variants = variants  # each: the code as before one change, for B's build
        self.precision = "f32" if precision == "fp32" else precision

    def prepare(self, model: PeerModel, threads: int) -> None:
        with contextlib.ExitStack() as stack:
            for variant in self._variants:
                stack.enter_context(variant())
            chosen = measured_plan(self._spec, self._device, self._db, self._precision)
            compiled = compile_model(self._spec, self._device, self._db, precision=self._precision,
                                     plan=chosen.plan if chosen else None)  # fmt: skip
        self._runner = TvmRunner(compiled, self._device, self.label, self.precision)

    def run(self, inputs):
        return self._runner.run(inputs)


def opaque_layout_transforms():
    """Legalize ``layout_transform`` as TVM does (tuner.layout looks its legalization up by
    name when it prepares a model)."""
    from tvm.relax.transform.legalize_ops.manipulate import _layout_transform

    import tuner.layout

    return swapped(tuner.layout, "_legalize_layout_transform", _layout_transform)


def unpacked_activations():
    """bf16 without packing a matmul's second activation (tuner.precision.bf16 asks
    ``packable_activation`` for each matmul of two activations)."""
    import tuner.precision.bf16 as bf16

    return swapped(bf16, "packable_activation", lambda a, b: False)


def separate_pads():
    """bf16 convs' padding as before 2026-11-27: one TOPI pad function each, which
    tuner.pad_fusion does not move into the producer (it moves the functions it marked)."""
    from tvm import topi

    import tuner.layout

    def topi_pad(bb, data, padding):
        top, left, bottom, right = padding
        return bb.emit(bb.call_te(topi.nn.pad, data, [0, 0, top, left, 0], [0, 0, bottom, right, 0],
                                  primfunc_name_hint="pad_NCHWc"))  # fmt: skip

    return swapped(tuner.layout, "emit_padded", topi_pad)


def unfolded_scales():
    """int8 requantize epilogues as before 2026-11-27 (twenty-seventh session): each scale a
    multiply of its own and every clip kept (tuner.precision.qdq.fold_scales left out)."""
    import tuner.precision.qdq as qdq

    return swapped(qdq, "fold_scales", lambda mod: mod)


@contextlib.contextmanager
def narrow_blocks():
    """AMX convs as before the twenty-eighth session: 16-channel input blocks, half a bf16
    tile row (a quarter of a uint8 one), no row taps for the stem (tuner.layout asks
    ``wide_blocks`` for both), uint8 padded inside the conv's function (``PAD_APART``) and
    every padding a function of its own (the fold left out of tuner.tasks' passes)."""
    import tuner.layout
    import tuner.graph.tasks

    with (swapped(tuner.layout, "wide_blocks", lambda target: {}),
          swapped(tuner.layout, "PAD_APART", ("bfloat16",)),
          swapped(tuner.tasks, "fold_pad_into_producer", tvm.transform.Sequential([]))):  # fmt: skip
        yield


def fp32_attention():
    """int8 as before the thirty-second session: matmuls of two quantized activations stay
    float32 (``tuner.precision`` asks ``_bf16_dots`` whether the target takes them in bf16)."""
    import tuner.precision

    return swapped(tuner.precision, "_bf16_dots", lambda target: False)


def unpadded_columns():
    """bf16 as before the thirty-third session: a weight whose columns are not whole 16-lane
    vectors (ResNet-50's 1000 classes) packed as one block of all its columns, no padding and
    no slice (``tuner.precision.bf16`` calls ``emit_weight_matmul`` for every dense layer)."""
    import tuner.precision.bf16 as bf16

    return swapped(bf16, "emit_weight_matmul", functools.partial(bf16.emit_weight_matmul, columns=1))


def narrow_1x1():
    """AMX as before the thirty-fourth session: a stride-1 1x1 conv reads its data in
    16-channel blocks even where nothing else reads it (``tuner.layout`` asks
    ``sole_readers`` which data is a conv's alone)."""
    import tuner.layout

    return swapped(tuner.layout, "sole_readers", lambda func: frozenset())


def shared_narrow_1x1():
    """AMX as before the thirty-sixth session: a stride-1 1x1 conv whose data others read
    too reads it in 16-channel blocks, never a wide copy."""
    import tuner.layout

    return swapped(tuner.layout, "SHARED_COPY_GAIN", sys.maxsize)


def tvm_bf16_casts():
    """Casts to bfloat16 as TVM lowers them, in integer instructions, as before the
    thirty-seventh session (``search_spaces.lowering`` looks the rewrite up when it lowers)."""
    import search_spaces.x86.bf16_casts

    return swapped(search_spaces.bf16_casts, "native_bf16_casts", lambda mod: mod)


def scalar_nearbyint():
    """Rounding as TVM lowers it, in scalar loops that LLVM may vectorize again, as before the
    thirty-eighth session (``search_spaces.lowering`` looks the rewrite up when it lowers)."""
    import search_spaces.lowering

    return swapped(search_spaces.lowering, "llvm_nearbyint", lambda mod: mod)


def divided_softmax():
    """A softmax over the last axis as before the thirty-seventh session: TOPI's
    ``fast_softmax``, a division per element (``tuner.layout`` looks the last-axis softmax up
    by name when it legalizes), so B's records of the old workload apply."""
    from tvm import topi

    import tuner.layout

    return swapped(tuner.layout, "fast_softmax_last_axis", lambda x: topi.nn.fast_softmax(x, len(x.shape) - 1))


def checked_taps():
    """The stem's row taps as before the thirty-sixth session: the taps' check is part of
    the bounds check (no select), and the block has no annotation."""
    from tvm import te

    import tuner.layout

    def row_taps(data, padding, kw, stride_w, block):
        n, _, h, w, b = (int(d) for d in data.shape)
        top, left, bottom, right = padding
        slots = block // b

        def value(i0, i1, i2, i3, i4):
            c, tap = i4 // slots, i4 % slots
            col = i3 * stride_w + tap - left
            inside = tvm.tirx.all(c < b, tap < kw, i2 >= top, i2 < h + top, col >= 0, col < w)
            return tvm.tirx.if_then_else(inside, data[i0, i1, i2 - top, col, c], tvm.tirx.const(0, data.dtype))

        ow = (w + left + right - kw) // stride_w + 1
        return te.compute((n, 1, h + top + bottom, ow, block), value, name="row_taps")

    return swapped(tuner.layout, "row_taps", row_taps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="database A: the 'TVM, database' row")
    p.add_argument("--db-b", required=True, help="database B: one more row of the same rounds")
    p.add_argument("--label-b", default="TVM, database B")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--peers", nargs="+", default=["onnxruntime", "openvino-f32"])
    p.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="fp32",
                   help="both builds' precision (their accuracy is precision_vs_peers.py's business)")
    p.add_argument("--b-opaque-transforms", action="store_true",
                   help="build B with TVM's own layout_transform legalization (opaque, fused with nothing)")
    p.add_argument("--b-widened-attention", action="store_true",
                   help="bf16: build B with attention's matmuls widened to float32 (not packed for vdpbf16ps)")
    p.add_argument("--b-separate-pads", action="store_true",
                   help="bf16: build B with each conv's padding a function of its own (not written by its producer)")
    p.add_argument("--b-unfolded-scales", action="store_true",
                   help="int8: build B with each requantize scale a multiply of its own and every clip kept")
    p.add_argument("--b-narrow-blocks", action="store_true",
                   help="AMX: build B as before the twenty-eighth session (16-channel blocks, paddings apart)")
    p.add_argument("--b-fp32-attention", action="store_true",
                   help="build B (int8) with attention's matmuls in float32, as before 2026-11-28")
    p.add_argument("--b-unpadded-columns", action="store_true",
                   help="bf16: build B with a weight of partial vectors' columns (1000 classes) unpadded, as before")
    p.add_argument("--b-narrow-1x1", action="store_true",
                   help="AMX: build B with stride-1 1x1 convs on 16-channel blocks, as before 2026-11-28")
    p.add_argument("--b-shared-narrow-1x1", action="store_true",
                   help="AMX int8: build B with 1x1 convs of shared data on 16-channel blocks, as before")
    p.add_argument("--b-checked-taps", action="store_true",
                   help="AMX bf16: build B with the stem's row taps as before the thirty-sixth session")
    p.add_argument("--b-tvm-bf16-casts", action="store_true",
                   help="bf16: build B with TVM's integer rounding for casts to bfloat16, as before 2026-11-29")
    p.add_argument("--b-divided-softmax", action="store_true",
                   help="build B with a softmax that divides each element by its row's sum, as before 2026-11-29")
    p.add_argument("--b-scalar-nearbyint", action="store_true",
                   help="build B with TVM's nearbyint, left to scalar loops by its vectorizer, as before 2026-11-29")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    device = parse_device("cpu")
    check_device(args.precision, device)
    spec = load_model(args.model)
    chosen_variants = [(args.b_opaque_transforms, opaque_layout_transforms), (args.b_widened_attention,
                       unpacked_activations), (args.b_separate_pads, separate_pads),
                       (args.b_unfolded_scales, unfolded_scales), (args.b_narrow_blocks, narrow_blocks),
                       (args.b_fp32_attention, fp32_attention),
                       (args.b_unpadded_columns, unpadded_columns), (args.b_narrow_1x1, narrow_1x1),
                       (args.b_checked_taps, checked_taps), (args.b_shared_narrow_1x1, shared_narrow_1x1),
                       (args.b_tvm_bf16_casts, tvm_bf16_casts), (args.b_divided_softmax, divided_softmax),
                       (args.b_scalar_nearbyint, scalar_nearbyint)]  # fmt: skip
    other = OtherDatabase(spec, device, TuningDatabase(args.db_b), args.label_b, args.precision,
                          tuple(make for wanted, make in chosen_variants if wanted))
    peers = [TorchBf16Peer() if name == "torch-bf16" else name for name in args.peers]
    db_a = TuningDatabase(args.db)
    # Each build's convs in the layouts its own database measured best, as `nightshift bench`.
    chosen = measured_plan(spec, device, db_a, args.precision)
    config = BenchConfig(rounds=args.rounds, peers=(*peers, other), fallback=False, precision=args.precision,
                         accuracy_inputs=0, plan=chosen.plan if chosen else None, layout_choice=chosen)
    load_before = os.getloadavg()
    result = bench(spec, device, db_a, source=args.model, config=config)
    console.print(render(result))
    write_result(args.out, "db_ab", {
        "db_a": args.db, "db_b": args.db_b, "label_b": args.label_b, "precision": args.precision,
        "b_opaque_transforms": args.b_opaque_transforms, "b_widened_attention": args.b_widened_attention,
        "b_separate_pads": args.b_separate_pads, "b_unfolded_scales": args.b_unfolded_scales,
        "b_narrow_blocks": args.b_narrow_blocks, "b_fp32_attention": args.b_fp32_attention,
        "b_unpadded_columns": args.b_unpadded_columns, "b_narrow_1x1": args.b_narrow_1x1,
        "b_checked_taps": args.b_checked_taps, "b_shared_narrow_1x1": args.b_shared_narrow_1x1,
        "b_tvm_bf16_casts": args.b_tvm_bf16_casts, "b_divided_softmax": args.b_divided_softmax,
        "b_scalar_nearbyint": args.b_scalar_nearbyint,
        "load_before": load_before, "load_after": os.getloadavg(), "result": result.to_json(),
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
