"""Triton kernels for the depth mixing of AttnRes on CUDA (attnres/gpu_kernels.py launches them).

The same ops as depth.py's references (attend_batched_reference, merge_read_reference; the CPU kernels in
csrc/depth_mix.c use the same algebra), written for a GPU: a program takes BLOCK_T tokens x the whole model
width (BLOCK_D, the next power of two of D, masked), keeps every row it touches in registers, and accumulates in
fp32.

* attend_fwd / attend_bwd: phase 1 of Q reads with static pseudo-queries over S sources (paper Algorithm 1),
  *scoring included*: logit[s, q] = rstd_s (v_s . w_q), rstd_s = (mean v_s^2 + eps)^-1/2, an online softmax over
  s, out_q = sum_s a[s, q] v_s and lse_q. Each source is read once forward (for its RMS, its Q logits and its Q
  multiply-adds) and twice backward (pass 1: the Q dot products g_q . v_s that softmax's backward needs summed
  over s, c_q = sum_s a g_q.v_s; pass 2: everything else). The gradient flows through lse as well.
* merge_fwd / merge_bwd: one read's phase 2, the online-softmax merge of K extras into a phase-1 output (with
  queries, the extras' key logits are computed here), fused with the PreNorm normalisation: y = h rstd is
  stored, h never is; backward takes g.h from the norm's backward (the depth._MergeReadC docstring).

Sources, extras and gradient targets are given as a table of int64 addresses (no stacked copy) with a dtype code
each: 0 = fp32, 1 = the one low-precision dtype LO (bf16 or fp16) of the call. Each gradient target has a mode:
0 skip, 1 write, 2 accumulate (a tracked source's fp32 sink; grad_sinks.GradSink.target). Gradients of the queries
are summed per program into a [P, Q, D] buffer that the caller reduces (deterministic, no atomics).

Rules that keep these kernels runnable under the Triton interpreter (TRITON_INTERPRET=1, the CPU tests): every
load is widened to fp32 before any arithmetic, arithmetic on a loop index goes through tl.cast, and there is one
launch configuration (no autotuning).
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    """Write (mode 1) or add into (mode 2, fp32 only: a sink) the gradient target at ``addr``."""
    if code != 0:  # a fresh gradient of a low-precision source: written, never accumulated
        tl.store(addr.to(tl.pointer_type(LO)) + offs, val.to(LO), mask=mask)
    else:
        ptr = addr.to(tl.pointer_type(tl.float32)) + offs
        if mode == 2:
            val += tl.load(ptr, mask=mask, other=0.0)
        tl.store(ptr, val, mask=mask)


@triton.jit
def attend_fwd(
    tab,
    S,
    q_ptr,
    lse_ptr,
    N,
    D,
    Q,
    eps,
    LO: tl.constexpr,
    Q_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """tab [2 S + Q]: source addresses, their dtype codes, then the addresses of the Q outputs [N, D] fp32;
    q_ptr [Q, D] fp32; lse_ptr [N, Q] fp32."""
    t = tl.cast(tl.program_id(0), tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT] token rows
    d = tl.arange(0, BLOCK_D)
    qi = tl.arange(0, Q_PAD)
    tmask, dmask, qmask = t < N, d < D, qi < Q
    offs = t[:, None] * D + d[None, :]  # [BT, BD]
    mask = tmask[:, None] & dmask[None, :]
    w = tl.load(q_ptr + qi[:, None] * D + d[None, :], mask=qmask[:, None] & dmask[None, :], other=0.0)  # [QP, BD]
    m = tl.full([Q_PAD, BLOCK_T], float("-inf"), tl.float32)  # running max of the logits
    den = tl.zeros([Q_PAD, BLOCK_T], tl.float32)  # running sum of exp(logit - m)
    acc = tl.zeros([Q_PAD, BLOCK_T, BLOCK_D], tl.float32)
    for s in range(S):
        x = _load(tl.load(tab + s), tl.load(tab + S + s), offs, mask, LO)  # [BT, BD]
        r = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)  # [BT]
        logit = tl.sum(x[None, :, :] * w[:, None, :], axis=2) * r[None, :]  # [QP, BT]
        m_new = tl.maximum(m, logit)
        scale = tl.exp(m - m_new)
        p = tl.exp(logit - m_new)
        acc = acc * scale[:, :, None] + p[:, :, None] * x[None, :, :]
        den = den * scale + p
        m = m_new
    out_ptr = tl.load(tab + 2 * S + qi, mask=qmask, other=0).to(tl.pointer_type(tl.float32))  # [QP]
    tl.store(
        out_ptr[:, None, None] + offs[None, :, :], acc / den[:, :, None], mask=qmask[:, None, None] & mask[None, :, :]
    )
    tl.store(lse_ptr + t[None, :] * Q + qi[:, None], m + tl.log(den), mask=qmask[:, None] & tmask[None, :])


@triton.jit
def attend_bwd(
    tab,
    S,
    q_ptr,
    lse_ptr,
    glse_ptr,
    dq_ptr,
    N,
    D,
    Q,
    eps,
    n_blocks,
    P,
    LO: tl.constexpr,
    Q_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Backward of attend_fwd. tab [5 S + Q]: source addresses, dtype codes, gradient-target addresses, their
    dtype codes and modes, then the addresses of dL/dout_q [N, D] fp32; glse_ptr [N, Q] fp32; dq_ptr [P, Q, D]
    fp32 (one slice per program). Program pid takes token blocks pid, pid + P, ..."""
    pid = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    qi = tl.arange(0, Q_PAD)
    dmask, qmask = d < D, qi < Q
    w = tl.load(q_ptr + qi[:, None] * D + d[None, :], mask=qmask[:, None] & dmask[None, :], other=0.0)  # [QP, BD]
    g_ptr = tl.load(tab + 5 * S + qi, mask=qmask, other=0).to(tl.pointer_type(tl.float32))  # [QP]
    dq = tl.zeros([Q_PAD, BLOCK_D], tl.float32)
    for blk in range(pid, n_blocks, P):
        t = tl.cast(blk, tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = t < N
        offs = t[:, None] * D + d[None, :]
        mask = tmask[:, None] & dmask[None, :]
        qt = qmask[:, None] & tmask[None, :]  # [QP, BT]
        g = tl.load(
            g_ptr[:, None, None] + offs[None, :, :], mask=qmask[:, None, None] & mask[None, :, :], other=0.0
        )  # [QP, BT, BD]
        lse = tl.load(lse_ptr + t[None, :] * Q + qi[:, None], mask=qt, other=0.0)  # [QP, BT]
        glse = tl.load(glse_ptr + t[None, :] * Q + qi[:, None], mask=qt, other=0.0)
        # pass 1: c_q = sum_s a[s, q] (g_q . v_s) = g_q . out_q (softmax's backward needs it before any dlogit)
        c = tl.zeros([Q_PAD, BLOCK_T], tl.float32)
        for s in range(S):
            x = _load(tl.load(tab + s), tl.load(tab + S + s), offs, mask, LO)
            r = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
            logit = tl.sum(x[None, :, :] * w[:, None, :], axis=2) * r[None, :]
            a = tl.where(qt, tl.exp(logit - lse), 0.0)
            c += a * tl.sum(g * x[None, :, :], axis=2)
        # pass 2: dL/dlogit = a (g.v - c + dL/dlse); the key logit's backward and the mix term
        for s in range(S):
            x = _load(tl.load(tab + s), tl.load(tab + S + s), offs, mask, LO)
            r = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
            logit = tl.sum(x[None, :, :] * w[:, None, :], axis=2) * r[None, :]
            a = tl.where(qt, tl.exp(logit - lse), 0.0)
            gz = a * (tl.sum(g * x[None, :, :], axis=2) - c + glse)  # [QP, BT]
            scaled = gz * r[None, :]
            dq += tl.sum(scaled[:, :, None] * x[None, :, :], axis=1)
            mode = tl.load(tab + 4 * S + s)
            if mode != 0:
                coef = tl.sum(gz * logit, axis=0) * r * r / D  # [BT]
                dx = (
                    tl.sum(a[:, :, None] * g, axis=0)
                    + tl.sum(scaled[:, :, None] * w[:, None, :], axis=0)
                    - coef[:, None] * x
                )
                _put(tl.load(tab + 2 * S + s), tl.load(tab + 3 * S + s), mode, offs, mask, dx, LO)
    tl.store(
        dq_ptr + tl.cast(pid, tl.int64) * Q * D + qi[:, None] * D + d[None, :], dq, mask=qmask[:, None] & dmask[None, :]
    )


@triton.jit
def merge_fwd(
    base_ptr,
    z_ptr,
    tab,
    K,
    q_ptr,
    y_ptr,
    a_ptr,
    rstd_ptr,
    logit_ptr,
    krstd_ptr,
    N,
    D,
    key_eps,
    eps,
    HAS_Q: tl.constexpr,
    LO: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """base [N, D] (any float dtype), z [K, N] fp32, tab [2 K]: extra addresses, dtype codes; q_ptr [K, D] fp32
    (HAS_Q); y [N, D] (the output dtype); a [K + 1, N], rstd [N], logits and key_rstd [K, N] (HAS_Q), fp32."""
    t = tl.cast(tl.program_id(0), tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    ki = tl.arange(0, K_PAD)
    tmask, dmask = t < N, d < D
    offs = t[:, None] * D + d[None, :]
    mask = tmask[:, None] & dmask[None, :]
    h = tl.load(base_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # base's group: logit 0 relative to its lse
    m = tl.zeros([BLOCK_T], tl.float32)
    den = tl.full([BLOCK_T], 1.0, tl.float32)
    zs = tl.zeros([K_PAD, BLOCK_T], tl.float32)  # every extra's logit, for the weights saved below
    for k in range(K):
        kN = tl.cast(k, tl.int64) * N
        x = _load(tl.load(tab + k), tl.load(tab + K + k), offs, mask, LO)
        zk = tl.load(z_ptr + kN + t, mask=tmask, other=0.0)
        if HAS_Q:
            qk = tl.load(q_ptr + tl.cast(k, tl.int64) * D + d, mask=dmask, other=0.0)
            kr = tl.rsqrt(tl.sum(x * x, axis=1) / D + key_eps)
            lg = tl.sum(x * qk[None, :], axis=1) * kr
            tl.store(logit_ptr + kN + t, lg, mask=tmask)
            tl.store(krstd_ptr + kN + t, kr, mask=tmask)
            zk += lg
        zs = tl.where(ki[:, None] == k, zk[None, :], zs)
        m_new = tl.maximum(m, zk)
        scale = tl.exp(m - m_new)
        p = tl.exp(zk - m_new)
        h = h * scale[:, None] + p[:, None] * x
        den = den * scale + p
        m = m_new
    h = h / den[:, None]
    lse = m + tl.log(den)
    tl.store(a_ptr + t, tl.exp(-lse), mask=tmask)
    tl.store(
        a_ptr + (ki[:, None] + 1) * N + t[None, :], tl.exp(zs - lse[None, :]), mask=(ki[:, None] < K) & tmask[None, :]
    )
    r = tl.rsqrt(tl.sum(h * h, axis=1) / D + eps)
    tl.store(rstd_ptr + t, r, mask=tmask)
    tl.store(y_ptr + offs, (h * r[:, None]).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def merge_bwd(
    g_ptr,
    y_ptr,
    a_ptr,
    rstd_ptr,
    tab,
    K,
    q_ptr,
    logit_ptr,
    krstd_ptr,
    gbase_ptr,
    gz_ptr,
    dq_ptr,
    N,
    D,
    eps,
    n_blocks,
    P,
    HAS_Q: tl.constexpr,
    LO: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Backward of merge_fwd from g = dL/dy: tab [5 K] (extras, codes, targets, codes, modes); writes
    grad_base [N, D] (base's dtype), grad_z [K, N] fp32 and this program's dq slice [K, D] (HAS_Q)."""
    pid = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    ki = tl.arange(0, K_PAD)
    dmask = d < D
    dq = tl.zeros([K_PAD, BLOCK_D], tl.float32)
    for blk in range(pid, n_blocks, P):
        t = tl.cast(blk, tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = t < N
        offs = t[:, None] * D + d[None, :]
        mask = tmask[:, None] & dmask[None, :]
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(rstd_ptr + t, mask=tmask, other=0.0)
        mean_gy = tl.sum(g * y, axis=1) / D
        u = g - mean_gy[:, None] * y  # dL/dh = rstd u
        gh = mean_gy * D * eps * r  # g.h / rstd (depth._MergeReadC docstring)
        for k in range(K):
            kN = tl.cast(k, tl.int64) * N
            x = _load(tl.load(tab + k), tl.load(tab + K + k), offs, mask, LO)
            ak = tl.load(a_ptr + kN + N + t, mask=tmask, other=0.0)
            gz = r * ak * (tl.sum(u * x, axis=1) - gh)  # [BT]
            tl.store(gz_ptr + kN + t, gz, mask=tmask)
            dx = (r * ak)[:, None] * u
            if HAS_Q:  # the key logit l_k = key_rstd_k (e_k . q_k)
                kr = tl.load(krstd_ptr + kN + t, mask=tmask, other=0.0)
                lg = tl.load(logit_ptr + kN + t, mask=tmask, other=0.0)
                scaled = gz * kr
                coef = gz * lg * kr * kr / D
                qk = tl.load(q_ptr + tl.cast(k, tl.int64) * D + d, mask=dmask, other=0.0)
                dq = tl.where(ki[:, None] == k, dq + tl.sum(scaled[:, None] * x, axis=0)[None, :], dq)
                dx += scaled[:, None] * qk[None, :] - coef[:, None] * x
            mode = tl.load(tab + 4 * K + k)
            if mode != 0:
                _put(tl.load(tab + 2 * K + k), tl.load(tab + 3 * K + k), mode, offs, mask, dx, LO)
        a0 = tl.load(a_ptr + t, mask=tmask, other=0.0)
        tl.store(gbase_ptr + offs, ((r * a0)[:, None] * u).to(gbase_ptr.dtype.element_ty), mask=mask)
    if HAS_Q:
        tl.store(
            dq_ptr + tl.cast(pid, tl.int64) * K * D + ki[:, None] * D + d[None, :],
            dq,
            mask=(ki[:, None] < K) & dmask[None, :],
        )
