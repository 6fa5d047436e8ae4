"""epx: expert-parallel dispatch and combine for Mixture-of-Experts over NVLink.

- ``epx.Buffer``, ``epx.HtBuffer``, ``epx.LlBuffer``, ``epx.Team``: the native API with torch tensors.
- ``epx.deep_ep``: DeepEP V1's Python API (``from epx import deep_ep`` in place of ``import deep_ep``).

Importing epx loads nothing native and needs neither a GPU nor torch; the native library (libepx, through
its C ABI) is loaded by the first call that needs it, and torch by the first call that takes tensors.
"""

from __future__ import annotations

from ._loader import build_info as _built_with
from .buffer import Buffer
from .errors import EpxError, EpxInvalidArgument, EpxTimeout, TorchRequired
from .ht import HtBuffer, HtCombineResult, HtDispatchResult, HtHandle, HtLayout
from .ll import LlBuffer, LlCombineResult, LlDispatchResult, LlHandle, LlReceive
from .team import Team

# The version CMake read from include/epx/version.hpp when libepx was built (the package's is the same).
__version__ = getattr(_built_with(), "version", "0+unknown")


def library_info() -> dict:
    """Loads the native library and says where it and its NCCL and CUDA runtime came from."""
    from . import _abi, _loader

    lib = _abi.lib()
    info = _loader.loaded_info()
    info.update(
        version=lib.epx_version().decode(),
        abi_version=lib.epx_abi_version(),
        cuda_architectures=lib.epx_cuda_architectures().decode(),
    )
    built = _loader.build_info()
    if built is not None:
        info.update(cuda_version_compiled=built.cuda_version)
    return info


__all__ = [
    "Buffer",
    "EpxError",
    "EpxInvalidArgument",
    "EpxTimeout",
    "HtBuffer",
    "HtCombineResult",
    "HtDispatchResult",
    "HtHandle",
    "HtLayout",
    "LlBuffer",
    "LlCombineResult",
    "LlDispatchResult",
    "LlHandle",
    "LlReceive",
    "Team",
    "TorchRequired",
    "__version__",
    "library_info",
]
