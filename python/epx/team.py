"""epx.Team: the ranks that exchange tokens (one process per GPU), over NCCL's symmetric memory.

A team is made collectively. Rank 0 makes a 128-byte bootstrap id, every rank receives it out of band
and joins: Team.from_group does that through a torch.distributed process group (all_gather_object),
Team.from_mpi through an mpi4py communicator, Team.create_nccl takes the id from anywhere.
"""

from __future__ import annotations

import ctypes

from . import _abi
from ._native import NativeObject


class Team(NativeObject):
    """One rank of a team, on the CUDA device that was current when it was made. Collective to make and
    to destroy (its buffers first)."""

    _free_call = "epx_team_destroy"
    _what = "team"

    def __init__(self, _native: int):
        self._native = _native
        self.rank = _abi.out_int("epx_team_rank", _native)
        self.size = _abi.out_int("epx_team_size", _native)
        self.device = _abi.out_int("epx_team_device", _native)

    # ---- making a team -------------------------------------------------------------------------------
    @staticmethod
    def make_unique_id() -> bytes:
        """On one rank only (it starts NCCL's bootstrap listener in this process): the id all ranks join."""
        uid = _abi.UniqueId()
        _abi.call("epx_team_make_unique_id", ctypes.byref(uid))
        return _abi.unique_id_bytes(uid)

    @classmethod
    def create_nccl(cls, unique_id: bytes, rank: int, size: int, *, wait_timeout_ms: int = 5000) -> "Team":
        """Collective: joins the team of `size` ranks as `rank`, on the current CUDA device."""
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != 128:
            raise ValueError("epx: unique_id must be the 128 bytes Team.make_unique_id() returned")
        uid = _abi.unique_id_from(unique_id)
        options = _abi.TeamOptions(wait_timeout_ms=int(wait_timeout_ms))
        native = ctypes.c_void_p()
        _abi.call(
            "epx_team_create_nccl", ctypes.byref(uid), int(rank), int(size), ctypes.byref(options), ctypes.byref(native)
        )
        return cls(native.value)

    @classmethod
    def from_group(cls, group=None, *, wait_timeout_ms: int = 5000) -> "Team":
        """Collective over a torch.distributed process group (default: the world). Each process must
        have its CUDA device set (torch.cuda.set_device) before."""
        from ._torch import torch

        dist = torch().distributed
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("epx: torch.distributed is not initialised (call init_process_group first)")
        group = group if group is not None else dist.group.WORLD
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        ids = [None] * size
        dist.all_gather_object(ids, cls.make_unique_id() if rank == 0 else None, group=group)
        return cls.create_nccl(ids[0], rank, size, wait_timeout_ms=wait_timeout_ms)

    @classmethod
    def from_mpi(cls, comm, *, wait_timeout_ms: int = 5000) -> "Team":
        """Collective over an mpi4py communicator."""
        rank, size = comm.Get_rank(), comm.Get_size()
        unique_id = comm.bcast(cls.make_unique_id() if rank == 0 else None, root=0)
        return cls.create_nccl(unique_id, rank, size, wait_timeout_ms=wait_timeout_ms)

    # ---- state ---------------------------------------------------------------------------------------
    def check_device_errors(self) -> None:
        """Raises EpxTimeout if a kernel of this team recorded an expired wait (call after synchronising)."""
        _abi.call("epx_team_check_device_errors", self._require())

    @property
    def failed(self) -> bool:
        return bool(_abi.out_int("epx_team_failed", self._require()))

    def __repr__(self) -> str:
        return f"epx.Team(rank={self.rank}, size={self.size}, device=cuda:{self.device})"
