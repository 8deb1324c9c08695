"""The registry of templates: :class:`Template`, :func:`register_template` and the lookups;
plug-ins register through the ``nightshift.templates`` entry point group."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nightshift.templates"


@dataclass(frozen=True)
class Template:
    """A hand-written schedule for one operator pattern.

    Attributes:
        name: registry key, also the ``kind`` that ``search_spaces.create`` accepts.
        knobs: ``(mod, target, limits) -> knobs``, or None when the template does not apply
            to the task (the wrong pattern or target).
        schedule: ``(sch, values, limits)`` schedules ``sch`` in place; ``values`` maps each
            knob's name to its value. It must be deterministic.
        constraint: ``(values, limits) -> reason or None``: points it rejects are outside
            the space (checked before anything is built).
        description: one line for listings.
        starts: ``(knob choices by name, limits) -> knob values by name``: points worth
            measuring first (a library's proven register tiles), each a dict of some knobs'
            values (the others take their first choice); those outside the space are dropped.
    """

    name: str
    knobs: Callable[[tvm.IRModule, tvm.target.Target, Limits], tuple[Knob, ...] | None]
    schedule: Callable[[Schedule, dict[str, Any], Limits], None]
    constraint: Callable[[dict[str, Any], Limits], str | None] | None = None
    description: str = ""
    starts: Callable[[dict[str, tuple], Limits], list[dict[str, Any]]] | None = None


_REGISTRY: dict[str, Template] = {}
_entry_points_loaded = False


def register_template(template: Template, *, replace: bool = False) -> Template:
    """Add a template to the registry; returns it (usable as a decorator's last step).

    Raises:
        ValueError: a template of that name exists and ``replace`` is False, or the name is
            a built-in space kind.
    """
    if template.name in ("sketch",):
        raise ValueError(f"{template.name!r} is a built-in space kind, not a template name")
    if template.name in _REGISTRY and not replace and _REGISTRY[template.name] is not template:
        raise ValueError(f"a template named {template.name!r} is already registered")
    _REGISTRY[template.name] = template
    return template


def unregister_template(name: str) -> None:
    """Remove a template (no error if absent)."""
    _REGISTRY.pop(name, None)


def get_template(name: str) -> Template:
    """The registered template ``name``.

    Raises:
        KeyError: no such template.
    """
    _load_entry_points()
    return _REGISTRY[name]


def templates() -> dict[str, Template]:
    """Every registered template, by name (built-ins, entry points, registered ones)."""
    _load_entry_points()
    return dict(_REGISTRY)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            template = obj() if callable(obj) and not isinstance(obj, Template) else obj
            if not isinstance(template, Template):
                raise TypeError(f"loads to {type(template).__name__}, not a Template")
            register_template(template, replace=True)
        except Exception as err:  # one broken plug-in must not take the others down
            logger.warning("template entry point %s failed to load: %s", ep.name, err)
