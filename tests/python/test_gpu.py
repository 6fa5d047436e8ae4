"""GPU tests: every rank of a torch.distributed (NCCL) group of processes, one GPU each, as users run epx,
executes the same scenario of gpu_scenarios.py; two ranks where two GPUs are visible, else one (the
scenarios that need a peer are skipped then). Skipped without a GPU."""

import os
import queue

import pytest

from conftest import cuda_devices

RANKS = min(cuda_devices(), 2)
os.environ["EPX_TEST_RANKS"] = str(RANKS)  # read by gpu_scenarios, here and in the rank processes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(RANKS < 1, reason="skipped: no GPU"),
]

SCENARIO_TIMEOUT_S = 300


class Ranks:
    def __init__(self, tmp_dir):
        import torch.multiprocessing as mp

        import gpu_scenarios

        ctx = mp.get_context("spawn")
        self.tasks = [ctx.Queue() for _ in range(gpu_scenarios.R)]
        self.results = ctx.Queue()
        init_file = str(tmp_dir / "dist_init")
        self.procs = [
            ctx.Process(
                target=gpu_scenarios.serve,
                args=(r, gpu_scenarios.R, init_file, self.tasks[r], self.results),
                daemon=True,
            )
            for r in range(gpu_scenarios.R)
        ]
        for p in self.procs:
            p.start()
        self.ready_error = self.collect("__ready__")

    def collect(self, name):
        errors = {}
        for _ in self.procs:
            try:
                rank, got, error = self.results.get(timeout=SCENARIO_TIMEOUT_S)
            except queue.Empty:
                dead = [p.exitcode for p in self.procs]
                return f"{name}: no answer within {SCENARIO_TIMEOUT_S} s (worker exit codes {dead})"
            assert got == name, (got, name)
            if error:
                errors[rank] = error
        return "\n".join(f"rank {r}:\n{e}" for r, e in sorted(errors.items())) or None

    def run(self, name):
        if self.ready_error:
            pytest.fail(f"the ranks did not start:\n{self.ready_error}")
        for t in self.tasks:
            t.put(name)
        error = self.collect(name)
        if error:
            pytest.fail(error)

    def close(self):
        for t in self.tasks:
            t.put(None)
        for p in self.procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    r = Ranks(tmp_path_factory.mktemp("epx_gpu"))
    yield r
    r.close()


def scenario_names():
    """Every scenario of gpu_scenarios.py, which is imported only where the tests run (it needs torch);
    elsewhere one placeholder, so that the skip above is reported."""
    if RANKS < 1:
        return ["every_scenario"]
    import gpu_scenarios

    return list(gpu_scenarios.SCENARIOS)


@pytest.mark.parametrize("scenario", scenario_names())
def test_scenario(ranks, scenario):
    import gpu_scenarios

    if RANKS < 2 and scenario in gpu_scenarios.NEEDS_A_PEER:
        pytest.skip("skipped: needs 2 GPUs (the scenario masks its peer)")
    ranks.run(scenario)
