"""Cost models: features of a candidate schedule -> predicted speed."""

from __future__ import annotations

from cost_models.base import CostModel
from cost_models.features import StoreFeatures, extract_features
from cost_models.pretrain import pretrain
from cost_models.registry import create, kinds

__all__ = ["CostModel", "StoreFeatures", "create", "extract_features", "kinds", "pretrain"]
