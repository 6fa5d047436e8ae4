"""Finds and loads libepx (the C ABI, include/epx/epx.h) and the two libraries it needs at run time.

Loading happens on first use, not at ``import epx``: importing never fails for want of a GPU, a CUDA
runtime or NCCL; the first call that needs the library says what is missing.

Order of events, and why:

1. If PyTorch is installed it is imported first. A process has one ``libnccl.so.2`` and one
   ``libcudart.so.13`` (the dynamic linker matches libraries by soname), and torch picks them from its
   wheels when it loads. Were epx to load first, torch would be bound to epx's choice, which may be
   older than torch needs. So torch chooses, and epx uses the same copies.
2. The CUDA runtime: already loaded (by torch) -> used; else the default search; else the build's
   toolkit directory, ``CUDA_HOME`` and the ``nvidia`` wheels.
3. NCCL: already loaded -> used (epx refuses to start a team if its version is not the one epx was
   compiled against, and says so). Else the first of: the ``nvidia.nccl`` wheel, the directory NCCL was
   found in at build time (also libepx's rpath), the default search -- whose ``ncclGetVersion`` equals
   the compile-time version. If none does, the first that loads is kept and the mismatch is reported
   when a team is created.
4. libepx itself: ``$EPX_LIBRARY`` if set, else ``libepx.so`` beside this file.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys
import threading
from typing import Optional

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_info: dict = {}


class LibraryNotFound(ImportError):
    """libepx or a library it needs could not be loaded."""


def build_info():
    """What CMake recorded when libepx was built (epx/_build_info.py), or None in a source tree."""
    try:
        from . import _build_info  # written by cmake/EpxPython.cmake

        return _build_info
    except ImportError:
        return None


def _already_loaded(soname: str) -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:
        return None


def _loaded_path(soname_prefix: str) -> Optional[str]:
    """The file a loaded library came from (for diagnostics), read from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith(soname_prefix):
                    return path
    except OSError:
        pass
    return None


def _site_dirs():
    dirs = [p for p in sys.path if p and os.path.isdir(p)]
    try:
        import site

        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except Exception:  # site is not always complete (embedded interpreters, virtualenv quirks)
        pass
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _import_torch_first() -> None:
    if "torch" in sys.modules or importlib.util.find_spec("torch") is None:
        return
    try:
        import torch  # noqa: F401  (its import loads its CUDA runtime and NCCL)
    except Exception:
        pass  # a broken torch: the calls that need it will say so


def _preload_cudart(info) -> None:
    major = (getattr(info, "cuda_version", "") or "13").split(".")[0]
    soname = f"libcudart.so.{major}"
    if _already_loaded(soname) is not None:
        return
    try:
        ctypes.CDLL(soname, mode=os.RTLD_GLOBAL)
        return
    except OSError:
        pass
    candidates = []
    if info is not None and getattr(info, "cuda_library_dir", ""):
        candidates.append(info.cuda_library_dir)
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidates += [os.path.join(os.environ[env], "lib64"), os.path.join(os.environ[env], "lib")]
    candidates.append("/usr/local/cuda/lib64")
    for site_dir in _site_dirs():
        candidates += glob.glob(os.path.join(site_dir, "nvidia", "cu*", "lib"))
        candidates.append(os.path.join(site_dir, "nvidia", "cuda_runtime", "lib"))
    for directory in candidates:
        path = os.path.join(directory, soname)
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
                return
            except OSError:
                continue
    # Not found: loading libepx below fails with the dynamic linker's own message.


def _nccl_version(handle: ctypes.CDLL) -> int:
    version = ctypes.c_int(0)
    try:
        if handle.ncclGetVersion(ctypes.byref(version)) != 0:
            return 0
    except AttributeError:
        return 0
    return version.value


def _nccl_candidates(info):
    out = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None:
        for root in list(spec.submodule_search_locations or []):
            out.append(os.path.join(root, "nccl", "lib", "libnccl.so.2"))
    if info is not None and getattr(info, "nccl_library_dir", ""):
        out.append(os.path.join(info.nccl_library_dir, "libnccl.so.2"))
    out.append("libnccl.so.2")  # the dynamic linker's default search
    return [p for p in out if os.path.sep not in p or os.path.exists(p)]


def _preload_nccl(info) -> None:
    if _already_loaded("libnccl.so.2") is not None:
        return
    wanted = getattr(info, "nccl_version_code", 0) if info is not None else 0
    first = None
    for path in _nccl_candidates(info):
        try:
            probe = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        except OSError:
            continue
        if not wanted or _nccl_version(probe) == wanted:
            ctypes.CDLL(path, mode=os.RTLD_GLOBAL)  # the same object, now visible to libepx
            return
        first = first or path
        try:
            import _ctypes

            _ctypes.dlclose(probe._handle)  # not the one: unload it so that its soname stays free
        except (ImportError, OSError, AttributeError):
            pass
    if first is not None:
        ctypes.CDLL(first, mode=os.RTLD_GLOBAL)


def library_path() -> str:
    return os.environ.get("EPX_LIBRARY") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "libepx.so")


def load() -> ctypes.CDLL:
    """libepx, loaded once per process (thread-safe)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        info = build_info()
        _import_torch_first()
        _preload_cudart(info)
        _preload_nccl(info)
        path = library_path()
        if not os.path.exists(path):
            raise LibraryNotFound(
                f"epx: the native library is not at {path}. Install the package with `pip install .` from "
                "the epx repository (it builds libepx), or point EPX_LIBRARY at a built libepx.so."
            )
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        except OSError as e:
            raise LibraryNotFound(
                f"epx: loading {path} failed: {e}. libepx needs the CUDA runtime (libcudart.so.13) and NCCL "
                "(libnccl.so.2): install the CUDA toolkit 13 or the nvidia-cuda-runtime and nvidia-nccl wheels, "
                "or put their lib directories on LD_LIBRARY_PATH."
            ) from e
        nccl = _already_loaded("libnccl.so.2")
        _info.update(
            library=path,
            nccl_library=_loaded_path("libnccl.so"),
            nccl_version_loaded=_nccl_version(nccl) if nccl is not None else 0,
            nccl_version_compiled=lib.epx_nccl_version_compiled(),
            cuda_runtime_library=_loaded_path("libcudart.so"),
        )
        _lib = lib
        return lib


def loaded_info() -> dict:
    """Where the libraries came from (after load())."""
    return dict(_info)
