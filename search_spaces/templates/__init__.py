"""Hand-written schedule templates for operator patterns, and their registry.

A template is a schedule function over a few named knobs, for the tasks it recognizes.
Templates ship here (``x86-conv2d-nchw``, ``x86-conv2d-nchwc``, ``x86-conv2d-nchwc-dot``,
``x86-conv2d-winograd``, ``x86-dense``, ``x86-dense-bf16``, ``x86-dense-vnni``,
``x86-depthwise-conv2d-nchw``, ``x86-depthwise-conv2d-nchwc``, ``x86-softmax``, ``x86-layer-norm``,
``x86-row-taps``,
and on Intel AMX tiles ``x86-conv2d-amx``, ``x86-dense-amx-bf16``, ``x86-dense-amx-int8``) or come from other packages,
either by calling
:func:`register_template` or through the ``nightshift.templates`` entry-point group, whose
entries load to a :class:`Template` (or a zero-argument callable returning one)::

    # pyproject.toml of the user's package
    [project.entry-points."nightshift.templates"]
    my-gemm = "mypkg.templates:MY_GEMM"
"""

from __future__ import annotations

from search_spaces.templates.registry import (
    ENTRY_POINT_GROUP,
    Template,
    get_template,
    register_template,
    templates,
    unregister_template,
)

__all__ = ["ENTRY_POINT_GROUP", "Template", "get_template", "register_template", "templates", "unregister_template"]

# The built-in templates register themselves on import.
from search_spaces.templates import (  # noqa: F401
    x86_conv2d,
    x86_conv2d_amx,
    x86_conv2d_nchwc,
    x86_conv2d_nchwc_dot,
    x86_conv2d_winograd,
    x86_dense,
    x86_dense_amx,
    x86_dense_dot,
    x86_depthwise,
    x86_layer_norm,
    x86_row_taps,
    x86_softmax,
)
