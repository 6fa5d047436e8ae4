"""Buffer sizes and DeepEP's size hints (host arithmetic: no GPU)."""

import pytest

import epx
from epx import deep_ep
from epx.deep_ep.buffer import Buffer as DeepEpBuffer


def ht_bytes(R, T, H=7168, K=8, E=256, combine_output=True):
    return epx.HtBuffer.required_bytes(
        R, max_tokens_per_rank=T, hidden=H, max_topk=K, num_experts=E, combine_output=combine_output
    )


def test_ht_bytes_per_token_worked_by_hand():
    # Per token a rank may receive (R of them per token slot): x row 2H (BF16, the widest), scales
    # 4 * H/128, src_idx 4, topk_idx 8K, weights 4K; the combine input again 2H and 4K. Per token it
    # sends: the combine output 2H and its weights 4K (private). With T a multiple of 256 every array
    # stays a multiple of the 128-byte alignment, so the difference is exact. Per started tile of 256
    # tokens, the layout kernel's scratch (private): 8 bytes per rank and 4 per expert.
    R, H, K, E = 2, 7168, 8, 256
    per_token = R * (2 * H + 4 * H // 128 + 4 + 8 * K + 4 * K + 2 * H + 4 * K) + (2 * H + 4 * K)
    assert per_token == 72424
    per_layout_tile = 8 * R + 4 * E
    assert ht_bytes(R, 4096 + 256) - ht_bytes(R, 4096) == 256 * per_token + per_layout_tile
    assert ht_bytes(R, 4096 + 512) - ht_bytes(R, 4096 + 256) == 256 * per_token + per_layout_tile
    # Without its own combine output (the caller gives combine an `out`), 2H less per token.
    assert ht_bytes(R, 4096) - ht_bytes(R, 4096, combine_output=False) == 4096 * 2 * H


def test_ht_bytes_grow_with_ranks_tokens_hidden():
    assert ht_bytes(2, 4096) < ht_bytes(4, 4096) < ht_bytes(8, 4096)
    assert ht_bytes(2, 1024) < ht_bytes(2, 2048)
    assert ht_bytes(2, 4096, H=4096) < ht_bytes(2, 4096, H=7168)


def test_nvl_hint_holds_the_documented_tokens():
    config = deep_ep.config
    assert (config.HT_HINT_TOKENS_PER_RANK, config.HT_HINT_TOPK) == (4096, 8)
    # deep_ep.Buffer's HT buffer has no combine output of its own: its combines write into fresh tensors.
    hint = deep_ep.Config(24).get_nvl_buffer_size_hint(7168 * 2, 2)
    assert hint == ht_bytes(2, 4096, E=1024, combine_output=False)
    assert deep_ep.Config().get_rdma_buffer_size_hint(7168 * 2, 2) == 0
    # An FP8 caller's hidden_bytes (hidden * 1) still gets room for BF16 rows of that hidden size.
    assert deep_ep.Config().get_nvl_buffer_size_hint(7168, 2) == ht_bytes(2, 4096, H=3584, E=1024, combine_output=False)
    # The common models' expert counts at every team size: 4096 tokens of top-8 fit, with little to spare.
    for R in (1, 2, 3, 4, 8, 16):
        hint = deep_ep.Config().get_nvl_buffer_size_hint(7168 * 2, R)
        assert config.hint_experts(R) % R == 0
        for E in (128, 160, 256, 384, 1024):
            if E % R == 0:
                need = ht_bytes(R, 4096, E=E, combine_output=False)
                assert need <= hint < 1.001 * need, (R, E)
    assert config.hint_experts(16) == 2048  # 128 a rank where that is more


def test_nvl_hint_tokens_from_the_environment(monkeypatch):
    # Code that sizes its Buffer with the hint (Megatron-LM does) can ask for more tokens without a change.
    monkeypatch.setenv("EPX_HT_HINT_TOKENS_PER_RANK", "8192")
    assert deep_ep.Config().get_nvl_buffer_size_hint(7168 * 2, 8) == ht_bytes(8, 8192, E=1024, combine_output=False)
    for bad in ("0", "-5", "many"):
        monkeypatch.setenv("EPX_HT_HINT_TOKENS_PER_RANK", bad)
        with pytest.raises(ValueError, match="EPX_HT_HINT_TOKENS_PER_RANK must be a positive integer"):
            deep_ep.Config().get_nvl_buffer_size_hint(7168 * 2, 8)


def test_ll_hint_bounds_every_topk():
    # DeepEP's hint has no top-k: epx's covers the largest it takes, so a top-10 model fits too.
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 2, 256)
    assert hint == epx.LlBuffer.required_bytes(2, max_tokens_per_rank=128, hidden=7168, max_topk=16, num_experts=256)
    # A smaller top-k needs less (combine keeps max(R, K) rows per token): the buffer made within the hint.
    assert hint > epx.LlBuffer.required_bytes(2, max_tokens_per_rank=128, hidden=7168, max_topk=8, num_experts=256)
    assert hint < deep_ep.Buffer.get_low_latency_rdma_size_hint(256, 7168, 2, 256)


def test_hint_arguments_are_checked():
    with pytest.raises(TypeError):
        deep_ep.Buffer.get_low_latency_rdma_size_hint(128.0, 7168, 2, 256)
    with pytest.raises(ValueError):
        deep_ep.Config().get_nvl_buffer_size_hint(0, 2)
    with pytest.raises(ValueError, match="needs 1 to 72 ranks, got 0"):
        epx.HtBuffer.required_bytes(0)
    with pytest.raises(ValueError, match="needs 1 to 72 ranks, got -1"):
        epx.LlBuffer.required_bytes(-1)


def test_tokens_per_rank_are_the_most_that_fit_in_num_nvl_bytes():
    buffer = DeepEpBuffer.__new__(DeepEpBuffer)  # only the sizing, no team

    def need(T, R=2):
        return ht_bytes(R, T, combine_output=False)

    for budget in (need(1000), need(1000) + 1, need(1001) - 1, need(4096)):
        buffer.num_nvl_bytes = budget
        tokens = buffer._ht_tokens_within(2, 7168, 8, 256)
        assert need(tokens) <= budget < need(tokens + 1)
    buffer.num_nvl_bytes = need(1) - 1
    assert buffer._ht_tokens_within(2, 7168, 8, 256) == 0
    # DeepEP's own intranode test gives 1e9 bytes for 4096 tokens a rank on 8 ranks: they fit.
    buffer.num_nvl_bytes = int(1e9)
    assert buffer._ht_tokens_within(8, 7168, 8, 256) >= 4096
