"""Several budgets from one run: ``train.budgets=[8,32,128]`` (tokens per parameter) with ``scheduler=wsd``.

A WSD schedule's constant phase does not depend on the run's length (experiments.training.optim.wsd_lambda), so the
state of a WSD run to the largest budget at step s is the state of a WSD run to any smaller budget at s, as long as s is
before that budget's decay and both share the warm-up. So (Hägele et al. 2024, arXiv 2405.18392):

* **the trunk** is the ordinary WSD run to the largest budget. While it is at the peak lr it saves its state at
  each smaller budget's decay start, ``steps_B - round(decay_fraction * steps_B)``, as that budget's
  **branch point**, ``<branch run dir>/checkpoints/branch_point.ckpt``;
* **each smaller budget is a decay branch**: the ordinary WSD run to that budget, started from its branch point
  instead of from step 0 (the branch point becomes its ``last.ckpt``, and the trunk's metrics up to that step its
  first rows); its lr is set from its own schedule at the step it starts from (:class:`ScheduleResync`). It is then
  interruptible and resumable like any run, from its own checkpoints. Its branch point is deleted once it is
  finished (completed or diverged).

**Per-budget learning rates.** Each budget's config resolves its own peak lr (``optimizer.lr``; a tuned-lr table
with ``lr_per_budget`` gives each budget its own: experiments.config.resolvers). Only budgets that share their peak
lr can share a trunk, so the budgets are grouped by it: the budgets of one lr are one trunk (the largest of them)
with its decay branches, as above, and a budget whose lr no other budget shares is an independent WSD run (a trunk
without branches). Every group uses the launch's one shared warm-up, so a launch whose budgets all share one lr
(an old-style table, ``size.lr=...``) is one trunk and plans exactly as it did before groups existed. The groups
train in turn, by increasing largest budget.

Identity: every branch, the trunk included, is the run its config describes: the launch's config with the length
of its budget (``size.tokens_per_param = B`` where the size has that key, else ``size.tokens = round(B *
size.target_params)``), ``train.budgets`` null and the shared warm-up. So a branch has the ``config_hash`` of an
independent WSD run to its budget: a relaunch skips the finished ones (experiments.run.record_builder.find_finished), an
independent run already in the study is not trained again, and a branch whose branch point is gone is trained from
step 0 as that independent run (the same result; it says so). The shared warm-up is ``scheduler.warmup_steps`` when
set, else ``warmup_fraction`` of the smallest budget's steps; a branch whose own ``warmup_fraction`` gives that same
length keeps ``warmup_steps`` null (its identity is then the plain run's), every other gets ``warmup_steps`` = the
shared length. Each record carries ``budget`` (B), ``lr`` and ``trunk_id`` (its group's trunk's run id; also on
the trunk's own). Interrupts and relaunches hold per group: a relaunch skips the finished budgets of every group,
resumes an unfinished trunk (keeping the branch points it saved) and an unfinished branch from its own checkpoint or
its branch point. Every record a launch writes names one ``git_commit``, the launch's (from the Python API too:
experiments.run.run_env.launch_commit_pinned).

Decisions and the measured cost: docs/runs.md, "Several budgets from one run". Lightning is imported only by the
callbacks' module (experiments.training.callbacks), when a branch trains.
"""

from __future__ import annotations

import copy
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from results import ledger

from ..config.validation import check_writable, min_free_mb
from . import interrupts
from .errors import SetupError, StopRequested
from .identity import run_identity
from .record_builder import find_finished
from .run_env import launch_commit_pinned
from .run_plan import planned_steps

BRANCH_POINT = "branch_point.ckpt"  # in the branch's own checkpoints/ directory
TRUNK_FILES = ("metrics.csv", "diagnostics.jsonl", "router.csv")  # a branch's first rows, up to its branch point
WSD_TARGET = "experiments.training.optim.wsd"


@dataclass(frozen=True)
class Branch:
    """One budget of a multi-budget launch: an ordinary WSD run (``cfg``) and where it branches from the trunk."""

    budget: int | float  # tokens per parameter
    cfg: DictConfig  # the run's own config: train.budgets null, the budget's length, the shared warm-up
    lr: float | None  # its peak lr, cfg's optimizer.lr: the budgets of one lr share a trunk
    steps: int
    decay_steps: int
    config_hash: str
    run_id: str
    run_dir: Path

    @property
    def start(self) -> int:
        """The step its decay starts at: its branch point on the trunk."""
        return self.steps - self.decay_steps

    @property
    def branch_point(self) -> Path:
        return self.run_dir / "checkpoints" / BRANCH_POINT

    def has_own_checkpoint(self) -> bool:
        ckpts = self.run_dir / "checkpoints"
        return (ckpts / "last.ckpt").is_file() or (ckpts / "last.prev.ckpt").is_file()


@dataclass(frozen=True)
class BudgetPlan:
    """A multi-budget launch: its budgets grouped by peak lr, each group one trunk and its decay branches."""

    groups: tuple[tuple[Branch, ...], ...]  # each by increasing budget, its last the trunk; by increasing trunk budget
    warmup_steps: int  # shared by every group
    warmup_from: str  # where the shared warm-up comes from, for the launch's first line
    study_dir: Path

    @property
    def branches(self) -> tuple[Branch, ...]:
        """Every budget's run, trunks included, by increasing budget."""
        return tuple(sorted((b for g in self.groups for b in g), key=lambda b: float(b.budget)))

    def trunk_of(self, branch: Branch) -> Branch:
        """The trunk of ``branch``'s group (``branch`` itself for a trunk)."""
        return next(g[-1] for g in self.groups if any(b is branch for b in g))


def _canonical(budget: Any) -> int | float:
    """A budget as the size key takes it: 32.0 -> 32 (an int keeps the hash of ``size.tokens_per_param=32``)."""
    value = float(budget)
    return int(value) if value.is_integer() else value


def branch_config(cfg: DictConfig, budget: int | float, warmup_steps: int | None) -> DictConfig:
    """The launch's config as the ordinary run to ``budget`` tokens per parameter (``warmup_steps`` None: the
    schedule's own warm-up). A ValueError naming the key when the length cannot be set that way."""
    size = cfg.size
    if size.get("target_params") is None:
        raise ValueError(
            f"train.budgets counts tokens per parameter of size.target_params, and size {size.get('name')!r} has "
            "none: set size.target_params (the N each budget multiplies)"
        )
    if OmegaConf.select(cfg, "train.tokens", throw_on_resolution_failure=False) is None or not (
        OmegaConf.is_interpolation(cfg.train, "tokens")
    ):
        raise ValueError(
            f"train.budgets sets each branch's length, so train.tokens must stay ${{size.tokens}} (it is "
            f"{cfg.train.get('tokens')!r}); drop the train.tokens override"
        )
    out = copy.deepcopy(cfg)
    want = round(float(size.target_params) * float(budget))
    with open_dict(out):
        out.train.budgets = None
        if "tokens_per_param" in size:
            out.size.tokens_per_param = budget
        else:
            out.size.tokens = want
        if warmup_steps is not None:
            out.scheduler.warmup_steps = warmup_steps
    got = OmegaConf.select(out, "train.tokens")
    if got != want:
        raise ValueError(
            f"train.budgets: budget {budget} should train {want} tokens ({budget} x size.target_params "
            f"{size.target_params}), but train.tokens resolves to {got!r} with size.tokens_per_param={budget}: drop "
            "the size.tokens override"
        )
    return out


def peak_lr(cfg: DictConfig, budget: int | float) -> float | None:
    """A budget's run config's ``optimizer.lr`` (None when the optimizer has none); a resolution error (the tuned-lr
    table lacks the budget) is a one-line ValueError."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        lr = OmegaConf.select(cfg, "optimizer.lr")
    except OmegaConfBaseException as e:
        cause: BaseException = e  # the resolver's own error, without OmegaConf's wrapping and key lines
        while (inner := cause.__cause__ or cause.__context__) is not None:
            cause = inner
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise ValueError(f"train.budgets: budget {budget}'s optimizer.lr does not resolve: {first}") from None
    return float(lr) if lr is not None else None


def plan_budgets(cfg: DictConfig) -> BudgetPlan:
    """Every branch's config, peak lr, steps, decay and identity, the groups of budgets that share a peak lr (one
    trunk each) and the launch's shared warm-up; a ValueError naming the key when the budgets cannot be planned (not
    WSD, two budgets of one step count, a decay that would start before the shared warm-up ends, a budget whose lr
    does not resolve). Reads nothing but the config: the data are not loaded yet.

    ``cfg`` is a config check_config passed; a branch's config differs from it in ``train.budgets`` (null),
    the size's length (``size.tokens_per_param`` = a budget check_budgets accepted, or ``size.tokens``) and the
    shared ``scheduler.warmup_steps`` (>= 1, before every decay: checked here), so it is not checked again."""
    sched = cfg.scheduler
    if str(sched.get("_target_")) != WSD_TARGET:
        raise ValueError(
            f"train.budgets branches decays from one constant-lr trunk, which needs scheduler=wsd (this config has "
            f"{sched.get('_target_')!r})"
        )
    budgets = [_canonical(b) for b in cfg.train.budgets]
    plain = [branch_config(cfg, b, None) for b in budgets]
    steps = [planned_steps(c.train, 0.0) for c in plain]  # a token count: flops_per_token is not read
    for b, s in zip(budgets, steps):
        if s < 1:
            raise ValueError(f"train.budgets: budget {b} trains {s} steps; every budget needs at least one step")
    for i in range(1, len(steps)):
        if steps[i] == steps[i - 1]:
            raise ValueError(
                f"train.budgets: budgets {budgets[i - 1]} and {budgets[i]} both train {steps[i]} steps (whole batches "
                f"of {cfg.train.batch_size} x {cfg.train.seq_len} tokens): drop one"
            )
    fraction, decay_fraction = float(sched.warmup_fraction), float(sched.decay_fraction)
    if sched.get("warmup_steps") is not None:
        warmup, source = int(sched.warmup_steps), "scheduler.warmup_steps"
    else:
        warmup = max(1, round(fraction * steps[0]))
        source = f"scheduler.warmup_fraction {fraction:g} of the smallest budget's {steps[0]} steps"
    branches = []
    for b, s, c in zip(budgets, steps, plain):
        decay = round(decay_fraction * s)
        if s - decay < warmup:
            raise ValueError(
                f"train.budgets: budget {b} ({s} steps) would start its decay at step {s - decay}, before the shared "
                f"warm-up ends at step {warmup} ({source}): raise the smallest budget or lower "
                "scheduler.warmup_steps / warmup_fraction or scheduler.decay_fraction"
            )
        own = sched.get("warmup_steps") is None and max(1, round(fraction * s)) == warmup
        run_cfg = c if own else branch_config(cfg, b, warmup)  # not checked again: the docstring
        lr = peak_lr(c, b)  # first: a budget the tuned-lr table lacks is named on one line
        chash, run_id, run_dir, study_dir = run_identity(run_cfg)
        branches.append(Branch(b, run_cfg, lr, s, decay, chash, run_id, run_dir))
    by_lr: dict[float | None, list[Branch]] = {}
    for branch in branches:  # by increasing budget, so each group is too
        by_lr.setdefault(branch.lr, []).append(branch)
    groups = sorted((tuple(g) for g in by_lr.values()), key=lambda g: float(g[-1].budget))
    return BudgetPlan(tuple(groups), warmup, source, study_dir)


# A run of experiments.train: (cfg, lineage, branch_points, seed, resync) -> its record.
TrainRun = Callable[..., dict[str, Any]]


def seed_branch(branch: Branch, trunk: Branch) -> None:
    """Start ``branch`` from its branch point: unless it has a checkpoint of its own, the branch point becomes its
    ``last.ckpt`` and the trunk's metrics.csv, diagnostics.jsonl and router.csv its files (the recorder keeps
    their rows up to the step it resumes at). Each file is written to a temporary name and renamed into place.
    The trunk's ModelCheckpoint states are left out of the branch's checkpoint: they name the trunk's directory
    (Lightning would only warn and ignore them)."""
    if branch.has_own_checkpoint() or not branch.branch_point.is_file():
        return
    import torch

    for name in TRUNK_FILES:
        if (trunk.run_dir / name).is_file():
            tmp = _temporary(branch.run_dir / name)
            shutil.copyfile(trunk.run_dir / name, tmp)
            os.replace(tmp, branch.run_dir / name)
    ckpt = torch.load(branch.branch_point, map_location="cpu", weights_only=False)
    ckpt["callbacks"] = {k: v for k, v in ckpt.get("callbacks", {}).items() if not k.startswith("ModelCheckpoint")}
    last = branch.run_dir / "checkpoints" / "last.ckpt"
    tmp = _temporary(last)
    try:
        with open(tmp, "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, last)
    finally:
        tmp.unlink(missing_ok=True)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")


def _lr_text(lr: float | None) -> str:
    if lr is None:
        return "lr -"
    mantissa, exponent = f"{lr:.2e}".split("e")
    return f"lr {mantissa}e{int(exponent)}"


def launch_line(plan: BudgetPlan) -> str:
    """The launch's first line: its budgets, its groups (each trunk with its lr, steps and branch points) and the
    shared warm-up."""
    n = len(plan.groups)
    parts = []
    for group in plan.groups:
        trunk = group[-1]
        branches = "".join(f"; branch {b.budget} at step {b.start} (+{b.decay_steps} decay)" for b in group[:-1])
        parts.append(f"trunk {trunk.run_id} ({trunk.budget}: {_lr_text(trunk.lr)}, {trunk.steps} steps{branches})")
    return (
        f"[attnres] budgets {', '.join(str(b.budget) for b in plan.branches)} tokens/parameter at {n} "
        f"lr{'s' if n > 1 else ''}: {'; '.join(parts)}; warm-up {plan.warmup_steps} steps, shared ({plan.warmup_from})"
    )


def train_budgets(cfg: DictConfig, train_run: TrainRun) -> dict[str, Any]:
    """Train the budgets of ``cfg.train.budgets`` that the study does not hold finished, group by group (the budgets
    of one peak lr; by increasing largest budget): the group's trunk (its largest budget) first, saving the branch
    points of the group's unfinished smaller budgets, then each of those from its branch point. Between two runs an
    interrupt the launch received stops it (StopRequested). Returns the largest budget's record with ``budgets``
    (every budget's record, smallest first); it is ``skipped`` only when every budget was. ``cfg``: a config
    check_config passed (experiments.train.train)."""
    try:
        plan = plan_budgets(cfg)
        check_writable(plan.study_dir, min_free_mb=min_free_mb(cfg))
    except ValueError as e:
        raise SetupError(str(e)) from e
    print(launch_line(plan))
    with launch_commit_pinned():  # one commit for every budget's record, from the Python API too
        records = _train_groups(cfg, plan, train_run)
    ordered = [records[b.budget] for b in plan.branches]
    result = dict(ordered[-1])
    if not all(r.get("skipped") for r in ordered):
        result.pop("skipped", None)
    result["budgets"] = ordered
    if all(r.get("skipped") for r in ordered):
        print(f"[attnres] all {len(ordered)} budgets are finished in {plan.study_dir}: nothing to train")
    return result


def _train_groups(cfg: DictConfig, plan: BudgetPlan, train_run: TrainRun) -> dict[int | float, dict[str, Any]]:
    """Every budget's record, by budget: the finished ones found, the others trained group by group
    (train_budgets)."""
    records: dict[int | float, dict[str, Any]] = {}
    pending: list[Branch] = []
    for b in plan.branches:
        done = None if cfg.force else find_finished(plan.study_dir, b.config_hash, b.run_id)
        if done is None:
            pending.append(b)
        else:
            records[b.budget] = done
            b.branch_point.unlink(missing_ok=True)
    for group in plan.groups:
        trunk = group[-1]
        todo = [b for b in group if any(b is p for p in pending)]
        todo.sort(key=lambda b: b is not trunk)  # the trunk first (it saves the branch points), then smallest first
        lineage = {"trunk_id": trunk.run_id}
        for b in todo:
            if (signame := interrupts.received()) is not None:
                raise StopRequested(signame)
            if b is trunk:
                points = {
                    p.start: p.branch_point
                    for p in todo
                    if p is not trunk and not p.has_own_checkpoint() and not p.branch_point.is_file()
                }
                records[b.budget] = train_run(b.cfg, lineage={**lineage, "budget": b.budget}, branch_points=points)
                continue
            if not b.has_own_checkpoint() and not b.branch_point.is_file():
                print(
                    f"[attnres] {b.run_id}: no trunk state at step {b.start} (its branch point is gone): budget "
                    f"{b.budget} trains from step 0, as the independent run it is"
                )
            rec = train_run(
                b.cfg, lineage={**lineage, "budget": b.budget}, seed=lambda b=b, t=trunk: seed_branch(b, t), resync=True
            )
            records[b.budget] = rec
            if rec.get("status") in ledger.FINISHED:
                b.branch_point.unlink(missing_ok=True)
    return records
