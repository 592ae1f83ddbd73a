"""Run tiny scipy optimisations with single-threaded BLAS.

L-BFGS-B calls BLAS/LAPACK on 4x4 problems; with OpenBLAS' default thread pool on a loaded 2-core machine the
thread hand-offs cost milliseconds per iteration (measured: a 4-parameter polish took 0.2 s instead of 2 ms).
threadpoolctl is used when installed; otherwise the OpenBLAS bundled with the scipy/numpy wheels is asked
directly.  Any failure leaves BLAS untouched: this is a speed fix, never a correctness one.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from typing import Iterator

_LIBS: list[tuple[ctypes.CDLL, str]] | None = None


def _openblas_libs() -> list[tuple[ctypes.CDLL, str]]:
    global _LIBS
    if _LIBS is None:
        _LIBS = []
        import numpy
        import scipy

        for pkg in (scipy, numpy):
            libdir = os.path.join(os.path.dirname(os.path.dirname(pkg.__file__)), f"{pkg.__name__}.libs")
            for path in glob.glob(os.path.join(libdir, "*openblas*.so*")):
                try:
                    lib = ctypes.CDLL(path)  # already loaded by the package: this only returns a handle
                except OSError:
                    continue
                for suffix in ("", "64_"):
                    if hasattr(lib, f"scipy_openblas_get_num_threads{suffix}") and hasattr(lib, f"scipy_openblas_set_num_threads{suffix}"):
                        _LIBS.append((lib, suffix))
                        break
    return _LIBS


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
        return
    saved = []
    try:
        for lib, sfx in _openblas_libs():
            n = int(getattr(lib, f"scipy_openblas_get_num_threads{sfx}")())
            getattr(lib, f"scipy_openblas_set_num_threads{sfx}")(ctypes.c_int(1))
            saved.append((lib, sfx, n))
    except Exception:  # noqa: BLE001 - a speed fix must never break a fit
        pass
    try:
        yield
    finally:
        for lib, sfx, n in saved:
            try:
                getattr(lib, f"scipy_openblas_set_num_threads{sfx}")(ctypes.c_int(n))
            except Exception:  # noqa: BLE001
                pass
