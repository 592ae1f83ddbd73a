"""The paper's own numbers (analysis/data/paper.json): refit its scaling laws and redraw its figures.

`python -m analysis paper --out DIR` runs the same pipeline as `fit` on Table 2 (one "run" per size and variant,
compute reconstructed as stated in paper.json) and adds the paper-only figures (Fig. 6, Fig. 7) and Table 4.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..io.fit_document import FitDocument
from ..io.paper_data import load_paper
from ..io.report import write_json
from ..laws.bootstrap import DEFAULT_B
from ..laws.fit import PowerLaw, fit_power_law, multiplier_curve
from ..laws.fit_options import FitOptions
from ..laws.scaling_ladder import analyse_scaling
from ..render import figures
from ..render.figures import block_size_figure
from ..render.markdown import summary_markdown
from ..render.tables import ablation_markdown, markdown_table
from .study_registry import add_bootstrap, register

PFLOPS_DAY = 1e15 * 86400
FIG4_VARIANTS = ["baseline", "block_attnres", "full_attnres"]  # the three series of the paper's Fig. 4


def paper_compute(
    act_params: float, tokens: float, n_layers: int, n_heads: int, paper: dict[str, Any] | None = None
) -> float:
    """C = 6 N_act D + 3 L_b T (H * head_dim) D in PFLOP/s-days (the reconstruction stated in paper.json)."""
    c = (paper or load_paper())["compute"]
    flops = 6.0 * act_params * tokens + 3.0 * n_layers * c["T"] * (n_heads * c["head_dim"]) * tokens
    return flops / PFLOPS_DAY


def paper_results(paper: dict[str, Any] | None = None) -> pd.DataFrame:
    """Table 2 as a results table (docs/results_schema.md columns that the fit uses), one seed per cell."""
    paper = paper or load_paper()
    t = paper["table2"]
    residual = {"baseline": "baseline", "block_attnres": "block", "full_attnres": "full"}
    rows = []
    for values in t["rows"]:
        r = dict(zip(t["columns"], values))
        N, D = r["act_params_M"] * 1e6, r["tokens_B"] * 1e9
        C = paper_compute(N, D, r["L_b"], r["H"], paper)
        shape = {"n_layers": r["L_b"], "d_model": r["d_model"], "n_heads": r["H"], "d_ff": r["d_ff"]}
        run = shape | {"params_non_embedding": N, "tokens": D, "lr": r["lr"], "batch_size": r["batch_size"]}
        run |= {"flops": C * PFLOPS_DAY, "pflops_days": C}
        for v in t["variants"]:
            head = {"run_id": f"paper-{v}-{r['size']}", "study": "paper_scaling", "variant": v}
            head |= {"residual": residual.get(v, "mhc"), "size": r["size"], "seed": 0, "status": "completed"}
            rows.append(head | run | {"val_loss": r[v], "run_dir": "", "error": ""})
    df = pd.DataFrame(rows)
    df.attrs["source"] = "analysis/data/paper.json (AttnRes Table 2)"
    return df


def refit_laws(paper: dict[str, Any] | None = None) -> dict[str, PowerLaw]:
    """Paper-form fits L = A C^-alpha of every Table 2 column."""
    df = paper_results(paper)
    return {v: fit_power_law(d["pflops_days"], d["val_loss"]) for v, d in df.groupby("variant", sort=False)}


def paper_comparison(paper: dict[str, Any] | None = None) -> dict[str, Any]:
    """Refit laws next to the published ones, and M at the paper's headline compute from both."""
    paper = paper or load_paper()
    laws = refit_laws(paper)
    pub = {v: PowerLaw(p["A"], p["alpha"]) for v, p in paper["fitted_laws"].items()}
    C_head = paper["headline"]["C"]
    out: dict[str, Any] = {"compute": paper["compute"], "laws": {}, "M_at_C": C_head, "M": {}}
    out["C"] = {s: float(c) for s, c in paper_results(paper).groupby("size", sort=False)["pflops_days"].first().items()}
    for v, law in laws.items():
        entry = {"A": law.A, "alpha": law.alpha}
        if v in pub:
            entry |= {"A_published": pub[v].A, "alpha_published": pub[v].alpha}
        out["laws"][v] = entry
    for v in laws:
        if v == "baseline":
            continue
        entry = {"refit": float(multiplier_curve(laws["baseline"], laws[v], C_head))}
        if v in pub:
            entry["published_laws"] = float(multiplier_curve(pub["baseline"], pub[v], C_head))
            entry["L_variant_published_law"] = float(pub[v].loss(C_head))
        out["M"][v] = entry
    out["headline"] = paper["headline"]
    return out


def _paper_markdown(cmp: dict[str, Any], labels: dict[str, str]) -> str:
    lines = [
        "## Refit vs the paper's published laws",
        "",
        f"Compute: `{cmp['compute']['formula']}` (T = {cmp['compute']['T']}, head_dim = {cmp['compute']['head_dim']}), "
        "in PFLOP/s-days: " + ", ".join(f"{s} {c:.3f}" for s, c in cmp["C"].items()) + ".",
        "",
    ]
    rows = []
    for v, e in cmp["laws"].items():
        pa = f"{e['A_published']:.3f}" if "A_published" in e else "–"
        pal = f"{e['alpha_published']:.3f}" if "alpha_published" in e else "–"
        rows.append([f"{labels.get(v, v)}", f"{e['A']:.4f}", f"{e['alpha']:.4f}", pa, pal])
    lines += markdown_table(["variant", "refit A", "refit α", "paper A", "paper α"], rows)
    lines += ["", f"Multiplier M at C = {cmp['M_at_C']} PFLOP/s-days (M(C) = C_base(L_variant(C)) / C):", ""]
    for v, e in cmp["M"].items():
        s = f"- {labels.get(v, v)}: refit {e['refit']:.3f}×"
        if "published_laws" in e:
            s += f"; from the published laws {e['published_laws']:.3f}×"
        lines.append(s)
    h = cmp["headline"]
    lines += ["", f'The paper: "{h["text"]}".', ""]
    return "\n".join(lines)


def run_paper(out: str | Path, *, B: int = DEFAULT_B, seed: int = 0, seed_sigma: float | None = None) -> FitDocument:
    """Refit Table 2, compare with the published laws, draw Fig. 4, 6 and 7 and write Table 4."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paper = load_paper()
    labels = dict(paper["table2"]["variants"])
    df = paper_results(paper)
    options = FitOptions(B=B, seed=seed, bootstrap_mode="parametric", seed_sigma=seed_sigma)
    parts = analyse_scaling(df, options, source=df.attrs["source"]).parts
    parts["paper"] = paper_comparison(paper)
    f6, one = paper["fig6"], {"val_loss_sd": None, "n_runs": 1}  # one published loss per point
    points = [{"block_size": s, "val_loss": loss} | one for s, loss in zip(f6["block_size"], f6["loss"])]
    # S = 1 is Full AttnRes, already a point
    sweep = {"size": f6["size"], "points": points, "baseline": {"val_loss": f6["baseline"]} | one, "full": None}
    parts["block_size_sweep"] = sweep
    base_loss = next(r["loss"] for r in paper["table4"]["rows"] if r["variant"] == "baseline")
    parts["ablations"] = [
        {"variant": r["label"], "val_loss": r["loss"]}
        | one
        | {"delta_vs_baseline": None if r["variant"] == "baseline" else r["loss"] - base_loss}
        for r in paper["table4"]["rows"]
    ]
    doc = FitDocument.from_dict(parts)
    title = "AttnRes paper, Fig. 4 refit (Table 2 losses)"
    written = figures.scaling_figure(df, doc, out / "fig4_scaling", labels=labels, variants=FIG4_VARIANTS, title=title)
    title = "AttnRes paper, Fig. 6: block size (436M model, 32 sublayers)"
    written += block_size_figure(doc.block_size_sweep, out / "fig6_block_size", title=title)
    written += figures.architecture_grid_figure(paper["fig7"], out / "fig7_architecture")
    table4 = ["# AttnRes paper, Table 4 (436M model)", "", *ablation_markdown(doc.ablations)]
    (out / "table4_ablations.md").write_text("\n".join(table4) + "\n")
    doc.files = [*sorted(str(p.relative_to(out)) for p in written), "fit.json", "summary.md", "table4_ablations.md"]
    plain = doc.to_dict()
    write_json(plain, out / "fit.json")
    md = summary_markdown(plain, title="AttnRes paper numbers, refitted")
    (out / "summary.md").write_text(md + "\n" + _paper_markdown(doc.paper, labels))
    return doc


def headline_numbers(doc: FitDocument) -> str:
    """One short text block of the numbers a reader checks first (printed by the CLI)."""
    cmp = doc.paper or {}
    lines = [f"{v}: A = {e['A']:.4f}, alpha = {e['alpha']:.4f}" for v, e in cmp["laws"].items()]
    for v, e in cmp["M"].items():
        pub = f" (published laws: {e['published_laws']:.3f})" if "published_laws" in e else ""
        lines.append(f"M({v}) at {cmp['M_at_C']} PFLOP/s-days = {e['refit']:.3f}{pub}")
    return "\n".join(lines)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory")
    add_bootstrap(p)
    p.add_argument(
        "--seed-sigma", type=float, help="seed-noise sd for the parametric bootstrap (default: fit residual sd)"
    )


@register(
    "paper",
    arguments=_arguments,
    files="fit.json, summary.md, table4_ablations.md, the paper's figures",
    printed=lambda doc: [headline_numbers(doc)],
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> Any:
    return run_paper(args.out, B=args.bootstrap, seed=args.seed, seed_sigma=args.seed_sigma)
