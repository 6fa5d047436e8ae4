"""epx.Buffer: a team with its HT buffer, its LL buffer, or both, made in one collective call."""

from __future__ import annotations

from typing import Optional

from .ht import HtBuffer, HtCombineResult, HtDispatchResult, HtHandle, HtLayout
from .ll import LlBuffer, LlCombineResult, LlDispatchResult, LlHandle
from .team import Team


class Buffer:
    """Expert-parallel exchange for one rank, from PyTorch.

    ``Buffer(group, hidden=7168, num_experts=256)`` joins the ranks of a torch.distributed process group
    (default: the world; each process has set its CUDA device) and makes the buffers:
    ``max_tokens_per_rank`` > 0 gives an HT buffer (dispatch/combine), ``ll_max_tokens_per_rank`` > 0 an
    LL buffer (ll_dispatch/ll_combine). Pass ``team`` to share one team between buffers.

    Every call takes torch tensors on the team's device and runs on the current CUDA stream, or on
    ``stream=``; ``async_op=True`` runs it on the buffer's communication stream and returns a
    torch.cuda.Event in the result (``event``) to wait on; ``previous_event=`` makes the call wait for an
    event first. HT outputs are views into the buffer (valid until the next dispatch, or combine)
    unless ``copy=True``; LL outputs are fresh tensors. See epx.HtBuffer and epx.LlBuffer.
    """

    def __init__(
        self,
        group=None,
        *,
        hidden: int,
        num_experts: int,
        max_topk: int = 8,
        max_tokens_per_rank: int = 4096,
        ll_max_tokens_per_rank: int = 0,
        num_sms: int = 0,
        ll_num_sms: int = 0,
        team: Optional[Team] = None,
        wait_timeout_ms: int = 5000,
    ):
        self._owns_team = team is None
        self.team = team if team is not None else Team.from_group(group, wait_timeout_ms=wait_timeout_ms)
        self.ht = None
        self.ll = None
        if max_tokens_per_rank > 0:
            self.ht = HtBuffer(
                self.team,
                max_tokens_per_rank=max_tokens_per_rank,
                hidden=hidden,
                max_topk=max_topk,
                num_experts=num_experts,
                num_sms=num_sms,
            )
        if ll_max_tokens_per_rank > 0:
            self.ll = LlBuffer(
                self.team,
                max_tokens_per_rank=ll_max_tokens_per_rank,
                hidden=hidden,
                max_topk=max_topk,
                num_experts=num_experts,
                num_sms=ll_num_sms,
            )

    @property
    def rank(self) -> int:
        return self.team.rank

    @property
    def size(self) -> int:
        return self.team.size

    def _ht(self) -> HtBuffer:
        if self.ht is None:
            raise RuntimeError("epx: this Buffer has no HT buffer (make it with max_tokens_per_rank > 0)")
        return self.ht

    def _ll(self) -> LlBuffer:
        if self.ll is None:
            raise RuntimeError("epx: this Buffer has no LL buffer (make it with ll_max_tokens_per_rank > 0)")
        return self.ll

    # ---- HT ------------------------------------------------------------------------------------------
    def get_layout(self, topk_idx, **kwargs) -> HtLayout:
        return self._ht().get_layout(topk_idx, **kwargs)

    def dispatch(self, x, topk_idx, topk_weights=None, **kwargs) -> HtDispatchResult:
        return self._ht().dispatch(x, topk_idx, topk_weights, **kwargs)

    def combine(self, y, handle: HtHandle, **kwargs) -> HtCombineResult:
        return self._ht().combine(y, handle, **kwargs)

    def combine_input(self, rows: int, hidden: int):
        return self._ht().combine_input(rows, hidden)

    # ---- LL ------------------------------------------------------------------------------------------
    def ll_dispatch(self, x, topk_idx, topk_weights=None, **kwargs) -> LlDispatchResult:
        return self._ll().dispatch(x, topk_idx, topk_weights, **kwargs)

    def ll_combine(self, y, handle: LlHandle, **kwargs) -> LlCombineResult:
        return self._ll().combine(y, handle, **kwargs)

    def ll_combine_buffer(self):
        return self._ll().combine_buffer()

    # ---- state ---------------------------------------------------------------------------------------
    def check_errors(self) -> None:
        """Raises what kernels recorded without a host wait; call after synchronising (say once per step)."""
        for buffer in (self.ht, self.ll):
            if buffer is not None:
                buffer.check_errors()

    def destroy(self) -> None:
        """Collective: the buffers, then the team if this Buffer made it."""
        for name in ("ll", "ht"):
            buffer = getattr(self, name)
            if buffer is not None:
                buffer.destroy()
                setattr(self, name, None)
        if self._owns_team and self.team is not None:
            self.team.destroy()

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
