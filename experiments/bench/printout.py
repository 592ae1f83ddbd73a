"""The printed report of the per-size and options sections (the columns docs/performance.md quotes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fmt_ratio(r: dict[str, Any] | None) -> str:
    """A summarised ratio as "median [q1, q3]"; "   -   " when absent."""
    if not r or r.get("median") is None:
        return "   -   "
    return f"{r['median']:.3f} [{r['q1']:.3f}, {r['q3']:.3f}]"


def print_size(res: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """The per-size section's table (ratios to the baseline) and its detail lines."""
    name = res["size"]["name"]
    log(f"\n-- {name}: ratios to baseline (median [q1, q3] over rounds)")
    log(
        f"  {'scheme':10s} {'step s':>8s} {'tok/s':>9s} {'GFLOP/s':>8s} {'MFU':>6s}  {'train step':>24s}  "
        f"{'train CPU time':>24s}  {'prefill':>24s}  {'decode/token':>24s}  {'saved act.':>10s}  "
        f"{'peak tensors':>12s}  {'peak step':>9s}"
    )
    for n, e in res["schemes"].items():
        r = res["ratios"].get(n, {})
        mfu = f"{100 * e['mfu']:5.1f}%" if e.get("mfu") is not None else "   -  "
        gf = f"{e['flop_per_s'] / 1e9:8.1f}" if e.get("flop_per_s") else "       -"
        sab = f"{r['saved_activation_bytes']:10.3f}" if r.get("saved_activation_bytes") else "         -"
        psb = f"{r['peak_step_bytes']:9.3f}" if r.get("peak_step_bytes") else "        -"
        ptb = f"{r['peak_tensor_step_bytes']:12.3f}" if r.get("peak_tensor_step_bytes") else "           -"
        log(
            f"  {n:10s} {e['train_step_s']['median']:8.3f} {e['tokens_per_s']:9.0f} {gf} {mfu}  "
            f"{fmt_ratio(r.get('train_step')):>24s}  {fmt_ratio(r.get('train_step_cpu')):>24s}  "
            f"{fmt_ratio(r.get('prefill')):>24s}  {fmt_ratio(r.get('decode')):>24s}  {sab}  {ptb}  {psb}"
        )
    _print_size_details(res, log)


def _print_size_details(res: dict[str, Any], log: Callable[[str], None]) -> None:
    """Memory, decode and first-step lines per scheme, the machine load, the checks."""
    for n, e in res["schemes"].items():
        if "saved_activation_bytes" in e:
            extra = ""
            if e.get("peak_tensor_step_bytes"):
                extra += f", peak tensors in a step {e['peak_tensor_step_bytes'] / 2**20:.1f} MiB"
            if "peak_step_bytes" in e:
                extra += f", peak step {e['peak_step_bytes'] / 2**20:.1f} MiB (peak {e['peak_bytes'] / 2**20:.1f} MiB)"
            log(f"  {n:10s} saved for backward {e['saved_activation_bytes'] / 2**20:.1f} MiB{extra}")
    for n, e in res["schemes"].items():
        if "decode_token_s" in e or "first_step_s" in e:
            dec = f"decode {1e3 * e['decode_token_s']['median']:.2f} ms/token" if "decode_token_s" in e else ""
            first = f"first step {e['first_step_s']:.1f} s" if "first_step_s" in e else ""
            log(f"  {n:10s} {'  '.join(x for x in (dec, first) if x)}")
    if res.get("other_cores_busy"):
        b = res["other_cores_busy"]
        log(f"  other processes used {b['median']:.2f} cores (median over rounds; max {b['max']:.2f})")
    for c in res["checks"]:
        v, lim = c["value"], c["limit"]
        if "bytes" in c["name"] or "memory" in c["name"] or "activations" in c["name"]:
            vs = f"{v / 2**20:.1f} MiB ({c['extra_in_BTd']:.1f} x B*T*d) vs limit {lim / 2**20:.1f} MiB"
        else:
            vs = f"{v:.3f} vs {lim}"
        log(f"  [{'PASS' if c['pass'] else 'FAIL'}] {c['name']}: {vs}")


def print_options(res: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """The options section's table."""
    log(f"\n-- options at {res['size']['name']} (step time; ratios median [q1, q3])")
    log(
        f"  {'scheme/option':24s} {'step s':>8s} {'first step s':>12s}  {'vs eager (same scheme)':>24s}  "
        f"{'vs baseline (same option)':>26s}  {'saved act. MiB':>14s}"
    )
    for n, e in res["results"].items():
        sab = f"{e['saved_activation_bytes'] / 2**20:14.1f}" if e.get("saved_activation_bytes") else "             -"
        log(
            f"  {n:24s} {e['train_step_s']['median']:8.3f} {e['first_step_s']:12.1f}  "
            f"{fmt_ratio(e['vs_eager_same_scheme']):>24s}  {fmt_ratio(e['vs_baseline_same_option']):>26s}  {sab}"
        )
