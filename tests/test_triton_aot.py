"""The Triton depth kernels compiled ahead of time for Hopper (sm_90a) on a machine without a GPU: at the five paper
sizes, every kernel configuration the dispatch chooses compiles without spills, leaves at least two blocks per SM,
and pads D only to a multiple of its chunk (scripts/triton_aot_report.py; experiments/bench/triton_aot.py).

The report runs in a subprocess: the kernels cannot be compiled in a process whose triton runs its interpreter
(conftest.py sets TRITON_INTERPRET=1 where there is no GPU). The calls come from running Block (N = 8) and Full
AttnRes at each size's depth under bf16-mixed and bf16-true. Skipped, with the reason, where triton or the ptxas it
ships is missing. About 30-40 s on 2 cores with an empty Triton cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (requirements-cpu.txt installs it for these tests)")

REPO = Path(__file__).resolve().parents[1]
SIZES = {"paper_194m": 896, "paper_241m": 960, "paper_296m": 1024, "paper_436m": 1168, "paper_528m": 1264}
KERNELS = {"attend_fwd", "attend_bwd", "merge_fwd", "merge_bwd"}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("aot") / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "triton_aot_report.py"), "--json", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode == 2:  # the report's own exit status for "no compiler here"
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_the_report_covers_every_paper_size_scheme_and_kernel(report):
    """Every size, both schemes, all four kernels; Block's phase 1 at each size's block size, Full's read groups
    of 4 (and the last, shorter one), merges with up to 3 extras (Full) and the partial sum (Block)."""
    assert {(r["size"], r["D"]) for r in report} == set(SIZES.items())
    for size in SIZES:
        for scheme in ("block", "full"):
            rows = [r for r in report if r["size"] == size and r["scheme"] == scheme]
            assert {r["kernel"] for r in rows} == KERNELS, (size, scheme)
    full = {r["n"] for r in report if r["scheme"] == "full" and r["kernel"] == "merge_fwd"}
    assert full == {0, 1, 2, 3}
    assert {r["n"] for r in report if r["size"] == "paper_528m" and r["kernel"] == "attend_fwd"} == {3, 4, 5}
    assert {r["out"] for r in report if r["kernel"] == "merge_fwd"} == {"fp32", "bf16"}  # mixed and true


def test_no_spills_two_blocks_per_sm_and_d_padded_to_a_chunk_at_most(report):
    bad = [
        (r["size"], r["scheme"], r["kernel"], r["n"], r["out"], r["registers"], r["spill_stores"], r["blocks_per_sm"])
        for r in report
        if r["spill_stores"] or r["spill_loads"] or r["blocks_per_sm"] < 2
    ]
    assert not bad, bad
    for r in report:
        chunk = r["launch"]["chunk"]
        assert r["padded"] % chunk == 0
        assert 0 <= r["padded"] - r["D"] < chunk, r
