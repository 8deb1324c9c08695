"""Search spaces: the schedules of one fused operator on one target, as explicit knobs.

``create(mod, target)`` gives TVM's sketches with every sampling decision as a knob
(:class:`SketchSpace`); ``create(mod, target, kind=NAME)`` gives a registered hand-written
template (:class:`TemplateSpace`; see :mod:`search_spaces.templates`).
"""

from __future__ import annotations

import tvm

from search_spaces.base import InvalidPointError, Point, SearchSpace
from search_spaces.constraints import Limits, limits_for, target_with_limits
from search_spaces.knobs import Knob
from search_spaces.lowering import install as _install_lowering
from search_spaces.sketch import SketchSpace
from search_spaces.template_space import TemplateSpace
from search_spaces.templates import Template, get_template, register_template, unregister_template
from search_spaces.templates import templates as registered_templates

__all__ = [
    "InvalidPointError",
    "Knob",
    "Limits",
    "Point",
    "SearchSpace",
    "SketchSpace",
    "Template",
    "TemplateSpace",
    "applicable_kinds",
    "create",
    "get_template",
    "kinds",
    "limits_for",
    "register_template",
    "registered_templates",
    "target_with_limits",
    "unregister_template",
]

_install_lowering()


def kinds() -> list[str]:
    """Every space kind ``create`` accepts: ``sketch`` and each registered template."""
    return ["sketch", *sorted(registered_templates())]


def create(mod: tvm.IRModule, target: tvm.target.Target, *, kind: str = "sketch", seed: int = 1) -> SearchSpace:
    """Create the search space of ``kind`` for a task's PrimFunc module and target.

    Raises:
        ValueError: ``kind`` is unknown, or the template does not apply to the task.
    """
    if kind == "sketch":
        return SketchSpace(mod, target, seed=seed)
    registered = registered_templates()
    if kind in registered:
        return TemplateSpace(mod, target, registered[kind])
    raise ValueError(f"unknown search space kind {kind!r}; known: {kinds()}")


def applicable_kinds(mod: tvm.IRModule, target: tvm.target.Target) -> list[str]:
    """The kinds that apply to this task: ``sketch`` and every template that matches it."""
    out = ["sketch"]
    for name, template in sorted(registered_templates().items()):
        if template.knobs(mod, target, limits_for(target)) is not None:
            out.append(name)
    return out
