"""Cost models by name: :func:`create` resolves ``"xgb"`` (its default objective),
``"xgb-rank"`` / ``"xgb-mse"`` (one objective), or ``"random"`` (lazily imported), or passes an
instance through."""

from __future__ import annotations

from typing import Literal

from cost_models.base import CostModel


def kinds() -> list[str]:
    """Every cost model name ``create`` accepts."""
    return ["random", "xgb", "xgb-mse", "xgb-rank"]


def create(kind: CostModel | Literal["xgb", "xgb-rank", "xgb-mse", "random"] = "xgb", **kwargs) -> CostModel:
    """Resolve a cost model by name (keyword options go to its constructor) or pass an
    instance through.

    Raises:
        ValueError: unknown name.
    """
    if isinstance(kind, CostModel):
        return kind
    if kind in ("xgb", "xgb-rank", "xgb-mse"):
        from cost_models.xgb import XGBCostModel

        if kind != "xgb":
            kwargs = {"objective": kind.removeprefix("xgb-")} | kwargs
        return XGBCostModel(**kwargs)
    if kind == "random":
        from cost_models.random_model import RandomCostModel

        return RandomCostModel(**kwargs)
    raise ValueError(f"unknown cost model {kind!r}; known: {kinds()}")
