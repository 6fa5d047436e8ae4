"""The Python side of the C ABI's objects: one owner class, and what the HT and LL buffers share."""

from __future__ import annotations

import ctypes
import sys

from . import _abi
from ._torch import CallStreams, torch


class NativeObject:
    """Owns one object of the C ABI, freed by the function `_free_call` names. For teams and buffers that
    is collective: call destroy() on every rank at the same point; collection does it too, except at
    interpreter exit, where no order between ranks can be kept (the process's end frees everything)."""

    _free_call = ""
    _what = "object"
    _native = None

    def _require(self) -> int:
        if not self._native:
            raise RuntimeError(f"epx: this {self._what} was destroyed")
        return self._native

    def destroy(self) -> None:
        native, self._native = self._native, None
        if native:
            _abi.call(self._free_call, native)

    def __del__(self):
        if sys.is_finalizing():
            return
        try:
            self.destroy()
        except Exception:
            pass


class BufferBase(NativeObject):
    """What HtBuffer and LlBuffer share: their size, SM count, communication stream and error report.
    `_prefix` is the C ABI's ("epx_ht" or "epx_ll"); subclasses make the native buffer with _create."""

    _prefix = ""
    _comm_stream = None

    def _create(self, team, options) -> None:
        """Collective: makes the native buffer from `options` (the ABI struct) and keeps its shape."""
        self.team = team
        self.max_tokens_per_rank, self.hidden = options.max_tokens_per_rank, options.hidden
        self.max_topk, self.num_experts = options.max_topk, options.num_experts
        native = ctypes.c_void_p()
        _abi.call(f"{self._prefix}_buffer_create", team._require(), ctypes.byref(options), ctypes.byref(native))
        self._native = native.value

    @property
    def buffer_bytes(self) -> int:
        """Device memory this buffer holds on this rank."""
        return _abi.out_size(f"{self._prefix}_buffer_bytes", self._require())

    @property
    def num_sms(self) -> int:
        """CTAs of the buffer's kernels."""
        return _abi.out_int(f"{self._prefix}_get_num_sms", self._require())

    @num_sms.setter
    def num_sms(self, value: int) -> None:
        _abi.call(f"{self._prefix}_set_num_sms", self._require(), int(value))

    @property
    def comm_stream(self):
        """The stream async calls run on (a torch.cuda.Stream, made on first use)."""
        if self._comm_stream is None:
            self._comm_stream = torch().cuda.Stream(device=self.team.device)
        return self._comm_stream

    def streams(self, stream=None, async_op=False, previous_event=None, allocate_on_comm_stream=False) -> CallStreams:
        return CallStreams(
            self.comm_stream if async_op else None,
            self.team.device,
            stream,
            async_op,
            previous_event,
            allocate_on_comm_stream,
        )

    def check_errors(self) -> None:
        """Raises what kernels recorded without a host wait (an invalid expert id, an expired wait, a
        worst-case dispatch that overflowed): call after synchronising the call's streams, say once a step."""
        _abi.call(f"{self._prefix}_check_errors", self._require())
