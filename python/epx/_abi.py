"""ctypes mirror of include/epx/epx.h, and the one place that turns a status into an exception.

Every struct here must have the layout of its C twin: tests/python/test_abi.py compares each size
with the library's epx_struct_size(). Keep the field order of the header.
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import POINTER, Structure, c_char, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint64, c_void_p

from . import _loader
from .errors import EpxError, EpxInvalidArgument

ABI_VERSION = 2

# epx_dtype (epx::ScalarType)
BF16, FP8_E4M3, FLOAT32, INT32, INT64, BOOL = range(6)
ELEMENT_SIZE = {BF16: 2, FP8_E4M3: 1, FLOAT32: 4, INT32: 4, INT64: 8, BOOL: 1}

LL_COMBINE_LOCAL, LL_COMBINE_NAIVE = 0, 1


# The range of each integer field type: ctypes would store anything else wrapped, without a word.
_INT_RANGES = {
    c_int32: (-(2**31), 2**31 - 1),
    c_int64: (-(2**63), 2**63 - 1),
    c_size_t: (0, 2 ** (8 * ctypes.sizeof(c_size_t)) - 1),
    c_uint64: (0, 2**64 - 1),
}


def _require_fits(what: str, bounds, value) -> None:
    """Raises EpxInvalidArgument when `value` is an integer outside `bounds` (a C type's range, or None)."""
    if bounds is not None and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
        raise EpxInvalidArgument(
            f"epx: {what} = {value} is out of range: it must be in [{bounds[0]}, {bounds[1]}]",
            "invalid_argument",
            -1,
            1,
        )


@functools.cache
def _field_bounds(cls) -> dict:
    return {name: _INT_RANGES[ctype] for name, ctype in cls._fields_ if ctype in _INT_RANGES}


class Checked(Structure):
    """A struct that refuses an integer a field cannot hold, where ctypes would wrap it. Fields are checked
    as the struct is made (every struct here is made with keywords): one lookup per field given."""

    def __init__(self, *args, **fields):
        bounds = _field_bounds(type(self))
        for name, value in fields.items():
            _require_fits(name, bounds.get(name), value)
        super().__init__(*args, **fields)


class Tensor(Checked):
    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_int32),
        ("rows", c_int64),
        ("cols", c_int64),
        ("row_stride", c_int64),
        ("col_stride", c_int64),
    ]


class Sized(Checked):
    """A struct whose first field is struct_size, set to its own size when made."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.struct_size = ctypes.sizeof(self)


class Streams(Sized):
    _fields_ = [("struct_size", c_size_t), ("stream", c_void_p), ("async_", c_int32), ("previous_event", c_void_p)]


class UniqueId(Structure):
    _fields_ = [("bytes", c_char * 128)]  # opaque; read and write it whole (unique_id_bytes / unique_id_from)


def unique_id_bytes(uid: UniqueId) -> bytes:
    """All 128 bytes (reading the c_char field would stop at the first zero byte)."""
    return ctypes.string_at(ctypes.addressof(uid), 128)


def unique_id_from(data: bytes) -> UniqueId:
    uid = UniqueId()
    ctypes.memmove(ctypes.addressof(uid), bytes(data), 128)
    return uid


class TeamOptions(Sized):
    _fields_ = [("struct_size", c_size_t), ("wait_timeout_ms", c_int64)]


class HtOptions(Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens_per_rank", c_int32),
        ("hidden", c_int32),
        ("max_topk", c_int32),
        ("num_experts", c_int32),
        ("handle_blocks", c_int32),
        ("num_sms", c_int32),
        ("combine_output", c_int32),
    ]


class HtLayout(Structure):
    _fields_ = [("num_tokens_per_rank", c_void_p), ("num_tokens_per_expert", c_void_p), ("is_token_in_rank", c_void_p)]


class HtDispatchArgs(Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("x", Tensor),
        ("x_scales", Tensor),
        ("topk_idx", Tensor),
        ("topk_weights", Tensor),
        ("expert_alignment", c_int32),
        ("num_worst_tokens", c_int64),
        ("cached", c_void_p),
    ]


# The dispatch's outputs, in the order epx_ht_dispatch_result and epx_ht_dispatch_copies list them.
HT_DISPATCH_OUTPUTS = (
    "recv_x",
    "recv_x_scales",
    "recv_src_idx",
    "recv_topk_idx",
    "recv_topk_weights",
    "num_recv_tokens_per_expert",
)


class HtDispatchResult(Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("num_rows", c_int64),
        ("num_recv_tokens", c_int64),
        *((name, Tensor) for name in HT_DISPATCH_OUTPUTS),
        ("num_recv_tokens_per_expert_host", POINTER(c_int32)),
        ("num_recv_tokens_per_expert_host_valid", c_int32),
        ("handle", c_void_p),
        ("finished", c_void_p),
        ("count_matrix", Tensor),
    ]


class HtDispatchCopies(Sized):
    _fields_ = [("struct_size", c_size_t), *((name, Tensor) for name in HT_DISPATCH_OUTPUTS)]


class HtCombineArgs(Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("y", Tensor),
        ("topk_weights", Tensor),
        ("bias", Tensor),
        ("handle", c_void_p),
        ("out", Tensor),
        ("out_weights", Tensor),
        ("second_bias", Tensor),
    ]


class HtCombineResult(Sized):
    _fields_ = [("struct_size", c_size_t), ("x", Tensor), ("topk_weights", Tensor), ("finished", c_void_p)]


class LlOptions(Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens_per_rank", c_int32),
        ("hidden", c_int32),
        ("max_topk", c_int32),
        ("num_experts", c_int32),
        ("num_sms", c_int32),
        ("mask_on_timeout", c_int32),
    ]


class LlOutputBytes(Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("x", c_size_t),
        ("scales", c_size_t),
        ("recv_count", c_size_t),
        ("src_idx", c_size_t),
        ("layout_range", c_size_t),
    ]


class LlRange(Structure):
    _fields_ = [("count", c_int32), ("begin", c_int32)]


class LlScalesLayout(Structure):
    _fields_ = [("expert_stride", c_int64), ("row_stride", c_int64), ("col_stride", c_int64)]


class LlDispatchOutputs(Structure):
    _fields_ = [
        ("x", c_void_p),
        ("scales", c_void_p),
        ("scales_layout", LlScalesLayout),
        ("recv_count", c_void_p),
        ("src_idx", c_void_p),
        ("layout_range", c_void_p),
    ]


class LlHandle(Structure):
    _fields_ = [
        ("buffer", c_void_p),
        ("set", c_int32),
        ("generation", c_uint64),
        ("num_tokens", c_int32),
        ("topk", c_int32),
        ("hidden", c_int32),
        ("has_weights", c_int32),
    ]


class LlDispatchArgs(Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("x", Tensor),
        ("topk_idx", Tensor),
        ("topk_weights", Tensor),
        ("use_fp8", c_int32),
        ("round_scale", c_int32),
        ("use_ue8m0", c_int32),
        ("send_only", c_int32),
        ("out", LlDispatchOutputs),
        ("cumulative_recv_count", c_void_p),
        ("cumulative_wait_cycles", c_void_p),
    ]


class LlDispatchResult(Sized):
    _fields_ = [("struct_size", c_size_t), ("handle", LlHandle), ("finished", c_void_p), ("receive", c_void_p)]


class LlCombineArgs(Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("y", Tensor),
        ("topk_weights", Tensor),
        ("handle", LlHandle),
        ("order", c_int32),
        ("send_only", c_int32),
        ("out", Tensor),
        ("cumulative_wait_cycles", c_void_p),
    ]


class LlCombineResult(Sized):
    _fields_ = [("struct_size", c_size_t), ("finished", c_void_p), ("receive", c_void_p)]


# The structs whose sizes the library reports (epx_struct_size), for the layout test.
STRUCTS = {
    "epx_tensor": Tensor,
    "epx_streams": Streams,
    "epx_unique_id": UniqueId,
    "epx_team_options": TeamOptions,
    "epx_ht_options": HtOptions,
    "epx_ht_layout": HtLayout,
    "epx_ht_dispatch_args": HtDispatchArgs,
    "epx_ht_dispatch_result": HtDispatchResult,
    "epx_ht_dispatch_copies": HtDispatchCopies,
    "epx_ht_combine_args": HtCombineArgs,
    "epx_ht_combine_result": HtCombineResult,
    "epx_ll_options": LlOptions,
    "epx_ll_output_bytes": LlOutputBytes,
    "epx_ll_range": LlRange,
    "epx_ll_scales_layout": LlScalesLayout,
    "epx_ll_dispatch_outputs": LlDispatchOutputs,
    "epx_ll_handle": LlHandle,
    "epx_ll_dispatch_args": LlDispatchArgs,
    "epx_ll_dispatch_result": LlDispatchResult,
    "epx_ll_combine_args": LlCombineArgs,
    "epx_ll_combine_result": LlCombineResult,
}

_p = c_void_p  # opaque object pointers
_PROTOTYPES = {
    "epx_abi_version": (c_int, []),
    "epx_version": (c_char_p, []),
    "epx_nccl_version_compiled": (c_int, []),
    "epx_cuda_architectures": (c_char_p, []),
    "epx_status_string": (c_char_p, [c_int]),
    "epx_last_error": (c_char_p, []),
    "epx_last_error_rank": (c_int, []),
    "epx_struct_size": (c_size_t, [c_char_p]),
    "epx_team_make_unique_id": (c_int, [POINTER(UniqueId)]),
    "epx_team_create_nccl": (c_int, [POINTER(UniqueId), c_int, c_int, POINTER(TeamOptions), POINTER(_p)]),
    "epx_team_destroy": (c_int, [_p]),
    "epx_team_rank": (c_int, [_p, POINTER(c_int)]),
    "epx_team_size": (c_int, [_p, POINTER(c_int)]),
    "epx_team_device": (c_int, [_p, POINTER(c_int)]),
    "epx_team_check_device_errors": (c_int, [_p]),
    "epx_team_failed": (c_int, [_p, POINTER(c_int)]),
    "epx_ht_required_bytes": (c_int, [POINTER(HtOptions), c_int, POINTER(c_size_t)]),
    "epx_ht_default_num_sms": (c_int, [c_int, POINTER(c_int)]),
    "epx_ht_buffer_create": (c_int, [_p, POINTER(HtOptions), POINTER(_p)]),
    "epx_ht_buffer_destroy": (c_int, [_p]),
    "epx_ht_buffer_bytes": (c_int, [_p, POINTER(c_size_t)]),
    "epx_ht_get_num_sms": (c_int, [_p, POINTER(c_int)]),
    "epx_ht_set_num_sms": (c_int, [_p, c_int]),
    "epx_ht_handle_release": (c_int, [_p]),
    "epx_ht_get_layout": (c_int, [_p, POINTER(Tensor), POINTER(HtLayout), POINTER(Streams), POINTER(_p)]),
    "epx_ht_dispatch": (c_int, [_p, POINTER(HtDispatchArgs), POINTER(Streams), POINTER(HtDispatchResult)]),
    "epx_ht_copy_dispatch_outputs": (c_int, [_p, POINTER(HtDispatchCopies), POINTER(Streams), POINTER(_p)]),
    "epx_ht_combine": (c_int, [_p, POINTER(HtCombineArgs), POINTER(Streams), POINTER(HtCombineResult)]),
    "epx_ht_combine_input": (c_int, [_p, c_int64, c_int64, POINTER(Tensor)]),
    "epx_ht_combine_input_weights": (c_int, [_p, c_int64, c_int64, POINTER(Tensor)]),
    "epx_ht_check_errors": (c_int, [_p]),
    "epx_ll_required_bytes": (c_int, [POINTER(LlOptions), c_int, POINTER(c_size_t)]),
    "epx_ll_buffer_create": (c_int, [_p, POINTER(LlOptions), POINTER(_p)]),
    "epx_ll_buffer_destroy": (c_int, [_p]),
    "epx_ll_buffer_bytes": (c_int, [_p, POINTER(c_size_t)]),
    "epx_ll_get_num_sms": (c_int, [_p, POINTER(c_int)]),
    "epx_ll_set_num_sms": (c_int, [_p, c_int]),
    "epx_ll_output_sizes": (c_int, [_p, c_int, c_int, c_int, POINTER(LlOutputBytes)]),
    "epx_ll_dispatch": (c_int, [_p, POINTER(LlDispatchArgs), POINTER(Streams), POINTER(LlDispatchResult)]),
    "epx_ll_combine": (c_int, [_p, POINTER(LlCombineArgs), POINTER(Streams), POINTER(LlCombineResult)]),
    "epx_ll_receive_run": (c_int, [_p]),
    "epx_ll_receive_release": (c_int, [_p]),
    "epx_ll_combine_buffer": (c_int, [_p, POINTER(Tensor)]),
    "epx_ll_check_errors": (c_int, [_p]),
    "epx_ll_set_rank_masked": (c_int, [_p, c_int, c_int, _p]),
    "epx_ll_query_rank_mask": (c_int, [_p, _p, _p]),
    "epx_ll_clear_rank_mask": (c_int, [_p, _p]),
}

_bound = None


def lib() -> ctypes.CDLL:
    """libepx with every prototype declared (loads it on first use)."""
    global _bound
    if _bound is None:
        handle = _loader.load()
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = restype, argtypes
        version = handle.epx_abi_version()
        if version != ABI_VERSION:
            raise _loader.LibraryNotFound(
                f"epx: {_loader.library_path()} has C ABI version {version}; this Python package needs "
                f"{ABI_VERSION}: reinstall the package so that both come from the same build"
            )
        _bound = handle
    return _bound


def check(status: int) -> None:
    """Raises EpxError for a failed call, with the library's message (naming the rank)."""
    if status != 0:
        handle = lib()
        message = (handle.epx_last_error() or b"").decode(errors="replace")
        raise EpxError.from_status(
            status, message or f"epx call failed with status {status}", handle.epx_last_error_rank()
        )


def call(name: str, *args) -> None:
    fn = getattr(lib(), name)
    for i, (value, ctype) in enumerate(zip(args, fn.argtypes)):
        _require_fits(f"argument {i + 1} of {name}", _INT_RANGES.get(ctype), value)
    check(fn(*args))


def out_int(name: str, *args) -> int:
    value = c_int(0)
    call(name, *args, ctypes.byref(value))
    return value.value


def out_size(name: str, *args) -> int:
    value = c_size_t(0)
    call(name, *args, ctypes.byref(value))
    return value.value
