"""The outlier rule: a run that spikes, plateaus, or ends far off its seed-mates is flagged (docs/analysis.md).

Pure numpy (no pandas, no torch): training calls :func:`curve_flags` on a finished run's own metrics and writes the
result into its record (``health``); the analysis adds the seed-mate check, which needs the other runs
(:func:`off_seed_mates`). A flag never removes a run by itself: the analysis keeps flagged runs in the headline
fit, names them in the summary, marks them in the figures, and reports the fit without them next to it.

Curve flags, from metrics.csv (``train_loss`` per logged step, ``val_loss`` per evaluation):

* ``spike@<step>`` -- after the first ``WARMUP_SHARE`` of training, the median of the ``SPIKE_SPAN`` logged training
  losses centred on a step above ``SPIKE_RATIO`` times the median of the ``SPIKE_WINDOW`` logged values before them,
  or an evaluation more than ``VAL_RISE`` (relative) above the best earlier one. A median over several logged
  steps, because one hard batch is not an instability: at 512-token batches a single batch of unusual text scores
  up to 1.7x the running median in healthy runs, and the next batches are back to normal;
* ``plateau`` -- the validation loss improved by less than ``PLATEAU_GAIN`` (relative) over the second half of
  training (healthy runs under a cosine decay improve by several percent there).

Seed-mate flag, from the final losses of one (arm, size) cell:

* ``off_mates`` -- in a cell of >= 3 runs, the run's final loss is more than ``OFF_MATES_SIGMAS`` pooled seed
  sds, and more than ``OFF_MATES_FLOOR`` nats, away from the cell's median (with two runs neither can be told to
  be the odd one; the cell check below still fires). The pooled sd is robust: the median over
  cells of the within-cell sd, divided by 0.83 (the median of s / sigma for three normal draws), so one outlier
  does not hide itself by inflating it.

A cell whose seeds disagree beyond ``CELL_SD_BOUND`` nats (sample sd) is warned about by the analysis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

WARMUP_SHARE = 0.1
SPIKE_RATIO = 1.3
SPIKE_WINDOW = 10
SPIKE_SPAN = 5
VAL_RISE = 0.01
PLATEAU_GAIN = 0.01
OFF_MATES_SIGMAS = 4.0
OFF_MATES_FLOOR = 0.02
CELL_SD_BOUND = 0.02
_MEDIAN_S_OVER_SIGMA = 0.83  # median of the sample sd of 3 normal draws, in units of sigma


def _finite(steps: Sequence[float], values: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(steps, float)
    v = np.asarray([np.nan if x is None else x for x in values], float)
    ok = np.isfinite(s) & np.isfinite(v)
    order = np.argsort(s[ok], kind="stable")
    return s[ok][order], v[ok][order]


def spike_step(
    steps: Sequence[float],
    train_loss: Sequence[float | None],
    val_steps: Sequence[float],
    val_loss: Sequence[float | None],
    total_steps: float,
) -> int | None:
    """The first step that spikes (see the module docstring), or None."""
    start = WARMUP_SHARE * total_steps
    s, v = _finite(steps, train_loss)
    h = SPIKE_SPAN // 2  # a window centred on each logged step, against the window before it
    for i in range(SPIKE_WINDOW + h, len(v) - h):
        before = float(np.median(v[i - h - SPIKE_WINDOW : i - h]))
        if s[i] > start and np.median(v[i - h : i + h + 1]) > SPIKE_RATIO * before:
            return int(s[i])
    s, v = _finite(val_steps, val_loss)
    for i in range(1, len(v)):
        if s[i] > start and v[i] > (1 + VAL_RISE) * float(v[:i].min()):
            return int(s[i])
    return None


def plateaued(val_steps: Sequence[float], val_loss: Sequence[float | None], total_steps: float) -> bool:
    """True when the val loss improved by less than PLATEAU_GAIN over the second half of training."""
    s, v = _finite(val_steps, val_loss)
    if len(v) < 2 or s[-1] < 0.9 * total_steps:
        return False
    half = s <= 0.5 * total_steps
    if not half.any():
        return False
    mid = float(v[half][-1])
    return bool(v[-1] > mid * (1 - PLATEAU_GAIN))


def curve_flags(
    steps: Sequence[float],
    train_loss: Sequence[float | None],
    val_steps: Sequence[float],
    val_loss: Sequence[float | None],
    total_steps: float,
) -> list[str]:
    """The curve flags of one run, e.g. ["spike@1200", "plateau"]; [] for a healthy run."""
    flags = []
    at = spike_step(steps, train_loss, val_steps, val_loss, total_steps)
    if at is not None:
        flags.append(f"spike@{at}")
    if plateaued(val_steps, val_loss, total_steps):
        flags.append("plateau")
    return flags


def pooled_seed_sd(cells: Sequence[Sequence[float]]) -> float | None:
    """Robust pooled seed sd: median over cells (>= 2 runs) of the sample sd, / 0.83; None without such cells."""
    sds = [float(np.std(np.asarray(c, float), ddof=1)) for c in cells if len(c) >= 2]
    if not sds:
        return None
    return float(np.median(sds)) / _MEDIAN_S_OVER_SIGMA


def off_seed_mates(losses: Sequence[float], sigma: float | None) -> list[bool]:
    """For each run of one cell: is its final loss off the cell's median (see the module docstring)?"""
    x = np.asarray(losses, float)
    if len(x) < 3:
        return [False] * len(x)
    bound = (
        max(OFF_MATES_SIGMAS * sigma, OFF_MATES_FLOOR)
        if sigma is not None and math.isfinite(sigma)
        else OFF_MATES_FLOOR
    )
    med = float(np.median(x))
    return [bool(abs(v - med) > bound) for v in x]
