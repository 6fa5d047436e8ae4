"""Arguments are refused before any GPU work (no GPU needed): unsupported options, wrong devices, dtypes
and shapes, unknown handles."""

import pytest

import epx
from epx import _torch as glue
from epx import deep_ep
from epx.deep_ep.buffer import Buffer as DeepEpBuffer


class OfflineTeam:
    """Stands in for a team: the checks below never reach it."""

    rank, size, device = 0, 2, 0


def offline_buffer(**attributes):
    """A deep_ep.Buffer without a team or a GPU, to reach the argument checks."""
    buffer = DeepEpBuffer.__new__(DeepEpBuffer)
    buffer._team = OfflineTeam()
    buffer._ht = buffer._ll = None
    buffer.num_nvl_bytes = buffer.num_rdma_bytes = 1 << 30
    buffer.low_latency_mode = True
    buffer.explicitly_destroy = True  # no teardown of the stand-in
    buffer._last_num_experts = None
    for name, value in attributes.items():
        setattr(buffer, name, value)
    return buffer


def test_constructor_refuses_what_epx_cannot_honour():
    with pytest.raises(ValueError, match="Either 'group' or 'comm'"):
        deep_ep.Buffer(None)
    with pytest.raises(NotImplementedError, match="NVLink only"):
        deep_ep.Buffer(object(), allow_nvlink_for_low_latency_mode=False)
    with pytest.raises(ValueError, match=">= 0"):
        deep_ep.Buffer(object(), num_nvl_bytes=-1)
    with pytest.raises(TypeError, match="num_rdma_bytes"):
        deep_ep.Buffer(object(), num_rdma_bytes=1e9)


def test_mask_buffer_calls_need_shrink_mode_and_another_rank():
    buffer = offline_buffer(enable_shrink=False, _masked_ranks=set(), _ll=None, rank=0, group_size=2)
    for call in (
        lambda: buffer.low_latency_update_mask_buffer(1, True),
        lambda: buffer.low_latency_query_mask_buffer(None),
        buffer.low_latency_clean_mask_buffer,
    ):
        with pytest.raises(RuntimeError, match="enable_shrink=True"):
            call()
    buffer.enable_shrink = True
    for rank in (0, 2, -1):  # itself, and outside the group
        with pytest.raises(ValueError, match="another rank"):
            buffer.low_latency_update_mask_buffer(rank, True)
    buffer.low_latency_update_mask_buffer(1, True)  # no LL buffer yet: kept for when it is made
    assert buffer._masked_ranks == {1}
    buffer.low_latency_clean_mask_buffer()
    assert buffer._masked_ranks == set()


def test_destroy_needs_explicitly_destroy():
    buffer = offline_buffer(explicitly_destroy=False)
    with pytest.raises(RuntimeError, match="explicitly_destroy"):
        buffer.destroy()
    buffer.explicitly_destroy = True  # keep __del__ off the stand-in team


def test_low_latency_options_epx_does_not_have(torch):
    buffer = offline_buffer()
    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    topk = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="cannot both be set"):
        buffer.low_latency_dispatch(x, topk, 8, 4, async_finish=True, return_recv_hook=True)
    with pytest.raises(NotImplementedError, match="use_logfmt"):
        buffer.low_latency_combine(x, topk, topk.float(), None, use_logfmt=True)
    with pytest.raises(TypeError, match="low_latency_dispatch returned"):
        buffer.low_latency_combine(x, topk, topk.float(), ("not", "a", "handle"))
    with pytest.raises(TypeError, match="low_latency_dispatch returned"):
        buffer.get_next_low_latency_combine_buffer((None, None, 8, 128, 4))


def test_low_latency_calls_need_low_latency_mode_and_cuda_tensors(torch):
    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    topk = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="is on cpu"):
        offline_buffer().low_latency_dispatch(x, topk, 8, 4)


def test_ht_arguments(torch):
    buffer = offline_buffer()
    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    topk = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="is on cpu"):
        buffer.dispatch(x, topk_idx=topk, num_tokens_per_expert=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="is on cpu"):
        buffer.get_dispatch_layout(topk, 4)
    with pytest.raises(TypeError, match="handle must be"):
        buffer.combine(x, handle=(1, 2, 3, 4, 5, 6))
    with pytest.raises(ValueError, match="allocate_on_comm_stream needs previous_event and async_finish"):
        buffer._streams(None, False, True)


def test_bias_is_a_tensor_or_a_pair():
    from epx.ht import bias_pair

    first, second = object(), object()
    assert bias_pair(None) == (None, None)
    assert bias_pair(first) == (first, None)
    assert bias_pair((first, second)) == (first, second)
    assert bias_pair([None, second]) == (None, second)
    with pytest.raises(ValueError, match="got 3 items"):
        bias_pair((first, second, first))
    with pytest.raises(ValueError, match="got 1 items"):
        bias_pair((first,))


def test_ht_handle_is_indexed_as_deepeps_tuple():
    from types import SimpleNamespace

    from epx.deep_ep.buffer import DispatchHandle

    handle = DispatchHandle(SimpleNamespace(num_tokens=0), None, "src_idx", 0, "in_rank", 4)
    assert len(handle) == 6
    assert handle[3] == "src_idx" and handle[-3] == "src_idx" and handle[4] == "in_rank"
    for index, name in ((1, "channel_prefix_matrix"), (2, "recv_channel_prefix_matrix"), (-1, "send_head")):
        with pytest.raises(NotImplementedError, match=f"DeepEP's {name}"):
            handle[index]
    for index in (6, -7, "0"):
        with pytest.raises(IndexError, match="6 entries"):
            handle[index]


def test_counter_tensors_are_checked(torch):
    from epx.ll import _counter_ptr

    assert _counter_ptr(None, "cumulative_wait_cycles", torch.int64, 2, 0) is None
    with pytest.raises(ValueError, match="is on cpu"):
        _counter_ptr(torch.zeros(2, dtype=torch.int64), "cumulative_wait_cycles", torch.int64, 2, 0)


def test_tensor_conversion_checks(torch):
    with pytest.raises(ValueError, match="is on cpu"):
        glue.as_matrix(torch.zeros(2, 2), "x", 0)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        glue.as_matrix([[1.0]], "x", 0)
    with pytest.raises(TypeError, match="float16"):
        glue.dtype_code(torch.float16, "x")
    assert glue.dtype_code(torch.bfloat16, "x") == 0
    assert glue.dtype_code(torch.float8_e4m3fn, "x") == 1
    assert glue.torch_dtype(4) is torch.int64


def test_previous_event_types(torch):
    assert glue.event_of(None) is None
    assert glue.event_of(deep_ep.EventOverlap()) is None
    with pytest.raises(TypeError, match="previous_event"):
        glue.event_of(deep_ep.EventOverlap("not an event"))


def test_previous_event_from_event_handle(torch):
    # DeepEP's EventHandle, alone or in an EventOverlap (Megatron-LM passes EventOverlap(EventHandle())).
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU (an EventHandle records a CUDA event)")
    from epx.deep_ep.utils import EventHandle

    handle = EventHandle()
    assert isinstance(handle.event, torch.cuda.Event)
    assert glue.event_of(handle) is handle.event
    assert glue.event_of(deep_ep.EventOverlap(handle)) is handle.event
    deep_ep.EventOverlap(handle).current_stream_wait()
    handle.current_stream_wait()
    torch.cuda.synchronize()
    assert handle.event.query()


def test_team_from_group_needs_torch_distributed(torch):
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(RuntimeError, match="not initialised"):
        epx.Team.from_group()


def test_buffer_methods_without_their_buffer():
    buffer = epx.Buffer.__new__(epx.Buffer)
    buffer.ht = buffer.ll = None
    with pytest.raises(RuntimeError, match="no HT buffer"):
        buffer.dispatch(None, None)
    with pytest.raises(RuntimeError, match="no LL buffer"):
        buffer.ll_combine(None, None)


def test_layout_in_torch_matches_a_loop(torch):
    # The layout get_dispatch_layout computes in torch before the HT buffer exists (CPU tensors here).
    from epx.deep_ep.buffer import layout_of

    R, E = 4, 16
    topk = torch.tensor([[0, 5, -1], [15, 15, 4], [-1, -1, -1], [3, 2, 1], [12, 16, -7]])
    per_rank, per_expert, in_rank = layout_of(topk, E, R)
    want_expert = [0] * E
    want_in_rank = [[False] * R for _ in topk]
    for t, row in enumerate(topk.tolist()):
        for e in set(row):
            if 0 <= e < E:
                want_expert[e] += 1
                want_in_rank[t][e // (E // R)] = True
    assert per_expert.tolist() == want_expert
    assert in_rank.tolist() == want_in_rank
    assert per_rank.tolist() == [sum(row[r] for row in want_in_rank) for r in range(R)]
    assert per_rank.dtype == torch.int32 and per_expert.dtype == torch.int32 and in_rank.dtype == torch.bool
