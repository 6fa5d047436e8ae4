"""epx.deep_ep has DeepEP V1's names and signatures (parameter names, order and defaults)."""

import inspect

import pytest

from epx import deep_ep

_ = inspect.Parameter.empty  # a parameter without a default

# (name, [(parameter, default), ...]) without self; DeepEP V1's deep_ep/buffer.py and utils.py.
BUFFER_METHODS = {
    "__init__": [
        ("group", None),
        ("num_nvl_bytes", 0),
        ("num_rdma_bytes", 0),
        ("low_latency_mode", False),
        ("num_qps_per_rank", 24),
        ("allow_nvlink_for_low_latency_mode", True),
        ("allow_mnnvl", False),
        ("use_fabric", False),
        ("explicitly_destroy", False),
        ("enable_shrink", False),
        ("comm", None),
    ],
    "set_num_sms": [("new_num_sms", _)],
    "get_dispatch_config": [("num_ranks", _)],
    "get_combine_config": [("num_ranks", _)],
    "get_low_latency_rdma_size_hint": [
        ("num_max_dispatch_tokens_per_rank", _),
        ("hidden", _),
        ("num_ranks", _),
        ("num_experts", _),
    ],
    "get_dispatch_layout": [
        ("topk_idx", _),
        ("num_experts", _),
        ("previous_event", None),
        ("async_finish", False),
        ("allocate_on_comm_stream", False),
    ],
    "dispatch": [
        ("x", _),
        ("handle", None),
        ("num_tokens_per_rank", None),
        ("num_tokens_per_rdma_rank", None),
        ("is_token_in_rank", None),
        ("num_tokens_per_expert", None),
        ("topk_idx", None),
        ("topk_weights", None),
        ("expert_alignment", 1),
        ("num_worst_tokens", 0),
        ("config", None),
        ("previous_event", None),
        ("async_finish", False),
        ("allocate_on_comm_stream", False),
    ],
    "combine": [
        ("x", _),
        ("handle", _),
        ("topk_weights", None),
        ("bias", None),
        ("config", None),
        ("previous_event", None),
        ("async_finish", False),
        ("allocate_on_comm_stream", False),
    ],
    "low_latency_dispatch": [
        ("x", _),
        ("topk_idx", _),
        ("num_max_dispatch_tokens_per_rank", _),
        ("num_experts", _),
        ("cumulative_local_expert_recv_stats", None),
        ("dispatch_wait_recv_cost_stats", None),
        ("use_fp8", True),
        ("round_scale", False),
        ("use_ue8m0", False),
        ("async_finish", False),
        ("return_recv_hook", False),
    ],
    "low_latency_combine": [
        ("x", _),
        ("topk_idx", _),
        ("topk_weights", _),
        ("handle", _),
        ("use_logfmt", False),
        ("zero_copy", False),
        ("async_finish", False),
        ("return_recv_hook", False),
        ("out", None),
        ("combine_wait_recv_cost_stats", None),
    ],
    "get_next_low_latency_combine_buffer": [("handle", _)],
    "clean_low_latency_buffer": [("num_max_dispatch_tokens_per_rank", _), ("hidden", _), ("num_experts", _)],
    "capture": [],
    "destroy": [],
    "get_comm_stream": [],
    "is_sm90_compiled": [],
    "low_latency_update_mask_buffer": [("rank_to_mask", _), ("mask", False)],
    "low_latency_query_mask_buffer": [("mask_status", _)],
    "low_latency_clean_mask_buffer": [],
}
STATIC = {
    "set_num_sms",
    "get_dispatch_config",
    "get_combine_config",
    "get_low_latency_rdma_size_hint",
    "capture",
    "is_sm90_compiled",
}


def parameters(fn, skip_self: bool):
    params = list(inspect.signature(fn).parameters.values())
    if skip_self:
        assert params and params[0].name == "self"
        params = params[1:]
    return [(p.name, p.default) for p in params]


@pytest.mark.parametrize("name", sorted(BUFFER_METHODS))
def test_buffer_method_signature(name):
    raw = inspect.getattr_static(deep_ep.Buffer, name)
    assert isinstance(raw, staticmethod) == (name in STATIC), f"{name}: static or not as in DeepEP"
    fn = getattr(deep_ep.Buffer, name)
    assert parameters(fn, name not in STATIC) == BUFFER_METHODS[name]


def test_buffer_class_attribute_num_sms():
    assert deep_ep.Buffer.num_sms == 20


def test_config_signature_and_methods():
    assert parameters(deep_ep.Config.__init__, True) == [
        ("num_sms", 20),
        ("num_max_nvl_chunked_send_tokens", 6),
        ("num_max_nvl_chunked_recv_tokens", 256),
        ("num_max_rdma_chunked_send_tokens", 6),
        ("num_max_rdma_chunked_recv_tokens", 256),
    ]
    assert parameters(deep_ep.Config.get_nvl_buffer_size_hint, True) == [("hidden_bytes", _), ("num_ranks", _)]
    assert parameters(deep_ep.Config.get_rdma_buffer_size_hint, True) == [("hidden_bytes", _), ("num_ranks", _)]
    config = deep_ep.Buffer.get_dispatch_config(8)
    assert isinstance(config, deep_ep.Config) and config.num_sms == deep_ep.Buffer.num_sms


def test_event_overlap_signature():
    assert parameters(deep_ep.EventOverlap.__init__, True) == [("event", None), ("extra_tensors", None)]
    assert parameters(deep_ep.EventOverlap.current_stream_wait, True) == []
    overlap = deep_ep.EventOverlap()
    with overlap as entered:  # no event: nothing to wait for on exit
        assert entered is overlap
    with pytest.raises(RuntimeError, match="no event"):
        overlap.current_stream_wait()


def test_event_handle_signature():
    # Megatron-LM imports both from deep_ep.utils and passes EventOverlap(EventHandle()) as previous_event.
    from epx.deep_ep.utils import EventHandle, EventOverlap

    assert EventOverlap is deep_ep.EventOverlap
    assert parameters(EventHandle.__init__, True) == []
    assert parameters(EventHandle.current_stream_wait, True) == []


def test_set_num_sms(monkeypatch):
    monkeypatch.setattr(deep_ep.Buffer, "num_sms", 20)
    deep_ep.Buffer.set_num_sms(24)
    assert deep_ep.Buffer.num_sms == 24
    assert deep_ep.Buffer.get_combine_config(2).num_sms == 24
    with pytest.raises(ValueError, match="even"):
        deep_ep.Buffer.set_num_sms(23)


def test_is_sm90_compiled():
    assert deep_ep.Buffer.is_sm90_compiled() is True
