"""PyTorch glue: the lazy import, torch tensors <-> epx_tensor, views of library memory as tensors, and
the streams of one call.

torch is imported only when a call needs it, so ``import epx`` works without it; the first call that
needs it raises TorchRequired with what to do.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Optional, Sequence

from . import _abi
from .errors import TorchRequired

_torch = None


def torch():
    """The torch module, imported on first use."""
    global _torch
    if _torch is None:
        try:
            import torch as module
        except ImportError as e:
            raise TorchRequired(
                "epx: this call needs PyTorch, which is not installed (pip install torch, a CUDA build)"
            ) from e
        _torch = module
    return _torch


@functools.cache
def _dtype_codes() -> dict:
    """torch dtype -> epx_dtype, made once (dispatch and combine convert several tensors per call)."""
    t = torch()
    return {
        t.bfloat16: _abi.BF16,
        t.float8_e4m3fn: _abi.FP8_E4M3,
        t.float32: _abi.FLOAT32,
        t.int32: _abi.INT32,
        t.int64: _abi.INT64,
        t.bool: _abi.BOOL,
    }


@functools.cache
def _torch_dtypes() -> dict:
    return {code: dtype for dtype, code in _dtype_codes().items()}


def dtype_code(dtype, name: str) -> int:
    codes = _dtype_codes()
    if dtype not in codes:
        raise TypeError(
            f"epx: {name} has dtype {dtype}; epx takes bfloat16, float8_e4m3fn, float32, int32, int64, bool"
        )
    return codes[dtype]


def torch_dtype(code: int):
    return _torch_dtypes()[code]


@functools.cache
def cuda_device(index: int):
    """torch.device("cuda", index), made once (a device string is parsed again at every use)."""
    return torch().device("cuda", index)


def check_device(tensor, name: str, device: Optional[int]) -> None:
    """A tensor the GPU will read or write: a CUDA tensor on the team's device."""
    t = torch()
    if not isinstance(tensor, t.Tensor):
        raise TypeError(f"epx: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cuda:
        raise ValueError(f"epx: {name} is on {tensor.device}; epx reads and writes CUDA tensors only")
    if device is not None and tensor.device.index != device:
        raise ValueError(f"epx: {name} is on {tensor.device}; this rank's team is on cuda:{device}")


def as_matrix(tensor, name: str, device: Optional[int]) -> _abi.Tensor:
    """A 2-D CUDA tensor as an epx_tensor (shape, element strides, dtype); the library checks the rest."""
    check_device(tensor, name, device)
    if tensor.dim() != 2:
        raise ValueError(f"epx: {name} must be 2-D, got shape {tuple(tensor.shape)}")
    return _abi.Tensor(
        data=tensor.data_ptr() or None,
        dtype=dtype_code(tensor.dtype, name),
        rows=tensor.size(0),
        cols=tensor.size(1),
        row_stride=tensor.stride(0),
        col_stride=tensor.stride(1),
    )


def as_optional_matrix(tensor, name: str, device: Optional[int]) -> _abi.Tensor:
    return _abi.Tensor() if tensor is None else as_matrix(tensor, name, device)


class _CudaMemory:
    """__cuda_array_interface__ over library-owned device memory. The tensor made from it keeps this
    object, and so `owner` (the buffer the memory belongs to), alive."""

    def __init__(self, ptr: int, shape, strides_bytes, typestr: str, owner):
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": tuple(int(s) for s in shape),
            "strides": tuple(int(s) for s in strides_bytes),
            "typestr": typestr,
            "data": (int(ptr), False),
            "version": 3,
            "stream": None,  # no synchronisation: ordering is the caller's, as for every epx output
        }


# How each dtype crosses __cuda_array_interface__ (which has no bfloat16 or fp8): as an integer of the
# same size, re-viewed afterwards.
_TYPESTR = {
    _abi.BF16: "<i2",
    _abi.FP8_E4M3: "|u1",
    _abi.FLOAT32: "<f4",
    _abi.INT32: "<i4",
    _abi.INT64: "<i8",
    _abi.BOOL: "|b1",
}


_numpy_checked = False


def _require_numpy() -> None:
    """torch turns __cuda_array_interface__ into a tensor with numpy's help; say so if it is missing."""
    global _numpy_checked
    if not _numpy_checked:
        import importlib.util

        if importlib.util.find_spec("numpy") is None:
            raise ImportError("epx: views of epx's buffers need numpy (torch reads them through it): pip install numpy")
        _numpy_checked = True


def device_view(ptr: Optional[int], code: int, shape: Sequence[int], strides: Sequence[int], device: int, owner):
    """A tensor over device memory the library owns (no copy). strides in elements."""
    t = torch()
    dtype = torch_dtype(code)
    if not ptr or any(s == 0 for s in shape):
        return t.empty(tuple(shape), dtype=dtype, device=cuda_device(device))
    _require_numpy()
    size = _abi.ELEMENT_SIZE[code]
    memory = _CudaMemory(ptr, shape, [s * size for s in strides], _TYPESTR[code], owner)
    view = t.as_tensor(memory, device=cuda_device(device))
    return view if view.dtype == dtype else view.view(dtype)


def matrix_view(ref: _abi.Tensor, device: int, owner):
    return device_view(ref.data, ref.dtype, (ref.rows, ref.cols), (ref.row_stride, ref.col_stride), device, owner)


def event_of(previous_event):
    """A torch.cuda.Event from what callers pass as previous_event: an Event, an EventHandle, an
    EventOverlap of either, or None."""
    event = previous_event
    for _ in range(2):  # EventOverlap -> EventHandle -> torch.cuda.Event
        event = getattr(event, "event", event)
    if event is None:
        return None
    if not isinstance(event, torch().cuda.Event):
        raise TypeError(
            "epx: previous_event must be a torch.cuda.Event, an EventHandle or an EventOverlap, "
            f"got {type(event).__name__}"
        )
    return event


class CallStreams:
    """The streams of one call.

    Not async: the call runs on `stream` (default: the current stream), after `previous_event` if given.
    Async: it runs on the buffer's communication stream (a torch.cuda.Stream the Python buffer owns,
    which get_comm_stream() returns), after `previous_event`, or else after everything already queued on
    `stream`; finish() records the event the caller waits on. Outputs are allocated on `stream` (or on
    the communication stream with allocate_on_comm_stream) and marked as used by the call's stream.

    The library sees a plain stream (epx_streams.async = 0): Python owns the communication stream, so
    that its outputs and events are torch objects and get_comm_stream() has something to return.
    """

    def __init__(
        self,
        comm_stream,
        device: int,
        stream=None,
        async_op: bool = False,
        previous_event=None,
        allocate_on_comm_stream: bool = False,
    ):
        t = torch()
        current = t.cuda.current_stream(device)
        self.compute = stream if stream is not None else current
        self.async_op = bool(async_op)
        self.call = comm_stream if self.async_op else self.compute
        self.alloc = self.call if allocate_on_comm_stream else self.compute
        # Whether allocating (copying) needs no switch of the current stream. A torch.cuda.stream() context
        # costs ~10-17 us of host time, and an LL dispatch allocates five outputs: with a context for each,
        # a dispatch took 136-145 us of host time, without 72-89 (nvidia-h200, 2026-11-29).
        self._alloc_is_current = self.alloc == current
        self._call_is_current = self.call == current
        ready = event_of(previous_event)
        if self.async_op:
            if ready is not None:
                self.call.wait_event(ready)
            else:
                self.call.wait_stream(self.compute)
        elif ready is not None:
            self.compute.wait_event(ready)
        self.capturing = t.cuda.is_current_stream_capturing()

    def native(self) -> _abi.Streams:
        return _abi.Streams(stream=self.call.cuda_stream or None, async_=0, previous_event=None)

    def empty(self, shape, dtype, device: int):
        t = torch()
        if self._alloc_is_current:
            return t.empty(shape, dtype=dtype, device=cuda_device(device))
        with t.cuda.stream(self.alloc):
            return t.empty(shape, dtype=dtype, device=cuda_device(device))

    def on_call_stream(self):
        """A context in which torch work goes on the call's stream (no switch where it is the current one)."""
        return contextlib.nullcontext() if self._call_is_current else torch().cuda.stream(self.call)

    def copy(self, view, device: int):
        """A fresh tensor with view's content, copied on the call's stream."""
        out = self.empty(view.shape, view.dtype, device)
        if out.numel() == 0:
            return out
        with self.on_call_stream():
            out.copy_(view)
        return out

    def finish(self, tensors=()):
        """With async: the tensors are marked as used on the communication stream (not inside a graph
        capture, where the caller keeps them alive instead) and the finished event is returned."""
        if not self.async_op:
            return None
        t = torch()
        if not self.capturing:
            for tensor in tensors:
                if isinstance(tensor, t.Tensor) and tensor.is_cuda and tensor.numel() > 0:
                    tensor.record_stream(self.call)
        event = t.cuda.Event()
        event.record(self.call)
        return event
