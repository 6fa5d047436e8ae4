"""DeepEP V1's Python API on epx: replace ``import deep_ep`` by ``from epx import deep_ep``, or, for code
you do not edit, call ``epx.deep_ep.install()`` before it imports ``deep_ep``.

Same names, signatures, return tuples, dtypes and shapes as DeepEP V1's ``deep_ep`` module; what differs
is written in each function's docstring and in README.md ("Migrating from DeepEP").
"""

from __future__ import annotations

import sys

from . import buffer, config, utils
from .buffer import Buffer
from .config import Config
from .utils import EventOverlap


def install() -> None:
    """Makes ``import deep_ep`` (and ``deep_ep.buffer``, ``deep_ep.utils``) import this module, so that code
    written for DeepEP (``from deep_ep import Buffer``) runs on epx unchanged. Call it before that code
    imports deep_ep. Refuses where another deep_ep module was imported already."""
    here = sys.modules[__name__]
    present = sys.modules.get("deep_ep")
    if present is not None and present is not here:
        raise RuntimeError(
            f"epx: a deep_ep module is imported already ({getattr(present, '__file__', present)}): call "
            "epx.deep_ep.install() before anything imports deep_ep"
        )
    sys.modules["deep_ep"] = here
    sys.modules["deep_ep.buffer"] = buffer
    sys.modules["deep_ep.utils"] = utils
    sys.modules["deep_ep.config"] = config


def __getattr__(name):
    # topk_idx_t is a torch dtype; looked up lazily so that importing this module needs no torch.
    if name == "topk_idx_t":
        from .._torch import torch

        return torch().int64
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Buffer", "Config", "EventOverlap", "install", "topk_idx_t"]
