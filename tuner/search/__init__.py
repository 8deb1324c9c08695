"""The search loop's parts: which task gets the next trials, and which points to try.

Strategies implement :class:`SearchStrategy` (the contract is in its docstring), one module
each, and are registered here by name; ``create(name, space, ...)`` resolves one.
"""

from __future__ import annotations

import importlib

from search_spaces import SearchSpace
from tuner.search.bandit import SpaceBandit
from tuner.search.base import Candidate, Proposal, Result, SearchStrategy
from tuner.search.scheduler import SCHEDULERS, NoTaskAvailable, TaskScheduler

__all__ = [
    "DEFAULT_STRATEGY",
    "SCHEDULERS",
    "Candidate",
    "NoTaskAvailable",
    "Proposal",
    "Result",
    "SearchStrategy",
    "SpaceBandit",
    "TaskScheduler",
    "create",
    "strategies",
    "strategy_class",
]

DEFAULT_STRATEGY = "evolutionary"

# name -> "module:Class"; imported on first use so Optuna loads only when a study is wanted.
_REGISTRY: dict[str, str] = {
    "evolutionary": "tuner.search.evolutionary:EvolutionarySearch",
    "random": "tuner.search.random_search:RandomSearch",
    "grid": "tuner.search.grid:GridSearch",
    "optuna-tpe": "tuner.search.optuna_search:OptunaTPESearch",
    "optuna-cmaes": "tuner.search.optuna_search:OptunaCmaEsSearch",
}


def strategies() -> list[str]:
    """Every registered strategy name."""
    return list(_REGISTRY)


def strategy_class(name: str) -> type[SearchStrategy]:
    """The class registered as ``name``.

    Raises:
        ValueError: no strategy has that name.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown search strategy {name!r}; known: {strategies()}")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def create(kind: SearchStrategy | str, space: SearchSpace | None = None, **kwargs) -> SearchStrategy:
    """Resolve a strategy by name (a new one over ``space``) or pass an instance through.

    Raises:
        ValueError: unknown name, no space given for a name, or options given with an instance.
        TypeError: an option the strategy does not take.
    """
    if isinstance(kind, SearchStrategy):
        if space is not None or kwargs:
            raise ValueError("options cannot be applied to an existing strategy instance")
        return kind
    if space is None:
        raise ValueError(f"strategy {kind!r} needs the search space to search")
    return strategy_class(kind)(space, **kwargs)
