"""Small ``torch.nn.Module`` wrappers that give a library's model one tensor out, as TVM's
importer and the peers take it. Imports torch: import this module only where torch is installed."""

from __future__ import annotations

from typing import Any

import torch


class OutputEntry(torch.nn.Module):
    """One entry of a module's dict output (torchvision's segmentation models return
    ``{"out": ..., "aux": ...}``)."""

    def __init__(self, inner: torch.nn.Module, key: str) -> None:
        super().__init__()
        self.inner = inner
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The ``key`` entry of the inner module's output on images ``x``."""
        return self.inner(x)[self.key]


class LastHiddenState(torch.nn.Module):
    """A Hugging Face model's ``last_hidden_state`` (the first output where it has none).

    The arguments are named as the model names them, so the imported ``main`` takes
    ``input_ids`` (and ``attention_mask``) by those names.
    """

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (batch, seq) -> hidden states (batch, seq, hidden)."""
        kwargs: dict[str, Any] = {"input_ids": input_ids}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        out = self.inner(**kwargs)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
