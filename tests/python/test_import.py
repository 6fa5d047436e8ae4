"""The package imports and loads its library on a machine without a GPU, and without torch."""

import subprocess
import sys
import textwrap

import pytest

import epx
from conftest import header_version


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_version_is_the_headers():
    if epx._loader.build_info() is None:
        pytest.skip("run from a source tree (EPX_LIBRARY): the version comes from the installed build's record")
    assert epx.__version__ == header_version()


def test_library_loads_with_its_nccl_and_cuda_runtime():
    info = epx.library_info()
    assert info["version"] == header_version()
    assert info["abi_version"] == 2
    assert info["library"].endswith("libepx.so")
    assert info["nccl_library"] and "libnccl.so" in info["nccl_library"]
    assert info["cuda_runtime_library"] and "libcudart.so" in info["cuda_runtime_library"]
    assert info["nccl_version_compiled"] // 100 == 228  # NCCL 2.28.x, the device API epx is built on
    assert "90" in info["cuda_architectures"]


def test_import_without_torch_fails_only_where_torch_is_needed():
    # torch made unimportable: sys.modules["torch"] = None makes `import torch` raise ImportError.
    result = run_python(
        """
        import sys
        sys.modules["torch"] = None
        import epx
        from epx import deep_ep
        info = epx.library_info()                     # the library needs no torch
        assert deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 2, 256) > 0
        assert deep_ep.Config().get_nvl_buffer_size_hint(7168 * 2, 2) > 0
        try:
            deep_ep.topk_idx_t
        except epx.TorchRequired as e:
            assert "PyTorch" in str(e)
        else:
            raise AssertionError("topk_idx_t without torch")
        try:
            epx.Team.from_group()
        except ImportError as e:                      # TorchRequired is an ImportError
            assert "PyTorch" in str(e)
        else:
            raise AssertionError("from_group without torch")
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_import_loads_nothing_native():
    result = run_python(
        """
        import sys
        import epx, epx.deep_ep
        maps = open("/proc/self/maps").read()
        assert "libepx" not in maps and "libnccl" not in maps, "import loaded native code"
        assert "torch" not in sys.modules, "import imported torch"
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr


def test_deep_ep_exports():
    from epx import deep_ep

    assert set(deep_ep.__all__) == {"Buffer", "Config", "EventOverlap", "install", "topk_idx_t"}


def test_deep_ep_install_serves_import_deep_ep():
    # Code written for DeepEP (Megatron-LM's fused_a2a: `from deep_ep import Buffer`,
    # `from deep_ep.utils import EventHandle, EventOverlap`) runs on epx once install() was called.
    result = run_python(
        """
        import epx.deep_ep
        epx.deep_ep.install()
        from deep_ep import Buffer, Config
        from deep_ep.utils import EventHandle, EventOverlap
        import deep_ep
        assert deep_ep is epx.deep_ep and Buffer is epx.deep_ep.Buffer and Config is epx.deep_ep.Config
        assert EventHandle is epx.deep_ep.utils.EventHandle and EventOverlap is epx.deep_ep.EventOverlap
        epx.deep_ep.install()  # again: fine
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_deep_ep_install_refuses_where_another_deep_ep_is_imported():
    result = run_python(
        """
        import sys, types
        sys.modules["deep_ep"] = types.ModuleType("deep_ep")
        import epx.deep_ep
        try:
            epx.deep_ep.install()
        except RuntimeError as e:
            assert "imported already" in str(e), e
            print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
