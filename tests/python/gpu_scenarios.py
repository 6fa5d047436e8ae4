"""What the GPU tests run: R ranks (processes, one GPU each; R from $EPX_TEST_RANKS, 2 by default) in a
torch.distributed group, as users run epx, each executing the same scenario; test_gpu.py sends scenario
names to every rank and collects results. Scenarios in NEEDS_A_PEER take R = 2.

Every input is made from a seed per rank, so each rank can rebuild every other rank's inputs and
compute what it must receive with plain torch (the references below, written loop by loop, independent
of epx). Token rows describe themselves: columns 0..2 hold (source rank, token % 256, token // 256).
"""

import os
import traceback

import torch
import torch.distributed as dist

import epx
from epx import deep_ep

R = int(os.environ.get("EPX_TEST_RANKS", "2"))
HT_TOKENS = (512, 384)  # per rank: different on purpose
LL_MAX_TOKENS, LL_TOKENS = 128, (128, 97)
HIDDEN, TOPK, EXPERTS = 2048, 8, 32
E_LOCAL = EXPERTS // R


# ---- inputs ----------------------------------------------------------------------------------------------
def make_inputs(rank: int, tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(tokens, HIDDEN, generator=g)
    t = torch.arange(tokens)
    x[:, 0], x[:, 1], x[:, 2] = rank, t % 256, t // 256
    topk = torch.rand(tokens, EXPERTS, generator=g).topk(TOPK, dim=1).indices  # distinct experts per token
    topk[torch.rand(tokens, TOPK, generator=g) < 0.1] = -1
    if tokens > 3:
        topk[3] = -1  # a token that goes nowhere
    weights = torch.rand(tokens, TOPK, generator=g)
    return x.bfloat16().cuda(), topk.cuda(), weights.cuda()


def all_inputs(tokens, seed):
    return [make_inputs(r, tokens[r], seed) for r in range(R)]


def to_fp8(x, rank):
    """(fp8 x, float32 scales [T, H/128]) with arbitrary positive scales (HT moves both as they are); seeded
    by the source rank, so that every rank makes the same scales for it."""
    g = torch.Generator().manual_seed(7919 + rank)
    scales = (torch.rand(x.size(0), HIDDEN // 128, generator=g) + 0.5).to(x.device)
    fp8 = (x.float() / 4).clamp(-400, 400).to(torch.float8_e4m3fn)
    return fp8, scales


# ---- references ------------------------------------------------------------------------------------------
def ref_layout(topk):
    T = topk.size(0)
    per_expert = torch.zeros(EXPERTS, dtype=torch.int32)
    in_rank = torch.zeros(T, R, dtype=torch.bool)
    for t, experts in enumerate(topk.tolist()):
        for e in set(experts) - {-1}:
            per_expert[e] += 1
            in_rank[t, e // E_LOCAL] = True
    return in_rank.sum(0, dtype=torch.int32), per_expert, in_rank


def ref_rank_prefix_matrix(inputs):
    """DeepEP's rank_prefix_matrix: [s][d] = tokens ranks 0..s send rank d."""
    counts = torch.stack([ref_layout(topk.cpu())[0] for _, topk, _ in inputs])
    return counts.cumsum(0, dtype=torch.int32)


def ref_ht_dispatch(inputs, rank, alignment=1):
    """What `rank` receives: rows by source rank, then token; topk_idx local (-1 elsewhere), weights 0 there."""
    xs, src, topks, weights = [], [], [], []
    for s in range(R):
        x, topk, w = (a.cpu() for a in inputs[s])
        local = (topk >= 0) & (topk // E_LOCAL == rank)
        for t in range(x.size(0)):
            if local[t].any():
                xs.append(x[t])
                src.append(t)
                topks.append(torch.where(local[t], topk[t] - rank * E_LOCAL, -1))
                weights.append(torch.where(local[t], w[t], 0.0))
    N = len(xs)
    recv_x = torch.stack(xs) if N else torch.empty(0, HIDDEN, dtype=torch.bfloat16)
    recv_topk = torch.stack(topks) if N else torch.empty(0, TOPK, dtype=torch.int64)
    recv_w = torch.stack(weights) if N else torch.empty(0, TOPK)
    counts = [int((recv_topk == e).any(1).sum()) for e in range(E_LOCAL)]
    counts = [-(-c // alignment) * alignment for c in counts]
    return recv_x, torch.tensor(src, dtype=torch.int32), recv_topk, recv_w, counts


def ref_ht_combine(inputs, home, y_scale, biases=()):
    """out[t] = sum over the ranks r that received t (ascending) of bf16(x[t] * y_scale(r)), then each bias
    given, float32 sum."""
    x, topk, _ = (a.cpu() for a in inputs[home])
    _, _, in_rank = ref_layout(topk)
    out = torch.zeros(x.size(0), HIDDEN)
    for r in range(R):
        rows = in_rank[:, r]
        out[rows] += (x[rows].float() * y_scale(r)).bfloat16().float()
    for bias in biases:
        out += bias.cpu().float()
    return out.bfloat16()


def ref_ll_dispatch(inputs, rank):
    """Per local expert: rows in source blocks from rank + 1 up (wrapping, the rank's own last), then by token;
    (begin, count) per source; source token indices."""
    recv_x = torch.zeros(E_LOCAL, R * LL_MAX_TOKENS, HIDDEN, dtype=torch.bfloat16)
    src_idx = torch.full((E_LOCAL, R * LL_MAX_TOKENS), -1, dtype=torch.int32)
    ranges = torch.zeros(E_LOCAL, R, 2, dtype=torch.int64)
    counts = torch.zeros(E_LOCAL, dtype=torch.int32)
    for e in range(E_LOCAL):
        g = rank * E_LOCAL + e
        row = 0
        for s in [(rank + 1 + i) % R for i in range(R)]:
            x, topk, _ = (a.cpu() for a in inputs[s])
            tokens = (topk == g).any(1).nonzero().flatten().tolist()
            ranges[e, s] = torch.tensor([row, len(tokens)])
            for t in tokens:
                recv_x[e, row], src_idx[e, row] = x[t], t
                row += 1
        counts[e] = row
    return recv_x, src_idx, ranges, counts


def ref_ll_combine(inputs, home, y_scale):
    """out[t] = sum_k w[t][k] * bf16(x[t] * y_scale(expert k)), k ascending, float32."""
    x, topk, w = (a.cpu() for a in inputs[home])
    out = torch.zeros(x.size(0), HIDDEN)
    for t in range(x.size(0)):
        for k, e in enumerate(topk[t].tolist()):
            if e >= 0:
                out[t] += w[t, k] * (x[t].float() * y_scale(e)).bfloat16().float()
    return out.bfloat16()


def expert_scale(e):
    return 1.0 + (e % 5) / 4  # exact in bf16 products' rounding terms: a per-expert mark on y


def rank_scale(r):
    return float(r + 1)


def close(got, want, what, rtol=1e-2, atol=1e-2):
    torch.testing.assert_close(
        got.float().cpu(), want.float().cpu(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}"
    )


def equal(got, want, what):
    got, want = got.cpu(), want.cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if got.dtype in (torch.bfloat16, torch.float8_e4m3fn):
        got, want = (
            got.view(torch.uint8 if got.dtype == torch.float8_e4m3fn else torch.int16),
            want.view(torch.uint8 if want.dtype == torch.float8_e4m3fn else torch.int16),
        )
    assert torch.equal(got, want), f"{what}: differs at {(got != want).nonzero()[:5].tolist()}"


# ---- the two ranks' shared state -------------------------------------------------------------------------
class Context:
    def __init__(self, rank):
        self.rank = rank
        self.group = dist.group.WORLD
        hint = deep_ep.Config(24).get_nvl_buffer_size_hint(HIDDEN * 2, R)
        self.ht = deep_ep.Buffer(self.group, num_nvl_bytes=hint, explicitly_destroy=True)
        ll_bytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(LL_MAX_TOKENS, HIDDEN, R, EXPERTS)
        self.ll = deep_ep.Buffer(self.group, num_rdma_bytes=ll_bytes, low_latency_mode=True, explicitly_destroy=True)

    def close(self):
        self.ht.destroy()
        self.ll.destroy()


# ---- HT scenarios (epx.deep_ep) --------------------------------------------------------------------------
def ht_layout(ctx):
    inputs = all_inputs(HT_TOKENS, 1)
    x, topk, w = inputs[ctx.rank]
    want = ref_layout(topk.cpu())
    fresh = deep_ep.Buffer(ctx.group, num_nvl_bytes=1 << 30, explicitly_destroy=True)
    if ctx.ht._ht is None:  # the kernel path needs the HT buffer, which the first dispatch makes
        ctx.ht.dispatch(x, topk_idx=topk, topk_weights=w, num_tokens_per_expert=want[1].cuda())
    for buffer, path in ((fresh, "torch"), (ctx.ht, "kernel")):
        per_rank, per_rdma, per_expert, in_rank, event = buffer.get_dispatch_layout(topk, EXPERTS)
        assert per_rdma is None and event.event is None
        equal(per_rank, want[0], f"num_tokens_per_rank ({path})")
        equal(per_expert, want[1], f"num_tokens_per_expert ({path})")
        equal(in_rank, want[2], f"is_token_in_rank ({path})")
        assert per_rank.dtype == torch.int32 and in_rank.dtype == torch.bool
        # async, after an event, allocated on the communication stream
        out = buffer.get_dispatch_layout(
            topk, EXPERTS, previous_event=deep_ep.Buffer.capture(), async_finish=True, allocate_on_comm_stream=True
        )
        out[4].current_stream_wait()
        equal(out[3], want[2], f"is_token_in_rank (async, {path})")
    fresh.destroy()


def ht_dispatch_combine_bf16(ctx):
    inputs = all_inputs(HT_TOKENS, 2)
    x, topk, w = inputs[ctx.rank]
    per_rank, _, per_expert, in_rank, _ = ctx.ht.get_dispatch_layout(topk, EXPERTS)
    recv_x, recv_topk, recv_w, counts, handle, event = ctx.ht.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=topk,
        topk_weights=w,
        expert_alignment=4,
    )
    want_x, want_src, want_topk, want_w, want_counts = ref_ht_dispatch(inputs, ctx.rank, alignment=4)
    equal(recv_x, want_x, "recv_x")
    equal(recv_topk, want_topk, "recv_topk_idx")
    equal(recv_w, want_w, "recv_topk_weights")
    equal(handle.recv_src_idx, want_src, "recv_src_idx")
    assert counts == want_counts, (counts, want_counts)
    assert handle.num_recv_tokens == want_x.size(0) and event.event is None
    assert recv_topk.dtype == deep_ep.topk_idx_t
    # DeepEP's handle entries: rank_prefix_matrix (every rank's routing), recv_src_idx, is_token_in_rank
    equal(handle[0], ref_rank_prefix_matrix(inputs), "handle[0] (rank_prefix_matrix)")
    assert handle[3] is handle.recv_src_idx and handle[4] is in_rank and len(handle) == 6
    for missing in (1, 2, 5):
        try:
            handle[missing]
        except NotImplementedError as e:
            assert "epx has none" in str(e), e
        else:
            raise AssertionError(f"handle[{missing}] should say epx has no such entry")
    # combine: each rank marks its rows; weights come back summed (one rank holds each non-zero)
    y = (recv_x.float() * rank_scale(ctx.rank)).bfloat16()
    bias = torch.randn(x.size(0), HIDDEN, device=x.device).bfloat16()
    combined, combined_w, event = ctx.ht.combine(y, handle, topk_weights=recv_w, bias=bias)
    close(combined, ref_ht_combine(inputs, ctx.rank, rank_scale, [bias]), "combined_x")
    equal(combined_w, torch.where(topk >= 0, w, 0.0), "combined_topk_weights")
    # outputs are fresh tensors: a second dispatch leaves the first one's alone
    kept = recv_x.clone()
    ctx.ht.dispatch(x * 2, topk_idx=topk, topk_weights=w, num_tokens_per_expert=per_expert)
    equal(recv_x, kept, "recv_x after the next dispatch")


def ht_dispatch_fp8_column_major_scales(ctx):
    inputs = all_inputs(HT_TOKENS, 3)
    fp8 = [to_fp8(x, s) for s, (x, _, _) in enumerate(inputs)]
    x, scales = fp8[ctx.rank]
    scales = scales.t().contiguous().t()  # column-major, as FP8 GEMM producers write them
    _, topk, w = inputs[ctx.rank]
    (recv_x, recv_scales), recv_topk, _, counts, handle, _ = ctx.ht.dispatch(
        (x, scales), topk_idx=topk, topk_weights=w, num_tokens_per_expert=torch.empty(EXPERTS, device=x.device)
    )
    # the reference moves the fp8 bytes and scales as bf16-sized stand-ins: compare per source
    want_x, want_src, want_topk, _, _ = ref_ht_dispatch(inputs, ctx.rank)
    rows_x, rows_s = [], []
    for s in range(R):
        local = ((inputs[s][1] >= 0) & (inputs[s][1] // E_LOCAL == ctx.rank)).any(1)
        rows_x.append(fp8[s][0].view(torch.uint8)[local])  # fp8 bytes, moved as they are
        rows_s.append(fp8[s][1][local])
    equal(recv_x.view(torch.uint8), torch.cat(rows_x), "recv_x fp8")
    equal(recv_scales, torch.cat(rows_s), "recv_x_scales")
    assert recv_scales.is_contiguous() and recv_x.dtype == torch.float8_e4m3fn
    equal(recv_topk, want_topk, "recv_topk_idx (fp8)")


def ht_worst_case_and_cached(ctx):
    inputs = all_inputs(HT_TOKENS, 4)
    x, topk, w = inputs[ctx.rank]
    worst = R * max(HT_TOKENS)
    recv_x, recv_topk, recv_w, counts, handle, _ = ctx.ht.dispatch(
        x, topk_idx=topk, topk_weights=w, num_tokens_per_expert=torch.empty(EXPERTS), num_worst_tokens=worst
    )
    want_x, want_src, want_topk, want_w, _ = ref_ht_dispatch(inputs, ctx.rank)
    N = want_x.size(0)
    assert counts == [] and recv_x.size(0) == worst and handle.num_recv_tokens is None
    equal(recv_x[:N], want_x, "recv_x (worst case)")
    equal(recv_topk[:N], want_topk, "recv_topk_idx (worst case)")
    equal(handle.recv_src_idx[:N], want_src, "recv_src_idx (worst case)")
    assert bool((handle.recv_src_idx[N:] == -1).all()) and bool((recv_topk[N:] == -1).all())
    assert bool((recv_w[N:] == 0).all())
    equal(handle[0], ref_rank_prefix_matrix(inputs), "handle[0] (rank_prefix_matrix, worst case)")
    equal(handle[4], ref_layout(topk.cpu())[2], "handle[4] (is_token_in_rank, from topk_idx)")
    y = (recv_x.float() * rank_scale(ctx.rank)).bfloat16()  # padding rows carry whatever: combine skips them
    combined, _, _ = ctx.ht.combine(y, handle)
    close(combined, ref_ht_combine(inputs, ctx.rank, rank_scale), "combined_x (worst case)")
    # cached: same routing, new x; returns (recv_x, None, None, None, None, event)
    x2 = (x.float() * 3).bfloat16()
    out = ctx.ht.dispatch(x2, handle=handle, num_worst_tokens=worst)
    assert out[1:5] == (None, None, None, None)
    inputs2 = [((a.float() * 3).bfloat16(), b, c) for a, b, c in inputs]
    equal(out[0][:N], ref_ht_dispatch(inputs2, ctx.rank)[0], "recv_x (cached)")
    # exact form, then a cached re-dispatch of it
    recv_x, _, _, _, handle, _ = ctx.ht.dispatch(
        x, topk_idx=topk, topk_weights=w, num_tokens_per_expert=torch.empty(EXPERTS)
    )
    out = ctx.ht.dispatch(x2, handle=handle)
    equal(out[0], ref_ht_dispatch(inputs2, ctx.rank)[0], "recv_x (cached, exact)")


def ht_dispatch_by_rank(ctx):
    """A dispatch without topk_idx (DeepEP allows it): tokens go where is_token_in_rank says; the list comes
    from every rank's num_tokens_per_expert."""
    inputs = all_inputs(HT_TOKENS, 11)
    x, topk, _ = inputs[ctx.rank]
    per_rank, _, per_expert, in_rank, _ = ctx.ht.get_dispatch_layout(topk, EXPERTS)
    recv_x, recv_topk, recv_w, counts, handle, _ = ctx.ht.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, expert_alignment=4
    )
    want_x, want_src, _, _, want_counts = ref_ht_dispatch(inputs, ctx.rank, alignment=4)
    assert recv_topk is None and recv_w is None
    equal(recv_x, want_x, "recv_x (by rank)")
    equal(handle.recv_src_idx, want_src, "recv_src_idx (by rank)")
    assert counts == want_counts, (counts, want_counts)
    y = (recv_x.float() * rank_scale(ctx.rank)).bfloat16()
    biases = [torch.randn(x.size(0), HIDDEN, device=x.device).bfloat16() for _ in range(2)]
    combined, combined_w, _ = ctx.ht.combine(y, handle, bias=tuple(biases))  # DeepEP's pair
    assert combined_w is None
    close(combined, ref_ht_combine(inputs, ctx.rank, rank_scale, biases), "combined_x (by rank, two biases)")
    out = ctx.ht.dispatch(x, handle=handle)  # cached, as DeepEP's test does after a dispatch without top-k
    equal(out[0], want_x, "recv_x (by rank, cached)")
    try:
        ctx.ht.dispatch(x, is_token_in_rank=in_rank)
    except ValueError as e:
        assert "pass both" in str(e), e
    else:
        raise AssertionError("a dispatch with neither topk_idx nor num_tokens_per_expert was accepted")


def ht_too_many_tokens(ctx):
    """A Buffer sized for 256 tokens a rank; rank 0 dispatches 300: every rank's dispatch fails at once with
    an error (rank 0's says how to make room), and the next dispatch works."""
    from epx.deep_ep.config import ht_buffer_bytes

    fits = (256, 256)
    inputs = all_inputs(fits, 12)
    x, topk, w = inputs[ctx.rank]
    small = deep_ep.Buffer(
        ctx.group, num_nvl_bytes=ht_buffer_bytes(R, 256, HIDDEN, TOPK, EXPERTS), explicitly_destroy=True
    )
    try:
        counts = ref_layout(topk.cpu())[1].cuda()
        small.dispatch(x, topk_idx=topk, topk_weights=w, num_tokens_per_expert=counts)  # makes the buffer
        assert small.ht_max_tokens_per_rank == 256
        big = make_inputs(ctx.rank, 300, 12) if ctx.rank == 0 else inputs[ctx.rank]
        try:
            small.dispatch(big[0], topk_idx=big[1], topk_weights=big[2], num_tokens_per_expert=counts)
        except epx.EpxInvalidArgument as e:
            want = "EPX_HT_HINT_TOKENS_PER_RANK" if ctx.rank == 0 else "rank 0 passed an invalid input"
            assert want in str(e), e
        else:
            raise AssertionError("a dispatch of more tokens than the buffer holds was accepted")
        recv_x, _, _, _, _, _ = small.dispatch(x, topk_idx=topk, topk_weights=w, num_tokens_per_expert=counts)
        equal(recv_x, ref_ht_dispatch(inputs, ctx.rank)[0], "recv_x (after a refused dispatch)")
    finally:
        small.destroy()


def check_graph_replays(rounds, rank, step, check):
    """step(x, topk, w) captured once in a torch.cuda.CUDAGraph, as decode loops run the calls, then replayed
    with each round's inputs (and the first's again) copied into the captured tensors; check(inputs, outputs,
    what) after every replay. The first call is eager: it may make the buffer, which cannot happen inside a
    capture."""
    x, topk, w = (t.clone() for t in rounds[0][rank])  # the captured inputs
    step(x, topk, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = step(x, topk, w)
    for i, inputs in enumerate(rounds + rounds[:1]):
        for captured, new in zip((x, topk, w), inputs[rank]):
            captured.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        check(inputs, outputs, f"replay {i}")


def ht_cuda_graph(ctx):
    """The worst-case HT dispatch (no host wait) and combine in a CUDA graph (check_graph_replays)."""
    worst = R * max(HT_TOKENS)

    def step(x, topk, w):
        recv_x, recv_topk, _, _, handle, _ = ctx.ht.dispatch(
            x, topk_idx=topk, topk_weights=w, num_tokens_per_expert=torch.empty(EXPERTS), num_worst_tokens=worst
        )
        combined, _, _ = ctx.ht.combine((recv_x.float() * rank_scale(ctx.rank)).bfloat16(), handle)
        return recv_x, recv_topk, handle, combined

    def check(inputs, outputs, what):
        recv_x, recv_topk, handle, combined = outputs
        want_x, want_src, want_topk, _, _ = ref_ht_dispatch(inputs, ctx.rank)
        N = want_x.size(0)
        equal(recv_x[:N], want_x, f"recv_x ({what})")
        equal(recv_topk[:N], want_topk, f"recv_topk_idx ({what})")
        equal(handle.recv_src_idx[:N], want_src, f"recv_src_idx ({what})")
        assert bool((handle.recv_src_idx[N:] == -1).all()), f"padding rows ({what})"
        close(combined, ref_ht_combine(inputs, ctx.rank, rank_scale), f"combined_x ({what})")

    check_graph_replays([all_inputs(HT_TOKENS, 30 + i) for i in range(2)], ctx.rank, step, check)


def ht_async_previous_event(ctx):
    inputs = all_inputs(HT_TOKENS, 5)
    x, topk, w = inputs[ctx.rank]
    stream = torch.cuda.current_stream()
    x_late = torch.empty_like(x)
    torch.cuda._sleep(50_000_000)  # the current stream is busy when x_late gets its values...
    x_late.copy_(x)
    ready = deep_ep.Buffer.capture()  # ...and the dispatch must wait for them through previous_event
    recv_x, recv_topk, recv_w, counts, handle, event = ctx.ht.dispatch(
        x_late,
        topk_idx=topk,
        topk_weights=w,
        num_tokens_per_expert=torch.empty(EXPERTS),
        previous_event=ready,
        async_finish=True,
        allocate_on_comm_stream=True,
    )
    assert event.event is not None
    with event:
        pass  # overlapped work would go here; leaving the block waits for the dispatch
    want = ref_ht_dispatch(inputs, ctx.rank)
    equal(recv_x, want[0], "recv_x (async)")
    y = (recv_x.float() * rank_scale(ctx.rank)).bfloat16()
    combined, _, event = ctx.ht.combine(y, handle, previous_event=deep_ep.Buffer.capture(), async_finish=True)
    event.current_stream_wait()
    close(combined, ref_ht_combine(inputs, ctx.rank, rank_scale), "combined_x (async)")
    assert ctx.ht.get_comm_stream() is not stream


def ht_num_sms_and_configs(ctx):
    """Buffer.set_num_sms and the Configs callers pass: the HT kernels run on other SM counts, same results."""
    inputs = all_inputs(HT_TOKENS, 12)
    x, topk, w = inputs[ctx.rank]
    want_x, want_src, _, want_w, _ = ref_ht_dispatch(inputs, ctx.rank)
    kept = deep_ep.Buffer.num_sms
    try:
        deep_ep.Buffer.set_num_sms(24)
        for config in (deep_ep.Buffer.get_dispatch_config(R), deep_ep.Config(8)):
            assert config.num_sms in (24, 8)
            recv_x, _, recv_w, _, handle, _ = ctx.ht.dispatch(
                x, topk_idx=topk, topk_weights=w, num_tokens_per_expert=torch.empty(EXPERTS), config=config
            )
            equal(recv_x, want_x, f"recv_x ({config.num_sms} SMs)")
            equal(recv_w, want_w, f"recv_topk_weights ({config.num_sms} SMs)")
            equal(handle.recv_src_idx, want_src, f"recv_src_idx ({config.num_sms} SMs)")
            y = (recv_x.float() * rank_scale(ctx.rank)).bfloat16()
            combined, _, _ = ctx.ht.combine(y, handle, config=deep_ep.Config(config.num_sms))
            close(combined, ref_ht_combine(inputs, ctx.rank, rank_scale), f"combined_x ({config.num_sms} SMs)")
    finally:
        deep_ep.Buffer.set_num_sms(kept)


# ---- LL scenarios (epx.deep_ep) --------------------------------------------------------------------------
def check_ll_dispatch(inputs, rank, recv_x, recv_count, handle, fp8_scales=None):
    want_x, want_src, want_ranges, want_counts = ref_ll_dispatch(inputs, rank)
    equal(recv_count, want_counts, "recv_count")
    src_info, layout_range, max_tokens, hidden, experts = handle
    assert (max_tokens, hidden, experts) == (LL_MAX_TOKENS, HIDDEN, EXPERTS)
    count, begin = layout_range & 0xFFFFFFFF, layout_range >> 32
    equal(torch.stack([begin, count], -1), want_ranges, "layout_range")
    for e in range(E_LOCAL):
        n = int(want_counts[e])
        equal(src_info[e, :n], want_src[e, :n], f"src_info[{e}]")
        if fp8_scales is None:
            equal(recv_x[e, :n], want_x[e, :n], f"recv_x[{e}]")
        else:
            scale = fp8_scales[e, :n].repeat_interleave(128, dim=1)
            got, want = recv_x[e, :n].float() * scale, want_x[e, :n].float().to(scale.device)
            assert bool(((got - want).abs() <= 0.07 * want.abs() + 0.02 * scale).all()), f"fp8 recv_x[{e}]"


def ll_dispatch_bf16_combine(ctx):
    inputs = all_inputs(LL_TOKENS, 6)
    x, topk, w = inputs[ctx.rank]
    stats = torch.zeros(E_LOCAL, dtype=torch.int32, device=x.device)
    waits = torch.zeros(R, dtype=torch.int64, device=x.device)  # cycles: any value >= 0 (C++ tests check more)
    recv_x, recv_count, handle, event, hook = ctx.ll.low_latency_dispatch(
        x,
        topk,
        LL_MAX_TOKENS,
        EXPERTS,
        cumulative_local_expert_recv_stats=stats,
        dispatch_wait_recv_cost_stats=waits,
        use_fp8=False,
    )
    assert hook is None and event.event is None
    assert recv_x.shape == (E_LOCAL, R * LL_MAX_TOKENS, HIDDEN) and recv_x.dtype == torch.bfloat16
    check_ll_dispatch(inputs, ctx.rank, recv_x, recv_count, handle)
    equal(stats, recv_count, "cumulative_local_expert_recv_stats")
    marks = torch.tensor([expert_scale(ctx.rank * E_LOCAL + e) for e in range(E_LOCAL)], device=x.device)
    y = (recv_x.float() * marks[:, None, None]).bfloat16()
    combined, event, hook = ctx.ll.low_latency_combine(y, topk, w, handle, combine_wait_recv_cost_stats=waits)
    assert hook is None and combined.shape == (x.size(0), HIDDEN) and combined.dtype == torch.bfloat16
    want = ref_ll_combine(inputs, ctx.rank, expert_scale)
    close(combined, want, "low_latency_combine")
    assert bool((waits >= 0).all()), f"wait cycles {waits.tolist()}"
    try:
        ctx.ll.low_latency_combine(y, topk, w, handle, combine_wait_recv_cost_stats=waits.int())
        raise AssertionError("an int32 combine_wait_recv_cost_stats was accepted")
    except ValueError as e:
        assert "cumulative_wait_cycles" in str(e), e
    # DeepEP's summation order, on request
    ctx.ll.low_latency_combine_order = "naive"
    try:
        combined, _, _ = ctx.ll.low_latency_combine(y, topk, w, handle)
    finally:
        del ctx.ll.low_latency_combine_order  # the class's default again
    close(combined, want, "low_latency_combine (naive order)")
    # out=, and zero copy through the buffer epx owns
    out = torch.empty_like(combined)
    combined, _, _ = ctx.ll.low_latency_combine(y, topk, w, handle, out=out)
    assert combined.data_ptr() == out.data_ptr()
    close(out, want, "low_latency_combine(out=)")
    recv_x, recv_count, handle, _, _ = ctx.ll.low_latency_dispatch(x, topk, LL_MAX_TOKENS, EXPERTS, use_fp8=False)
    zero = ctx.ll.get_next_low_latency_combine_buffer(handle)
    assert zero.shape == (E_LOCAL, R * LL_MAX_TOKENS, HIDDEN) and zero.dtype == torch.bfloat16
    zero.copy_((recv_x.float() * marks[:, None, None]).bfloat16())
    combined, _, _ = ctx.ll.low_latency_combine(zero, topk, w, handle, zero_copy=True)
    close(combined, want, "low_latency_combine(zero_copy=True)")


def ll_dispatch_fp8(ctx):
    inputs = all_inputs(LL_TOKENS, 7)
    x, topk, _ = inputs[ctx.rank]
    (recv_x, scales), recv_count, handle, _, _ = ctx.ll.low_latency_dispatch(x, topk, LL_MAX_TOKENS, EXPERTS)
    C, G = R * LL_MAX_TOKENS, HIDDEN // 128
    assert recv_x.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32
    assert scales.shape == (E_LOCAL, C, G) and scales.stride() == (C * G, 1, C), scales.stride()
    check_ll_dispatch(inputs, ctx.rank, recv_x, recv_count, handle, fp8_scales=scales)
    # round_scale: powers of two; UE8M0: the same exponents, four per int32
    (recv_x, rounded), recv_count, handle, _, _ = ctx.ll.low_latency_dispatch(
        x, topk, LL_MAX_TOKENS, EXPERTS, round_scale=True
    )
    for e in range(E_LOCAL):
        n = int(recv_count[e])
        s = rounded[e, :n]
        assert torch.equal(s, torch.exp2(torch.round(torch.log2(s)))), "round_scale gives powers of two"
    check_ll_dispatch(inputs, ctx.rank, recv_x, recv_count, handle, fp8_scales=rounded)
    (_, packed), recv_count, _, _, _ = ctx.ll.low_latency_dispatch(
        x, topk, LL_MAX_TOKENS, EXPERTS, round_scale=True, use_ue8m0=True
    )
    assert packed.dtype == torch.int32 and packed.shape == (E_LOCAL, C, HIDDEN // 512)
    exponents = packed.contiguous().view(torch.uint8).view(E_LOCAL, C, G).float()
    for e in range(E_LOCAL):
        n = int(recv_count[e])
        equal(torch.exp2(exponents[e, :n] - 127), rounded[e, :n], f"UE8M0 scales[{e}]")


def ll_cuda_graph(ctx):
    """LL dispatch, the experts' work and combine in a CUDA graph (check_graph_replays)."""
    marks = torch.tensor([expert_scale(ctx.rank * E_LOCAL + e) for e in range(E_LOCAL)], device="cuda")

    def step(x, topk, w):
        recv_x, recv_count, handle, _, _ = ctx.ll.low_latency_dispatch(x, topk, LL_MAX_TOKENS, EXPERTS, use_fp8=False)
        y = (recv_x.float() * marks[:, None, None]).bfloat16()
        combined, _, _ = ctx.ll.low_latency_combine(y, topk, w, handle)
        return recv_x, recv_count, handle, combined

    def check(inputs, outputs, what):
        recv_x, recv_count, handle, combined = outputs
        check_ll_dispatch(inputs, ctx.rank, recv_x, recv_count, handle)
        close(combined, ref_ll_combine(inputs, ctx.rank, expert_scale), f"low_latency_combine ({what})")

    check_graph_replays([all_inputs(LL_TOKENS, 20 + i) for i in range(3)], ctx.rank, step, check)


def ll_hooks_and_async(ctx):
    inputs = all_inputs(LL_TOKENS, 8)
    x, topk, w = inputs[ctx.rank]
    recv_x, recv_count, handle, event, hook = ctx.ll.low_latency_dispatch(
        x, topk, LL_MAX_TOKENS, EXPERTS, use_fp8=False, return_recv_hook=True
    )
    assert callable(hook) and event.event is None
    hook()  # the receive step: the outputs are complete after it, in stream order
    check_ll_dispatch(inputs, ctx.rank, recv_x, recv_count, handle)
    marks = torch.tensor([expert_scale(ctx.rank * E_LOCAL + e) for e in range(E_LOCAL)], device=x.device)
    y = (recv_x.float() * marks[:, None, None]).bfloat16()
    combined, event, hook = ctx.ll.low_latency_combine(y, topk, w, handle, return_recv_hook=True)
    hook()
    want = ref_ll_combine(inputs, ctx.rank, expert_scale)
    close(combined, want, "low_latency_combine (hook)")
    # async_finish: the event covers the call on the communication stream
    recv_x, recv_count, handle, event, hook = ctx.ll.low_latency_dispatch(
        x, topk, LL_MAX_TOKENS, EXPERTS, use_fp8=False, async_finish=True
    )
    assert hook is None and event.event is not None and event.extra_tensors is not None
    event.current_stream_wait()
    check_ll_dispatch(inputs, ctx.rank, recv_x, recv_count, handle)
    combined, event, _ = ctx.ll.low_latency_combine(y, topk, w, handle, async_finish=True)
    event.current_stream_wait()
    close(combined, want, "low_latency_combine (async)")
    ctx.ll.clean_low_latency_buffer(LL_MAX_TOKENS, HIDDEN, EXPERTS)  # a no-op in epx; calls still work after it


def ll_rank_masking(ctx):
    """enable_shrink: each rank masks the other (before the LL buffer exists, so epx applies it when it
    makes it) and exchanges alone; both clean their masks and exchange together again."""
    other = 1 - ctx.rank
    ll_bytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(LL_MAX_TOKENS, HIDDEN, R, EXPERTS)
    buffer = deep_ep.Buffer(
        ctx.group, num_rdma_bytes=ll_bytes, low_latency_mode=True, enable_shrink=True, explicitly_destroy=True
    )
    try:
        inputs = all_inputs(LL_TOKENS, 11)
        x, topk, w = inputs[ctx.rank]
        status = torch.full((R,), -1, dtype=torch.int32, device=x.device)

        def exchange(seen, what):
            recv_x, recv_count, handle, _, _ = buffer.low_latency_dispatch(x, topk, LL_MAX_TOKENS, EXPERTS, use_fp8=False)
            check_ll_dispatch(seen, ctx.rank, recv_x, recv_count, handle)
            marks = torch.tensor([expert_scale(ctx.rank * E_LOCAL + e) for e in range(E_LOCAL)], device=x.device)
            combined, _, _ = buffer.low_latency_combine((recv_x.float() * marks[:, None, None]).bfloat16(), topk, w, handle)
            close(combined, ref_ll_combine(seen, ctx.rank, expert_scale), f"low_latency_combine ({what})")

        buffer.low_latency_update_mask_buffer(other, True)
        buffer.low_latency_query_mask_buffer(status)
        assert status.tolist() == [int(r == other) for r in range(R)], status
        # as this rank sees the exchange: the other rank's experts are -1 and it sends nothing
        alone = [
            (xs, torch.where((t >= 0) & (t // E_LOCAL == other), -1, t) if s == ctx.rank else torch.full_like(t, -1), ws)
            for s, (xs, t, ws) in enumerate(inputs)
        ]
        for _ in range(2):
            exchange(alone, "masked")
        buffer.low_latency_query_mask_buffer(status)
        assert status.tolist() == [int(r == other) for r in range(R)], status
        buffer.low_latency_clean_mask_buffer()
        buffer.low_latency_query_mask_buffer(status)
        assert status.tolist() == [0] * R, status
        for _ in range(2):
            exchange(inputs, "together again")
    finally:
        buffer.destroy()


# ---- the native API (epx.Buffer) -------------------------------------------------------------------------
def native_buffer(ctx):
    inputs = all_inputs(HT_TOKENS, 9)
    x, topk, w = inputs[ctx.rank]
    with epx.Buffer(
        ctx.group,
        hidden=HIDDEN,
        num_experts=EXPERTS,
        max_tokens_per_rank=max(HT_TOKENS),
        ll_max_tokens_per_rank=LL_MAX_TOKENS,
    ) as buffer:
        layout = buffer.get_layout(topk)
        equal(layout.is_token_in_rank, ref_layout(topk.cpu())[2], "epx layout")
        got = buffer.dispatch(x, topk, w)  # views into the buffer
        want = ref_ht_dispatch(inputs, ctx.rank)
        equal(got.recv_x, want[0], "epx recv_x (view)")
        equal(got.recv_src_idx, want[1], "epx recv_src_idx")
        assert got.num_recv_tokens == want[0].size(0)
        N = got.num_recv_tokens
        y = buffer.combine_input(N, HIDDEN)  # written in place: combine copies nothing
        y.copy_((got.recv_x.float() * rank_scale(ctx.rank)).bfloat16())
        out = buffer.combine(y, got.handle, copy=True)
        close(out.x, ref_ht_combine(inputs, ctx.rank, rank_scale), "epx combine (in place)")
        # the sums written where the caller says
        mine = torch.full((x.size(0), HIDDEN), float("nan"), dtype=torch.bfloat16, device=x.device)
        again = buffer.combine(y, got.handle, out=mine)
        assert again.x is mine
        equal(mine, out.x, "epx combine into out")
        # async with an event
        got = buffer.dispatch(x, topk, w, copy=True, async_op=True)
        torch.cuda.current_stream().wait_event(got.event)
        equal(got.recv_x, want[0], "epx recv_x (async copy)")
        # LL with the weights given to dispatch: the local combine order
        ll_inputs = all_inputs(LL_TOKENS, 10)
        lx, ltopk, lw = ll_inputs[ctx.rank]
        d = buffer.ll_dispatch(lx, ltopk, lw, use_fp8=False)
        marks = torch.tensor([expert_scale(ctx.rank * E_LOCAL + e) for e in range(E_LOCAL)], device=x.device)
        c = buffer.ll_combine((d.recv_x.float() * marks[:, None, None]).bfloat16(), d.handle)
        close(c.out, ref_ll_combine(ll_inputs, ctx.rank, expert_scale), "epx ll_combine (local order)")
        # without dispatch weights: combine takes them, in the local order too
        d = buffer.ll_dispatch(lx, ltopk, use_fp8=False)
        c = buffer.ll_combine((d.recv_x.float() * marks[:, None, None]).bfloat16(), d.handle, topk_weights=lw)
        close(c.out, ref_ll_combine(ll_inputs, ctx.rank, expert_scale), "epx ll_combine (local, weights here)")
        buffer.check_errors()


SCENARIOS = {
    f.__name__: f
    for f in (
        ht_layout,
        ht_dispatch_combine_bf16,
        ht_dispatch_fp8_column_major_scales,
        ht_worst_case_and_cached,
        ht_dispatch_by_rank,
        ht_too_many_tokens,
        ht_cuda_graph,
        ht_async_previous_event,
        ht_num_sms_and_configs,
        ll_dispatch_bf16_combine,
        ll_dispatch_fp8,
        ll_cuda_graph,
        ll_hooks_and_async,
        ll_rank_masking,
        native_buffer,
    )
}
NEEDS_A_PEER = {ll_rank_masking.__name__}


def serve(rank: int, world: int, init_file: str, tasks, results) -> None:
    """One rank: joins the group, then runs the scenarios it is sent until it gets None."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    try:
        ctx = Context(rank)
        results.put((rank, "__ready__", None))
    except Exception:
        results.put((rank, "__ready__", traceback.format_exc()))
        return
    while True:
        name = tasks.get()
        if name is None:
            break
        try:
            SCENARIOS[name](ctx)
            torch.cuda.synchronize()
            error = None
        except Exception:
            error = traceback.format_exc()
        results.put((rank, name, error))
    ctx.close()
    dist.destroy_process_group()
