"""Process-wide settings of the compiled training step (``train_path=compiled``; docs/performance.md, "The compiled
CPU step"). :func:`configure_compiler` is called once per run, before its model is compiled.

* **One cache per machine, shared by every run and worker.** Inductor's on-disk caches (FX graphs, AOTAutograd
  graphs, the built C++ kernels) live in ``$TORCHINDUCTOR_CACHE_DIR`` when it is set (to anything but torch's own
  default), else in
  ``<attnres cache root>/inductor`` (attnres.cpu_kernels.cache_root: ~/.cache/attnres), not in the system temp
  directory, so a study's later runs, later studies and later sessions reuse what the first run built. Inductor
  writes every entry atomically and builds each kernel under a file lock, so two workers may share the cache.
* **Same-shape runs of one process reuse the compiled code** (dynamo guards on shapes, not on the model object), so
  a worker compiles each (scheme, size) once. Different shapes add cache entries to the same code objects: the
  recompile limit is raised to :data:`RECOMPILE_LIMIT`, and reaching it raises instead of silently training the
  rest of the run eagerly on a path recorded as compiled.
* **Compilation runs in the run's own threads** (inductor's ``compile_threads`` = the run's torch threads), so a
  single-thread job of a parallel sweep does not start compile workers on the other job's core, and the run's
  CPU time (``cpu_time_s`` in its record: experiments.run.run_env.cpu_seconds) includes its compilation, the C++
  compiler's child processes included.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
RECOMPILE_LIMIT = 64  # compiled variants per code object and process: far more (scheme, size) pairs than a study has


def default_cache_dir() -> Path:
    from attnres.cpu_kernels import cache_root

    return cache_root() / "inductor"


def configure_compiler(threads: int) -> Path:
    """Apply the settings above for a run with ``threads`` torch threads; returns the inductor cache directory."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as torch_default

    current = os.environ.get(CACHE_ENV)  # torch sets it to its own default (the temp dir) once it has looked
    if current is None or os.path.abspath(current) == os.path.abspath(torch_default()):
        os.environ[CACHE_ENV] = str(default_cache_dir())
    cache = Path(os.environ[CACHE_ENV])
    dynamo_config.recompile_limit = max(int(dynamo_config.recompile_limit), RECOMPILE_LIMIT)
    dynamo_config.fail_on_recompile_limit_hit = True
    inductor_config.compile_threads = max(1, int(threads))
    return cache
