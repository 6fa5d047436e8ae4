"""deep_ep.Buffer on epx: DeepEP V1's class, its arguments and its return tuples, over epx.HtBuffer and
epx.LlBuffer.

How the two APIs meet:
- DeepEP sizes its buffers in bytes at construction and learns the shapes at each call; epx fixes the
  shapes of a buffer when it is made. So epx makes its buffers at the first call that knows the shapes
  (HT: the first dispatch, from hidden, top-k and the expert count; LL: the first low_latency_dispatch,
  from num_max_dispatch_tokens_per_rank, hidden, top-k and num_experts), within the bytes the caller
  gave (num_nvl_bytes for HT, num_rdma_bytes for LL), and makes them again, collectively, when a later
  call needs more. That first call must not be inside a CUDA graph capture.
- HT: epx keeps every received token in its buffer (no ring), so num_nvl_bytes bounds the tokens per
  rank: the most that fit for the shapes (Buffer.ht_max_tokens_per_rank says how many once made).
- Streams: the Buffer owns a communication stream (get_comm_stream()); async_finish runs a call there
  and returns an EventOverlap to wait on, previous_event makes a call wait first, as in DeepEP.
"""

from __future__ import annotations

import operator
import sys
from typing import List, Optional, Tuple, Union

from .. import _abi
from .._torch import CallStreams, check_device, torch
from ..errors import EpxInvalidArgument
from ..ht import HtBuffer, HtHandle
from ..ll import LlBuffer, LlHandle
from ..team import Team
from .config import HT_HINT_TOKENS_ENV, Config, ht_buffer_bytes
from .utils import EventHandle, EventOverlap

# Top-k the LL buffer is made for when the call's is smaller (a later call up to it needs no new buffer;
# DeepSeek-V3's is 8).
LL_DEFAULT_TOPK = 8
HT_DEFAULT_TOPK = 8
_LL_MAX_TOPK = 16  # LlBufferOptions::max_topk's bound


class DispatchHandle:
    """What DeepEP's HT handle is for: combine and cached dispatch take it back. Public fields:
    recv_src_idx ([rows] int32, each received row's token index on its source, -1 for padding),
    num_recv_tokens (N, or None in worst-case form) and num_tokens (T dispatched by this rank).

    Indexed as DeepEP's 6-tuple where epx has the entry: [0] rank_prefix_matrix ([R, R] int32, [s][d] =
    tokens ranks 0..s send rank d), [3] recv_src_idx, [4] is_token_in_rank ([T, R] bool). [1], [2] and
    [5] (DeepEP's channel prefix matrices and send head, state of its ring buffers) have no epx
    equivalent and raise. Read the entries as any output: after the dispatch's event, if async."""

    _NOT_IN_EPX = {
        1: "channel_prefix_matrix",
        2: "recv_channel_prefix_matrix",
        5: "send_head",
    }

    def __init__(
        self,
        native: HtHandle,
        topk_idx,
        recv_src_idx,
        num_recv_tokens: Optional[int],
        is_token_in_rank,
        num_experts: int,
    ):
        self.native = native
        self.topk_idx = topk_idx  # a copy: a cached dispatch re-sends the same routing
        self.recv_src_idx = recv_src_idx
        self.num_recv_tokens = num_recv_tokens
        self.num_tokens = native.num_tokens
        self._is_token_in_rank = is_token_in_rank  # the caller's, or None until asked for
        self._num_experts = num_experts
        self._rank_prefix_matrix = None

    def __len__(self):
        return 6

    def __getitem__(self, index):
        if not isinstance(index, int) or not -6 <= index < 6:
            raise IndexError(f"epx: the HT handle has DeepEP's 6 entries; got index {index!r}")
        index %= 6
        if index in self._NOT_IN_EPX:
            raise NotImplementedError(
                f"epx: handle[{index}] is DeepEP's {self._NOT_IN_EPX[index]}, state of its ring buffers; epx has "
                "none (its handle has [0] rank_prefix_matrix, [3] recv_src_idx, [4] is_token_in_rank)"
            )
        if index == 0:
            if self._rank_prefix_matrix is None:
                self._rank_prefix_matrix = self.native.count_matrix.cumsum(0, dtype=torch().int32)
            return self._rank_prefix_matrix
        if index == 3:
            return self.recv_src_idx
        if self._is_token_in_rank is None:
            num_ranks = self.native.buffer.team.size
            self._is_token_in_rank = layout_of(self.topk_idx, self._num_experts, num_ranks)[2]
        return self._is_token_in_rank


class LowLatencyHandle(tuple):
    """DeepEP's LL handle: (src_info, layout_range, num_max_dispatch_tokens_per_rank, hidden, num_experts).

    src_info is [E_local, C] int32, the token index on its source rank, and layout_range [E_local, R] int64,
    each source rank's rows of each expert packed as in DeepEP:
    ``count = layout_range & 0xFFFFFFFF; begin = layout_range >> 32``.
    """

    def __new__(cls, items, native: LlHandle):
        handle = super().__new__(cls, items)
        handle.native = native
        return handle


def layout_of(topk_idx, num_experts: int, num_ranks: int):
    """(num_tokens_per_rank [R] int32, num_tokens_per_expert [E] int32, is_token_in_rank [T, R] bool) in
    torch, on topk_idx's device and current stream: what epx's layout kernel computes (a token naming
    one expert twice counts once; ids outside [0, E) count as -1, the dispatch reports them)."""
    t = torch()
    T = topk_idx.size(0)
    idx = topk_idx.long()
    valid = (idx >= 0) & (idx < num_experts)
    hit = t.zeros((T, num_experts + 1), dtype=t.bool, device=idx.device)  # column E collects the -1s
    hit.scatter_(1, t.where(valid, idx, t.full_like(idx, num_experts)), True)
    hit = hit[:, :num_experts]
    in_rank = hit.reshape(T, num_ranks, num_experts // num_ranks).any(2)
    return in_rank.sum(0, dtype=t.int32), hit.sum(0, dtype=t.int32), in_rank


def routing_by_rank(is_token_in_rank, experts_per_rank: int):
    """topk_idx for a dispatch routed by is_token_in_rank ([T, R] bool): column r names rank r's first
    expert where the token goes to rank r, else -1. epx sends a token once to each rank its top-k names."""
    t = torch()
    R = is_token_in_rank.size(1)
    first_experts = t.arange(R, dtype=t.int32, device=is_token_in_rank.device) * experts_per_rank
    return t.where(is_token_in_rank, first_experts, -1)


def _int(value, name: str) -> int:
    """An integer argument (Python or numpy int); floats such as 1e9 are refused, not truncated."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"epx: {name} must be an int, got {type(value).__name__}") from None


class Buffer:
    """DeepEP V1's Buffer, on epx. See the module docstring for how the two meet.

    Arguments epx accepts but does not need: num_qps_per_rank (RDMA queue pairs: epx's LL runs over
    NVLink), allow_mnnvl and use_fabric (epx uses the NVLink domain NCCL reports, multi-node NVLink
    included, and NCCL's allocator). Arguments epx cannot honour raise NotImplementedError:
    allow_nvlink_for_low_latency_mode=False (epx's LL is NVLink-only). comm (an mpi4py communicator) may
    replace group, as in DeepEP.

    enable_shrink=True (rank masking): a low-latency wait on a rank that expires masks that rank instead
    of failing, and the low_latency_*_mask_buffer calls work (include/epx/ll.hpp says what masking does).
    """

    num_sms: int = 20
    # LL combine's summation order (epx.LlBuffer.combine's `order`): "local" sums each rank's experts of a
    # token on the expert side (the weights go there at the start of the call) and sends one row back per
    # (token, rank); "naive" sends one row per (token, expert) and sums them in slot order on the home
    # rank, as DeepEP does, with up to K / R times the bytes back over NVLink.
    low_latency_combine_order: str = "local"

    def __init__(
        self,
        group=None,
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        allow_nvlink_for_low_latency_mode: bool = True,
        allow_mnnvl: bool = False,
        use_fabric: bool = False,
        explicitly_destroy: bool = False,
        enable_shrink: bool = False,
        comm=None,
    ) -> None:
        num_nvl_bytes = _int(num_nvl_bytes, "num_nvl_bytes")
        num_rdma_bytes = _int(num_rdma_bytes, "num_rdma_bytes")
        _int(num_qps_per_rank, "num_qps_per_rank")
        if num_nvl_bytes < 0 or num_rdma_bytes < 0:
            raise ValueError(f"epx: buffer sizes must be >= 0, got {num_nvl_bytes}, {num_rdma_bytes}")
        if not allow_nvlink_for_low_latency_mode:
            raise NotImplementedError(
                "epx: the low-latency mode runs over NVLink only; "
                "allow_nvlink_for_low_latency_mode=False cannot be honoured"
            )
        if group is None and comm is None:
            raise ValueError("Either 'group' or 'comm' must be provided.")
        self._team = None
        self._ht: Optional[HtBuffer] = None
        self._ll: Optional[LlBuffer] = None
        if group is not None:
            self._team = Team.from_group(group)
        else:
            self._team = Team.from_mpi(comm)
        self.group = group if group is not None else comm
        self.rank = self._team.rank
        self.group_size = self._team.size
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = bool(enable_shrink)
        self._masked_ranks = set()  # masked by the caller; applied to every LL buffer made
        self._ht_num_sms = 0
        self._last_num_experts: Optional[int] = None
        self._comm_stream = torch().cuda.Stream(device=self._team.device)

    # ---- static helpers ------------------------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled() -> bool:
        """Whether the kernels were compiled for Hopper (epx always is, for sm_90a); asks the library."""
        return "90" in _abi.lib().epx_cuda_architectures().decode()

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """The SMs (CTAs) epx's HT kernels use, for every Buffer; DeepEP's default is 20, and so is this."""
        _int(new_num_sms, "new_num_sms")
        if new_num_sms % 2 != 0:
            raise ValueError("The SM count must be even")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """An event recorded on the current stream (to pass as previous_event), as DeepEP makes it."""
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
    ) -> int:
        """num_rdma_bytes for low-latency calls of these shapes with any top-k epx takes (up to 16; DeepEP's
        hint has no top-k either). A bound, not an allocation: the LL buffer is made for the calls' top-k
        (at least LL_DEFAULT_TOPK) within it: 42 MB for 128 tokens, hidden 7168, top-8 of 256 experts on
        2 ranks, where the hint is 76 MB."""
        return LlBuffer.required_bytes(
            _int(num_ranks, "num_ranks"),
            max_tokens_per_rank=_int(num_max_dispatch_tokens_per_rank, "num_max_dispatch_tokens_per_rank"),
            hidden=_int(hidden, "hidden"),
            max_topk=_LL_MAX_TOPK,
            num_experts=_int(num_experts, "num_experts"),
        )

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        """A Config with Buffer.num_sms (epx needs no per-rank-count table: any team size works)."""
        if _int(num_ranks, "num_ranks") < 1:
            raise ValueError(f"epx: num_ranks must be >= 1, got {num_ranks}")
        return Config(Buffer.num_sms)

    get_combine_config = get_dispatch_config  # the same Config serves both

    # ---- state ---------------------------------------------------------------------------------------
    def get_comm_stream(self):
        """The stream async_finish calls run on (a torch.cuda.Stream)."""
        return self._comm_stream

    @property
    def ht_max_tokens_per_rank(self) -> int:
        """Tokens per rank the HT buffer holds (0 before the first dispatch made it)."""
        return self._ht.max_tokens_per_rank if self._ht is not None else 0

    def destroy(self) -> None:
        """Frees the buffers and the team (collective). Needs explicitly_destroy=True, as in DeepEP;
        without it they are freed when the Buffer is collected."""
        if not self.explicitly_destroy:
            raise RuntimeError("`explicitly_destroy` flag must be set")
        self._free()

    def _free(self) -> None:
        for name in ("_ll", "_ht"):
            buffer = getattr(self, name, None)
            if buffer is not None:
                setattr(self, name, None)
                buffer.destroy()
        team, self._team = getattr(self, "_team", None), None
        if team is not None:
            team.destroy()

    def __del__(self):
        if sys.is_finalizing() or getattr(self, "explicitly_destroy", True):
            return
        try:
            self._free()
        except Exception:
            pass

    def _require_team(self) -> Team:
        if self._team is None:
            raise RuntimeError("epx: this Buffer was destroyed")
        return self._team

    def _streams(self, previous_event, async_finish: bool, allocate_on_comm_stream: bool) -> CallStreams:
        if allocate_on_comm_stream and (previous_event is None or not async_finish):
            raise ValueError("allocate_on_comm_stream needs previous_event and async_finish (as in DeepEP)")
        return CallStreams(
            self._comm_stream, self._require_team().device, None, async_finish, previous_event, allocate_on_comm_stream
        )

    @staticmethod
    def _no_capture(what: str) -> None:
        if torch().cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"epx: the {what} buffer is made by the first call with these shapes, and that cannot "
                "happen inside a CUDA graph capture: run one call eagerly before capturing"
            )

    # ---- HT ------------------------------------------------------------------------------------------
    def _ht_for(self, hidden: int, topk: int, num_experts: int) -> HtBuffer:
        """The HT buffer for these shapes, made (collectively, at the same call on every rank: the shapes
        are the same everywhere) when there is none or the present one is too small."""
        current = self._ht
        if (
            current is not None
            and hidden <= current.hidden
            and topk <= current.max_topk
            and num_experts == current.num_experts
        ):
            return current
        self._no_capture("HT")
        team = self._require_team()
        if current is not None and num_experts == current.num_experts:
            hidden, topk = max(hidden, current.hidden), max(topk, current.max_topk)
        topk = max(topk, HT_DEFAULT_TOPK)
        tokens = self._ht_tokens_within(team.size, hidden, topk, num_experts)
        if tokens < 1:
            need = ht_buffer_bytes(team.size, 1, hidden, topk, num_experts)
            raise ValueError(
                f"epx: num_nvl_bytes={self.num_nvl_bytes} is too small for HT calls of hidden {hidden}, "
                f"top-{topk}, {num_experts} experts (one token per rank needs {need} bytes)"
            )
        if current is not None:
            self._ht = None
            current.destroy()
        self._ht = HtBuffer(
            team,
            max_tokens_per_rank=tokens,
            hidden=hidden,
            max_topk=topk,
            num_experts=num_experts,
            num_sms=Buffer.num_sms,
            combine_output=False,  # every combine writes into a fresh tensor
        )
        self._ht_num_sms = Buffer.num_sms
        return self._ht

    def _ht_tokens_within(self, num_ranks: int, hidden: int, topk: int, num_experts: int) -> int:
        """The most tokens per rank whose HT buffer fits in num_nvl_bytes (0 if not even one)."""

        def need(tokens: int) -> int:
            return ht_buffer_bytes(num_ranks, tokens, hidden, topk, num_experts)

        if need(1) > self.num_nvl_bytes:
            return 0
        lo, hi = 1, ((1 << 31) - 1) // num_ranks  # R * T_max must fit in int32
        while lo < hi:  # need() grows with tokens: the last that fits
            mid = (lo + hi + 1) // 2
            if need(mid) <= self.num_nvl_bytes:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _set_ht_sms(self, buffer: HtBuffer, config: Optional[Config]) -> None:
        num_sms = config.num_sms if config is not None else Buffer.num_sms
        if num_sms != self._ht_num_sms:
            buffer.num_sms = num_sms
            self._ht_num_sms = num_sms

    def get_dispatch_layout(
        self,
        topk_idx,
        num_experts: int,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """(num_tokens_per_rank [R] int32, None, num_tokens_per_expert [E] int32, is_token_in_rank [T, R] bool,
        event). epx's dispatch computes its own layout, so these are for the caller only; a token naming
        one expert twice counts once."""
        t = torch()
        team = self._require_team()
        check_device(topk_idx, "topk_idx", team.device)
        if topk_idx.dim() != 2 or topk_idx.dtype not in (t.int64, t.int32):
            raise ValueError(
                f"epx: topk_idx must be [num_tokens, num_topk] int64 (or int32), got "
                f"{topk_idx.dtype} {tuple(topk_idx.shape)}"
            )
        if _int(num_experts, "num_experts") < team.size or num_experts % team.size != 0:
            raise ValueError(
                f"epx: num_experts ({num_experts}) must be a positive multiple of the group size ({team.size})"
            )
        self._last_num_experts = num_experts
        s = self._streams(previous_event, async_finish, allocate_on_comm_stream)
        ht = self._ht
        if (
            ht is not None
            and ht.num_experts == num_experts
            and topk_idx.size(0) <= ht.max_tokens_per_rank
            and 1 <= topk_idx.size(1) <= ht.max_topk
        ):
            layout = ht.get_layout(topk_idx, streams=s)
            return (
                layout.num_tokens_per_rank,
                None,
                layout.num_tokens_per_expert,
                layout.is_token_in_rank,
                EventOverlap(layout.event),
            )
        # No HT buffer yet (its hidden size is known only at the first dispatch), or one made for other
        # shapes: the same layout in torch.
        per_rank, per_expert, in_rank = self._torch_layout(s, topk_idx, num_experts)
        return per_rank, None, per_expert, in_rank, EventOverlap(s.finish((topk_idx, per_rank, per_expert, in_rank)))

    def _torch_layout(self, s: CallStreams, topk_idx, num_experts: int):
        team = self._require_team()
        with s.on_call_stream():
            layout = layout_of(topk_idx, num_experts, team.size)
        if s.alloc is s.call:
            return list(layout)
        return [s.copy(tensor, team.device) for tensor in layout]  # owned by the allocation stream, as DeepEP's

    def dispatch(
        self,
        x: Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]],
        handle=None,
        num_tokens_per_rank=None,
        num_tokens_per_rdma_rank=None,
        is_token_in_rank=None,
        num_tokens_per_expert=None,
        topk_idx=None,
        topk_weights=None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """HT dispatch: (recv_x or (recv_x, recv_x_scales), recv_topk_idx, recv_topk_weights,
        num_recv_tokens_per_expert_list, handle, event).

        x is bf16 [T, H], or (fp8 [T, H], float32 scales [T, H/128], row- or column-major). Outputs are
        fresh tensors, as in DeepEP: epx copies them out of its buffer. recv_topk_idx holds local expert ids
        (-1 elsewhere). num_tokens_per_rank and num_tokens_per_rdma_rank are accepted and not needed, nor is
        is_token_in_rank with topk_idx (epx routes by topk_idx); num_tokens_per_expert gives the expert count
        (else the last get_dispatch_layout's). Without topk_idx (and topk_weights) the tokens go where
        is_token_in_rank says, recv_topk_idx and recv_topk_weights are None, and the list is what every
        rank's num_tokens_per_expert sends this rank (a collective over the group, as in DeepEP, whose
        ranks exchange these counts). With num_worst_tokens > 0 the outputs have that many rows (padding: src
        -1, topk_idx -1, weights 0) and the list is empty. With handle (cached dispatch) the routing is the
        handle's and the call returns (recv_x, None, None, None, None, event). The handle is a
        DispatchHandle, indexed as DeepEP's tuple where epx has the entry.
        """
        team = self._require_team()
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        check_device(x, "x", team.device)
        _int(expert_alignment, "expert_alignment")
        _int(num_worst_tokens, "num_worst_tokens")
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise ValueError("epx: a cached dispatch (handle given) takes no topk_idx or topk_weights")
            if not isinstance(handle, DispatchHandle):
                raise TypeError("epx: handle must be the one epx.deep_ep's dispatch returned")
            buffer = handle.native.buffer
            if buffer is not self._ht:
                raise RuntimeError(
                    "epx: the handle's HT buffer was replaced by a larger one since (a later dispatch "
                    "had a larger hidden size or top-k); dispatch again without the handle"
                )
            self._set_ht_sms(buffer, config)
            s = self._streams(previous_event, async_finish, allocate_on_comm_stream)
            r = buffer.dispatch(
                x,
                handle.topk_idx,
                None,
                x_scales=x_scales,
                expert_alignment=handle.native.expert_alignment,
                num_worst_tokens=num_worst_tokens,
                cached=handle.native,
                copy=True,
                streams=s,
            )
            recv_x = (r.recv_x, r.recv_x_scales) if x_scales is not None else r.recv_x
            return recv_x, None, None, None, None, EventOverlap(r.event)

        by_rank = topk_idx is None
        if by_rank:
            if topk_weights is not None:
                raise ValueError("epx: topk_weights is given without topk_idx")
            if is_token_in_rank is None or num_tokens_per_expert is None:
                raise ValueError(
                    "epx: a dispatch without topk_idx routes by is_token_in_rank and counts by "
                    "num_tokens_per_expert: pass both"
                )
            check_device(is_token_in_rank, "is_token_in_rank", team.device)
            if tuple(is_token_in_rank.shape) != (x.size(0), team.size) or is_token_in_rank.dtype != torch().bool:
                raise ValueError(
                    f"epx: is_token_in_rank must be bool [{x.size(0)}, {team.size}], got "
                    f"{is_token_in_rank.dtype} {tuple(is_token_in_rank.shape)}"
                )
            topk = team.size
        else:
            check_device(topk_idx, "topk_idx", team.device)
            if topk_idx.dim() != 2:
                raise ValueError(f"epx: topk_idx must be [num_tokens, num_topk], got {tuple(topk_idx.shape)}")
            topk = topk_idx.size(1)
        if num_tokens_per_expert is not None:
            num_experts = num_tokens_per_expert.numel()
        elif self._last_num_experts is not None:
            num_experts = self._last_num_experts
        else:
            raise ValueError(
                "epx: pass num_tokens_per_expert (from get_dispatch_layout) so that epx knows the number of experts"
            )
        buffer = self._ht_for(x.size(1), topk, num_experts)
        self._set_ht_sms(buffer, config)
        s = self._streams(previous_event, async_finish, allocate_on_comm_stream)
        if by_rank:
            with s.on_call_stream():
                topk_idx = routing_by_rank(is_token_in_rank, num_experts // team.size)
            routing = topk_idx  # fresh: cached calls may read it
        else:
            routing = s.copy(topk_idx, team.device)  # before the dispatch, in its stream order: cached calls read it
        try:
            r = buffer.dispatch(
                x,
                topk_idx,
                topk_weights,
                x_scales=x_scales,
                expert_alignment=expert_alignment,
                num_worst_tokens=num_worst_tokens,
                copy=True,
                streams=s,
            )
        except EpxInvalidArgument as e:
            # Too many tokens on this rank: the dispatch was refused on every rank (the others name this
            # one); say here how to make room.
            if x.size(0) <= buffer.max_tokens_per_rank:
                raise
            need = ht_buffer_bytes(team.size, x.size(0), buffer.hidden, buffer.max_topk, num_experts)
            raise EpxInvalidArgument(
                f"{e} (epx keeps every received token: num_nvl_bytes={self.num_nvl_bytes} holds "
                f"{buffer.max_tokens_per_rank} tokens per rank for these shapes). Make the Buffer with "
                f"num_nvl_bytes >= {need}, or, where num_nvl_bytes comes from Config.get_nvl_buffer_size_hint, "
                f"set {HT_HINT_TOKENS_ENV}={x.size(0)} or more on every rank",
                e.kind,
                e.rank,
                e.status,
            ) from e
        handle = DispatchHandle(r.handle, routing, r.recv_src_idx, r.num_recv_tokens, is_token_in_rank, num_experts)
        recv_x = (r.recv_x, r.recv_x_scales) if x_scales is not None else r.recv_x
        counts: List[int] = []
        if num_worst_tokens == 0:
            if by_rank:
                with s.on_call_stream():
                    counts = self._expert_counts_sent_here(num_tokens_per_expert, expert_alignment)
            else:
                counts = r.num_recv_tokens_per_expert_list
        recv_topk_idx = None if by_rank else r.recv_topk_idx
        recv_topk_weights = r.recv_topk_weights if topk_weights is not None else None
        return recv_x, recv_topk_idx, recv_topk_weights, counts, handle, EventOverlap(r.event)

    def _expert_counts_sent_here(self, num_tokens_per_expert, expert_alignment: int) -> List[int]:
        """Collective over the group: the tokens every rank's num_tokens_per_expert ([E]) sends this rank's
        experts, each rounded up to expert_alignment (DeepEP's list for a dispatch without topk_idx)."""
        R = self.group_size
        if isinstance(self.group, torch().distributed.ProcessGroup):
            totals = num_tokens_per_expert.to(torch().int64)  # a copy: all_reduce writes it
            torch().distributed.all_reduce(totals, group=self.group)
            sums = totals.view(R, -1)[self.rank].tolist()
        else:  # an mpi4py communicator
            every = self.group.allgather(num_tokens_per_expert.view(R, -1)[self.rank].tolist())
            sums = [sum(column) for column in zip(*every)]
        return [-(-int(n) // expert_alignment) * expert_alignment for n in sums]

    def combine(
        self,
        x,
        handle,
        topk_weights=None,
        bias=None,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """HT combine: (combined_x [T, H] bf16, combined_topk_weights [T, K] float32 or None, event).
        Sums, without weights, each token's rows from the ranks it went to (float32 accumulation), then
        adds bias: a tensor, or DeepEP's pair (bias_0 then bias_1; either may be None)."""
        if not isinstance(handle, DispatchHandle):
            raise TypeError("epx: handle must be the one epx.deep_ep's dispatch returned")
        buffer = handle.native.buffer
        if buffer is not self._ht:
            raise RuntimeError("epx: the handle's HT buffer was replaced since its dispatch")
        self._set_ht_sms(buffer, config)
        s = self._streams(previous_event, async_finish, allocate_on_comm_stream)
        r = buffer.combine(x, handle.native, topk_weights=topk_weights, bias=bias, copy=True, streams=s)
        return r.x, r.topk_weights, EventOverlap(r.event)

    # ---- LL ------------------------------------------------------------------------------------------
    def _ll_for(self, max_tokens: int, hidden: int, topk: int, num_experts: int) -> LlBuffer:
        if not self.low_latency_mode:
            raise RuntimeError("epx: low-latency calls need Buffer(..., low_latency_mode=True)")
        current = self._ll
        if (
            current is not None
            and current.max_tokens_per_rank == max_tokens
            and current.num_experts == num_experts
            and hidden <= current.hidden
            and topk <= current.max_topk
        ):
            return current
        self._no_capture("LL")
        team = self._require_team()
        if current is not None and current.max_tokens_per_rank == max_tokens and current.num_experts == num_experts:
            hidden, topk = max(hidden, current.hidden), max(topk, current.max_topk)

        def need(k: int) -> int:
            return LlBuffer.required_bytes(
                team.size, max_tokens_per_rank=max_tokens, hidden=hidden, max_topk=k, num_experts=num_experts
            )

        roomy = min(max(topk, LL_DEFAULT_TOPK), _LL_MAX_TOPK)
        topk = roomy if need(roomy) <= self.num_rdma_bytes else topk
        if need(topk) > self.num_rdma_bytes:
            raise ValueError(
                f"epx: num_rdma_bytes={self.num_rdma_bytes} is too small for low-latency calls of "
                f"{max_tokens} tokens per rank, hidden {hidden}, top-{topk}, {num_experts} experts: epx "
                f"needs {need(topk)} bytes"
            )
        if current is not None:
            self._ll = None
            current.destroy()
        self._ll = LlBuffer(
            team,
            max_tokens_per_rank=max_tokens,
            hidden=hidden,
            max_topk=topk,
            num_experts=num_experts,
            mask_on_timeout=self.enable_shrink,
        )
        for rank in sorted(self._masked_ranks):
            self._ll.set_rank_masked(rank, True)
        return self._ll

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Nothing to do in epx: its flags only grow or carry the call's stamp, so no buffer needs zeroing."""
        _int(num_max_dispatch_tokens_per_rank, "num_max_dispatch_tokens_per_rank")
        _int(hidden, "hidden")
        _int(num_experts, "num_experts")

    def low_latency_dispatch(
        self,
        x,
        topk_idx,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        cumulative_local_expert_recv_stats=None,
        dispatch_wait_recv_cost_stats=None,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
    ):
        """LL dispatch: (recv_x or (recv_x, recv_x_scales), recv_count, handle, event, hook).

        recv_x [E_local, R * T_max, H] fp8 (use_fp8) or bf16; scales [E_local, R * T_max, H / 128] float32 (or
        H / 512 int32 with use_ue8m0), per expert column-major as in DeepEP; recv_count [E_local] int32.
        Within an expert, rows come in blocks by source rank (from this rank + 1 up, wrapping, its own block
        last; layout_range says where each is), then by token. hook is None unless return_recv_hook:
        then call it (once) to receive. dispatch_wait_recv_cost_stats (int64 [R]) gets the clock cycles this
        rank's warps spent waiting for each source rank's data added (a warp that found it there adds none).
        """
        if async_finish and return_recv_hook:
            raise ValueError("async_finish and return_recv_hook cannot both be set")
        team = self._require_team()
        check_device(x, "x", team.device)
        check_device(topk_idx, "topk_idx", team.device)
        if x.dim() != 2 or topk_idx.dim() != 2:
            raise ValueError(
                f"epx: x must be [num_tokens, hidden] and topk_idx [num_tokens, num_topk], got "
                f"{tuple(x.shape)} and {tuple(topk_idx.shape)}"
            )
        max_tokens = _int(num_max_dispatch_tokens_per_rank, "num_max_dispatch_tokens_per_rank")
        _int(num_experts, "num_experts")
        buffer = self._ll_for(max_tokens, x.size(1), topk_idx.size(1), num_experts)
        s = self._streams(None, async_finish, False)
        r = buffer.dispatch(
            x,
            topk_idx,
            None,
            use_fp8=use_fp8,
            round_scale=round_scale,
            use_ue8m0=use_ue8m0,
            cumulative_recv_count=cumulative_local_expert_recv_stats,
            cumulative_wait_cycles=dispatch_wait_recv_cost_stats,
            send_only=return_recv_hook,
            streams=s,
        )
        handle = LowLatencyHandle((r.src_idx, r.layout_range, max_tokens, x.size(1), num_experts), r.handle)
        recv_x = (r.recv_x, r.recv_x_scales) if use_fp8 else r.recv_x
        kept = (
            x,
            topk_idx,
            r.recv_x,
            r.recv_x_scales,
            r.recv_count,
            r.src_idx,
            r.layout_range,
            cumulative_local_expert_recv_stats,
            dispatch_wait_recv_cost_stats,
        )
        return recv_x, r.recv_count, handle, EventOverlap(r.event, kept if async_finish else None), r.receive

    def low_latency_combine(
        self,
        x,
        topk_idx,
        topk_weights,
        handle,
        use_logfmt: bool = False,
        zero_copy: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
        out=None,
        combine_wait_recv_cost_stats=None,
    ):
        """LL combine: (combined_x [T, H] bf16, event, hook). out[t] = sum_k topk_weights[t][k] * x[expert k][row],
        float32 accumulation, in Buffer.low_latency_combine_order: by default epx's local order (the weights
        go to the expert side, which sums each rank's experts of a token before sending). topk_idx is the
        dispatch's (epx keeps the routing; its shape is checked). zero_copy is accepted: epx reads x in
        place whatever it is. combine_wait_recv_cost_stats (int64 [R]): as low_latency_dispatch's
        dispatch_wait_recv_cost_stats, per expert-side rank. use_logfmt is not supported."""
        if use_logfmt:
            raise NotImplementedError("epx: use_logfmt (LogFMT-compressed combine) is not implemented")
        if async_finish and return_recv_hook:
            raise ValueError("async_finish and return_recv_hook cannot both be set")
        if not isinstance(handle, LowLatencyHandle):
            raise TypeError("epx: handle must be the one epx.deep_ep's low_latency_dispatch returned")
        native = handle.native
        if native.buffer is not self._ll:
            raise RuntimeError("epx: the handle's LL buffer was replaced since its dispatch")
        team = self._require_team()
        check_device(topk_idx, "topk_idx", team.device)
        if tuple(topk_idx.shape) != (native.num_tokens, native.topk):
            raise ValueError(
                f"epx: topk_idx must be the dispatch's [{native.num_tokens}, {native.topk}], got "
                f"{tuple(topk_idx.shape)}"
            )
        s = self._streams(None, async_finish, False)
        r = native.buffer.combine(
            x,
            native,
            topk_weights=topk_weights,
            order=self.low_latency_combine_order,
            out=out,
            cumulative_wait_cycles=combine_wait_recv_cost_stats,
            send_only=return_recv_hook,
            streams=s,
        )
        kept = (x, topk_idx, topk_weights, handle[0], handle[1], r.out, combine_wait_recv_cost_stats)
        return r.out, EventOverlap(r.event, kept if async_finish else None), r.receive

    def get_next_low_latency_combine_buffer(self, handle):
        """[E_local, R * T_max, hidden] bf16 owned by epx, for low_latency_combine's x (zero copy). epx reads
        any x in place, so this is a convenience: the memory is allocated on the first call."""
        if not isinstance(handle, LowLatencyHandle):
            raise TypeError("epx: handle must be the one epx.deep_ep's low_latency_dispatch returned")
        buffer = handle.native.buffer
        if buffer is not self._ll:
            raise RuntimeError("epx: the handle's LL buffer was replaced since its dispatch")
        return buffer.combine_buffer()[:, :, : handle[3]]

    # ---- rank masking (shrink mode) ------------------------------------------------------------------
    # epx makes its LL buffer at the first low_latency_dispatch; the caller's masks are kept here and
    # applied to it then. Masks made by expired waits live in the LL buffer only.
    def _require_shrink(self, what: str) -> None:
        if not self.enable_shrink:
            raise RuntimeError(f"epx: {what} needs Buffer(..., enable_shrink=True)")

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False):
        """Masks (mask=True) or unmasks `rank_to_mask` for this rank's low-latency calls, on the current stream."""
        self._require_shrink("low_latency_update_mask_buffer")
        rank = _int(rank_to_mask, "rank_to_mask")
        if not 0 <= rank < self.group_size or rank == self.rank:
            raise ValueError(f"epx: rank_to_mask must be another rank in [0, {self.group_size}), got {rank}")
        if mask:
            self._masked_ranks.add(rank)
        else:
            self._masked_ranks.discard(rank)
        if self._ll is not None:
            self._ll.set_rank_masked(rank, bool(mask))

    def low_latency_query_mask_buffer(self, mask_status):
        """Writes 1 for each masked rank, else 0, into `mask_status` (int32 [num_ranks], CUDA), on the current stream."""
        self._require_shrink("low_latency_query_mask_buffer")
        t = torch()
        if self._ll is not None:
            self._ll.query_rank_mask(mask_status)
            return
        check_device(mask_status, "mask_status", self._team.device)
        known = t.tensor([int(r in self._masked_ranks) for r in range(self.group_size)], dtype=mask_status.dtype)
        mask_status.copy_(known.to(mask_status.device), non_blocking=False)

    def low_latency_clean_mask_buffer(self):
        """Unmasks every rank (see include/epx/ll.hpp for when a masked rank may come back)."""
        self._require_shrink("low_latency_clean_mask_buffer")
        self._masked_ranks.clear()
        if self._ll is not None:
            self._ll.clear_rank_mask()


__all__ = ["Buffer", "DispatchHandle", "LowLatencyHandle"]
