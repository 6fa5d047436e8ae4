"""epx.LlBuffer: low-latency dispatch and combine (decode) with torch tensors.

The contract is include/epx/ll.hpp's. Shapes are fixed when the buffer is made (C = R * T_max rows per
local expert); no call waits on the host, and dispatch + combine can be captured in a CUDA graph.
Dispatch outputs are fresh tensors (the library writes straight into them); combine reads y in place.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Optional

from . import _abi
from ._native import BufferBase, NativeObject
from ._torch import CallStreams, as_matrix, as_optional_matrix, check_device, device_view, torch
from .team import Team

_ORDERS = {"local": _abi.LL_COMBINE_LOCAL, "naive": _abi.LL_COMBINE_NAIVE}


def _counter_ptr(tensor, name: str, dtype, size: int, device: int) -> Optional[int]:
    """The address of an optional 1-D counter tensor the library adds to, after checking it."""
    if tensor is None:
        return None
    check_device(tensor, name, device)
    if tensor.dtype != dtype or tensor.dim() != 1 or tensor.numel() != size or not tensor.is_contiguous():
        raise ValueError(
            f"epx: {name} must be a contiguous {dtype} [{size}], got {tensor.dtype} {tuple(tensor.shape)}"
        )
    return tensor.data_ptr()


def ll_options(
    max_tokens_per_rank: int,
    hidden: int,
    max_topk: int,
    num_experts: int,
    num_sms: int = 0,
    mask_on_timeout: bool = False,
) -> _abi.LlOptions:
    return _abi.LlOptions(
        max_tokens_per_rank=int(max_tokens_per_rank),
        hidden=int(hidden),
        max_topk=int(max_topk),
        num_experts=int(num_experts),
        num_sms=int(num_sms),
        mask_on_timeout=int(bool(mask_on_timeout)),
    )


class LlReceive(NativeObject):
    """The receive step of a send_only call: call it exactly once, before the call of the same kind two
    calls later. It launches on the stream the call ran on."""

    _free_call = "epx_ll_receive_release"
    _what = "receive step"

    def __init__(self, native: int, keep=()):
        self._native = native
        self._keep = keep  # the call's tensors, alive until the step has run

    def __call__(self) -> None:
        _abi.call("epx_ll_receive_run", self._require())
        self._keep = ()


class LlHandle:
    """What combine needs to know of a dispatch (its routing stays on the device). Valid for combine
    until the dispatch two calls later on the same buffer."""

    def __init__(self, native: _abi.LlHandle, buffer: "LlBuffer"):
        self.native = native
        self.buffer = buffer
        self.num_tokens, self.topk, self.hidden = native.num_tokens, native.topk, native.hidden
        self.has_weights = bool(native.has_weights)


@dataclass
class LlDispatchResult:
    recv_x: "torch.Tensor"  # [E_local, C, H] float8_e4m3fn (use_fp8) or bfloat16
    recv_x_scales: Optional[
        "torch.Tensor"
    ]  # use_fp8: [E_local, C, H/128] float32, or [E_local, C, H/512] int32 (UE8M0)
    recv_count: "torch.Tensor"  # [E_local] int32: rows [0, recv_count[e]) of expert e are valid
    src_idx: "torch.Tensor"  # [E_local, C] int32: each row's token index on its source rank
    layout_range: "torch.Tensor"  # [E_local, R] int64: per (expert, source) LlRange {int32 count, int32 begin},
    # as in DeepEP: count = layout_range & 0xFFFFFFFF, begin = layout_range >> 32
    handle: LlHandle
    event: Optional["torch.cuda.Event"]
    receive: Optional[LlReceive]  # with send_only


@dataclass
class LlCombineResult:
    out: "torch.Tensor"  # [T, H] bf16
    event: Optional["torch.cuda.Event"]
    receive: Optional[LlReceive]


class LlBuffer(BufferBase):
    """One rank's LL buffer (collective to make and to destroy). Calls take stream, async_op and
    previous_event as HtBuffer's do.

    Rank masking (include/epx/ll.hpp): set_rank_masked, query_rank_mask and clear_rank_mask run on the
    current stream (or `stream`); with mask_on_timeout=True a wait on a peer that expires masks the peer
    instead of failing the team."""

    _free_call = "epx_ll_buffer_destroy"
    _prefix = "epx_ll"
    _what = "LlBuffer"

    def __init__(
        self,
        team: Team,
        *,
        max_tokens_per_rank: int = 128,
        hidden: int = 7168,
        max_topk: int = 8,
        num_experts: int = 256,
        num_sms: int = 0,
        mask_on_timeout: bool = False,
    ):
        options = ll_options(max_tokens_per_rank, hidden, max_topk, num_experts, num_sms, mask_on_timeout)
        self.mask_on_timeout = bool(mask_on_timeout)
        self._create(team, options)
        self.num_local_experts = num_experts // team.size
        self.rows_per_expert = team.size * max_tokens_per_rank  # C
        self._checked_sizes = set()

    @staticmethod
    def required_bytes(
        num_ranks: int, *, max_tokens_per_rank: int = 128, hidden: int = 7168, max_topk: int = 8, num_experts: int = 256
    ) -> int:
        """Device bytes per rank of such a buffer, before combine_buffer() (host arithmetic only)."""
        options = ll_options(max_tokens_per_rank, hidden, max_topk, num_experts)
        return _abi.out_size("epx_ll_required_bytes", ctypes.byref(options), int(num_ranks))

    def output_bytes(self, use_fp8: bool, use_ue8m0: bool = False, hidden: int = 0) -> dict:
        out = _abi.LlOutputBytes()
        _abi.call("epx_ll_output_sizes", self._require(), int(use_fp8), int(use_ue8m0), int(hidden), ctypes.byref(out))
        return {name: getattr(out, name) for name in ("x", "scales", "recv_count", "src_idx", "layout_range")}

    # ---- rank masking --------------------------------------------------------------------------------
    def _stream_handle(self, stream) -> Optional[int]:
        t = torch()
        return (stream if stream is not None else t.cuda.current_stream(self.team.device)).cuda_stream or None

    def set_rank_masked(self, rank: int, masked: bool = True, *, stream=None) -> None:
        """Stops (or, with masked=False, resumes) exchanging with `rank` on this rank; see ll.hpp."""
        _abi.call("epx_ll_set_rank_masked", self._require(), int(rank), int(bool(masked)), self._stream_handle(stream))

    def query_rank_mask(self, out=None, *, stream=None):
        """int32 [R] on the device: 1 for a masked rank. Written into `out` when given."""
        t = torch()
        R = self.team.size
        if out is None:
            out = t.empty(R, dtype=t.int32, device=f"cuda:{self.team.device}")
        check_device(out, "out", self.team.device)
        if out.dtype != t.int32 or tuple(out.shape) != (R,) or not out.is_contiguous():
            raise ValueError(f"epx: out must be a contiguous int32 tensor of shape ({R},), got {out.dtype} {tuple(out.shape)}")
        _abi.call("epx_ll_query_rank_mask", self._require(), out.data_ptr(), self._stream_handle(stream))
        return out

    def clear_rank_mask(self, *, stream=None) -> None:
        """Unmasks every rank (see ll.hpp for when a rank may come back)."""
        _abi.call("epx_ll_clear_rank_mask", self._require(), self._stream_handle(stream))

    # ---- calls ---------------------------------------------------------------------------------------
    def allocate_outputs(
        self, s: CallStreams, hidden: int, use_fp8: bool, use_ue8m0: bool, scales_column_major: bool = True
    ):
        """Fresh dispatch outputs. Scales per expert column-major by default (DeepEP's layout, what TMA
        loads of FP8 GEMMs want): [E_local, C, G] with strides (C * G, 1, C)."""
        t = torch()
        device = self.team.device
        E, C, R = self.num_local_experts, self.rows_per_expert, self.team.size
        x = s.empty((E, C, hidden), t.float8_e4m3fn if use_fp8 else t.bfloat16, device)
        scales = None
        if use_fp8:
            groups, dtype = (hidden // 512, t.int32) if use_ue8m0 else (hidden // 128, t.float32)
            if scales_column_major:
                scales = s.empty((E, groups, C), dtype, device).transpose(1, 2)
            else:
                scales = s.empty((E, C, groups), dtype, device)
        recv_count = s.empty((E,), t.int32, device)
        src_idx = s.empty((E, C), t.int32, device)
        layout_range = s.empty((E, R), t.int64, device)  # LlRange {int32 count, int32 begin} per entry
        key = (hidden, use_fp8, use_ue8m0)
        if key not in self._checked_sizes:  # the allocations above follow ll.hpp; confirm with the library once
            need = self.output_bytes(use_fp8, use_ue8m0, hidden)
            got = {"x": x, "recv_count": recv_count, "src_idx": src_idx, "layout_range": layout_range}
            if scales is not None:
                got["scales"] = scales
            for name, tensor in got.items():
                if tensor.numel() * tensor.element_size() < need[name]:
                    raise RuntimeError(
                        f"epx: internal: {name} of {tensor.numel() * tensor.element_size()} bytes, "
                        f"the library needs {need[name]}"
                    )
            self._checked_sizes.add(key)
        return x, scales, recv_count, src_idx, layout_range

    def dispatch(
        self,
        x,
        topk_idx,
        topk_weights=None,
        *,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        scales_column_major: bool = True,
        cumulative_recv_count=None,
        cumulative_wait_cycles=None,
        send_only: bool = False,
        streams: Optional[CallStreams] = None,
        **stream_args,
    ) -> LlDispatchResult:
        """Collective. With topk_weights the weights travel with the tokens; without them, combine takes
        them (in either order). cumulative_recv_count (int32 [E_local]) gets each call's receive counts
        added; cumulative_wait_cycles (int64 [R]) the clock cycles this rank's warps waited for each
        source rank's data."""
        s = streams or self.streams(**stream_args)
        if send_only and s.async_op:
            raise ValueError(
                "epx: send_only (a receive hook) and async_op cannot be combined: the receive step "
                "runs on the stream of the sends"
            )
        device = self.team.device
        x_ref = as_matrix(x, "x", device)
        topk_ref = as_matrix(topk_idx, "topk_idx", device)
        weights_ref = as_optional_matrix(topk_weights, "topk_weights", device)
        recv_count_ptr = _counter_ptr(
            cumulative_recv_count, "cumulative_recv_count", torch().int32, self.num_local_experts, device
        )
        wait_cycles_ptr = _counter_ptr(cumulative_wait_cycles, "cumulative_wait_cycles", torch().int64, self.team.size, device)
        recv_x, scales, recv_count, src_idx, layout_range = self.allocate_outputs(
            s, x.size(1), use_fp8, use_ue8m0, scales_column_major
        )
        layout = _abi.LlScalesLayout()
        if scales is not None:
            layout = _abi.LlScalesLayout(*scales.stride())
        args = _abi.LlDispatchArgs(
            x=x_ref,
            topk_idx=topk_ref,
            topk_weights=weights_ref,
            use_fp8=int(use_fp8),
            round_scale=int(round_scale),
            use_ue8m0=int(use_ue8m0),
            send_only=int(send_only),
            out=_abi.LlDispatchOutputs(
                recv_x.data_ptr(),
                scales.data_ptr() if scales is not None else None,
                layout,
                recv_count.data_ptr(),
                src_idx.data_ptr(),
                layout_range.data_ptr(),
            ),
            cumulative_recv_count=recv_count_ptr,
            cumulative_wait_cycles=wait_cycles_ptr,
        )
        result = _abi.LlDispatchResult()
        native_streams = s.native()
        _abi.call(
            "epx_ll_dispatch", self._require(), ctypes.byref(args), ctypes.byref(native_streams), ctypes.byref(result)
        )
        tensors = (
            x,
            topk_idx,
            topk_weights,
            recv_x,
            scales,
            recv_count,
            src_idx,
            layout_range,
            cumulative_recv_count,
            cumulative_wait_cycles,
        )
        handle = LlHandle(_abi.LlHandle.from_buffer_copy(result.handle), self)
        receive = LlReceive(result.receive, tensors) if result.receive else None
        event = s.finish(tensors)
        return LlDispatchResult(recv_x, scales, recv_count, src_idx, layout_range, handle, event, receive)

    def _y_ref(self, y, device: int) -> _abi.Tensor:
        """y as [E_local * C][H]: a [E_local, C, H] tensor whose experts follow each other row by row,
        or the 2-D form itself."""
        check_device(y, "y", device)
        if y.dim() == 2:
            return as_matrix(y, "y", device)
        if y.dim() != 3 or y.size(0) * y.size(1) != self.num_local_experts * self.rows_per_expert:
            raise ValueError(
                f"epx: y must be [E_local={self.num_local_experts}, C={self.rows_per_expert}, H] (or "
                f"[E_local * C, H]), got {tuple(y.shape)}"
            )
        if y.size(0) > 1 and y.stride(0) != y.size(1) * y.stride(1):
            raise ValueError(
                f"epx: y's experts must follow each other in memory (stride(0) == size(1) * "
                f"stride(1)), got strides {y.stride()}"
            )
        flat = as_matrix(y[0], "y", device)
        flat.rows = y.size(0) * y.size(1)
        return flat

    def combine(
        self,
        y,
        handle: LlHandle,
        *,
        topk_weights=None,
        order: str = "local",
        out=None,
        cumulative_wait_cycles=None,
        send_only: bool = False,
        streams: Optional[CallStreams] = None,
        **stream_args,
    ) -> LlCombineResult:
        """Collective: out[t] = sum_k w[t][k] * y[expert k][row of (t, k)], float32 accumulation, bf16.
        order "local" sums each rank's experts on the expert side, with the weights given to dispatch, or,
        when that dispatch had none, with topk_weights given here (they go to the expert side first);
        "naive" uses topk_weights given here, bit-identical to the plain per-expert order.
        cumulative_wait_cycles (int64 [R]) gets the clock cycles this rank's warps waited for each rank's
        data added."""
        if not isinstance(handle, LlHandle) or handle.buffer is not self:
            raise ValueError("epx: combine needs the LlHandle of a dispatch on this buffer")
        if order not in _ORDERS:
            raise ValueError(f"epx: order must be 'local' or 'naive', got {order!r}")
        s = streams or self.streams(**stream_args)
        if send_only and s.async_op:
            raise ValueError("epx: send_only (a receive hook) and async_op cannot be combined")
        device = self.team.device
        y_ref = self._y_ref(y, device)
        if out is None:
            out = s.empty((handle.num_tokens, y_ref.cols), torch().bfloat16, device)
        args = _abi.LlCombineArgs(
            y=y_ref,
            topk_weights=as_optional_matrix(topk_weights, "topk_weights", device),
            handle=handle.native,
            order=_ORDERS[order],
            send_only=int(send_only),
            out=as_matrix(out, "out", device),
            cumulative_wait_cycles=_counter_ptr(
                cumulative_wait_cycles, "cumulative_wait_cycles", torch().int64, self.team.size, device
            ),
        )
        result = _abi.LlCombineResult()
        native_streams = s.native()
        _abi.call(
            "epx_ll_combine", self._require(), ctypes.byref(args), ctypes.byref(native_streams), ctypes.byref(result)
        )
        tensors = (y, topk_weights, out, cumulative_wait_cycles)
        receive = LlReceive(result.receive, tensors) if result.receive else None
        return LlCombineResult(out, s.finish(tensors), receive)

    def combine_buffer(self):
        """[E_local, C, H_max] bf16 owned by the buffer (allocated on the first call), a place for y."""
        ref = _abi.Tensor()
        _abi.call("epx_ll_combine_buffer", self._require(), ctypes.byref(ref))
        E, C = self.num_local_experts, self.rows_per_expert
        return device_view(
            ref.data,
            ref.dtype,
            (E, C, ref.cols),
            (C * ref.row_stride, ref.row_stride, ref.col_stride),
            self.team.device,
            self,
        )
