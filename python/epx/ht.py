"""epx.HtBuffer: high-throughput dispatch and combine (training, prefill) with torch tensors.

The contract is include/epx/ht.hpp's; this module adds torch tensors, the current CUDA stream and torch
events. Outputs are views into the buffer (no copy): a dispatch's are valid until the next dispatch on
the buffer is enqueued, a combine's until the next combine. Pass copy=True for fresh tensors that stay
valid: a dispatch copies its outputs out of the buffer (one library call, ordered after the dispatch and
before the next call on the buffer, whatever the streams); a combine writes its sums straight into fresh
tensors (or into `out`), with no copy.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import List, Optional

from . import _abi
from ._native import BufferBase, NativeObject
from ._torch import CallStreams, as_matrix, as_optional_matrix, matrix_view, torch, torch_dtype
from .team import Team


def ht_options(
    max_tokens_per_rank: int,
    hidden: int,
    max_topk: int,
    num_experts: int,
    handle_blocks: int = 4,
    num_sms: int = 0,
    combine_output: bool = True,
) -> _abi.HtOptions:
    return _abi.HtOptions(
        max_tokens_per_rank=int(max_tokens_per_rank),
        hidden=int(hidden),
        max_topk=int(max_topk),
        num_experts=int(num_experts),
        handle_blocks=int(handle_blocks),
        num_sms=int(num_sms),
        combine_output=int(bool(combine_output)),
    )


class HtHandle(NativeObject):
    """The routing of one dispatch: combine needs it; a cached dispatch (same routing, new x) reuses it.
    Holds device memory of the buffer's handle pool until it is collected."""

    _free_call = "epx_ht_handle_release"
    _what = "handle"

    def __init__(
        self,
        native: int,
        buffer: "HtBuffer",
        num_tokens: int,
        num_rows: int,
        topk: int,
        expert_alignment: int,
        count_matrix: _abi.Tensor,
    ):
        self._native = native
        self.buffer = buffer
        self.num_tokens = num_tokens  # T: tokens this rank dispatched
        self.num_rows = num_rows  # rows this rank received (N, or num_worst_tokens)
        self.topk = topk
        self.expert_alignment = expert_alignment
        self._count_matrix = count_matrix

    @property
    def count_matrix(self):
        """[R, R] int32 on the device, in this handle's memory: [s][d] = tokens rank s sends rank d in the
        dispatch (the whole team's). A new view at each use, not one made by every dispatch (host time);
        not kept here either: the view keeps the handle alive, and a handle that kept its view would wait
        for the garbage collector's cycles before its block went back to the pool."""
        return matrix_view(self._count_matrix, self.buffer.team.device, self)


@dataclass
class HtLayout:
    num_tokens_per_rank: "torch.Tensor"  # [R] int32
    num_tokens_per_expert: "torch.Tensor"  # [E] int32
    is_token_in_rank: "torch.Tensor"  # [T, R] bool
    event: Optional["torch.cuda.Event"]  # with async_op


@dataclass
class HtDispatchResult:
    recv_x: "torch.Tensor"  # [rows, H], the dtype of x
    recv_x_scales: Optional["torch.Tensor"]  # fp8: [rows, H/128] float32, row-major
    recv_src_idx: "torch.Tensor"  # [rows] int32: index of the token on its source rank (-1: padding)
    recv_topk_idx: "torch.Tensor"  # [rows, K], local expert ids or -1
    recv_topk_weights: "torch.Tensor"  # [rows, K] float32 (0 where recv_topk_idx is -1)
    num_recv_tokens_per_expert: "torch.Tensor"  # [E_local] int32 on the device (aligned)
    num_recv_tokens_per_expert_list: Optional[List[int]]  # the same on the host; None in worst-case form
    num_recv_tokens: Optional[int]  # N; None in worst-case form (then it is only on the device)
    handle: HtHandle
    event: Optional["torch.cuda.Event"]  # with async_op


@dataclass
class HtCombineResult:
    x: "torch.Tensor"  # [T, H] bf16
    topk_weights: Optional["torch.Tensor"]  # [T, K] float32 when weights were given
    event: Optional["torch.cuda.Event"]


def _present(ref: _abi.Tensor) -> bool:
    return bool(ref.data) or ref.rows != 0 or ref.cols != 0


def bias_pair(bias):
    """combine's bias argument as (first, second): a tensor or None is the first, a pair is both."""
    if not isinstance(bias, (tuple, list)):
        return bias, None
    if len(bias) != 2:
        raise ValueError(f"epx: bias is a tensor or a pair of them (either may be None); got {len(bias)} items")
    return bias[0], bias[1]


class HtBuffer(BufferBase):
    """One rank's HT buffer (collective to make and to destroy).

    Every call takes: stream (default: the current stream), async_op (run on the buffer's communication
    stream and return a torch.cuda.Event to wait on), previous_event (an event the call waits for).
    Kernels record some errors without a host wait (worst-case form, get_layout): check_errors().
    combine_output=False makes the buffer without its own combine output (max_tokens_per_rank x hidden
    bf16): every combine then passes out= or copy=True.
    """

    _free_call = "epx_ht_buffer_destroy"
    _prefix = "epx_ht"
    _what = "HtBuffer"

    def __init__(
        self,
        team: Team,
        *,
        max_tokens_per_rank: int = 4096,
        hidden: int = 7168,
        max_topk: int = 8,
        num_experts: int = 256,
        handle_blocks: int = 4,
        num_sms: int = 0,
        combine_output: bool = True,
    ):
        options = ht_options(max_tokens_per_rank, hidden, max_topk, num_experts, handle_blocks, num_sms, combine_output)
        self._create(team, options)

    @staticmethod
    def required_bytes(
        num_ranks: int,
        *,
        max_tokens_per_rank: int = 4096,
        hidden: int = 7168,
        max_topk: int = 8,
        num_experts: int = 256,
        handle_blocks: int = 4,
        combine_output: bool = True,
    ) -> int:
        """Device bytes per rank of such a buffer (host arithmetic only; no GPU needed)."""
        options = ht_options(max_tokens_per_rank, hidden, max_topk, num_experts, handle_blocks, 0, combine_output)
        return _abi.out_size("epx_ht_required_bytes", ctypes.byref(options), int(num_ranks))

    @staticmethod
    def default_num_sms(num_ranks: int) -> int:
        return _abi.out_int("epx_ht_default_num_sms", int(num_ranks))

    # ---- calls ---------------------------------------------------------------------------------------
    def get_layout(self, topk_idx, *, streams: Optional[CallStreams] = None, **stream_args) -> HtLayout:
        """Local: tokens per rank, per expert, and which ranks each token goes to."""
        t = torch()
        s = streams or self.streams(**stream_args)
        device = self.team.device
        ref = as_matrix(topk_idx, "topk_idx", device)
        R = self.team.size
        per_rank = s.empty((R,), t.int32, device)
        per_expert = s.empty((self.num_experts,), t.int32, device)
        in_rank = s.empty((topk_idx.size(0), R), t.bool, device)
        out = _abi.HtLayout(per_rank.data_ptr(), per_expert.data_ptr(), in_rank.data_ptr() or None)
        native_streams = s.native()
        _abi.call(
            "epx_ht_get_layout",
            self._require(),
            ctypes.byref(ref),
            ctypes.byref(out),
            ctypes.byref(native_streams),
            None,
        )
        event = s.finish((topk_idx, per_rank, per_expert, in_rank))
        return HtLayout(per_rank, per_expert, in_rank, event)

    def dispatch(
        self,
        x,
        topk_idx,
        topk_weights=None,
        *,
        x_scales=None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        cached: Optional[HtHandle] = None,
        copy: bool = False,
        streams: Optional[CallStreams] = None,
        **stream_args,
    ) -> HtDispatchResult:
        """Collective. Exact form (the default: returns once N is known), worst-case form
        (num_worst_tokens > 0: no host wait, graph-capturable, rows N.. are padding), or cached form
        (cached = an earlier dispatch's handle, same routing: skips the count exchange)."""
        s = streams or self.streams(**stream_args)
        device = self.team.device
        args = _abi.HtDispatchArgs(
            x=as_matrix(x, "x", device),
            x_scales=as_optional_matrix(x_scales, "x_scales", device),
            topk_idx=as_matrix(topk_idx, "topk_idx", device),
            topk_weights=as_optional_matrix(topk_weights, "topk_weights", device),
            expert_alignment=int(expert_alignment),
            num_worst_tokens=int(num_worst_tokens),
            cached=cached._native if cached is not None else None,
        )
        if cached is not None and cached.buffer is not self:
            raise ValueError("epx: the cached handle comes from another HtBuffer")
        E_local = self.num_experts // self.team.size
        host_counts = (ctypes.c_int32 * max(E_local, 1))()
        result = _abi.HtDispatchResult(num_recv_tokens_per_expert_host=host_counts)
        native_streams = s.native()
        _abi.call(
            "epx_ht_dispatch", self._require(), ctypes.byref(args), ctypes.byref(native_streams), ctypes.byref(result)
        )
        handle = HtHandle(
            result.handle,
            self,
            x.size(0),
            result.num_rows,
            topk_idx.size(1),
            int(expert_alignment),
            _abi.Tensor.from_buffer_copy(result.count_matrix),
        )
        outputs = self._copied_outputs(result, s) if copy else self._output_views(result, handle)
        recv_src_idx = outputs["recv_src_idx"]
        dispatched = HtDispatchResult(
            recv_x=outputs["recv_x"],
            recv_x_scales=outputs["recv_x_scales"],
            recv_src_idx=recv_src_idx.reshape(-1) if recv_src_idx is not None else None,
            recv_topk_idx=outputs["recv_topk_idx"],
            recv_topk_weights=outputs["recv_topk_weights"],
            num_recv_tokens_per_expert=outputs["num_recv_tokens_per_expert"].reshape(-1),
            num_recv_tokens_per_expert_list=(
                host_counts[:E_local] if result.num_recv_tokens_per_expert_host_valid else None
            ),
            num_recv_tokens=int(result.num_recv_tokens) if result.num_recv_tokens >= 0 else None,
            handle=handle,
            event=None,
        )
        dispatched.event = s.finish(
            (
                x,
                x_scales,
                topk_idx,
                topk_weights,
                dispatched.recv_x,
                dispatched.recv_x_scales,
                dispatched.recv_src_idx,
                dispatched.recv_topk_idx,
                dispatched.recv_topk_weights,
                dispatched.num_recv_tokens_per_expert,
            )
        )
        return dispatched

    def _output_views(self, result: _abi.HtDispatchResult, handle: HtHandle) -> dict:
        """The dispatch's outputs as views of the buffer (None where absent). The device counts live in the
        handle's block of the pool: their view keeps the handle alive."""
        device = self.team.device
        views = {}
        for name in _abi.HT_DISPATCH_OUTPUTS:
            ref = getattr(result, name)
            owner = handle if name == "num_recv_tokens_per_expert" else self
            views[name] = matrix_view(ref, device, owner) if _present(ref) else None
        return views

    def _copied_outputs(self, result: _abi.HtDispatchResult, s: CallStreams) -> dict:
        """The dispatch's outputs as fresh tensors (None where absent), filled by one library call that is
        ordered after the dispatch and before the next call on the buffer."""
        device = self.team.device
        fresh, refs = {}, {}
        for name in _abi.HT_DISPATCH_OUTPUTS:
            ref = getattr(result, name)
            if not _present(ref):
                fresh[name] = None
                continue
            tensor = s.empty((ref.rows, ref.cols), torch_dtype(ref.dtype), device)
            fresh[name] = tensor
            refs[name] = _abi.Tensor(
                data=tensor.data_ptr() or None,
                dtype=ref.dtype,
                rows=ref.rows,
                cols=ref.cols,
                row_stride=ref.cols,
                col_stride=1,
            )
        copies = _abi.HtDispatchCopies(**refs)
        native_streams = s.native()
        _abi.call(
            "epx_ht_copy_dispatch_outputs", self._require(), ctypes.byref(copies), ctypes.byref(native_streams), None
        )
        return fresh

    def combine(
        self,
        y,
        handle: HtHandle,
        *,
        topk_weights=None,
        bias=None,
        out=None,
        out_weights=None,
        copy: bool = False,
        streams: Optional[CallStreams] = None,
        **stream_args,
    ) -> HtCombineResult:
        """Collective: x[t] = sum over the ranks that received token t of y's row for it (+ bias).

        bias: a [T, H] bf16 tensor, or DeepEP's pair of them (either may be None), added in that order.
        x goes into `out` ([T, H] bf16, contiguous) when given, else into a fresh tensor with copy=True,
        else into the buffer (a view, valid until the next combine). The weights' sums likewise
        (out_weights, [T, K] float32)."""
        if not isinstance(handle, HtHandle) or handle.buffer is not self:
            raise ValueError("epx: combine needs the HtHandle of a dispatch on this buffer")
        t = torch()
        s = streams or self.streams(**stream_args)
        device = self.team.device
        y_ref = as_matrix(y, "y", device)
        first_bias, second_bias = bias_pair(bias)
        if copy and out is None:
            out = s.empty((handle.num_tokens, y_ref.cols), t.bfloat16, device)
        if copy and out_weights is None and topk_weights is not None:
            out_weights = s.empty((handle.num_tokens, handle.topk), t.float32, device)
        args = _abi.HtCombineArgs(
            y=y_ref,
            topk_weights=as_optional_matrix(topk_weights, "topk_weights", device),
            bias=as_optional_matrix(first_bias, "bias", device),
            handle=handle._native,
            out=as_optional_matrix(out, "out", device),
            out_weights=as_optional_matrix(out_weights, "out_weights", device),
            second_bias=as_optional_matrix(second_bias, "bias[1]", device),
        )
        result = _abi.HtCombineResult()
        native_streams = s.native()
        _abi.call(
            "epx_ht_combine", self._require(), ctypes.byref(args), ctypes.byref(native_streams), ctypes.byref(result)
        )
        x = out if out is not None else matrix_view(result.x, device, self)
        weights = None
        if topk_weights is not None:
            weights = out_weights if out_weights is not None else matrix_view(result.topk_weights, device, self)
        event = s.finish((y, topk_weights, first_bias, second_bias, x, weights))
        return HtCombineResult(x, weights, event)

    def combine_input(self, rows: int, hidden: int):
        """[rows, hidden] bf16 in the buffer where combine reads y: writing y here saves combine a copy
        (write it only after the previous combine on this buffer, in stream order)."""
        ref = _abi.Tensor()
        _abi.call("epx_ht_combine_input", self._require(), int(rows), int(hidden), ctypes.byref(ref))
        return matrix_view(ref, self.team.device, self)

    def combine_input_weights(self, rows: int, topk: int):
        ref = _abi.Tensor()
        _abi.call("epx_ht_combine_input_weights", self._require(), int(rows), int(topk), ctypes.byref(ref))
        return matrix_view(ref, self.team.device, self)
