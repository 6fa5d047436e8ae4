"""EventOverlap and EventHandle: DeepEP's wrappers of a CUDA event, for overlapping communication with
compute."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from .._torch import event_of, torch


class EventHandle:
    """DeepEP's EventHandle: making one records a CUDA event (``event``, a torch.cuda.Event) on the
    current stream; ``current_stream_wait()`` makes the current stream wait for it. EventOverlap and
    every ``previous_event`` take it where DeepEP does (``EventOverlap(EventHandle())``)."""

    def __init__(self) -> None:
        self.event = torch().cuda.Event()
        self.event.record(torch().cuda.current_stream())

    def current_stream_wait(self) -> None:
        torch().cuda.current_stream().wait_event(self.event)


class EventOverlap:
    """A CUDA event (a torch.cuda.Event in epx's results; an EventHandle where the caller made one)
    recorded after a call, plus tensors to keep alive until then (``extra_tensors``: what record_stream
    would do, in a form CUDA graphs accept).

    ``current_stream_wait()`` makes the current stream wait for the event; as a context manager, the
    body runs on the current stream overlapped with the call and the stream waits for it on exit.
    """

    def __init__(
        self, event: Optional["torch.cuda.Event"] = None, extra_tensors: Optional[Tuple["torch.Tensor", ...]] = None
    ) -> None:
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is None:
            raise RuntimeError("epx: this EventOverlap holds no event (the call was not made with async_finish)")
        torch().cuda.current_stream().wait_event(event_of(self.event))

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if self.event is not None:
            self.current_stream_wait()
