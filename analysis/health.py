"""The outlier rule (docs/analysis.md, "The outlier rule"; its thresholds are the constants below): a run that
spikes, plateaus, or ends far off its seed-mates is flagged, never dropped by the flag alone.

Pure numpy: training calls :func:`curve_flags` on a finished run's own metrics and writes the result into its record
(``health``); the analysis adds the checks that need the other runs: the seed-mate check (:func:`off_seed_mates`) and
the spikes that are the data's (:func:`data_events`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

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
DATA_EVENT_STEPS = 50  # 5 logged steps at conf/train.yaml's log_every of 10: one spike window
_MEDIAN_S_OVER_SIGMA = 0.83  # median of the sample sd of 3 normal draws, in units of sigma


def _finite(steps: Sequence[float], values: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(steps, float)
    v = np.asarray([np.nan if x is None else x for x in values], float)
    ok = np.isfinite(s) & np.isfinite(v)
    order = np.argsort(s[ok], kind="stable")
    return s[ok][order], v[ok][order]


def _spike_step(s: np.ndarray, v: np.ndarray, vs: np.ndarray, vv: np.ndarray, start: float) -> int | None:
    h = SPIKE_SPAN // 2  # a window centred on each logged step, against the window before it
    for i in range(SPIKE_WINDOW + h, len(v) - h):
        before = float(np.median(v[i - h - SPIKE_WINDOW : i - h]))
        if s[i] > start and np.median(v[i - h : i + h + 1]) > SPIKE_RATIO * before:
            return int(s[i])
    for i in range(1, len(vv)):
        if vs[i] > start and vv[i] > (1 + VAL_RISE) * float(vv[:i].min()):
            return int(vs[i])
    return None


def curve_flags(
    steps: Sequence[float],
    train_loss: Sequence[float | None],
    val_steps: Sequence[float],
    val_loss: Sequence[float | None],
    total_steps: float,
) -> list[str]:
    """The curve flags of one run: ``spike@<step>`` (the first step that spikes) and ``plateau`` (the val loss
    improved by less than PLATEAU_GAIN over the second half of training); [] for a healthy run."""
    vs, vv = _finite(val_steps, val_loss)
    at = _spike_step(*_finite(steps, train_loss), vs, vv, WARMUP_SHARE * total_steps)
    flags = [] if at is None else [f"spike@{at}"]
    half = vs <= 0.5 * total_steps
    if len(vv) >= 2 and vs[-1] >= 0.9 * total_steps and half.any() and vv[-1] > vv[half][-1] * (1 - PLATEAU_GAIN):
        flags.append("plateau")
    return flags


def pooled_seed_sd(cells: Sequence[Sequence[float]]) -> float | None:
    """Robust pooled seed sd: median over cells (>= 2 runs) of the sample sd, / 0.83; None without such cells."""
    sds = [float(np.std(np.asarray(c, float), ddof=1)) for c in cells if len(c) >= 2]
    return float(np.median(sds)) / _MEDIAN_S_OVER_SIGMA if sds else None


def off_seed_mates(losses: Sequence[float], sigma: float | None) -> list[bool]:
    """For each run of one cell of >= 3 runs: is its final loss more than OFF_MATES_SIGMAS ``sigma`` and more than
    OFF_MATES_FLOOR nats off the cell's median? (With fewer runs none can be told to be the odd one.)"""
    x = np.asarray(losses, float)
    if len(x) < 3:
        return [False] * len(x)
    bound = OFF_MATES_FLOOR
    if sigma is not None and math.isfinite(sigma):
        bound = max(OFF_MATES_SIGMAS * sigma, OFF_MATES_FLOOR)
    med = float(np.median(x))
    return [bool(abs(v - med) > bound) for v in x]


def data_events(
    spike_steps: Sequence[int | None], data_orders: Sequence[Hashable], trajectories: Sequence[Hashable]
) -> list[bool]:
    """For each run's first spike step (None: none): is that spike the data's? True when a run with the same data
    order (equal ``data_orders``: the same batches at the same steps) on another trajectory (unequal
    ``trajectories``: not the run itself nor a branch of its trunk) also spikes within DATA_EVENT_STEPS steps of it:
    a stretch of hard text that every model trained on those batches scores high, not this run's instability."""
    runs = list(zip(spike_steps, data_orders, trajectories, strict=True))
    return [
        step is not None
        and any(
            other is not None and order == o_order and traj != o_traj and abs(step - other) <= DATA_EVENT_STEPS
            for other, o_order, o_traj in runs
        )
        for step, order, traj in runs
    ]
