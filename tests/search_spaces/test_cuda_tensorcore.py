"""``cuda-dense-tensorcore``: which tasks it takes, that its points build to tensor-core code
for sm_80 and sm_90 here (nvcc, no GPU), and, where a GPU is, that they compute the matmul."""

from __future__ import annotations

import numpy as np
import pytest
import test_conformance as conformance
import tvm
from tvm import te, topi

import search_spaces
from search_spaces import Point
from search_spaces.cuda.dense_tensorcore import NAME, shared_bytes

SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
SM80 = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})


def matmul(m: int = 64, k: int = 128, n: int = 128, dtype: str = "float16", out: str = "float16", *,
           trans_b: bool = False, batch: int = 0, epilogue: bool = True) -> tvm.IRModule:
    """A matmul by a weight [k, n] (``trans_b``: [n, k], as ``topi.nn.dense``), accumulated
    in ``out``, + bias + relu; ``batch`` > 0: a batched matmul of two activations, no epilogue."""
    lead = (batch,) if batch else ()
    a = te.placeholder((*lead, m, k), dtype, name="A")
    b = te.placeholder((*lead, *((n, k) if trans_b else (k, n))), dtype, name="B")
    r = te.reduce_axis((0, k), "k")

    def body(*idx):
        *bi, i, j = idx
        rhs = b[(*bi, j, r)] if trans_b else b[(*bi, r, j)]
        return te.sum(a[(*bi, i, r)].astype(out) * rhs.astype(out), axis=r)

    c = te.compute((*lead, m, n), body, name="matmul")
    if batch or not epilogue:
        return tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    bias = te.placeholder((n,), out, name="bias")
    return tvm.IRModule({"main": te.create_prim_func([a, b, bias, topi.nn.relu(topi.add(c, bias))])})


@pytest.mark.parametrize(("mod", "target", "applies"), [
    (lambda: matmul(), SM90, True),
    (lambda: matmul(trans_b=True, out="float32"), SM80, True),
    (lambda: matmul(batch=2), SM90, True),
    (lambda: matmul(dtype="bfloat16", out="float32"), SM80, True),
    # float32 stays with the sketch space; so do shapes that are not whole 16 x 16 x 16 tiles.
    (lambda: matmul(dtype="float32", out="float32"), SM90, False),
    (lambda: matmul(m=46), SM90, False),
    # WMMA on bfloat16 needs sm_80; the CPU has no tensor cores.
    (lambda: matmul(dtype="bfloat16", out="float32"), tvm.target.Target({"kind": "cuda", "arch": "sm_75"}), False),
    (lambda: matmul(), tvm.target.Target({"kind": "llvm"}), False),
], ids=["fp16", "fp16-nt-f32acc", "batched", "bf16", "fp32", "ragged", "bf16-sm75", "llvm"])
def test_applies_by_pattern_and_precision(mod, target, applies):
    assert (NAME in search_spaces.applicable_kinds(mod(), target)) == applies


def test_constraint_keeps_shared_memory_and_tiles_within_limits():
    sp = search_spaces.create(matmul(m=128, k=256, n=256), SM90, kind=NAME)
    assert 0 < sp.size() < sp.grid_size()
    rng = np.random.default_rng(0)
    for _ in range(16):
        values = sp.values(sp.sample(rng))
        assert shared_bytes(values) <= 49152
        assert 128 % (values["warp_m"] * values["frag_m"] * 16) == 0
        assert not (values["async_copy"] and values["stages"] == 1)
    starts = sp.starts()
    assert starts and all(sp.static_violation(p) is None for p in starts)
    assert {sp.values(p)["async_copy"] for p in starts} == {1}  # sm_90 has cp.async


@pytest.mark.parametrize("check", [conformance.test_knobs_and_size, conformance.test_sample_is_valid_and_seeded,
                                   conformance.test_apply_is_deterministic_and_json_round_trips,
                                   conformance.test_trace_replays_in_tvm],
                         ids=lambda f: f.__name__.removeprefix("test_"))  # fmt: skip
def test_conformance(check):
    """The search-space contract (the conformance suite pairs no CUDA float16 task)."""
    check(_space())


_SPACES: dict[str, search_spaces.SearchSpace] = {}


def _space() -> search_spaces.SearchSpace:
    if "fp16" not in _SPACES:
        _SPACES["fp16"] = search_spaces.create(matmul(), SM90, kind=NAME)
    return _SPACES["fp16"]


def _source(mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """The CUDA source of a build that nvcc compiled to device code for the target's arch."""
    from tuner.measure.cuda import prepare_cuda_build

    prepare_cuda_build()
    with target:
        lib = tvm.compile(mod, target=target)
    return lib.mod.imports[0].inspect_source()


def _point(sp: search_spaces.SearchSpace, **values) -> Point:
    return Point(0, tuple(values.get(k.name, k.choices[0]) for k in sp.knobs(0)))


@pytest.mark.slow
@pytest.mark.parametrize("target", [SM90, SM80], ids=["sm_90", "sm_80"])
def test_points_build_to_tensor_core_code(target):
    """A pipelined point with 16-byte vectors and cp.async, and a random one, build with nvcc;
    the source multiplies on tensor cores and fetches in vectors."""
    sp = search_spaces.create(matmul(k=256), target, kind=NAME)
    piped = _point(sp, warp_m=2, warp_n=2, frag_m=2, frag_n=2, chunk_k=2, vector=8, stages=2, async_copy=1)
    assert sp.check(piped) is None, sp.check(piped)
    src = _source(sp.apply(piped).mod, target)
    assert "wmma::mma_sync" in src and "wmma::load_matrix_sync" in src
    assert "uint4" in src  # 8 float16 = 16 bytes a load
    assert "cp.async" in src
    drawn = sp.sample(np.random.default_rng(5))
    assert "wmma::mma_sync" in _source(sp.apply(drawn).mod, target)


@pytest.mark.slow
def test_bfloat16_builds_for_sm80():
    sp = search_spaces.create(matmul(dtype="bfloat16", out="float32", trans_b=True), SM80, kind=NAME)
    src = _source(sp.apply(sp.sample(np.random.default_rng(2))).mod, SM80)
    assert "wmma::mma_sync" in src and "nv_bfloat16" in src


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_points_compute_the_matmul_on_a_gpu(seed):
    """Random points (a pipelined one among them) against numpy, on the GPU."""
    from tuner.cuda_runtime import gpu_identity

    gpu = gpu_identity(0)
    if gpu is None:
        pytest.skip("needs an NVIDIA GPU with TVM's CUDA runtime")
    target = tvm.target.Target({"kind": "cuda", "arch": gpu["arch"]})
    mod = matmul(m=128, k=256, n=128, trans_b=seed == 1, out="float32" if seed == 2 else "float16")
    sp = search_spaces.create(mod, target, kind=NAME)
    point = sp.sample(np.random.default_rng(seed))
    if seed == 0:
        point = _point(sp, warp_m=2, warp_n=2, frag_m=2, frag_n=2, chunk_k=2, vector=8, stages=2,
                       async_copy=int(gpu["arch"] >= "sm_80"))
    _source(sp.apply(point).mod, target)  # prepares the nvcc build
    with target:
        lib = tvm.compile(sp.apply(point).mod, target=target)
    rng = np.random.default_rng(seed)
    args = [p for p in mod["main"].params]
    shapes = [[int(d) for d in mod["main"].buffer_map[p].shape] for p in args]
    dtypes = [str(mod["main"].buffer_map[p].dtype) for p in args]
    host = [rng.uniform(-1, 1, s).astype(d) for s, d in zip(shapes[:-1], dtypes[:-1], strict=True)]
    dev = tvm.cuda(0)
    bufs = [tvm.runtime.tensor(h, dev) for h in host] + [tvm.runtime.empty(shapes[-1], dtypes[-1], dev)]
    lib["main"](*bufs)
    a, b, bias = (h.astype("float32") for h in host)
    want = np.maximum(a @ (b.T if seed == 1 else b) + bias, 0)
    np.testing.assert_allclose(bufs[-1].numpy().astype("float32"), want, rtol=2e-2, atol=5e-2)
