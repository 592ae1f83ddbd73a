"""Triton kernels for the depth mixing on CUDA (depth_mix_triton.py), as torch.library custom ops.

The kernels read each source for a whole group of reads at once (scoring it in the same kernel), keep the read
h out of memory (the merge is fused with the PreNorm normalisation), and launch with the tiles of
attnres/triton_launch.py, writing their tables of addresses on the device (no host copy: CUDA-graph safe).
They are a speed path only: depth.py calls them through its dispatch functions, its plain-torch references run
wherever they do not apply (no triton, another device, float64, ATTNRES_TRITON=0 or ``use_kernels(False)``), and
the tests check them against those references.

Two ops, as on the CPU (cpu_kernels.py):
  * attend(sources, queries, eps) -> (Q outputs [B, T, D] fp32, lse [B, T, Q], and for backward the sources'
    logits and rstd): phase 1 of Q reads with static pseudo-queries over S sources, the key logits included
    (depth.attend_batched);
  * merge(base, z, extras, queries, ...) -> y (and for backward y32, y's fp32 value when y is low precision): one
    read's softmax merge of K extras, fused with the PreNorm normalisation (depth.merge_read).
Each is a ``torch.library.custom_op`` (``attnres::attend``, ``attnres::merge`` and their ``*_backward``) with a
fake implementation and registered autograd, so torch.compile(fullgraph=True) traces through them as opaque
kernels. Sources of any mix of fp32 and one low-precision dtype (bf16 or fp16), any D (masked), any strides
(non-contiguous inputs are copied), accumulation in fp32. In eager mode a tracked source's gradient is
written or added into its fp32 sink inside the backward kernel (attnres/grad_sinks.py), as on the CPU.

The kernels run on CUDA tensors. Under ``use_kernels(True)`` they also take CPU tensors when the process runs
Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported): that is how CI tests them
(tests/test_triton_kernels.py). triton is imported on first use only, so `import attnres` never needs it.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from .grad_sinks import sinks_of
from .kernel_switch import KernelSwitch
from .triton_launch import Launch, launch

ENV_SWITCH = "ATTNRES_TRITON"  # "0" / "off" / "false" / "no": never use the Triton kernels
MAX_READS = 16  # attend: at most this many queries (Q) per call
MAX_EXTRAS = 16  # merge: at most this many extras (K) per call
MAX_WIDTH = 8192  # D: the widest the kernels are tested at (they walk D in chunks: no limit of their own)
_LOW = (torch.bfloat16, torch.float16)
_FLOATS = (torch.float32, *_LOW)

_SWITCH = KernelSwitch(ENV_SWITCH)
# with use_kernels(True): also on CPU tensors under the Triton interpreter; False: never; None: as the environment
use_kernels = _SWITCH.use


_INSTALLED = importlib.util.find_spec("triton") is not None  # without importing it (attnres imports it on first use)


_probe: dict[str, str | None] = {}  # "triton": None once it imported, else why not (one attempt per process)


def _triton() -> str | None:
    """None when triton imports, else why not."""
    if "triton" not in _probe:
        try:
            import triton  # noqa: F401

            from . import depth_mix_triton  # noqa: F401

            _probe["triton"] = None
        except Exception as err:  # noqa: BLE001 - ImportError, or a triton that does not match this torch (any error)
            _probe["triton"] = f"{type(err).__name__}: {err}"
    return _probe["triton"]


def _triton_ok() -> bool:
    if torch.compiler.is_compiling():  # tracing cannot import triton; an eager call has usually tried already
        return _INSTALLED and _probe.get("triton") is None
    return _triton() is None


def _interpreting() -> bool:
    """Whether triton runs kernels in its interpreter (TRITON_INTERPRET=1 when it was imported)."""
    if "triton" in sys.modules and not torch.compiler.is_compiling():
        from triton import knobs

        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def status() -> str:
    """'on', 'off (...)' or 'unavailable: why'; recorded with benchmark results."""
    if _SWITCH.off():
        return _SWITCH.off_reason()
    why = _triton()
    if why is not None:
        return f"unavailable: {why}"
    import triton

    return f"on (triton {triton.__version__}{', interpreter' if _interpreting() else ''})"


def applies(*tensors: torch.Tensor) -> bool:
    """Whether these tensors (a call's sources / extras / base) take the kernels: CUDA (or CPU under the
    interpreter inside use_kernels(True)), fp32 and at most one low-precision float dtype, D <= MAX_WIDTH, and
    triton importable."""
    if _SWITCH.off() or not tensors:
        return False
    device = tensors[0].device
    if device.type == "cpu":
        if not (_SWITCH.forced() and _interpreting()):
            return False
    elif device.type != "cuda":
        return False
    low = set()
    for t in tensors:
        if t.device != device or t.dtype not in _FLOATS or t.dim() == 0:
            return False
        if t.dtype != torch.float32:
            low.add(t.dtype)
    if len(low) > 1 or tensors[0].shape[-1] > MAX_WIDTH:
        return False
    return _triton_ok()


# ---------------------------------------------------------------------------------------------------------
# Launch helpers


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def attend_fits(Q: int, D: int) -> bool:
    """Whether attend takes Q queries (of width D, which the kernels walk in chunks: any D applies() takes)."""
    return Q <= MAX_READS


def _low_dtype(tensors: list[torch.Tensor]):
    """The triton dtype of the call's low-precision tensors (bf16 when there are none: unused)."""
    import triton.language as tl

    for t in tensors:
        if t.dtype == torch.float16:
            return tl.float16
    return tl.bfloat16


def _code(t: torch.Tensor | None) -> int:
    return 0 if t is None or t.dtype == torch.float32 else 1


def _table(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 table of addresses / codes on the device, written by kernels whose arguments carry the values: no
    host memory is read when it runs, so a CUDA graph that captured it replays it (the addresses of a captured
    graph's tensors are fixed), and no host-device synchronisation or copy happens."""
    from . import depth_mix_triton as k

    table = torch.empty(max(1, len(values)), dtype=torch.int64, device=device)
    width = k.TABLE_WIDTH
    for at in range(0, len(values), width):
        part = values[at : at + width]
        args = [v + k.TABLE_BIAS for v in part] + [k.TABLE_BIAS] * (width - len(part))
        k.write_table[(1,)](table[at:], len(part), *args, num_warps=1)
    return table


def _placed_targets(targets: list[torch.Tensor], modes: list[int]) -> list[torch.Tensor | None]:
    """The gradient targets laid out one per source (None where its mode is 0): ``targets`` holds one contiguous
    tensor per non-zero mode, in order; an accumulating target (mode 2) is fp32."""
    it = iter(targets)
    placed: list[torch.Tensor | None] = []
    for mode in modes:
        t = next(it) if mode else None
        if t is not None:
            assert t.is_contiguous()
            assert mode == 1 or t.dtype == torch.float32
        placed.append(t)
    return placed


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


_SMS: dict[int, int] = {}  # streaming multiprocessors per CUDA device index


def _programs(n_blocks: int, device: torch.device, launch: Launch) -> int:
    """Programs of a persistent grid: launch.per_sm per SM (at most one per token block); 2 on the CPU (the
    interpreter), so that a program loops over several token blocks there too."""
    if device.type != "cuda":
        return max(1, min(n_blocks, 2))
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return max(1, min(n_blocks, launch.per_sm * _SMS[index]))


def _low_name(lo) -> str:
    return "fp16" if str(lo) == "fp16" else "bf16"


def _meta(lo, cfg: Launch) -> dict:
    """The constexprs and launch options every depth kernel takes from its Launch."""
    return {
        "LO": lo,
        "BLOCK_T": cfg.block_t,
        "CH": cfg.chunk,
        "UNROLL": cfg.unroll,
        "num_warps": cfg.warps,
        "num_stages": cfg.stages,
    }


def _grid(t: torch.Tensor) -> tuple[torch.device, int]:
    return t.device, t.numel() // t.shape[-1]


# ---------------------------------------------------------------------------------------------------------
# attnres::attend (phase 1, scoring included)


@torch.library.custom_op("attnres::attend", mutates_args=())
def attend(
    sources: list[torch.Tensor], queries: torch.Tensor, eps: float
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q reads with static queries [Q, D] over S sources [B, T, D]: (Q outputs [B, T, D] fp32, lse [B, T, Q],
    every source's logits [S, B, T, Q] and rstd [S, B, T], fp32; the last two are kept for backward)."""
    from . import depth_mix_triton as k

    srcs = [_rows(v) for v in sources]
    device, N = _grid(srcs[0])
    D, Q, S = srcs[0].shape[-1], queries.shape[0], len(srcs)
    lead = srcs[0].shape[:-1]
    w = _rows(queries.to(torch.float32))
    outs = [torch.empty(srcs[0].shape, dtype=torch.float32, device=device) for _ in range(Q)]
    lse = torch.empty((*lead, Q), dtype=torch.float32, device=device)
    logits = torch.empty((S, *lead, Q), dtype=torch.float32, device=device)
    rstd = torch.empty((S, *lead), dtype=torch.float32, device=device)
    tab = _table([v.data_ptr() for v in srcs] + [_code(v) for v in srcs] + [o.data_ptr() for o in outs], device)
    lo = _low_dtype(srcs)
    cfg = launch("attend_fwd", D, Q, True, _low_name(lo))
    n_blocks = _cdiv(N, cfg.block_t)
    k.attend_fwd[(_programs(n_blocks, device, cfg),)](
        tab, S, w, lse, logits, rstd, N, D, Q, eps, n_blocks, **_meta(lo, cfg), Q_PAD=_pow2(Q)
    )
    return outs, lse, logits, rstd


@attend.register_fake
def _(sources, queries, eps):
    v, Q, S = sources[0], queries.shape[0], len(sources)
    lead, f32 = v.shape[:-1], torch.float32
    return (
        [v.new_empty(v.shape, dtype=f32) for _ in range(Q)],
        v.new_empty((*lead, Q), dtype=f32),
        v.new_empty((S, *lead, Q), dtype=f32),
        v.new_empty((S, *lead), dtype=f32),
    )


@torch.library.custom_op("attnres::attend_backward", mutates_args=("targets",))
def attend_backward(
    sources: list[torch.Tensor],
    queries: torch.Tensor,
    lse: torch.Tensor,
    logits: torch.Tensor,
    rstd: torch.Tensor,
    grads: list[torch.Tensor],
    grad_lse: torch.Tensor,
    targets: list[torch.Tensor],
    modes: list[int],
) -> torch.Tensor:
    """Backward of attend (lse, logits, rstd: its outputs): writes (mode 1) or adds into (mode 2) each source's
    gradient target (targets: one per source whose mode is not 0, in order) and returns the queries' gradient
    [Q, D] fp32."""
    from . import depth_mix_triton as k

    srcs = [_rows(v) for v in sources]
    device, N = _grid(srcs[0])
    D, Q, S = srcs[0].shape[-1], queries.shape[0], len(srcs)
    w = _rows(queries.to(torch.float32))
    gs = [_rows(g.to(torch.float32)) for g in grads]
    glse = _rows(grad_lse.to(torch.float32))
    tgt = _placed_targets(targets, modes[:S])
    tab = _table(
        [v.data_ptr() for v in srcs]
        + [_code(v) for v in srcs]
        + [0 if t is None else t.data_ptr() for t in tgt]
        + [_code(t) for t in tgt]
        + list(modes)
        + [g.data_ptr() for g in gs],
        device,
    )
    lo = _low_dtype(srcs + [t for t in tgt if t is not None])
    cfg = launch("attend_bwd", D, Q, True, _low_name(lo))
    n_blocks = _cdiv(N, cfg.block_t)
    P = _programs(n_blocks, device, cfg)
    scratch = torch.empty_like(logits)  # [S, B, T, Q]: g_q . v_s, then dL/dlogit * rstd
    coef = torch.empty_like(rstd)  # [S, B, T]
    dq = torch.zeros((P, Q, D), dtype=torch.float32, device=device)
    k.attend_bwd[(P,)](
        tab, S, w, _rows(lse), glse, logits, rstd, scratch, coef, dq, N, D, Q, n_blocks,
        **_meta(lo, cfg), Q_PAD=_pow2(Q),
    )  # fmt: skip
    return dq.sum(0)


@attend_backward.register_fake
def _(sources, queries, lse, logits, rstd, grads, grad_lse, targets, modes):
    return queries.new_empty(queries.shape, dtype=torch.float32)


def _attend_setup(ctx, inputs, output) -> None:
    sources, queries, _eps = inputs
    _, lse, logits, rstd = output
    ctx.sinks = sinks_of(sources)  # eager: tracked sources (attnres/grad_sinks.py); compiled: none
    ctx.source_grad = [v.requires_grad for v in sources]
    ctx.queries_grad, ctx.queries_dtype = queries.requires_grad, queries.dtype
    ctx.save_for_backward(queries, lse, logits, rstd, *sources)
    ctx.mark_non_differentiable(logits, rstd)


def _attend_grad(ctx, grad_outs, grad_lse, *_unused):
    queries, lse, logits, rstd, *sources = ctx.saved_tensors
    targets, modes, grads = _targets(ctx.sinks, ctx.source_grad, sources)
    grad_outs = [torch.zeros_like(sources[0], dtype=torch.float32) if g is None else g for g in grad_outs]
    grad_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse
    grad_q = attend_backward(sources, queries, lse, logits, rstd, grad_outs, grad_lse, targets, modes)
    return grads, grad_q.to(ctx.queries_dtype) if ctx.queries_grad else None, None


attend.register_autograd(_attend_grad, setup_context=_attend_setup)


def _targets(
    sinks: list, needed: list[bool], values: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[int], list[torch.Tensor | None]]:
    """Gradient targets of a backward kernel: (targets, modes, gradients to return), for the sources that need a
    gradient: a tracked source's fp32 sink (GradSink.target: mode 1 written, 2 added into; nothing returned), else
    a fresh contiguous gradient in the source's dtype (mode 1) that backward returns; mode 0 for the others."""
    targets, modes, grads = [], [], []
    for sink, need, v in zip(sinks, needed, values):
        grad = None
        if not need:
            modes.append(0)
        elif sink is not None:
            target, mode = sink.target(v)
            targets.append(target)
            modes.append(mode)
        else:
            grad = torch.empty(v.shape, dtype=v.dtype, device=v.device)
            targets.append(grad)
            modes.append(1)
        grads.append(grad)
    return targets, modes, grads


# ---------------------------------------------------------------------------------------------------------
# attnres::merge (phase 2 fused with the PreNorm normalisation)


@torch.library.custom_op("attnres::merge", mutates_args=())
def merge(
    base: torch.Tensor,
    z: torch.Tensor | None,
    extras: list[torch.Tensor],
    queries: torch.Tensor | None,
    key_eps: float,
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = rmsnorm_unit(a_0 base + sum_k a_k extras[k]) in out_dtype, a = softmax([0, z (+ key logits)]).
    Returns (y, y32: y's fp32 value when out_dtype is not fp32 (else empty), a [K + 1, B, T], rstd [B, T],
    logits, key_rstd [K, B, T] with queries (else empty)), all fp32 but y."""
    from . import depth_mix_triton as k

    b = _rows(base)
    device, N = _grid(b)
    D, K = b.shape[-1], len(extras)
    ext = [_rows(e) for e in extras]
    lead = b.shape[:-1]
    y = torch.empty(b.shape, dtype=out_dtype, device=device)
    low_y = out_dtype != torch.float32
    y32 = torch.empty(b.shape if low_y else (0,), dtype=torch.float32, device=device)
    a = torch.empty((K + 1, *lead), dtype=torch.float32, device=device)
    rstd = torch.empty(lead, dtype=torch.float32, device=device)
    has_q = queries is not None and K > 0
    logits = torch.empty((K, *lead) if has_q else (0,), dtype=torch.float32, device=device)
    key_rstd = torch.empty_like(logits)
    zz = a
    if K:
        assert z is not None  # the extras' logits
        zz = _rows(z.to(torch.float32))
    qq = _rows(queries.to(torch.float32)) if queries is not None and K > 0 else a  # if has_q
    tab = _table([e.data_ptr() for e in ext] + [_code(e) for e in ext], device)
    lo = _low_dtype([*ext, b, y])
    cfg = launch("merge_fwd", D, K, has_q, _low_name(lo))
    n_blocks = _cdiv(N, cfg.block_t)
    k.merge_fwd[(_programs(n_blocks, device, cfg),)](
        b,
        zz,
        tab,
        qq,
        y,
        y32 if low_y else y,
        a,
        rstd,
        logits if has_q else a,
        key_rstd if has_q else a,
        N,
        D,
        key_eps,
        eps,
        n_blocks,
        K=K,
        HAS_Q=has_q,
        LOW_Y=low_y,
        **_meta(lo, cfg),
    )
    return y, y32, a, rstd, logits, key_rstd


@merge.register_fake
def _(base, z, extras, queries, key_eps, eps, out_dtype):
    K, lead = len(extras), base.shape[:-1]
    has_q = queries is not None and K > 0
    f32 = torch.float32
    return (
        base.new_empty(base.shape, dtype=out_dtype),
        base.new_empty(base.shape if out_dtype != f32 else (0,), dtype=f32),
        base.new_empty((K + 1, *lead), dtype=f32),
        base.new_empty(lead, dtype=f32),
        base.new_empty((K, *lead) if has_q else (0,), dtype=f32),
        base.new_empty((K, *lead) if has_q else (0,), dtype=f32),
    )


@torch.library.custom_op("attnres::merge_backward", mutates_args=("targets",))
def merge_backward(
    grad_out: torch.Tensor,
    y: torch.Tensor,
    a: torch.Tensor,
    rstd: torch.Tensor,
    extras: list[torch.Tensor],
    queries: torch.Tensor | None,
    logits: torch.Tensor,
    key_rstd: torch.Tensor,
    base_dtype: torch.dtype,
    targets: list[torch.Tensor],
    modes: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of merge from y [B, T, D] fp32 (merge's y32, or y itself when it is fp32): (grad_base in
    base_dtype, grad_z [K, B, T] fp32, grad_queries [K, D] fp32 or empty); each extra's gradient goes into its
    target (mode 1: =, 2: +=; targets: one per extra whose mode is not 0)."""
    from . import depth_mix_triton as k

    assert y.dtype == torch.float32
    g = _rows(grad_out)
    device, N = _grid(g)
    D, K = g.shape[-1], len(extras)
    ext = [_rows(e) for e in extras]
    has_q = queries is not None and K > 0
    grad_base = torch.empty(g.shape, dtype=base_dtype, device=device)
    grad_z = torch.empty((K, *g.shape[:-1]), dtype=torch.float32, device=device)
    tgt = _placed_targets(targets, modes[:K])
    tab = _table(
        [e.data_ptr() for e in ext]
        + [_code(e) for e in ext]
        + [0 if t is None else t.data_ptr() for t in tgt]
        + [_code(t) for t in tgt]
        + list(modes),
        device,
    )
    lo = _low_dtype(ext + [g, grad_base] + [t for t in tgt if t is not None])
    cfg = launch("merge_bwd", D, K, has_q, _low_name(lo))
    n_blocks = _cdiv(N, cfg.block_t)
    P = _programs(n_blocks, device, cfg)
    dq = torch.zeros((P, K, D) if has_q else (0,), dtype=torch.float32, device=device)
    qq = _rows(queries.to(torch.float32)) if queries is not None and K > 0 else a  # if has_q
    k.merge_bwd[(P,)](
        g,
        _rows(y),
        a,
        rstd,
        tab,
        qq,
        logits if has_q else a,
        key_rstd if has_q else a,
        grad_base,
        grad_z,
        dq if has_q else a,
        N,
        D,
        n_blocks,
        K=K,
        HAS_Q=has_q,
        **_meta(lo, cfg),
    )
    return grad_base, grad_z, dq.sum(0) if has_q else dq


@merge_backward.register_fake
def _(grad_out, y, a, rstd, extras, queries, logits, key_rstd, base_dtype, targets, modes):
    K = len(extras)
    has_q = queries is not None and K > 0
    return (
        grad_out.new_empty(grad_out.shape, dtype=base_dtype),
        grad_out.new_empty((K, *grad_out.shape[:-1]), dtype=torch.float32),
        grad_out.new_empty((K, grad_out.shape[-1]) if has_q else (0,), dtype=torch.float32),
    )


def _merge_setup(ctx, inputs, output) -> None:
    base, z, extras, queries, _key_eps, _eps, out_dtype = inputs
    y, y32, a, rstd, logits, key_rstd = output
    ctx.base_dtype, ctx.z_dtype = base.dtype, None if z is None else z.dtype
    ctx.sinks = sinks_of(extras)
    ctx.extra_grad = [e.requires_grad for e in extras]
    ctx.base_grad = base.requires_grad
    ctx.z_grad = z is not None and z.requires_grad
    ctx.queries_grad = queries is not None and queries.requires_grad
    ctx.queries_dtype = None if queries is None else queries.dtype
    # backward needs y in fp32 (a bf16 y loses the softmax gradient's small differences)
    ctx.save_for_backward(y32 if out_dtype != torch.float32 else y, a, rstd, logits, key_rstd, queries, *extras)
    ctx.mark_non_differentiable(y32, a, rstd, logits, key_rstd)


def _merge_grad(ctx, grad_y, *_unused):
    y, a, rstd, logits, key_rstd, queries, *extras = ctx.saved_tensors
    targets, modes, grads = _targets(ctx.sinks, ctx.extra_grad, extras)
    grad_base, grad_z, grad_q = merge_backward(
        grad_y, y, a, rstd, extras, queries, logits, key_rstd, ctx.base_dtype, targets, modes
    )
    return (
        grad_base if ctx.base_grad else None,
        grad_z.to(ctx.z_dtype) if ctx.z_grad else None,
        grads,
        grad_q.to(ctx.queries_dtype) if ctx.queries_grad else None,
        None,
        None,
        None,
    )


merge.register_autograd(_merge_grad, setup_context=_merge_setup)


# ---------------------------------------------------------------------------------------------------------
# What depth.py calls


def attend_batched(
    sources: list[torch.Tensor], queries: torch.Tensor, eps: float
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """depth.attend_batched on the kernels (check applies() first)."""
    outs, lse, _logits, _rstd = attend(list(sources), queries, float(eps))
    return outs, lse


def merge_read(
    base: torch.Tensor,
    z: torch.Tensor | None,
    extras: list[torch.Tensor],
    normalize_eps: float,
    out_dtype: torch.dtype,
    queries: torch.Tensor | None,
    key_eps: float,
) -> torch.Tensor:
    """depth.merge_read with normalize_eps on the kernels (check applies() first). Returns a new tensor (base is
    not consumed: its memory goes back to the caching allocator when the caller drops it)."""
    if not extras:
        z = queries = None
    return merge(base, z, list(extras), queries, float(key_eps), float(normalize_eps), out_dtype)[0]
