"""The depth kernels' byte model (experiments/depth_roofline.py): per call by hand, and per step from the
schemes' own calls. No GPU needed (the timing half runs in scripts/gpu_suite.sh)."""

from __future__ import annotations

from collections import Counter

from experiments.depth_roofline import call_bytes, kernel_calls_of, step_bytes, step_calls


def test_call_bytes_by_hand():
    N, D = 4, 8
    # attend over an fp32 and a bf16 source, 1 query: sources 4 + 2 bytes, 1 fp32 output, lse, the query
    t = call_bytes("attend_fwd", N, D, ["fp32", "bf16"], 1)
    assert t.minimum == 6 * N * D + 4 * N * D + 4 * N + 4 * D
    # two passes over the sources; logits and rstd [S, N, Q + 1] kept for backward
    assert t.passes == 2 * 6 * N * D + 4 * N * D + 4 * N + 2 * N * 2 * 4 + 4 * D
    # merge of one bf16 extra into an fp32 base, with its query, y bf16 (and y32 for backward)
    t = call_bytes("merge_fwd", N, D, ["bf16"], 1, has_q=True, out="bf16")
    small = (2 * 1 + 2) * N * 4
    assert t.minimum == 4 * N * D + 2 * N * D + (2 + 4) * N * D + small
    assert t.passes == 2 * 4 * N * D + 3 * 2 * N * D + (2 + 4) * N * D + small
    # its backward, the extra's gradient written once in bf16 (not a sink)
    t = call_bytes("merge_bwd", N, D, ["bf16"], 1, has_q=True, out="bf16", sinks=False)
    assert t.minimum == (2 + 4) * N * D + 2 * N * D + 4 * N * D + 2 * N * D + small


def test_passes_are_never_fewer_than_the_minimum():
    for kernel in ("attend_fwd", "attend_bwd", "merge_fwd", "merge_bwd"):
        for sources in (["fp32"], ["fp32", "bf16", "bf16"], ["bf16"] * 5):
            n = len(sources) if kernel.startswith("merge") else 3
            t = call_bytes(kernel, 64, 96, sources, n, has_q=True, out="bf16")
            assert t.passes >= t.minimum > 0


def test_step_bytes_sum_the_schemes_calls():
    """Block at 4 layers (8 sublayers, N = 8 blocks of one sublayer) and Full: every call's forward and backward."""
    for scheme in ("block", "full"):
        calls = step_calls(4, scheme)
        assert sum(calls.values()) > 0
        assert {c.op for c in calls} == {"attend", "merge"}
        total = step_bytes(calls, 16, 32)
        one_by_one = sum(
            count * call_bytes(k, 16, 32, c.sources, c.n, **kw).minimum
            for c, count in calls.items()
            for k, kw in kernel_calls_of(c)
        )
        assert total.minimum == one_by_one
    # Full reads more than Block at the same depth
    assert step_bytes(step_calls(6, "full"), 16, 32).minimum > step_bytes(step_calls(6, "block"), 16, 32).minimum
    assert step_bytes(Counter(), 16, 32).minimum == 0
