"""The load other processes put on the machine while a benchmark runs (:class:`CoreMonitor`). No torch."""

from __future__ import annotations

import os
import time


class CoreMonitor:
    """Cores used by other processes during a window: busy jiffies of the whole machine (/proc/stat) minus
    this process's own CPU time, divided by the wall time. None where /proc/stat is unavailable."""

    def __init__(self) -> None:
        self.available = os.path.exists("/proc/stat")
        self._start: tuple[float, float, float] | None = None

    @staticmethod
    def _busy_seconds() -> float:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_seconds() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self) -> None:
        if self.available:
            self._start = (time.perf_counter(), self._busy_seconds(), self._own_seconds())

    def stop(self) -> float | None:
        if not self.available or self._start is None:
            return None
        t0, busy0, own0 = self._start
        wall = time.perf_counter() - t0
        other = (self._busy_seconds() - busy0) - (self._own_seconds() - own0)
        return max(0.0, other / wall) if wall > 0 else None

    def wait_quiet(self, max_wait_s: float, threshold: float = 0.25, probe_s: float = 1.0) -> float | None:
        """Sleep until other processes use less than `threshold` cores over a `probe_s` window, or until
        `max_wait_s` passed; returns the last probe (None without /proc/stat or when max_wait_s <= 0)."""
        if not self.available or max_wait_s <= 0:
            return None
        deadline = time.perf_counter() + max_wait_s
        while True:
            self.start()
            time.sleep(probe_s)
            load = self.stop()
            if load is None or load < threshold or time.perf_counter() >= deadline:
                return load
