"""The gallery: every paper figure and table beside the harness's own version of it, on one Markdown page
(docs/results/README.md, written by ``python -m sweeps.study figures`` or ``python -m analysis gallery``).

Each entry holds the paper's numbers (transcribed: analysis/data/paper.json and paper_gallery.json), ours as a figure
and a table with 95% intervals and seed counts, its provenance (command, commits, CPU and wall time of its runs) and
one sentence, computed from the numbers, on where the two agree; for Fig. 5 and Fig. 8, whose run directories are not
kept, a labelled reading of the committed figure. An entry whose study has no result says why instead.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..io.fit_document import FitDocument
from ..io.paper_data import load_paper
from ..io.provenance import Provenance, provenance, seed_text
from ..io.runs import load_results
from .tables import ablation_markdown, block_size_markdown, markdown_table

GALLERY_DATA = Path(__file__).resolve().parents[1] / "data" / "paper_gallery.json"  # analysis/data
COMMITTED_SCALING = Path(__file__).resolve().parents[2] / "docs" / "results" / "cpu_deep" / "pooled"


def load_gallery_text() -> dict[str, Any]:
    """analysis/data/paper_gallery.json: per paper item, its title, section and transcribed claims."""
    items: dict[str, Any] = json.loads(GALLERY_DATA.read_text(encoding="utf-8"))["items"]
    return items


@dataclass(frozen=True)
class Entry:
    """One gallery entry: a paper item and ours."""

    key: str
    item: str
    title: str
    section: str
    paper: list[str]
    verdict: str
    ours: list[str] = field(default_factory=list)  # Markdown lines (a table)
    figures: list[Path] = field(default_factory=list)
    provenance: Provenance | None = None
    reachable: bool = True


def _entry(
    key: str, verdict: str, ours: list[str], figures: list[Path], runs: pd.DataFrame | None, command: str, **kw: Any
) -> Entry:
    """The entry of paper item ``key``: its gallery text, our ``verdict`` and table, the ``figures`` that exist, the
    provenance of ``runs`` (None: the command alone), and ``kw`` (Entry's ``reachable``)."""
    text = load_gallery_text()[key]
    prov = provenance(runs, command) if runs is not None else Provenance(command)
    shown = [f for f in figures if f.is_file()]
    return Entry(key, text["item"], text["title"], text["section"], text["paper"], verdict, ours, shown, prov, **kw)


def _ci(lo: float | None, hi: float | None, fmt: str = "{:.3f}") -> str:
    if lo is None or hi is None or any(math.isnan(x) for x in (lo, hi)):
        return "no interval"
    return f"[{fmt.format(lo)}, {fmt.format(hi)}]"


def _where(value: float, lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "cannot be placed against our interval"
    return "inside our interval" if lo <= value <= hi else ("above our interval" if value > hi else "below it")


def _direction(lo: float | None, hi: float | None, no_effect: float = 1.0) -> str:
    """What a multiplier's interval (above ``no_effect``: the arm helps) says, as a verb phrase."""
    if lo is None or hi is None:
        return "is not decided"
    if lo > no_effect:
        return "helps"
    return "hurts" if hi < no_effect else f"is not decided (the interval holds {no_effect:g})"


def _num(x: Any) -> str:
    return "-" if x is None else f"{float(x):.3f}"


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# ---- the entries --------------------------------------------------------------------------------------------


def frontier_sentence(report: Path) -> str:
    """Block AttnRes's multiplier along the compute-optimal frontier from a training-length report (``report``: its
    directory, length.json's ``frontier``): M(C) in the middle of the measured C and at its top, with N inside the
    measured rungs and free, their half-widths and the rollout to the largest rung; '' where there is none."""
    path = report / "length.json"
    if not path.is_file():
        return ""
    front = _read_json(path).get("frontier") or {}
    C = front.get("C") or []
    free, within = front.get("M") or {}, (front.get("within_rungs") or {}).get("M") or {}
    if not C or len(free.get("M") or []) != len(C):
        return ""

    def at(curve: dict[str, Any], i: int) -> str:
        m, lo, hi = curve["M"][i], curve["ci95_lo"][i], curve["ci95_hi"][i]
        return "n/a" if m is None else f"{m:.2f}x {_ci(lo, hi, '{:.2f}')}"

    def half(curve: dict[str, Any]) -> str:
        h = curve.get("half_width_over_M_at_top")
        return "n/a" if h is None else f"{100 * h:.0f}%"

    mid, top = len(C) // 2, len(C) - 1
    rungs = ", ".join(str(r).removeprefix("deep_L") for r in front.get("rungs", []))
    budgets = ", ".join(f"{b:g}" for b in front.get("budgets", []))
    text = (
        f" Along the compute-optimal frontier (Chinchilla approach 3 per arm over L_b {rungs} x {budgets} tokens "
        f"per parameter, Muon + WSD; `python -m sweeps.study deep_budgets`): M = {at(within or free, mid)} in the "
        f"middle of the measured C ({C[mid]:.3g} PF-days); at its top ({C[top]:.3g})"
    )
    if within:
        text += f" {at(within, top)} with N kept inside the measured rungs, half-width {half(within)}, and"
    text += f" {at(free, top)} with N free, half-width {half(free)}"
    cells = ((front.get("rollout") or {}).get("largest_rung") or {}).get("cells")
    if cells:
        inside = sum(bool(c["inside"]) for c in cells)
        text += f"; fitted without the largest rung, the law predicts {inside} of its {len(cells)} cells"
    return text + "."


def scaling_entry(
    report: Path, runs: pd.DataFrame | None, command: str, regime: str, frontier: Path | None = None
) -> Entry:
    """Fig. 4: the compute multiplier of each AttnRes arm on a CPU ladder (``report``: a fit's directory), and where
    ``frontier`` holds a training-length report, M(C) along the compute-optimal frontier beside it."""
    doc = FitDocument.from_json(report / "fit.json")
    paper_m = float(load_paper()["headline"]["M"])
    cells = []
    seeds = "/".join(map(str, sorted(set((doc.bootstrap.seeds_per_size or {}).values())))) if doc.bootstrap else "?"
    for name, m in doc.multipliers.items():
        if m.m is None:
            continue
        lo, hi = m.m_ci95 or (None, None)
        paired = m.paired or {}
        plo, phi = paired.get("m_ci95") or (None, None)
        pm = paired.get("m")
        cells.append([name, f"{m.m:.3f} {_ci(lo, hi)}", f"{'-' if pm is None else f'{pm:.3f}'} {_ci(plo, phi)}", seeds])
    rows = markdown_table(["arm", "m, joint fit [95% CI]", "m, same-seed pairs [95% CI]", "seeds per size"], cells)
    block = doc.multipliers.get("block_attnres")
    if block is None or block.m is None:
        verdict = "No Block AttnRes multiplier in this fit."
    else:
        lo, hi = block.m_ci95 or (None, None)
        paired = block.paired or {}
        plo, phi = paired.get("m_ci95") or (None, None)
        pm = paired.get("m")
        pairs = "" if pm is None else f"; on same-seed pairs m = {pm:.3f} {_ci(plo, phi)}, so it {_direction(plo, phi)}"
        verdict = (
            f"Paper: Block AttnRes is worth {paper_m:.2f}x the baseline's compute; ours, {regime}: joint fit "
            f"m = {block.m:.3f} {_ci(lo, hi)}, so Block AttnRes {_direction(lo, hi)}{pairs}; the paper's "
            f"{paper_m:.2f} is {_where(paper_m, lo, hi)}."
        )
    figures = [report / "fig4_scaling.png", report / "loss_curves.png"]
    if frontier is not None and (extra := frontier_sentence(frontier)):
        verdict += extra
        figures.append(frontier / "fig_frontier.png")
    return _entry("fig4", verdict, rows, figures, runs, command)


def table2_entry(report: Path, command: str) -> Entry:
    """Table 2: the paper's own losses refitted (``report``: ``python -m analysis paper``'s directory)."""
    paper = _read_json(report / "fit.json")["paper"]
    cells = []
    for name, law in paper["laws"].items():
        m = paper["M"].get(name, {})
        pub_a, pub_al = law.get("A_published"), law.get("alpha_published")
        a = f"{law['A']:.4f} / {'-' if pub_a is None else pub_a}"
        alpha = f"{law['alpha']:.4f} / {'-' if pub_al is None else pub_al}"
        cells.append([name, a, alpha, f"{_num(m.get('refit'))} / {_num(m.get('published_laws'))}"])
    header = ["variant", "A (refit / published)", "alpha (refit / published)"]
    rows = markdown_table([*header, "M at 5.6 PF-days (refit / published laws)"], cells)
    block = FitDocument.from_json(report / "fit.json").multipliers.get("block_attnres")
    lo, hi = block.paper_M_ci95 if block is not None and block.paper_M_ci95 else (None, None)
    refit, published = paper["M"]["block_attnres"]["refit"], paper["M"]["block_attnres"]["published_laws"]
    spread = f"; five points per arm leave it uncertain by {(hi - lo) / 2 / refit:.0%} either way" if lo and hi else ""
    verdict = (
        f"Refitting the paper's own Table 2 losses against a reconstructed FLOP count (the paper states none) gives "
        f"Block AttnRes M = {refit:.3f} {_ci(lo, hi)} at 5.6 PF-days against the published laws' {published:.3f} "
        f"({refit / published - 1:+.1%}), and the published {load_paper()['headline']['M']:.2f} is "
        f"{_where(float(load_paper()['headline']['M']), lo, hi)}{spread}."
    )
    return _entry("table2", verdict, rows, [report / "fig4_scaling.png"], None, command)


def reading_entry(key: str, figure: Path, runs: pd.DataFrame | None, command: str) -> Entry:
    """Fig. 5 or Fig. 8: a reading of the committed figure (its data lives in run directories, which are not kept),
    beside ``figure`` when this run drew one, else beside the committed figure itself."""
    committed = COMMITTED_SCALING / figure.name
    shown = figure if figure.is_file() else committed
    verdict = load_gallery_text()[key]["ours_reading"]
    if shown.resolve() != committed.resolve() and committed.is_file():
        verdict += " (This figure was drawn by this run; the reading is of the committed one.)"
    elif not figure.is_file():
        verdict += " (This run kept no run directories to draw it from: the committed figure is shown.)"
    return _entry(key, verdict, [], [shown], runs, command)


def map_entry(report: Path, runs: pd.DataFrame | None, command: str, arch_grid: Path | None = None) -> Entry:
    """Fig. 7: the depth-by-width map (``report``: ``python -m analysis map``'s directory), plus the fixed-compute
    architecture grid's demonstration when ``arch_grid`` holds one."""
    map_cells = _read_json(report / "map.json")["cells"]
    cells = []
    for c in map_cells:
        delta = f"{c['delta']:+.4f} {_ci(c['ci_lo'], c['ci_hi'], '{:+.4f}')}"
        cells.append([str(c["n_layers"]), str(c["d_model"]), str(c["n_pairs"]), delta, c["verdict"]])
    rows = markdown_table(["L_b", "d_model", "pairs", "Block - baseline [95% CI]", "verdict"], cells)
    verdicts = [c["verdict"] for c in map_cells]
    wins = [f"L_b {c['n_layers']} x d {c['d_model']}" for c in map_cells if c["verdict"] == "wins"]
    loses = [f"L_b {c['n_layers']} x d {c['d_model']}" for c in map_cells if c["verdict"] == "loses"]
    aspect = {v: [c["n_layers"] / c["d_model"] for c in map_cells if c["verdict"] == v] for v in ("wins", "loses")}
    where = ""
    if aspect["wins"] and aspect["loses"] and min(aspect["wins"]) > max(aspect["loses"]):
        where = ": where it wins is deeper and narrower (higher L_b / d_model) than where it loses, as the paper's "
        where += "optimum moves"
    verdict = (
        f"Paper: AttnRes wins in all 25 cells of its grid; ours: of {len(verdicts)} cells measured, Block AttnRes "
        f"wins in {len(wins)} ({', '.join(wins) or 'none'}), loses in {len(loses)} ({', '.join(loses) or 'none'}) "
        f"and is undecided in {verdicts.count('undecided')}{where}."
    )
    figures = [report / "fig7_map.png", *([arch_grid / "fig7_arch_grid.png"] if arch_grid is not None else [])]
    return _entry("fig7", verdict, rows, figures, runs, command)


def _study_runs(runs: pd.DataFrame | None, kind: str) -> pd.DataFrame | None:
    """The runs the study of ``kind`` trained itself (its references from other studies are counted there)."""
    if runs is None or "study_kind" not in runs.columns:
        return runs
    return runs[runs["study_kind"] == kind]


def block_size_entry(report: Path, runs: pd.DataFrame | None, command: str) -> Entry:
    """Fig. 6: Block AttnRes' loss per block size S (``report``: ``python -m analysis block-size``'s directory)."""
    doc = _read_json(report / "block_size.json")
    regime = (
        f"Shape: L_b {doc['n_sublayers'] // 2}, d_model {doc['d_model']} ({doc['n_sublayers']} sublayers, as the "
        f"paper's), {doc['tokens_per_param']:.0f} tokens per parameter, every arm at the baseline's lr."
    )
    ours = [regime, "", *block_size_markdown(doc)[2:]]  # the study's table without its heading
    own = _study_runs(runs, "block_size")
    return _entry("fig6", doc["verdict"], ours, [report / "fig6_block_size.png"], own, command)


def ablations_entry(report: Path, runs: pd.DataFrame | None, command: str) -> Entry:
    """Table 4: ablations and peers (``report``: ``python -m analysis ablations``' directory)."""
    doc = _read_json(report / "ablations.json")
    notes = sorted({r["note"] for r in doc["rows"] if r.get("note")})
    ours = [f"Shape {doc['size']}; Δ on same-seed pairs, arm minus baseline.", "", *ablation_markdown(doc["rows"])]
    if notes:
        ours += ["", *[f"Rows marked from another study: {n}." for n in notes]]
    own = _study_runs(runs, "ablations")
    return _entry("table4", doc["verdict"], ours, [report / "fig_table4_ablations.png"], own, command)


def table3_entry(command: str) -> Entry:
    """Table 3: not reachable at CPU scale; how a GPU user produces it."""
    return _entry("table3", load_gallery_text()["table3"]["why_not_cpu"], [], [], None, command, reachable=False)


# ---- the page -------------------------------------------------------------------------------------------------


ORDER = ("table2", "fig4", "fig5", "table3", "table4", "fig6", "fig7", "fig8")


def gallery_markdown(entries: list[Entry], page: Path, intro: list[str] | None = None) -> str:
    """The gallery page, entries in the paper's order; figure links relative to ``page``."""
    by_key = {e.key: e for e in entries}
    ordered = [by_key[k] for k in ORDER if k in by_key] + [e for e in entries if e.key not in ORDER]
    lines = ["# The paper's figures and tables, beside ours", "", *(intro or [])]
    items = [[f"[{e.item}: {e.title}](#{_anchor(e)})", _status(e)] for e in ordered]
    lines += ["", *markdown_table(["paper item", "ours"], items)]
    for e in ordered:
        lines += ["", f"## {e.item}: {e.title}", "", f"**Paper** ({e.section}):", ""]
        lines += [f"- {p}" for p in e.paper]
        lines += ["", "**Ours:**" if e.reachable else "**Not reachable at CPU scale.**", ""]
        lines += [f"![{e.item}]({os.path.relpath(f.resolve(), page.parent.resolve())})" for f in e.figures]
        lines += [""] if e.figures else []
        lines += [*e.ours, ""] if e.ours else []
        lines.append(f"**Where they agree:** {e.verdict}")
        if e.provenance is not None:
            lines += ["", f"**How it was made:** {e.provenance.markdown()}"]
    return "\n".join(lines) + "\n"


def _anchor(e: Entry) -> str:
    text = f"{e.item}: {e.title}".lower()
    return "".join(ch for ch in text.replace(" ", "-") if ch.isalnum() or ch in "-_")


def _status(e: Entry) -> str:
    if not e.reachable:
        return "GPU only (why: below)"
    if not e.figures and not e.ours:
        return "not yet run"
    p = e.provenance
    return f"{p.n_runs} runs, seeds {seed_text(p.seeds)}" if p is not None and p.n_runs else "from the paper's numbers"


def write_gallery(entries: list[Entry], page: Path, intro: list[str] | None = None) -> Path:
    """Write the gallery page (atomically) and return its path."""
    from results.io import atomic_write_text

    page.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(page, gallery_markdown(entries, page, intro))
    return page


def _load_runs(path: Path | None) -> pd.DataFrame | None:
    """A results table for provenance, or None when ``path`` is None or missing."""
    return load_results(path) if path is not None and path.exists() else None


@dataclass(frozen=True)
class GallerySources:
    """Where each entry's report and runs are: a report directory (fit.json / map.json and figures) and a results
    table or study directory (for provenance) per study."""

    scaling: Path  # Fig. 4, 5, 8: a scaling fit of the deep ladder
    scaling_runs: Path | None
    block_size: Path  # Fig. 6
    block_size_runs: Path | None
    ablations: Path  # Table 4
    ablations_runs: Path | None
    depth_map: Path  # Fig. 7: the depth-by-width map
    depth_map_runs: Path | None
    arch_grid: Path | None  # Fig. 7: the fixed-compute grid's demonstration
    paper_refit: Path  # Table 2: python -m analysis paper
    frontier: Path | None = None  # Fig. 4's M(C) along the frontier: a training-length report (deep_budgets)

    @classmethod
    def committed(cls, results: Path) -> GallerySources:
        """The committed results under ``results`` (docs/results)."""
        pooled, frontier = results / "cpu_deep" / "pooled", results / "cpu_deep_budgets" / "report"
        return cls._named(results, results, pooled, results / "cpu_arch_grid", frontier)

    @classmethod
    def from_studies(cls, reports: Path, runs: Path, arch_grid: Path | None) -> GallerySources:
        """A fresh run of the studies: each study's report under ``reports`` and its runs under ``runs``, both
        named by the study (sweeps.study's ``figures``)."""
        return cls._named(reports, runs, reports / "cpu_deep", arch_grid, reports / "cpu_deep_budgets")

    @classmethod
    def _named(cls, reports: Path, runs: Path, scaling: Path, arch_grid: Path | None, frontier: Path) -> GallerySources:
        """Every study's report under ``reports`` and its runs under ``runs``, in folders named by the study."""
        return cls(
            scaling=scaling,
            scaling_runs=runs / "cpu_deep",
            block_size=reports / "deep_block_size",
            block_size_runs=runs / "deep_block_size",
            ablations=reports / "deep_ablations",
            ablations_runs=runs / "deep_ablations",
            depth_map=reports / "cpu_map",
            depth_map_runs=runs / "cpu_map",
            arch_grid=arch_grid,
            paper_refit=reports / "paper_refit",
            frontier=frontier,
        )


# The commands that reproduce each entry (what the gallery prints; sweeps.study's `figures` runs them all).
COMMANDS = {
    "table2": "python -m analysis paper --out docs/results/paper_refit",
    "fig4": "python -m sweeps.study deep_full --seeds 0,1,2,20,21,22 && python -m sweeps.study deep_per_arm "
    "--seeds 0,1,2,20,21,22",
    "fig6": "python -m sweeps.study deep_block_size --seeds 0,1,2,20,21,22",
    "table4": "python -m sweeps.study deep_ablations",
    "fig7": "python -m sweeps.study map",
    "fig5": "the deep ladder's runs (Fig. 4's command)",
    "fig8": "the deep ladder's runs (Fig. 4's command)",
    "table3": "python -m experiments.lm_eval_adapter --checkpoint runs/<study>/<paper-size run> --device cuda "
    "--tasks mmlu,mmlu_pro,gpqa_diamond_n_shot,bbh,arc_challenge,hellaswag,triviaqa,gsm8k,... (docs/gpu.md)",
}
DEEP_REGIME = "L_b 8-16 at d_model = 2 L_b, 8 tokens per parameter"


def gallery_entries(src: GallerySources) -> list[Entry]:
    """Every entry, from ``src``; a study whose report is missing or unreadable becomes a 'not yet run' entry naming
    the problem and the command that makes it, so one broken study never hides the others."""
    scaling_runs = _load_runs(src.scaling_runs)
    builders: dict[str, Callable[[], Entry]] = {
        "table2": lambda: table2_entry(src.paper_refit, COMMANDS["table2"]),
        "fig4": lambda: scaling_entry(src.scaling, scaling_runs, COMMANDS["fig4"], DEEP_REGIME, src.frontier),
        "fig5": lambda: reading_entry("fig5", src.scaling / "fig5_dynamics.png", scaling_runs, COMMANDS["fig4"]),
        "table3": lambda: table3_entry(COMMANDS["table3"]),
        "table4": lambda: ablations_entry(src.ablations, _load_runs(src.ablations_runs), COMMANDS["table4"]),
        "fig6": lambda: block_size_entry(src.block_size, _load_runs(src.block_size_runs), COMMANDS["fig6"]),
        "fig7": lambda: map_entry(src.depth_map, _load_runs(src.depth_map_runs), COMMANDS["fig7"], src.arch_grid),
        "fig8": lambda: reading_entry("fig8", src.scaling / "fig8_depth_weights.png", scaling_runs, COMMANDS["fig4"]),
    }
    entries = []
    for key, build in builders.items():
        try:
            entries.append(build())
        except (FileNotFoundError, KeyError, ValueError, json.JSONDecodeError) as e:
            why = f"no result yet ({type(e).__name__}: {e})."
            entries.append(_entry(key, why, [], [], None, COMMANDS.get(key, "")))
    return entries
