"""benchmarks/peer_profiles.py: TVM's functions named by the ONNX nodes of their size."""

from __future__ import annotations

from tests.benchmarks.bench_scripts import load_script

peer_profiles = load_script("peer_profiles")


def _gemm(name: str, k: int, n: int):
    return peer_profiles.HeavyOp(name, f"gemm 1x{k} @ {n}x{k}", n, k * n, k, k * n)


def test_a_dense_padded_to_whole_blocks_is_named_by_its_node():
    """A classifier's 1000 outputs run padded to 1024 columns: the function still matches its
    Gemm, and an op of exactly the function's size wins over a padded one."""
    ops = {o.name: o for o in (_gemm("head", 1280, 1000), _gemm("other", 64, 8))}
    padded = (1024, 1280 * 1024, 1280, 1280 * 1024)
    assert [o.name for o in peer_profiles.match(padded, ops)] == ["head"]
    exact = {**ops, "wide": _gemm("wide", 1280, 1024)}
    assert [o.name for o in peer_profiles.match(padded, exact)] == ["wide"]
    # More than an eighth of padding is another op, not this one padded.
    assert peer_profiles.match((1200, 1280 * 1200, 1280, 1280 * 1200), ops) == []
