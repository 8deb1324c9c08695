"""The host-local cache of rebuilt features: round trip, bound, damage and an unusable file."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import zlib

import numpy as np
import pytest
import tvm

from cost_models.feature_cache import NO_REPLAY, FeatureCache, feature_key
from cost_models.features import FEATURE_WIDTH


def _rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, FEATURE_WIDTH)).astype(np.float32)


def test_entries_read_back_in_a_new_process_view(tmp_path):
    path = tmp_path / "features.sqlite"
    first = FeatureCache(path)
    first.put_many({"a": _rows(3), "b": NO_REPLAY, "c": _rows(0)})
    first.close()
    cache = FeatureCache(path)  # a later job on the same host
    got = cache.get_many(["a", "b", "c", "d"])
    np.testing.assert_array_equal(got["a"], _rows(3))
    assert "b" in got and got["b"] is None  # does not replay: known, not rebuilt again
    assert got["c"].shape == (0, FEATURE_WIDTH)
    assert "d" not in got
    assert (cache.hits, cache.misses) == (3, 1)
    cache.close()


def test_keeps_the_newest_entries(tmp_path):
    path = tmp_path / "f.sqlite"
    cache = FeatureCache(path, max_entries=3)
    for i in range(5):
        cache.put_many({f"k{i}": _rows(1, i)})
    cache.close()  # a rebuild's end: the oldest go
    cache = FeatureCache(path, max_entries=3)
    assert sorted(cache.get_many([f"k{i}" for i in range(5)])) == ["k2", "k3", "k4"]
    cache.close()


def test_a_damaged_entry_is_a_miss(tmp_path):
    path = tmp_path / "f.sqlite"
    cache = FeatureCache(path)
    cache.put_many({"good": _rows(2)})
    cache.close()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("INSERT INTO features VALUES ('torn', 2, x'00ff', 0)")
        conn.execute("INSERT INTO features VALUES ('short', 5, ?, 0)", (zlib.compress(_rows(2).tobytes()),))
    cache = FeatureCache(path)
    assert sorted(cache.get_many(["good", "torn", "short"])) == ["good"]
    cache.close()


def test_an_unusable_file_degrades_to_rebuilding(tmp_path, caplog):
    (tmp_path / "not-a-dir").write_text("")
    cache = FeatureCache(tmp_path / "not-a-dir" / "features.sqlite")
    with caplog.at_level(logging.WARNING, logger="cost_models.feature_cache"):
        assert cache.get_many(["a"]) == {}
        cache.put_many({"a": _rows(1)})
        assert cache.get_many(["a"]) == {}
    assert len(caplog.records) == 1 and "rebuilt without it" in caplog.records[0].getMessage()


@pytest.mark.parametrize("value", ["off", "0"])
def test_switched_off(monkeypatch, value):
    monkeypatch.setenv("NIGHTSHIFT_FEATURE_CACHE", value)
    assert FeatureCache.default() is None


def test_the_key_depends_on_target_and_record():
    a = tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})
    b = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    keys = {feature_key("w", t, r) for t in (a, b) for r in ('{"t": 1}', '{"t": 2}')}
    assert len(keys) == 4 and feature_key("w", a, '{"t": 1}') == feature_key("w", a, '{"t": 1}')
