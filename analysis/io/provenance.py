"""Where a result came from: the command and what its completed runs record (seeds, commits, CPU-hours, wall
time), as the gallery prints it beside each of our figures."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .runs import completed_runs

ACTIVE_GAP_S = 1800.0  # a pause longer than this between runs is not counted as the study's wall time


@dataclass(frozen=True)
class Provenance:
    """Where an entry's runs came from: the command that reproduces them, and what their records say."""

    command: str
    n_runs: int = 0
    seeds: tuple[int, ...] = ()
    commits: tuple[str, ...] = ()
    cpu_hours: float = 0.0
    wall_s: float = 0.0  # active_wall_s

    def markdown(self) -> str:
        if self.n_runs == 0:
            return f"`{self.command}`"
        commits = ", ".join(self.commits[:4]) + (f" and {len(self.commits) - 4} more" if len(self.commits) > 4 else "")
        return (
            f"`{self.command}`: {self.n_runs} runs, seeds {seed_text(self.seeds)}, "
            f"{self.cpu_hours:.2f} CPU-hours, {self.wall_s / 60:.0f} min of wall time; commits {commits}"
        )


def seed_text(seeds: tuple[int, ...]) -> str:
    return ", ".join(map(str, seeds)) if len(seeds) <= 8 else f"{len(seeds)} seeds ({seeds[0]}-{seeds[-1]})"


def provenance(df: pd.DataFrame, command: str) -> Provenance:
    """The command plus what the completed runs of ``df`` (a results table) record."""
    done = completed_runs(df)
    if done.empty:
        return Provenance(command)
    seeds = tuple(sorted({int(s) for s in done["seed"].dropna()}))
    commits = tuple(sorted({str(c)[:7] for c in done.get("git_commit", pd.Series(dtype=str)).dropna() if c}))
    cpu = float(pd.to_numeric(done.get("cpu_time_s"), errors="coerce").fillna(0).sum()) / 3600
    return Provenance(command, len(done), seeds, commits, cpu, active_wall_s(done))


def active_wall_s(df: pd.DataFrame) -> float:
    """Wall time the runs of ``df`` took together: the union of their [started_at, finished_at] spans, with pauses
    between runs longer than ACTIVE_GAP_S (a study resumed in a later session) left out."""
    if "started_at" not in df.columns or "finished_at" not in df.columns:
        return 0.0
    spans = sorted(
        (a.timestamp(), b.timestamp())
        for a, b in zip(pd.to_datetime(df["started_at"], utc=True), pd.to_datetime(df["finished_at"], utc=True))
        if not (pd.isna(a) or pd.isna(b))
    )
    total, (start, end) = 0.0, spans[0] if spans else (0.0, 0.0)
    for a, b in spans[1:]:
        if a > end + ACTIVE_GAP_S:
            total += end - start
            start = a
        end = max(end, b)
    return total + (end - start)
