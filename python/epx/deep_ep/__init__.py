"""DeepEP V1's Python API on epx: replace ``import deep_ep`` by ``from epx import deep_ep``.

Same names, signatures, return tuples, dtypes and shapes as DeepEP V1's ``deep_ep`` module; what differs
is written in each function's docstring and in README.md ("Migrating from DeepEP").
"""

from __future__ import annotations

from .buffer import Buffer
from .config import Config
from .utils import EventOverlap


def __getattr__(name):
    # topk_idx_t is a torch dtype; looked up lazily so that importing this module needs no torch.
    if name == "topk_idx_t":
        from .._torch import torch

        return torch().int64
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Buffer", "Config", "EventOverlap", "topk_idx_t"]
