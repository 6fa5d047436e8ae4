"""The C ABI (include/epx/epx.h) as the package binds it: struct layouts, errors, host-only calls."""

import ctypes

import pytest

import epx
from epx import _abi


def test_every_struct_has_the_libraries_size():
    lib = _abi.lib()
    for name, struct in _abi.STRUCTS.items():
        assert lib.epx_struct_size(name.encode()) == ctypes.sizeof(struct), name
    assert lib.epx_struct_size(b"no_such_struct") == 0


def test_unique_ids_travel_whole_zero_bytes_included():
    data = bytes(range(128))  # a zero byte first, as NCCL's ids often have
    assert _abi.unique_id_bytes(_abi.unique_id_from(data)) == data


def test_status_strings_name_the_error_kinds():
    lib = _abi.lib()
    assert lib.epx_status_string(0) == b"success"
    assert lib.epx_status_string(1) == b"invalid argument"
    assert lib.epx_status_string(4) == b"timeout"
    assert lib.epx_status_string(99) == b"unknown status"


def test_null_arguments_are_refused_with_a_message():
    lib = _abi.lib()
    out = ctypes.c_size_t(0)
    assert lib.epx_ht_required_bytes(None, 2, ctypes.byref(out)) == 1
    assert lib.epx_last_error() == b"epx: options is a null pointer"
    assert lib.epx_last_error_rank() == -1
    options = _abi.HtOptions()
    assert lib.epx_ht_required_bytes(ctypes.byref(options), 2, None) == 1
    assert lib.epx_last_error() == b"epx: out is a null pointer"


def test_an_integer_a_field_cannot_hold_is_refused_not_wrapped():
    # ctypes alone would store 2**32 + 128 in an int32 field as 128, a valid size.
    with pytest.raises(epx.EpxInvalidArgument, match="max_tokens_per_rank = 4294967424 is out of range"):
        epx.HtBuffer.required_bytes(2, max_tokens_per_rank=2**32 + 128)
    with pytest.raises(epx.EpxInvalidArgument, match="rows"):
        _abi.Tensor(rows=2**63)
    with pytest.raises(epx.EpxInvalidArgument, match="argument 1 of epx_ht_default_num_sms"):
        epx.HtBuffer.default_num_sms(2**32 + 2)
    assert _abi.HtOptions(max_tokens_per_rank=2**31 - 1).max_tokens_per_rank == 2**31 - 1


def test_a_struct_from_a_newer_header_is_refused():
    options = _abi.HtOptions()
    options.struct_size = ctypes.sizeof(options) + 8
    with pytest.raises(epx.EpxInvalidArgument, match="struct_size"):
        _abi.out_size("epx_ht_required_bytes", ctypes.byref(options), 2)


def test_a_struct_from_an_older_header_keeps_the_defaults_of_the_fields_it_lacks():
    # An older caller that knew only struct_size and max_tokens_per_rank: the rest are EPX_HT_OPTIONS_INIT's.
    full = _abi.HtOptions(
        max_tokens_per_rank=64, hidden=7168, max_topk=8, num_experts=256, handle_blocks=4, combine_output=1
    )
    short = _abi.HtOptions(max_tokens_per_rank=64)
    short.struct_size = 12  # size_t + one int32
    a = _abi.out_size("epx_ht_required_bytes", ctypes.byref(full), 2)
    b = _abi.out_size("epx_ht_required_bytes", ctypes.byref(short), 2)
    assert a == b


def test_destroying_nothing_is_fine():
    for name in (
        "epx_team_destroy",
        "epx_ht_buffer_destroy",
        "epx_ll_buffer_destroy",
        "epx_ht_handle_release",
        "epx_ll_receive_release",
    ):
        _abi.call(name, None)


def test_an_invalid_team_is_refused_before_any_gpu_work():
    uid = bytes(128)
    with pytest.raises(epx.EpxInvalidArgument, match="a team has 1 to 72 ranks, not 0") as e:
        epx.Team.create_nccl(uid, 0, 0)
    assert e.value.kind == "invalid_argument"
    assert str(e.value).startswith("epx rank 0: ")
    with pytest.raises(epx.EpxInvalidArgument, match=r"rank 5 is outside \[0, 2\)"):
        epx.Team.create_nccl(uid, 5, 2)
    with pytest.raises(epx.EpxInvalidArgument, match="wait_timeout"):
        epx.Team.create_nccl(uid, 0, 2, wait_timeout_ms=0)
    with pytest.raises(ValueError, match="128 bytes"):
        epx.Team.create_nccl(b"short", 0, 2)


def test_receive_steps_run_once():
    # A receive step the library never made cannot be built from Python; the null one is refused.
    with pytest.raises(epx.EpxInvalidArgument, match="receive is a null pointer"):
        _abi.call("epx_ll_receive_run", None)


def test_calls_on_no_object_are_refused():
    with pytest.raises(epx.EpxInvalidArgument, match="buffer is a null pointer"):
        _abi.call(
            "epx_ll_combine", None, ctypes.byref(_abi.LlCombineArgs()), None, ctypes.byref(_abi.LlCombineResult())
        )
    with pytest.raises(epx.EpxInvalidArgument, match="buffer is a null pointer"):
        _abi.call(
            "epx_ht_dispatch", None, ctypes.byref(_abi.HtDispatchArgs()), None, ctypes.byref(_abi.HtDispatchResult())
        )
    with pytest.raises(epx.EpxInvalidArgument, match="team is a null pointer"):
        _abi.out_int("epx_team_rank", None)
    for name, args in (
        ("epx_ll_set_rank_masked", (1, 1, None)),
        ("epx_ll_query_rank_mask", (None, None)),
        ("epx_ll_clear_rank_mask", (None,)),
    ):
        with pytest.raises(epx.EpxInvalidArgument, match="buffer is a null pointer"):
            _abi.call(name, None, *args)


def test_the_library_says_what_it_was_built_with():
    lib = _abi.lib()
    assert lib.epx_nccl_version_compiled() // 100 == 228  # NCCL 2.28.x, whose device API epx uses
    assert "90" in lib.epx_cuda_architectures().decode()
