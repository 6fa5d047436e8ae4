"""Config: DeepEP's per-call tuning record. epx reads num_sms from it; the chunk sizes tune DeepEP's
ring buffers, which epx does not have, and are kept only so that code which builds or reads a Config
works unchanged. Its size hints are epx's."""

from __future__ import annotations

import os

# The HT size hint is for this many tokens per rank, top-8, and up to HT_HINT_EXPERTS experts (or 128 a
# rank, where that is more): epx keeps every received token, so its HT buffer grows with the tokens per
# rank, which DeepEP's hint does not take. The expert count costs little (~72 bytes an expert at 4096
# tokens), so the hint covers every common model's at every team size (sized for 128 experts a rank only,
# it held 4095 tokens of a 384-expert model at EP=2). To dispatch more tokens, pass more bytes
# (epx.HtBuffer.required_bytes), or, where the code sizes its Buffer with this hint (as Megatron-LM does),
# set EPX_HT_HINT_TOKENS_PER_RANK to the most tokens a rank dispatches.
HT_HINT_TOKENS_PER_RANK = 4096
HT_HINT_TOKENS_ENV = "EPX_HT_HINT_TOKENS_PER_RANK"
HT_HINT_TOPK = 8
HT_HINT_EXPERTS = 1024
HT_HINT_EXPERTS_PER_RANK = 128


def ht_buffer_bytes(num_ranks: int, tokens: int, hidden: int, topk: int, num_experts: int) -> int:
    """Bytes per rank of the HT buffer Buffer makes for these shapes. Its combines write into fresh
    tensors, so it has no combine output of its own (epx.HtBuffer's combine_output=False)."""
    from ..ht import HtBuffer

    return HtBuffer.required_bytes(
        int(num_ranks),
        max_tokens_per_rank=tokens,
        hidden=hidden,
        max_topk=topk,
        num_experts=num_experts,
        combine_output=False,
    )


def hint_tokens_per_rank() -> int:
    """The tokens per rank the HT hint is sized for: EPX_HT_HINT_TOKENS_PER_RANK where set, else
    HT_HINT_TOKENS_PER_RANK."""
    value = os.environ.get(HT_HINT_TOKENS_ENV)
    if value is None:
        return HT_HINT_TOKENS_PER_RANK
    try:
        tokens = int(value)
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise ValueError(f"epx: {HT_HINT_TOKENS_ENV} must be a positive integer, got {value!r}")
    return tokens


def hint_experts(num_ranks: int) -> int:
    """The expert count the HT hint is sized for: at least HT_HINT_EXPERTS (made a multiple of the ranks)
    and HT_HINT_EXPERTS_PER_RANK a rank."""
    return max(num_ranks * HT_HINT_EXPERTS_PER_RANK, -(-HT_HINT_EXPERTS // num_ranks) * num_ranks)


class Config:
    def __init__(
        self,
        num_sms: int = 20,
        num_max_nvl_chunked_send_tokens: int = 6,
        num_max_nvl_chunked_recv_tokens: int = 256,
        num_max_rdma_chunked_send_tokens: int = 6,
        num_max_rdma_chunked_recv_tokens: int = 256,
    ) -> None:
        if int(num_sms) < 1:
            raise ValueError(f"epx: Config.num_sms must be >= 1, got {num_sms}")
        self.num_sms = int(num_sms)
        self.num_max_nvl_chunked_send_tokens = int(num_max_nvl_chunked_send_tokens)
        self.num_max_nvl_chunked_recv_tokens = int(num_max_nvl_chunked_recv_tokens)
        self.num_max_rdma_chunked_send_tokens = int(num_max_rdma_chunked_send_tokens)
        self.num_max_rdma_chunked_recv_tokens = int(num_max_rdma_chunked_recv_tokens)

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Bytes of num_nvl_bytes for HT calls of hidden_bytes per token (hidden * 2 for BF16), sized for
        hint_tokens_per_rank() tokens per rank, top-HT_HINT_TOPK, hint_experts(num_ranks) experts (see above)."""
        if int(hidden_bytes) <= 0 or int(num_ranks) < 1:
            raise ValueError(f"epx: need hidden_bytes > 0 and num_ranks >= 1, got {hidden_bytes}, {num_ranks}")
        hidden = -(-int(hidden_bytes) // 2)  # BF16 elements, the widest payload epx moves
        hidden = -(-hidden // 128) * 128
        return ht_buffer_bytes(
            int(num_ranks), hint_tokens_per_rank(), hidden, HT_HINT_TOPK, hint_experts(int(num_ranks))
        )

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """0: epx's HT mode needs no RDMA buffer (it runs within one NVLink domain)."""
        return 0

    def __repr__(self) -> str:
        return (
            f"Config(num_sms={self.num_sms}, nvl_chunks=({self.num_max_nvl_chunked_send_tokens}, "
            f"{self.num_max_nvl_chunked_recv_tokens}), rdma_chunks=({self.num_max_rdma_chunked_send_tokens}, "
            f"{self.num_max_rdma_chunked_recv_tokens}))"
        )
