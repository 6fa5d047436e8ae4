"""GPU time of epx.deep_ep's HT calls as a DeepEP user makes them, on one GPU (a team of one rank).

The bench (bench/) times the kernels through the C++ API; this times what the Python module adds around
them: the copies of outputs into fresh tensors, the layout, the allocations. With one rank every token
comes back to its own GPU, so no NVLink figure comes from here. Each call is timed with CUDA events around
it (median of --reps, after --warmup), and its results are checked: with y = recv_x, the combine must give
back x exactly (every token names experts, one rank holds them all).

Usage: EPX_LIBRARY=.../libepx.so PYTHONPATH=python python3 bench/tools/deep_ep_calls.py [--tokens 4096]
"""

import argparse
import os
import statistics
import tempfile

import torch
import torch.distributed as dist

from epx import deep_ep


def timed(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=50)
    a = p.parse_args()

    torch.cuda.set_device(0)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    init = os.path.join(tempfile.mkdtemp(), "init")
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1)
    group = dist.group.WORLD
    torch.manual_seed(0)
    x = torch.randn(a.tokens, a.hidden, device="cuda").bfloat16()
    scores = torch.rand(a.tokens, a.experts, device="cuda")
    topk_idx = scores.topk(a.topk, dim=1).indices
    topk_weights = torch.rand(a.tokens, a.topk, device="cuda")

    hint = deep_ep.Buffer.get_dispatch_config(1).get_nvl_buffer_size_hint(a.hidden * 2, 1)
    buffer = deep_ep.Buffer(group, num_nvl_bytes=hint, explicitly_destroy=True)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, a.experts)

    def dispatch():
        return buffer.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=topk_idx,
            topk_weights=topk_weights,
        )

    recv_x, _, _, _, handle, _ = dispatch()
    combined, _, _ = buffer.combine(recv_x, handle)
    if not torch.equal(combined, x):
        raise SystemExit("deep_ep_calls: the combine did not give x back")

    results = {
        "layout": timed(lambda: buffer.get_dispatch_layout(topk_idx, a.experts), a.warmup, a.reps),
        "dispatch": timed(dispatch, a.warmup, a.reps),
        "cached dispatch": timed(lambda: buffer.dispatch(x, handle=handle), a.warmup, a.reps),
        "combine": timed(lambda: buffer.combine(recv_x, handle), a.warmup, a.reps),
    }
    print(f"epx.deep_ep HT calls, one rank, T={a.tokens} H={a.hidden} top-{a.topk} of {a.experts}: median us")
    for name, us in results.items():
        print(f"  {name:16s} {us:8.1f}")
    buffer.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
