"""Shared helpers of the Python tests. They test the installed package (pip install .), not python/."""

import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs (skipped elsewhere)")


def cuda_devices() -> int:
    """Visible CUDA devices (0 without torch or without a GPU)."""
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def header_version() -> str:
    with open(os.path.join(REPO, "include", "epx", "version.hpp")) as f:
        for line in f:
            if line.startswith("#define EPX_VERSION_STRING"):
                return line.split('"')[1]
    raise AssertionError("EPX_VERSION_STRING not found")


@pytest.fixture
def torch():
    return pytest.importorskip("torch")
