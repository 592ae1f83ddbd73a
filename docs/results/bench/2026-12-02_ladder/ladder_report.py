"""The ladder section's printout (:func:`print_ladder`) and its Markdown tables (:func:`markdown`:
``python -m experiments.bench.ladder --markdown BENCH_JSON``, the tables of docs/performance.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def f(v: float | None, fmt: str, scale: float = 1.0) -> str:
    """``v * scale`` in ``fmt``; "-" when missing."""
    return format(v * scale, fmt) if v is not None else "-"


def g(d: dict[str, Any] | None, *keys: str) -> Any:
    """``d[k0][k1]...``, None where a level is missing."""
    for key in keys:
        d = (d or {}).get(key)
    return d


def header(*cols: str) -> list[str]:
    """A Markdown table's header rows, after a blank line."""
    return ["", "| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]


def print_ladder(res: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """The ladder section's tables (``res``: the bench JSON's ``ladder``) and its checks."""
    k = str(res["study_seeds"])  # the K of the amortised figures (ladder.STUDY_SEEDS when it ran)

    log(
        f"\n-- CPU ladder (train.tokens x {res['fraction']:g}): tokens per CPU-second; compiled cold = fresh inductor "
        f"cache, warm = same process, disk = new process, 1/{k} = one cold run in {k}; 'x': / eager"
    )
    log(
        f"  {'size':7s} {'arm':13s} {'eager':>6s} {'cold':>6s} {'warm':>6s} {'disk':>6s} {'1/' + k:>6s} {'x cold':>6s} "
        f"{'x warm':>6s} {'x 1/' + k:>6s}"
    )
    for s in res["sizes"]:
        for scheme, a in s["arms"].items():
            am = (a.get("amortised") or {}).get(k) or {}
            cells = [(a.get(x) or {}).get("tokens_per_cpu_s") for x in ("eager", "cold", "warm", "disk")]
            log(
                f"  {s['size']['name']:7s} {scheme:13s} "
                + " ".join(f"{f(c, '6.0f'):>6s}" for c in [*cells, am.get("tokens_per_cpu_s")])
                + " "
                + " ".join(
                    f"{f(v, '6.2f'):>6s}"
                    for v in (
                        (a.get("cold") or {}).get("vs_eager"),
                        (a.get("warm") or {}).get("vs_eager"),
                        am.get("vs_eager"),
                    )
                )
            )
    _print_floor(res, k, log)
    _print_ratios_and_checks(res, log)


def _print_floor(res: dict[str, Any], k: str, log: Callable[[str], None]) -> None:
    log("\n-- step against the GEMM floor (floor / step) and the 512^3 matmul peak (achieved GFLOP/s / peak); CPU ms")
    log(
        f"  {'size':7s} {'arm':13s} {'floor':>6s} {'eager':>6s} {'warm':>6s} {'fl.e':>5s} {'fl.w':>5s} {'fl.e.wh':>7s} "
        f"{'fl.1/' + k:>7s} {'GF.e':>5s} {'GF.w':>5s} {'pk.e':>5s} {'pk.w':>5s} {'peak GF':>7s}"
    )
    for s in res["sizes"]:
        for scheme, a in s["arms"].items():
            e, w = a.get("eager") or {}, a.get("warm") or {}
            am = (a.get("amortised") or {}).get(k) or {}
            es, ws = e.get("steady") or {}, w.get("steady") or {}
            log(
                f"  {s['size']['name']:7s} {scheme:13s} {1e3 * s['gemm_floor']['floor_s']:6.2f} "
                f"{f(e.get('steady_step_s'), '6.2f', 1e3):>6s} {f(w.get('steady_step_s'), '6.2f', 1e3):>6s} "
                f"{f(es.get('floor_fraction'), '5.2f'):>5s} {f(ws.get('floor_fraction'), '5.2f'):>5s} "
                f"{f((e.get('whole') or {}).get('floor_fraction'), '7.2f'):>7s} "
                f"{f(am.get('floor_fraction'), '7.2f'):>7s} "
                f"{f(es.get('gflop_per_s'), '5.1f'):>5s} {f(ws.get('gflop_per_s'), '5.1f'):>5s} "
                f"{f(es.get('peak_fraction'), '5.2f'):>5s} {f(ws.get('peak_fraction'), '5.2f'):>5s} "
                f"{s['matmul_peak_gflop_per_s']:7.1f}"
            )


def _print_ratios_and_checks(res: dict[str, Any], log: Callable[[str], None]) -> None:
    log("\n-- step / baseline's step, same path, round by round: median [q1, q3] (steady; whole run CPU per step)")
    for s in res["sizes"]:
        for scheme, by_path in s["step_ratios"].items():
            parts = [
                f"{p} {r['steady']['median']:.3f} [{r['steady']['q1']:.3f}, {r['steady']['q3']:.3f}]; whole "
                f"{r['whole']['median']:.3f}"
                for p, r in by_path.items()
                if r["steady"]["median"] is not None
            ]
            log(f"  {s['size']['name']:7s} {scheme:13s} " + " | ".join(parts))
    for s in res["sizes"]:
        b = s.get("other_cores_busy")
        if b:
            log(
                f"  {s['size']['name']:7s} other processes used {b['median']:.2f} cores (median of rounds; "
                f"max {b['max']:.2f})"
            )
    for c in res["checks"]:
        log(f"  [{'PASS' if c['pass'] else 'FAIL'}] {c['name']}: {c['value']:.3f} (target {c['limit']})")


def markdown(res: dict[str, Any]) -> str:
    """The ladder section's results (``res``: bench JSON's ``ladder``) as the Markdown tables of docs/performance.md,
    "The compiled CPU step"."""
    k = str(res["study_seeds"])  # the K of the amortised figures (ladder.STUDY_SEEDS when it ran)

    out = [f"Tokens per CPU-second, train.tokens x {res['fraction']:g} (x: compiled / eager; 1/{k}: one cold in {k})"]
    out += header(
        *("size", "arm", "eager", "compiled cold", "warm", "disk", f"1/{k}", "x cold", "x warm", "x disk"),
        *(f"x 1/{k}", "projected x warm", f"projected x 1/{k}", f"projected x 1 disk in {k}"),
    )
    for s in res["sizes"]:
        for scheme, a in s["arms"].items():
            cells = [g(a, x, "tokens_per_cpu_s") for x in ("eager", "cold", "warm", "disk")]
            cells.append(g(a, "amortised", k, "tokens_per_cpu_s"))
            ratios = [g(a, x, "vs_eager") for x in ("cold", "warm", "disk")] + [g(a, "amortised", k, "vs_eager")]
            proj = [
                g(a, "projected", "warm_vs_eager"),
                g(a, "projected", "amortised", k, "vs_eager"),
                g(a, "projected", "disk_amortised", "vs_eager"),
            ]
            out.append(
                f"| {s['size']['name']} | {scheme} | "
                + " | ".join(f(c, ".0f") for c in cells)
                + " | "
                + " | ".join(f(r, ".2f") for r in ratios + proj)
                + " |"
            )
    out += _md_floor(res, k) + _md_ratios(res) + _md_compile(res)
    return "\n".join(out)


def _md_floor(res: dict[str, Any], k: str) -> list[str]:
    out = ["", "Step against the GEMM floor (floor / step) and the matmul peak (step FLOP/s / peak)"]
    out += header(
        *("size", "floor ms", "peak GFLOP/s", "arm", "eager step ms", "compiled step ms", "floor: eager steady"),
        *("compiled steady", "eager whole", f"compiled whole, 1/{k}", f"projected 1/{k}", "GFLOP/s eager"),
        *("compiled", "peak: eager", "compiled"),
    )
    for s in res["sizes"]:
        for scheme, a in s["arms"].items():
            out.append(
                f"| {s['size']['name']} | {1e3 * s['gemm_floor']['floor_s']:.2f} | {s['matmul_peak_gflop_per_s']:.0f} "
                f"| {scheme} | {f(g(a, 'eager', 'steady_step_s'), '.1f', 1e3)} | "
                f"{f(g(a, 'warm', 'steady_step_s'), '.1f', 1e3)} | "
                f"{f(g(a, 'eager', 'steady', 'floor_fraction'), '.2f')} | "
                f"{f(g(a, 'warm', 'steady', 'floor_fraction'), '.2f')} | "
                f"{f(g(a, 'eager', 'whole', 'floor_fraction'), '.2f')} | "
                f"{f(g(a, 'amortised', k, 'floor_fraction'), '.2f')} | "
                f"{f(g(a, 'projected', 'amortised', k, 'floor_fraction'), '.2f')} | "
                f"{f(g(a, 'eager', 'steady', 'gflop_per_s'), '.1f')} | "
                f"{f(g(a, 'warm', 'steady', 'gflop_per_s'), '.1f')} | "
                f"{f(g(a, 'eager', 'steady', 'peak_fraction'), '.2f')} | "
                f"{f(g(a, 'warm', 'steady', 'peak_fraction'), '.2f')} |"
            )
    return out


def _md_ratios(res: dict[str, Any]) -> list[str]:
    paths = res["paths"]
    out = ["", "Step / the baseline's step, same path, median [q1, q3] over rounds"]
    out += header("size", "arm", *(f"{p} {w}" for p in paths for w in ("steady", "whole", "whole, warm runs")))
    for s in res["sizes"]:
        for scheme, by_path in s["step_ratios"].items():
            cells = []
            for p in paths:
                r = by_path[p]
                st, wh, ww = r["steady"], r["whole"], r["whole_warm"]
                cells.append(f"{f(st['median'], '.3f')} [{f(st['q1'], '.3f')}, {f(st['q3'], '.3f')}]")
                cells.append(f"{f(wh['median'], '.3f')}")
                cells.append(f"{f(ww['median'], '.3f')}")
            out.append(f"| {s['size']['name']} | {scheme} | " + " | ".join(cells) + " |")
    return out


def _md_compile(res: dict[str, Any]) -> list[str]:
    out = ["", "Compilation: CPU seconds above a warm in-process run of the same length"]
    out += header("size", "arm", "cold", "disk", "cold first step, wall s", "other cores busy (median of rounds)")
    for s in res["sizes"]:
        busy = g(s, "other_cores_busy", "median")
        for scheme, a in s["arms"].items():
            out.append(
                f"| {s['size']['name']} | {scheme} | {f(g(a, 'compile_cpu_s', 'cold'), '.1f')} | "
                f"{f(g(a, 'compile_cpu_s', 'disk'), '.1f')} | {f(g(a, 'cold', 'first_step_wall_s'), '.1f')} | "
                f"{f(busy, '.2f')} |"
            )
    return out
