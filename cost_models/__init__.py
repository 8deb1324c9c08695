"""Cost models: features of a candidate schedule -> predicted speed."""

from __future__ import annotations

from typing import Literal

from cost_models.base import CostModel
from cost_models.features import extract_features

__all__ = ["CostModel", "create", "extract_features"]


def create(kind: CostModel | Literal["xgb"] = "xgb", **kwargs) -> CostModel:
    """Resolve a cost model by name or pass an instance through."""
    if isinstance(kind, CostModel):
        return kind
    if kind == "xgb":
        from cost_models.xgb import XGBCostModel

        return XGBCostModel(**kwargs)
    raise ValueError(f"unknown cost model {kind!r}; known: ['xgb']")
