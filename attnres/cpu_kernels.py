"""Compiled CPU kernels for the depth mixing (csrc/depth_mix.c), built on first use with the system C compiler.

The kernels take every token's rows (its sources, reads and gradients: a few KiB) once, in L1, where the torch
reference makes one [B, T, D] pass per (source, read) pair and per operation. They are a speed path only: depth.py
calls them through its dispatch functions (CPU, fp32, eager, built), its references run everywhere else, and the
tests check the kernels against them. ``ATTNRES_CPU_KERNELS=0`` (or ``use_kernels(False)``) switches them off.

The shared library is compiled once per machine type into ~/.cache/attnres/kernels (or $ATTNRES_CACHE_DIR) with
``$CC`` or ``cc``: -O3 -march=native, no fused multiply-add contraction (the kernels round every product and
sum as the torch references do), and OpenMP when the compiler has it (the library then binds to the libgomp
torch already loaded, so the kernels share torch's thread pool and thread count). The file name hashes the source,
the flags, the compiler's version and the CPU's flags, so a home directory shared by different nodes gets one
build per CPU type. Pure torch + ctypes: no Lightning, Hydra or W&B.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import torch

from .kernel_switch import KernelSwitch

ENV_SWITCH = "ATTNRES_CPU_KERNELS"  # "0" / "off" / "false" / "no": never build or use the kernels
SOURCE = Path(__file__).with_name("csrc") / "depth_mix.c"
_FLAG_SETS = (  # tried in order: the first that compiles is used
    ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared"],
    ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared"],  # no OpenMP (e.g. Apple clang): one thread
    ["-O3", "-ffp-contract=off", "-fPIC", "-shared"],
)

MAX_EXTRAS = 64  # merge_forward/backward: at most this many extra sources (MAX_EXTRAS in the C file)

_lock = threading.Lock()


class _State(TypedDict, total=False):
    lib: ctypes.CDLL | None  # None: the build failed (status says why)
    status: str


_state: _State = {}  # both set by the first library() call


_SWITCH = KernelSwitch(ENV_SWITCH)
use_kernels = _SWITCH.use  # with use_kernels(True / False / None): the kernels on, off, or as the environment says


def cache_root() -> Path:
    """Where attnres keeps what it builds on this machine: $ATTNRES_CACHE_DIR, else $XDG_CACHE_HOME/attnres, else
    ~/.cache/attnres (the C kernels under kernels/, the compiled training step's inductor cache under inductor/)."""
    if os.environ.get("ATTNRES_CACHE_DIR"):
        return Path(os.environ["ATTNRES_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnres"


def _cache_dir() -> Path:
    return cache_root() / "kernels"


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and feature flags (Linux), else the platform's names."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "\n".join(sorted(set(keep)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _build() -> tuple[ctypes.CDLL | None, str]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None, "unavailable: no C compiler (set CC)"
    source = SOURCE.read_bytes()
    version = _compiler_version(cc)
    errors = []
    for flags in _FLAG_SETS:
        key = hashlib.sha256(
            b"\0".join([source, " ".join(flags).encode(), cc.encode(), version.encode(), _cpu_signature().encode()])
        ).hexdigest()[:16]
        target = _cache_dir() / f"depth_mix-{key}.so"
        if not target.exists():
            tmp = None
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)  # parallel builders: last rename wins
                os.close(fd)
                done = subprocess.run(
                    [cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120
                )
                if done.returncode != 0:
                    errors.append(f"{' '.join(flags)}: {done.stderr.strip()[:300]}")
                    continue
                os.chmod(tmp, 0o755)  # mkstemp's 0600 would hide it from other users of a shared cache
                os.replace(tmp, target)
            except (OSError, subprocess.SubprocessError) as err:  # e.g. a read-only cache directory
                errors.append(f"{' '.join(flags)}: {err}")
                continue
            finally:
                if tmp is not None and os.path.exists(tmp):
                    os.unlink(tmp)
        try:
            lib = ctypes.CDLL(str(target))
        except OSError as err:
            errors.append(f"{target}: {err}")
            continue
        _declare(lib)
        return lib, f"on ({' '.join(flags[:-2])}; {target})"
    reason = "unavailable: " + " | ".join(errors)
    warnings.warn(
        f"attnres: the CPU depth-mixing kernels did not build with {cc}; the PyTorch path runs instead "
        f"(a few percent slower on the CPU; {ENV_SWITCH}=0 silences this). {reason}",
        stacklevel=3,
    )
    return None, reason


def _declare(lib: ctypes.CDLL) -> None:
    ptr, ptrs = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    i32, long_ = ctypes.c_int, ctypes.c_long  # C int and long, as in depth_mix.c
    lib.attnres_mix_forward.argtypes = [i32, i32, long_, i32, ptrs, ptr, ptrs, i32]
    lib.attnres_mix_forward.restype = None
    lib.attnres_mix_backward.argtypes = [i32, i32, long_, i32, ptrs, ptr, ptrs, ptr, ptrs, ctypes.POINTER(i32), i32]
    lib.attnres_mix_backward.restype = None
    f32 = ctypes.c_float
    lib.attnres_merge_forward.argtypes = [i32, long_, i32, ptr, ptr, ptrs, ptr, f32, f32, ptr, ptr, ptr, ptr, i32]
    lib.attnres_merge_forward.restype = None
    lib.attnres_merge_backward.argtypes = [
        i32,
        long_,
        i32,
        ptr,
        ptr,
        ptr,
        ptr,
        f32,
        ptrs,
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        ptrs,
        ctypes.POINTER(i32),
        i32,
    ]
    lib.attnres_merge_backward.restype = None


def library() -> ctypes.CDLL | None:
    """The loaded kernels, built on the first call; None when switched off or they cannot be built."""
    if _SWITCH.off():
        return None
    if "status" not in _state:
        with _lock:
            if "status" not in _state:
                _state["lib"], _state["status"] = _build()
    return _state["lib"]


def status() -> str:
    """'on (flags; path)', 'off (ATTNRES_CPU_KERNELS=...)' or 'unavailable: why'; recorded with every result."""
    if _SWITCH.off():
        return _SWITCH.off_reason()
    library()
    return str(_state["status"])


def applies(*tensors: torch.Tensor) -> bool:
    """Whether these tensors can take the kernels: CPU, fp32, contiguous, eager, the kernels switched on and
    built. The entry points below assume it."""
    if torch.compiler.is_compiling():
        return False
    for t in tensors:
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
            return False
    return library() is not None


def _lib() -> ctypes.CDLL:
    """The library applies() loaded (also when the switch changed since: a backward follows its forward)."""
    return _state["lib"]  # type: ignore[return-value]


def _pointers(tensors: Sequence[torch.Tensor | None]) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*[None if t is None else t.data_ptr() for t in tensors])


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def mix_forward(weights: torch.Tensor, values: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    """outs[q] = sum_s weights[s, :, :, q] * values[s]; weights [S, B, T, Q], values and outs [B, T, D]."""
    S, Q, D = len(values), len(outs), values[0].shape[-1]
    _lib().attnres_mix_forward(
        S, Q, values[0].numel() // D, D, _pointers(values), weights.data_ptr(), _pointers(outs), torch.get_num_threads()
    )


def mix_backward(
    weights: torch.Tensor,
    values: list[torch.Tensor],
    grads: list[torch.Tensor | None],
    grad_weights: torch.Tensor | None,
    targets: list[torch.Tensor | None],
    modes: list[int],
) -> None:
    """Backward of mix_forward, from the outputs' gradients grads (None: output unused): grad_weights[s, :, :, q]
    = grads[q] . values[s] ([S, B, T, Q], or None: skipped), and sum_q weights[s, :, :, q] * grads[q] into
    targets[s] ([B, T, D]; modes[s] 1: written, 2: added, 0: skipped)."""
    S, Q, D = len(values), len(grads), values[0].shape[-1]
    _lib().attnres_mix_backward(
        S,
        Q,
        values[0].numel() // D,
        D,
        _pointers(values),
        weights.data_ptr(),
        _pointers(grads),
        _ptr(grad_weights),
        _pointers(targets),
        (ctypes.c_int * S)(*modes),
        torch.get_num_threads(),
    )


def merge_forward(
    base: torch.Tensor,
    z: torch.Tensor | None,
    extras: list[torch.Tensor],
    queries: torch.Tensor | None,
    key_eps: float,
    eps: float,
    a: torch.Tensor,
    rstd: torch.Tensor,
    logits: torch.Tensor | None,
    key_rstd: torch.Tensor | None,
) -> None:
    """depth.merge_read with normalize_eps, in place into base [B, T, D]: reads z [K, B, T] and queries [K, D]
    (or None), writes a [K + 1, B, T, 1], rstd [B, T, 1] and, with queries, logits and key_rstd [K, B, T]."""
    D = base.shape[-1]
    _lib().attnres_merge_forward(
        len(extras),
        base.numel() // D,
        D,
        base.data_ptr(),
        _ptr(z),
        _pointers(extras),
        _ptr(queries),
        key_eps,
        eps,
        a.data_ptr(),
        rstd.data_ptr(),
        _ptr(logits),
        _ptr(key_rstd),
        torch.get_num_threads(),
    )


def merge_backward(
    grad_out: torch.Tensor,
    y: torch.Tensor,
    a: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
    extras: list[torch.Tensor],
    queries: torch.Tensor | None,
    logits: torch.Tensor | None,
    key_rstd: torch.Tensor | None,
    grad_base: torch.Tensor,
    grad_z: torch.Tensor | None,
    targets: list[torch.Tensor | None],
    modes: list[int],
) -> torch.Tensor | None:
    """Backward of merge_forward: writes grad_base [B, T, D] and grad_z [K, B, T], puts each extra's gradient into
    targets[k] (modes[k] 1: written, 2: added, 0: skipped); returns the queries' gradient [K, D] (with queries,
    else None)."""
    K, D, threads = len(extras), y.shape[-1], torch.get_num_threads()
    grad_q = torch.zeros(threads, K, D) if queries is not None else None  # one slice per thread, no races
    _lib().attnres_merge_backward(
        K,
        y.numel() // D,
        D,
        grad_out.data_ptr(),
        y.data_ptr(),
        a.data_ptr(),
        rstd.data_ptr(),
        eps,
        _pointers(extras),
        _ptr(queries),
        _ptr(logits),
        _ptr(key_rstd),
        grad_base.data_ptr(),
        _ptr(grad_z),
        _ptr(grad_q),
        _pointers(targets),
        (ctypes.c_int * max(K, 1))(*modes),
        threads,
    )
    return None if grad_q is None else grad_q.sum(0)
