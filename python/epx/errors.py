"""The exceptions of epx."""

from __future__ import annotations

# epx_status (include/epx/epx.h) -> the C++ epx::ErrorKind's name
_KINDS = {1: "invalid_argument", 2: "cuda", 3: "nccl", 4: "timeout", 5: "system", 6: "internal"}


class EpxError(RuntimeError):
    """An error the native library reported: its message starts with the rank that saw it
    ("epx rank 3: ..."). ``kind`` is the C++ ErrorKind's name, ``rank`` the rank (-1 if none yet)."""

    def __init__(self, message: str, kind: str = "internal", rank: int = -1, status: int = 6):
        super().__init__(message)
        self.kind = kind
        self.rank = rank
        self.status = status

    @staticmethod
    def from_status(status: int, message: str, rank: int) -> "EpxError":
        kind = _KINDS.get(status, "internal")
        cls = {"invalid_argument": EpxInvalidArgument, "timeout": EpxTimeout}.get(kind, EpxError)
        return cls(message, kind, rank, status)


class EpxInvalidArgument(EpxError, ValueError):
    """The library refused an argument (before launching anything)."""


class EpxTimeout(EpxError, TimeoutError):
    """A device-side wait ran past the team's timeout: a peer is dead, hung, or not making the same call."""


class TorchRequired(ImportError):
    """The call needs PyTorch, which is not installed."""
