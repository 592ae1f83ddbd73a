"""Triton kernels for the depth mixing of AttnRes on CUDA (attnres/gpu_kernels.py launches them).

The same ops as depth.py's references (attend_batched_reference, merge_read_reference; the CPU kernels in
csrc/depth_mix.c use the same algebra), written for a GPU. Every kernel walks D in chunks of CH (= 32, one warp's
width: tokens across warps, one element of a row per lane; D padded to a multiple of CH at most) and holds no
state of width D; a program takes BLOCK_T tokens at a time and loops over token blocks (a persistent grid: pid,
pid + P, ...). Sums over D are reduced within a warp. Accumulation is in fp32 throughout. UNROLL unrolls the
loops that do not store (their loads issued together: Triton pipelines no load that does not feed a tl.dot);
attend_bwd loads its sources in groups of UNROLL instead. The launch tiles: attnres/triton_launch.py.

* attend_fwd / attend_bwd: phase 1 of Q reads with static pseudo-queries over S sources (paper Algorithm 1),
  *scoring included*: logit[s, q] = rstd_s (v_s . w_q), rstd_s = (mean v_s^2 + eps)^-1/2, a softmax over s,
  out_q = sum_s a[s, q] v_s and lse_q. Forward reads each source twice (its logits, then its share of the mix,
  chunk by chunk) and keeps the logits and rstd for backward; backward reads each source and dL/dout twice
  (the dot products g_q . v_s that softmax's backward needs summed over s, c_q = sum_s a g_q.v_s; then every
  gradient). The gradient flows through lse as well.
* merge_fwd / merge_bwd: one read's phase 2, the softmax merge of K extras into a phase-1 output (with queries,
  the extras' key logits are computed here), fused with the PreNorm normalisation: y = h rstd is stored (with
  y32, its fp32 value, when y itself is low precision), h never is (three walks over D: the key logits, the sum of
  squares of h, y). Backward starts from y32 (depth._MergeReadC docstring): dL/dh = rstd (g - mean(g y) y), and
  the extras' logit gradients as a_k dL/dh . (e_k - h) with h = y32 / rstd, which stays accurate where
  e_k ~ h (a_k ~ 1).

Sources, extras and gradient targets are given as a table of int64 addresses (no stacked copy) with a dtype code
each: 0 = fp32, 1 = the one low-precision dtype LO (bf16 or fp16) of the call. Each gradient target has a mode:
0 skip, 1 write, 2 accumulate (a tracked source's fp32 sink; grad_sinks.GradSink.target). Gradients of the queries
are added per program into a zeroed [P, Q, D] buffer that the caller reduces (deterministic, no atomics).
write_table fills such a table from kernel arguments, so that no host memory is read at run time (CUDA graphs).

Rules that keep these kernels runnable under the Triton interpreter (TRITON_INTERPRET=1, the CPU tests): every
load is widened to fp32 before any arithmetic, arithmetic on a loop index goes through tl.cast, masks come from
full-shape comparisons (a scalar condition and-ed with a tensor is not a mask there), and a low-precision store
rounds to nearest even by hand (_round: the interpreter would truncate a bf16 store).
"""

from __future__ import annotations

import triton
import triton.language as tl

TABLE_WIDTH = 32  # values written by one write_table launch
TABLE_BIAS = 1 << 32  # added to every value by the launcher: all arguments are int64 (one compiled variant)


@triton.jit
def _round(x, DT: tl.constexpr):
    """fp32 x as DT, rounded to nearest even on every backend (the interpreter truncates a cast to bf16)."""
    if tl.bfloat16 == DT:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16) << 16
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))  # NaN stays NaN
    return x.to(DT)


@triton.jit
def _load(addr, code, offs, mask, LO: tl.constexpr):
    """A tile of the tensor at integer address ``addr`` (dtype code 0: fp32, else LO), widened to fp32."""
    if code != 0:
        x = tl.load(addr.to(tl.pointer_type(LO)) + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.load(addr.to(tl.pointer_type(tl.float32)) + offs, mask=mask, other=0.0)
    return x


@triton.jit
def _put(addr, code, mode, offs, mask, val, LO: tl.constexpr):
    """Write (mode 1) or add into (mode 2, fp32 only: a sink) a tile of the gradient target at ``addr``."""
    if code != 0:  # a fresh gradient of a low-precision source: written, never accumulated
        tl.store(addr.to(tl.pointer_type(LO)) + offs, _round(val, LO), mask=mask)
    else:
        ptr = addr.to(tl.pointer_type(tl.float32)) + offs
        if mode == 2:
            val += tl.load(ptr, mask=mask, other=0.0)
        tl.store(ptr, val, mask=mask)


@triton.jit
def _source(tab, S, s, offs, mask, LO: tl.constexpr):
    """A tile of source s (clamped to S - 1: a prefetch past the last source is masked off) of the table."""
    s = tl.minimum(s, S - 1)
    return _load(tl.load(tab + s), tl.load(tab + S + s), offs, mask, LO)


@triton.jit
def _sources(tab, S, s0, offs, t, N, dmask, G: tl.constexpr, LO: tl.constexpr):
    """Tiles of sources s0 .. s0 + G - 1 of the table (zero past the last source), loaded before any is used."""
    xs = ()
    for i in tl.static_range(G):
        xs = xs + (_source(tab, S, s0 + i, offs, _live(t, N, s0 + i, S)[:, None] & dmask[None, :], LO),)
    return xs


@triton.jit
def _live(t, N, s, S):
    """The rows of tokens t that source s has: t < N while s < S, else none."""
    return t < tl.where(s < S, N, 0)


@triton.jit
def _zeros(shape: tl.constexpr, NC: tl.constexpr):
    z = ()
    for _c in tl.static_range(NC):
        z = z + (tl.zeros(shape, tl.float32),)
    return z


@triton.jit(do_not_specialize=[f"v{i}" for i in range(TABLE_WIDTH)])
def write_table(
    out,
    n,
    v0,
    v1,
    v2,
    v3,
    v4,
    v5,
    v6,
    v7,
    v8,
    v9,
    v10,
    v11,
    v12,
    v13,
    v14,
    v15,
    v16,
    v17,
    v18,
    v19,
    v20,
    v21,
    v22,
    v23,
    v24,
    v25,
    v26,
    v27,
    v28,
    v29,
    v30,
    v31,
):
    """out[i] = v_i - TABLE_BIAS for i < n <= TABLE_WIDTH (int64): a table whose values travel as kernel
    arguments (each biased by TABLE_BIAS, so that every argument is an int64 whatever its value)."""
    i = tl.arange(0, 32)
    vals = tl.zeros([32], tl.int64)
    vals = tl.where(i == 0, v0, vals)
    vals = tl.where(i == 1, v1, vals)
    vals = tl.where(i == 2, v2, vals)
    vals = tl.where(i == 3, v3, vals)
    vals = tl.where(i == 4, v4, vals)
    vals = tl.where(i == 5, v5, vals)
    vals = tl.where(i == 6, v6, vals)
    vals = tl.where(i == 7, v7, vals)
    vals = tl.where(i == 8, v8, vals)
    vals = tl.where(i == 9, v9, vals)
    vals = tl.where(i == 10, v10, vals)
    vals = tl.where(i == 11, v11, vals)
    vals = tl.where(i == 12, v12, vals)
    vals = tl.where(i == 13, v13, vals)
    vals = tl.where(i == 14, v14, vals)
    vals = tl.where(i == 15, v15, vals)
    vals = tl.where(i == 16, v16, vals)
    vals = tl.where(i == 17, v17, vals)
    vals = tl.where(i == 18, v18, vals)
    vals = tl.where(i == 19, v19, vals)
    vals = tl.where(i == 20, v20, vals)
    vals = tl.where(i == 21, v21, vals)
    vals = tl.where(i == 22, v22, vals)
    vals = tl.where(i == 23, v23, vals)
    vals = tl.where(i == 24, v24, vals)
    vals = tl.where(i == 25, v25, vals)
    vals = tl.where(i == 26, v26, vals)
    vals = tl.where(i == 27, v27, vals)
    vals = tl.where(i == 28, v28, vals)
    vals = tl.where(i == 29, v29, vals)
    vals = tl.where(i == 30, v30, vals)
    vals = tl.where(i == 31, v31, vals)
    tl.store(out + i, vals - (1 << 32), mask=i < n)


@triton.jit(do_not_specialize=["S", "Q", "n_blocks"])
def attend_fwd(
    tab,
    S,
    q_ptr,
    lse_ptr,
    logit_ptr,
    rstd_ptr,
    N,
    D,
    Q,
    eps,
    n_blocks,
    LO: tl.constexpr,
    Q_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CH: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """tab [2 S + Q]: source addresses, their dtype codes, then the addresses of the Q outputs [N, D] fp32;
    q_ptr [Q, D] fp32; lse_ptr [N, Q]; logit_ptr [S, N, Q] and rstd_ptr [S, N] (every source's logits and rstd,
    kept for backward), fp32. Program pid takes token blocks pid, pid + P, ...; D is walked in chunks of CH.

    Pass 1 scores the sources one by one (each source's chunks in turn: its sum of squares and Q dot products)
    and keeps the running max and sum of the softmax; pass 2 walks D chunk by chunk, each chunk mixing every
    source with its final weight, and writes the Q outputs: two reads of each source, no [Q, D] state."""
    qi = tl.arange(0, Q_PAD)
    qmask = qi < Q
    j = tl.arange(0, CH)
    out_ptr = tl.load(tab + 2 * S + qi, mask=qmask, other=0).to(tl.pointer_type(tl.float32))  # [QP]
    for blk in range(tl.program_id(0), n_blocks, tl.num_programs(0)):
        t = tl.cast(blk, tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT] token rows
        tmask = t < N
        qt = qmask[:, None] & tmask[None, :]  # [QP, BT]
        m = tl.full([Q_PAD, BLOCK_T], float("-inf"), tl.float32)  # running max of the logits
        den = tl.zeros([Q_PAD, BLOCK_T], tl.float32)  # running sum of exp(logit - m)
        for s in range(S):
            addr, code = tl.load(tab + s), tl.load(tab + S + s)
            ss = tl.zeros([BLOCK_T, CH], tl.float32)
            dots = tl.zeros([Q_PAD, BLOCK_T], tl.float32)
            for d0 in tl.range(0, D, CH, loop_unroll_factor=UNROLL):
                d = d0 + j
                dmask = d < D
                x = _load(addr, code, t[:, None] * D + d[None, :], tmask[:, None] & dmask[None, :], LO)  # [BT, CH]
                w = tl.load(q_ptr + qi[:, None] * D + d[None, :], mask=qmask[:, None] & dmask[None, :], other=0.0)
                ss += x * x
                dots += tl.sum(w[:, None, :] * x[None, :, :], axis=2)
            r = tl.rsqrt(tl.sum(ss, axis=1) / D + eps)  # [BT]
            logit = dots * r[None, :]  # [QP, BT]
            sN = tl.cast(s, tl.int64) * N
            tl.store(logit_ptr + (sN + t[None, :]) * Q + qi[:, None], logit, mask=qt)
            tl.store(rstd_ptr + sN + t, r, mask=tmask)
            m_new = tl.maximum(m, logit)
            den = den * tl.exp(m - m_new) + tl.exp(logit - m_new)
            m = m_new
        lse = m + tl.log(den)
        tl.store(lse_ptr + t[None, :] * Q + qi[:, None], lse, mask=qt)
        tl.debug_barrier()  # pass 2 reads the logits back, maybe in other threads
        for d0 in range(0, D, CH):
            d = d0 + j
            dmask = d < D
            acc = tl.zeros([Q_PAD, BLOCK_T, CH], tl.float32)
            for s in tl.range(0, S, loop_unroll_factor=UNROLL):
                sN = tl.cast(s, tl.int64) * N
                a = tl.exp(tl.load(logit_ptr + (sN + t[None, :]) * Q + qi[:, None], mask=qt, other=0.0) - lse)
                offs = t[:, None] * D + d[None, :]
                x = _load(tl.load(tab + s), tl.load(tab + S + s), offs, tmask[:, None] & dmask[None, :], LO)
                acc += a[:, :, None] * x[None, :, :]
            mask = qt[:, :, None] & dmask[None, None, :]
            tl.store(out_ptr[:, None, None] + t[None, :, None] * D + d[None, None, :], acc, mask=mask)
        tl.debug_barrier()  # the next token block's pass 1 overwrites nothing pass 2 reads, but keeps them apart


@triton.jit(do_not_specialize=["S", "Q", "n_blocks"])
def attend_bwd(
    tab,
    S,
    q_ptr,
    lse_ptr,
    glse_ptr,
    logit_ptr,
    rstd_ptr,
    gs_ptr,
    coef_ptr,
    dq_ptr,
    N,
    D,
    Q,
    n_blocks,
    LO: tl.constexpr,
    Q_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CH: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """Backward of attend_fwd. tab [5 S + Q]: source addresses, dtype codes, gradient-target addresses, their
    dtype codes and modes, then the addresses of dL/dout_q [N, D] fp32; lse, glse [N, Q]; logit_ptr [S, N, Q]
    and rstd_ptr [S, N] (attend_fwd's); gs_ptr [S, N, Q] and coef_ptr [S, N]: scratch; dq_ptr [P, Q, D] (zeroed;
    one slice per program, added into). All fp32. Program pid takes token blocks pid, pid + P, ...

    Pass 1 walks D chunk by chunk (each chunk of dL/dout loaded once) and sums gv[s, q] = g_q . v_s over the chunks
    into gs; then softmax's backward per source: c_q = sum_s a g_q.v_s, dL/dlogit = a (g.v - c + dL/dlse), its
    product with rstd (kept in gs) and the key norm's coefficient (coef). Pass 2 walks D again: each source's
    gradient chunk (mix term, key-logit term) and the queries' gradient."""
    pid = tl.program_id(0)
    qi = tl.arange(0, Q_PAD)
    qmask = qi < Q
    j = tl.arange(0, CH)
    g_ptr = tl.load(tab + 5 * S + qi, mask=qmask, other=0).to(tl.pointer_type(tl.float32))  # [QP]
    for blk in range(pid, n_blocks, tl.num_programs(0)):
        t = tl.cast(blk, tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = t < N
        qt = qmask[:, None] & tmask[None, :]  # [QP, BT]
        lse = tl.load(lse_ptr + t[None, :] * Q + qi[:, None], mask=qt, other=0.0)  # [QP, BT]
        glse = tl.load(glse_ptr + t[None, :] * Q + qi[:, None], mask=qt, other=0.0)
        # pass 1: gv[s, q, t] = g_q . v_s, summed over the chunks of D into gs
        for d0 in range(0, D, CH):
            d = d0 + j
            dmask = d < D
            gmask = qt[:, :, None] & dmask[None, None, :]
            g = tl.load(g_ptr[:, None, None] + t[None, :, None] * D + d[None, None, :], mask=gmask, other=0.0)
            offs = t[:, None] * D + d[None, :]
            for group in range(0, S, UNROLL):  # UNROLL sources at a time: their loads in flight together
                s0 = tl.cast(group, tl.int32)
                xs = _sources(tab, S, s0, offs, t, N, dmask, UNROLL, LO)
                for i in tl.static_range(UNROLL):
                    part = tl.sum(g * xs[i][None, :, :], axis=2)  # [QP, BT]
                    ptr = gs_ptr + (tl.cast(s0 + i, tl.int64) * N + t[None, :]) * Q + qi[:, None]
                    smask = qmask[:, None] & _live(t, N, s0 + i, S)[None, :]
                    if d0 > 0:
                        part += tl.load(ptr, mask=smask, other=0.0)
                    tl.store(ptr, part, mask=smask)
        tl.debug_barrier()
        # softmax's backward, per source: c_q = sum_s a[s, q] gv[s, q] = g_q . out_q first
        cq = tl.zeros([Q_PAD, BLOCK_T], tl.float32)
        for s in range(S):
            at = (tl.cast(s, tl.int64) * N + t[None, :]) * Q + qi[:, None]
            a = tl.where(qt, tl.exp(tl.load(logit_ptr + at, mask=qt, other=0.0) - lse), 0.0)
            cq += a * tl.load(gs_ptr + at, mask=qt, other=0.0)
        for s in range(S):
            sN = tl.cast(s, tl.int64) * N
            at = (sN + t[None, :]) * Q + qi[:, None]
            logit = tl.load(logit_ptr + at, mask=qt, other=0.0)
            a = tl.where(qt, tl.exp(logit - lse), 0.0)
            gz = a * (tl.load(gs_ptr + at, mask=qt, other=0.0) - cq + glse)  # dL/dlogit [QP, BT]
            r = tl.load(rstd_ptr + sN + t, mask=tmask, other=0.0)
            tl.store(gs_ptr + at, gz * r[None, :], mask=qt)  # dL/d(v_s . w_q)
            tl.store(coef_ptr + sN + t, tl.sum(gz * logit, axis=0) * r * r / D, mask=tmask)
        tl.debug_barrier()
        # pass 2: dL/dv_s = sum_q a g_q + sum_q gs w_q - coef v_s; dL/dw_q = sum_s,t gs v_s
        for d0 in range(0, D, CH):
            d = d0 + j
            dmask = d < D
            gmask = qt[:, :, None] & dmask[None, None, :]
            g = tl.load(g_ptr[:, None, None] + t[None, :, None] * D + d[None, None, :], mask=gmask, other=0.0)
            wmask = qmask[:, None] & dmask[None, :]
            w = tl.load(q_ptr + qi[:, None] * D + d[None, :], mask=wmask, other=0.0)  # [QP, CH]
            dq = tl.zeros([Q_PAD, BLOCK_T, CH], tl.float32)
            offs = t[:, None] * D + d[None, :]
            xmask = tmask[:, None] & dmask[None, :]
            for group in range(0, S, UNROLL):  # UNROLL sources at a time: their loads in flight together
                s0 = tl.cast(group, tl.int32)
                xs = _sources(tab, S, s0, offs, t, N, dmask, UNROLL, LO)
                for i in tl.static_range(UNROLL):
                    s = tl.minimum(s0 + i, S - 1)
                    sN = tl.cast(s, tl.int64) * N
                    at = (sN + t[None, :]) * Q + qi[:, None]
                    smask = qmask[:, None] & _live(t, N, s0 + i, S)[None, :]
                    x = xs[i]
                    a = tl.where(smask, tl.exp(tl.load(logit_ptr + at, mask=smask, other=0.0) - lse), 0.0)
                    gsv = tl.load(gs_ptr + at, mask=smask, other=0.0)  # 0 past the last source
                    dq += gsv[:, :, None] * x[None, :, :]
                    mode = tl.load(tab + 4 * S + s) * tl.cast(s0 + i < S, tl.int64)  # 0 past the last source
                    if mode != 0:
                        coef = tl.load(coef_ptr + sN + t, mask=tmask, other=0.0)
                        dx = tl.sum(a[:, :, None] * g + gsv[:, :, None] * w[:, None, :], axis=0) - coef[:, None] * x
                        _put(tl.load(tab + 2 * S + s), tl.load(tab + 3 * S + s), mode, offs, xmask, dx, LO)
            ptr = dq_ptr + tl.cast(pid, tl.int64) * Q * D + qi[:, None] * D + d[None, :]
            tl.store(ptr, tl.load(ptr, mask=wmask, other=0.0) + tl.sum(dq, axis=1), mask=wmask)
        tl.debug_barrier()  # the next token block's pass 1 overwrites gs


@triton.jit(do_not_specialize=["n_blocks"])
def merge_fwd(
    base_ptr,
    z_ptr,
    tab,
    q_ptr,
    y_ptr,
    y32_ptr,
    a_ptr,
    rstd_ptr,
    logit_ptr,
    krstd_ptr,
    N,
    D,
    key_eps,
    eps,
    n_blocks,
    K: tl.constexpr,
    HAS_Q: tl.constexpr,
    LOW_Y: tl.constexpr,
    LO: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CH: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """base [N, D] (any float dtype), z [K, N] fp32, tab [2 K]: extra addresses, dtype codes; q_ptr [K, D] fp32
    (HAS_Q); y [N, D] (the output dtype) and, with LOW_Y, y32 [N, D] fp32 (y's value before rounding); a [K + 1, N],
    rstd [N], logits and key_rstd [K, N] (HAS_Q), fp32. Program pid takes token blocks pid, pid + P, ...

    Three walks over D in chunks of CH: the extras' key logits (HAS_Q), then the sum of squares of
    h = a_0 base + sum_k a_k e_k, then y = h rstd (h recomputed chunk by chunk, never stored)."""
    j = tl.arange(0, CH)
    for blk in range(tl.program_id(0), n_blocks, tl.num_programs(0)):
        t = tl.cast(blk, tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = t < N
        zs = ()  # K x [BT]: every extra's logit relative to base's group (whose logit is 0)
        for k in tl.static_range(K):
            zk = tl.load(z_ptr + k * N + t, mask=tmask, other=0.0)
            if HAS_Q:
                addr, code = tl.load(tab + k), tl.load(tab + K + k)
                ss = tl.zeros([BLOCK_T, CH], tl.float32)
                dot = tl.zeros([BLOCK_T, CH], tl.float32)
                for d0 in tl.range(0, D, CH, loop_unroll_factor=UNROLL):
                    d = d0 + j
                    dmask = d < D
                    x = _load(addr, code, t[:, None] * D + d[None, :], tmask[:, None] & dmask[None, :], LO)
                    ss += x * x
                    dot += x * tl.load(q_ptr + k * D + d, mask=dmask, other=0.0)[None, :]
                kr = tl.rsqrt(tl.sum(ss, axis=1) / D + key_eps)
                lg = tl.sum(dot, axis=1) * kr
                tl.store(logit_ptr + k * N + t, lg, mask=tmask)
                tl.store(krstd_ptr + k * N + t, kr, mask=tmask)
                zk += lg
            zs = zs + (zk,)
        m = tl.zeros([BLOCK_T], tl.float32)
        for k in tl.static_range(K):
            m = tl.maximum(m, zs[k])
        den = tl.exp(-m)
        for k in tl.static_range(K):
            den += tl.exp(zs[k] - m)
        a0 = tl.exp(-m) / den
        tl.store(a_ptr + t, a0, mask=tmask)
        ak = ()
        for k in tl.static_range(K):
            ak = ak + (tl.exp(zs[k] - m) / den,)
            tl.store(a_ptr + (k + 1) * N + t, ak[k], mask=tmask)
        ss = tl.zeros([BLOCK_T, CH], tl.float32)
        for d0 in tl.range(0, D, CH, loop_unroll_factor=UNROLL):
            h = _mixed(base_ptr, tab, a0, ak, t, tmask, d0 + j, D, K, LO)
            ss += h * h
        r = tl.rsqrt(tl.sum(ss, axis=1) / D + eps)
        tl.store(rstd_ptr + t, r, mask=tmask)
        for d0 in range(0, D, CH):  # stores in the loop: unrolling would not let the next loads go first
            d = d0 + j
            mask = tmask[:, None] & (d < D)[None, :]
            y = _mixed(base_ptr, tab, a0, ak, t, tmask, d, D, K, LO) * r[:, None]
            tl.store(y_ptr + t[:, None] * D + d[None, :], _round(y, y_ptr.dtype.element_ty), mask=mask)
            if LOW_Y:
                tl.store(y32_ptr + t[:, None] * D + d[None, :], y, mask=mask)


@triton.jit
def _mixed(base_ptr, tab, a0, ak, t, tmask, d, D, K: tl.constexpr, LO: tl.constexpr):
    """One chunk [BT, CH] of h = a_0 base + sum_k a_k e_k (the extras at tab's addresses), fp32."""
    offs = t[:, None] * D + d[None, :]
    mask = tmask[:, None] & (d < D)[None, :]
    h = a0[:, None] * tl.load(base_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for k in tl.static_range(K):
        h += ak[k][:, None] * _load(tl.load(tab + k), tl.load(tab + K + k), offs, mask, LO)
    return h


@triton.jit(do_not_specialize=["n_blocks"])
def merge_bwd(
    g_ptr,
    y_ptr,
    a_ptr,
    rstd_ptr,
    tab,
    q_ptr,
    logit_ptr,
    krstd_ptr,
    gbase_ptr,
    gz_ptr,
    dq_ptr,
    N,
    D,
    n_blocks,
    K: tl.constexpr,
    HAS_Q: tl.constexpr,
    LO: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CH: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """Backward of merge_fwd from g = dL/dy and y [N, D] fp32 (merge_fwd's y32, or y when it is fp32): tab [5 K]
    (extras, codes, targets, codes, modes); writes grad_base [N, D] (base's dtype), grad_z [K, N] fp32 and adds
    into this program's slice of dq [P, K, D] (HAS_Q; zeroed). Program pid takes token blocks pid, pid + P, ...

    Three walks over D in chunks of CH: mean(g y); then each extra's logit gradient
    a_k rstd u . (e_k - h), u = g - mean(g y) y, h = y / rstd; then the gradients of base, of the extras
    (their key logits' terms included) and of the queries."""
    pid = tl.program_id(0)
    j = tl.arange(0, CH)
    for blk in range(pid, n_blocks, tl.num_programs(0)):
        t = tl.cast(blk, tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = t < N
        gy = tl.zeros([BLOCK_T, CH], tl.float32)
        for d0 in tl.range(0, D, CH, loop_unroll_factor=UNROLL):
            d = d0 + j
            offs = t[:, None] * D + d[None, :]
            mask = tmask[:, None] & (d < D)[None, :]
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            gy += g * tl.load(y_ptr + offs, mask=mask, other=0.0)
        mean_gy = tl.sum(gy, axis=1) / D
        r = tl.load(rstd_ptr + t, mask=tmask, other=1.0)
        inv_r = 1.0 / r
        parts = _zeros([BLOCK_T, CH], K)  # K x [BT, CH]: dL/dh . (e_k - h) / rstd, element-wise
        for d0 in tl.range(0, D, CH, loop_unroll_factor=UNROLL):
            d = d0 + j
            offs = t[:, None] * D + d[None, :]
            mask = tmask[:, None] & (d < D)[None, :]
            y = tl.load(y_ptr + offs, mask=mask, other=0.0)
            u = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32) - mean_gy[:, None] * y
            h = y * inv_r[:, None]
            new = ()
            for k in tl.static_range(K):
                x = _load(tl.load(tab + k), tl.load(tab + K + k), offs, mask, LO)
                new = new + (parts[k] + u * (x - h),)
            parts = new
        ra0 = r * tl.load(a_ptr + t, mask=tmask, other=0.0)
        ra = ()  # K x [BT]: rstd a_k
        sc = ()  # K x [BT]: dL/d(e_k . q_k) = dL/dz_k key_rstd_k (HAS_Q)
        cf = ()  # K x [BT]: the key norm's coefficient (HAS_Q)
        for k in tl.static_range(K):
            ra = ra + (r * tl.load(a_ptr + (k + 1) * N + t, mask=tmask, other=0.0),)
            gz = ra[k] * tl.sum(parts[k], axis=1)
            tl.store(gz_ptr + k * N + t, gz, mask=tmask)
            if HAS_Q:
                kr = tl.load(krstd_ptr + k * N + t, mask=tmask, other=0.0)
                lg = tl.load(logit_ptr + k * N + t, mask=tmask, other=0.0)
                sc = sc + (gz * kr,)
                cf = cf + (gz * lg * kr * kr / D,)
        for d0 in range(0, D, CH):  # stores in the loop: unrolling would not let the next loads go first
            d = d0 + j
            dmask = d < D
            offs = t[:, None] * D + d[None, :]
            mask = tmask[:, None] & dmask[None, :]
            y = tl.load(y_ptr + offs, mask=mask, other=0.0)
            u = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32) - mean_gy[:, None] * y
            tl.store(gbase_ptr + offs, _round(ra0[:, None] * u, gbase_ptr.dtype.element_ty), mask=mask)
            for k in tl.static_range(K):
                dx = ra[k][:, None] * u
                mode = tl.load(tab + 4 * K + k)
                if HAS_Q:  # the key logit l_k = key_rstd_k (e_k . q_k)
                    x = _load(tl.load(tab + k), tl.load(tab + K + k), offs, mask, LO)
                    qk = tl.load(q_ptr + k * D + d, mask=dmask, other=0.0)
                    dx += sc[k][:, None] * qk[None, :] - cf[k][:, None] * x
                    ptr = dq_ptr + (tl.cast(pid, tl.int64) * K + k) * D + d
                    tl.store(ptr, tl.load(ptr, mask=dmask, other=0.0) + tl.sum(sc[k][:, None] * x, axis=0), mask=dmask)
                if mode != 0:
                    _put(tl.load(tab + 2 * K + k), tl.load(tab + 3 * K + k), mode, offs, mask, dx, LO)
