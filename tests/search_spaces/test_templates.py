"""The template registry: built-ins, register_template, entry points, create()."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
from conftest import target, task
from user_templates import USER_GEMM

import search_spaces
import search_spaces.templates.registry as registry


def test_builtin_and_user_templates_are_kinds():
    kinds = search_spaces.kinds()
    assert kinds[0] == "sketch"
    assert {"x86-conv2d-nchw", "x86-conv2d-nchwc", "x86-dense", "x86-depthwise-conv2d-nchw", "user-gemm"} <= set(kinds)


def test_applicable_kinds_match_the_pattern():
    assert search_spaces.applicable_kinds(task("conv"), target("llvm")) == ["sketch", "x86-conv2d-nchw"]
    assert search_spaces.applicable_kinds(task("matmul"), target("llvm")) == ["sketch", "user-gemm"]
    assert search_spaces.applicable_kinds(task("conv"), target("cuda-sm90")) == ["sketch"]
    for name in ("conv_nchwc", "conv_nchwc_first", "conv_nchwc_bare"):
        assert search_spaces.applicable_kinds(task(name), target("llvm")) == ["sketch", "x86-conv2d-nchwc"]
    for name in ("dense", "batch_matmul"):
        assert search_spaces.applicable_kinds(task(name), target("llvm")) == ["sketch", "x86-dense"]
        assert search_spaces.applicable_kinds(task(name), target("cuda-sm90")) == ["sketch"]
    for name in ("depthwise", "depthwise_s2"):
        assert search_spaces.applicable_kinds(task(name), target("llvm")) == ["sketch", "x86-depthwise-conv2d-nchw"]
    for name in ("depthwise_nchwc", "depthwise_nchwc_s2", "depthwise_nchwc16"):
        assert search_spaces.applicable_kinds(task(name), target("llvm")) == ["sketch", "x86-depthwise-conv2d-nchwc"]
        assert search_spaces.applicable_kinds(task(name), target("cuda-sm90")) == ["sketch"]
    with pytest.raises(ValueError, match="does not apply"):
        search_spaces.create(task("relu"), target("llvm"), kind="x86-conv2d-nchw")
    with pytest.raises(ValueError, match="unknown search space kind"):
        search_spaces.create(task("relu"), target("llvm"), kind="no-such-kind")


def test_register_refuses_duplicates_and_builtin_names():
    with pytest.raises(ValueError, match="already registered"):
        search_spaces.register_template(registry.Template("user-gemm", USER_GEMM.knobs, USER_GEMM.schedule))
    with pytest.raises(ValueError, match="built-in"):
        search_spaces.register_template(registry.Template("sketch", USER_GEMM.knobs, USER_GEMM.schedule))


def test_templates_load_from_entry_points(monkeypatch):
    ep = EntryPoint(name="ep-gemm", value="user_templates:USER_GEMM", group=registry.ENTRY_POINT_GROUP)
    broken = EntryPoint(name="broken", value="no_such_module_here:X", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep, broken] if group == ep.group else [])
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    search_spaces.unregister_template("user-gemm")
    try:
        assert "user-gemm" in registry.templates(), "the entry point registered it; the broken one was skipped"
        sp = search_spaces.create(task("matmul"), target("llvm"), kind="user-gemm")
        assert sp.size() == len(sp.knobs(0)[0]) * len(sp.knobs(0)[1])
    finally:
        search_spaces.register_template(USER_GEMM, replace=True)
