"""Command line: ``python -m analysis {fit,lr,map,length,recipe,gallery,paper} ...`` (also ``attnres-analysis``).

Heavy imports (pandas, scipy, matplotlib) happen inside the subcommands so that ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Scaling-law fits, compute multipliers with intervals, and figures from attnres result records "
        "(docs/results_schema.md). Output schema: docs/analysis.md.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_fit, _add_lr, _add_map, _add_fixed_shape, _add_length, _add_recipe, _add_gallery, _add_paper):
        add(sub)  # one function per subcommand, in the order --help lists them
    return p


def _add_fit(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``fit``: the scaling ladder's fit, its bootstrap and outlier options."""
    f = sub.add_parser("fit", help="fit a results table and write fit.json, summary.md and figures")
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--results",
        help="results.csv, a results.json, or a study/run directory (results.csv or results.json files below it)",
    )
    src.add_argument(
        "--wandb", metavar="ENTITY/PROJECT", help="read the same records from W&B (needs wandb and network)"
    )
    f.add_argument("--wandb-group", help="W&B group (study) to read, with --wandb")
    f.add_argument("--out", required=True, help="output directory")
    f.add_argument("--baseline", default="baseline", help="variant name of the baseline arm (default: baseline)")
    f.add_argument(
        "--dataset",
        help="fit only the runs of this data set (data_fingerprint, a prefix of it, or the dataset "
        "path); needed when a table holds several",
    )
    f.add_argument("--study", help="which study to fit as the scaling ladder (default: the one of study_kind scaling)")
    f.add_argument(
        "--compute",
        default="pflops_days",
        choices=["pflops_days", "pflops_days_6nd"],
        help="compute column (default: pflops_days)",
    )
    f.add_argument("--bootstrap", type=int, default=2000, metavar="B", help="bootstrap replicates (default: 2000)")
    f.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default: 0)")
    f.add_argument(
        "--bootstrap-mode",
        default="auto",
        choices=["auto", "cluster", "parametric"],
        help="auto: paired cluster bootstrap over seeds when every size has >= 2 seeds, else parametric",
    )
    f.add_argument(
        "--seed-sigma", type=float, help="seed-noise sd of one run's final val loss, for the parametric bootstrap"
    )
    f.add_argument(
        "--seed-rho", type=float, default=0.0, help="share of seed noise common to both arms of a cell (default: 0)"
    )
    f.add_argument(
        "--form",
        default="auto",
        choices=["auto", "saturating", "power_law"],
        help="joint-fit form: auto = E + A C^-alpha, falling back to E = 0 when E hits a bound",
    )
    f.add_argument(
        "--outliers",
        default="keep",
        choices=["keep", "exclude"],
        help="runs the outlier rule flags: keep them in the fit (default; the fit without them is reported too) "
        "or exclude them",
    )
    f.add_argument(
        "--skip-incomplete",
        action="store_true",
        help="skip (with a warning) variants with fewer than 3 sizes instead of failing",
    )
    f.add_argument(
        "--seeds",
        type=_seed_list,
        help="fit only the runs of these seeds, comma-separated (e.g. a study's held-out seeds 20,21,22)",
    )
    f.add_argument("--no-figures", action="store_true", help="write fit.json and summary.md only")
    _add_fit_sections(f)


def _add_fit_sections(f: argparse.ArgumentParser) -> None:
    """``fit``'s optional sections (docs/analysis.md): wall clock, rollout, E sensitivity, the N-D fit."""
    f.add_argument(
        "--wallclock",
        action="store_true",
        help="add the wall-clock multiplier beside each compute multiplier (from the records' CPU times)",
    )
    f.add_argument(
        "--rollout",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="K",
        help="fit without the K largest rungs (default 1), predict their losses and the multiplier there beside "
        "the measurement (fit.json rollout, fig_rollout.png)",
    )
    f.add_argument(
        "--e-sensitivity",
        type=_fractions,
        nargs="?",
        const=(0.5, 0.8, 0.9, 0.95),
        default=None,
        metavar="F,F,...",
        help="the multiplier with E fitted, E = 0 and E pinned at these fractions of the lowest loss "
        "(default 0.5,0.8,0.9,0.95)",
    )
    f.add_argument(
        "--nd",
        action="store_true",
        help="also fit L = E + A/N^alpha + B/D^beta per arm (Chinchilla's approach 3; needs several tokens per "
        "parameter)",
    )


def _add_lr(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``lr``: the learning-rate tuning and the config it writes."""
    r = sub.add_parser(
        "lr", help="tune the learning rate per (size, arm) from an LR study; write the config the sizes read"
    )
    r.add_argument("--results", required=True, help="the LR study's results.csv (or a study directory)")
    r.add_argument("--out", required=True, help="output directory (lr.json, lr_summary.md, fig_lr.png)")
    r.add_argument(
        "--dataset", help="only the runs of this data set (data_fingerprint, a prefix of it, or the dataset path)"
    )
    r.add_argument(
        "--write-config", metavar="PATH", help="also write the tuned lrs as a config, e.g. conf/tuned_lr/cpu.yaml"
    )
    r.add_argument("--bootstrap", type=int, default=2000, metavar="B", help="bootstrap replicates (default: 2000)")
    r.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default: 0)")
    r.add_argument("--seed-sigma", type=float, help="seed-noise sd of one run's val loss, for single-seed curves")
    r.add_argument(
        "--rule",
        default="per_size",
        choices=["per_size", "trend"],
        help="lr written per size: each size's own optimum (default), or the arm's power law in N over sizes",
    )
    r.add_argument("--no-figures", action="store_true", help="write lr.json and lr_summary.md only")


def _add_map(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``map``: the depth-by-width map."""
    m = sub.add_parser("map", help="the depth-by-width map: per-cell same-seed deltas, intervals, boundary, heat map")
    m.add_argument("--results", required=True, help="the map study's results.csv (or a study directory)")
    m.add_argument("--out", required=True, help="output directory (map.json, map_summary.md, fig7_map.png)")
    m.add_argument("--arm", default="block_attnres", help="the arm compared with the baseline (default: block_attnres)")
    m.add_argument("--baseline", default="baseline", help="variant name of the baseline arm (default: baseline)")
    m.add_argument(
        "--bootstrap", type=int, default=2000, metavar="B", help="resamples for the boundary (default: 2000)"
    )
    m.add_argument("--seed", type=int, default=0, help="resampling seed (default: 0)")


def _add_fixed_shape(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``block-size`` and ``ablations``: the fixed-shape studies."""
    for name, what in (("block-size", "block size (Fig. 6)"), ("ablations", "ablations and peers (Table 4)")):
        k = sub.add_parser(name, help=f"{what}: same-seed differences with 95%% t intervals, beside the paper's")
        k.add_argument("--results", required=True, help="the study's results.csv (or a study directory)")
        k.add_argument("--out", required=True, help="output directory (JSON, Markdown, figure)")
        k.add_argument("--baseline", default="baseline", help="variant name of the baseline arm (default: baseline)")


def _add_length(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``length``: arm - baseline per rung and training length."""
    t = sub.add_parser(
        "length", help="arm - baseline per rung at each training length (tokens per parameter): 95%% t intervals"
    )
    t.add_argument("--results", required=True, help="a study with several budgets per rung (results.csv or directory)")
    t.add_argument("--out", required=True, help="output directory (length.json, length_summary.md, fig_length.png)")
    t.add_argument("--arm", default="block_attnres", help="the arm compared with the baseline (default: block_attnres)")
    t.add_argument("--baseline", default="baseline", help="variant name of the baseline arm (default: baseline)")
    t.add_argument(
        "--no-fit",
        action="store_true",
        help="the per-budget differences only: no compute fit over the (rung, budget) points (fit/)",
    )
    t.add_argument("--bootstrap", type=int, default=2000, metavar="B", help="the fit's bootstrap replicates (2000)")
    t.add_argument("--seed", type=int, default=0, help="the fit's bootstrap random seed (default: 0)")
    t.add_argument(
        "--frontier-bootstrap",
        type=int,
        default=None,
        metavar="B",
        help="the frontier's bootstrap replicates (default: the smaller of 400 and --bootstrap)",
    )
    t.add_argument("--no-figures", action="store_true", help="write length.json and length_summary.md only")


def _add_recipe(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``recipe``: two training recipes x arms x rungs."""
    c = sub.add_parser(
        "recipe", help="a recipe study: two training recipes x arms x rungs; multipliers, wall clock, interaction"
    )
    c.add_argument(
        "--results", required=True, nargs="+", help="the study's results.csv or directory (several are read as one)"
    )
    c.add_argument("--out", required=True, help="output directory (recipe.json, recipe_summary.md, figures)")
    c.add_argument("--seeds", type=_seed_list, help="read only the runs of these seeds, comma-separated")
    c.add_argument("--baseline", default="baseline", help="variant name of the baseline arm (default: baseline)")
    c.add_argument("--reference-recipe", default="adamw+cosine", help="optimizer+lr_schedule (default: adamw+cosine)")
    c.add_argument("--recipe", default="muon+wsd", help="the recipe compared with it (default: muon+wsd)")
    c.add_argument("--lr-protocol", default="baseline", help="the arms' lr protocol read (default: baseline)")
    c.add_argument("--design-seeds", type=_seed_list, default=[0, 1, 2], help="design seeds (default: 0,1,2)")
    c.add_argument("--held-out-seeds", type=_seed_list, default=[20, 21, 22], help="held-out seeds (default: 20,21,22)")
    c.add_argument("--bootstrap", type=int, default=2000, metavar="B", help="bootstrap replicates (default: 2000)")
    c.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default: 0)")
    c.add_argument("--no-figures", action="store_true", help="write recipe.json and recipe_summary.md only")
    c.add_argument(
        "--timing",
        nargs="+",
        default=None,
        metavar="DIR",
        help="study directories or results.csv files of extra runs of the same configurations, read for the step-time "
        "ratios only (e.g. re-runs of committed runs whose records predate step_cpu_s), never fitted",
    )


def _add_gallery(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``gallery``: the paper's figures and tables beside ours."""
    g = sub.add_parser("gallery", help="the paper's figures and tables beside ours, one Markdown page")
    g.add_argument(
        "--results", default="docs/results", help="the committed results to draw from (default: docs/results)"
    )
    g.add_argument("--out", default=None, help="the page (default: <results>/README.md)")


def _add_paper(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``paper``: the refit of the paper's published numbers."""
    q = sub.add_parser("paper", help="refit the paper's published numbers and draw its figures")
    q.add_argument("--out", required=True, help="output directory")
    q.add_argument("--bootstrap", type=int, default=2000, metavar="B", help="bootstrap replicates (default: 2000)")
    q.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default: 0)")
    q.add_argument(
        "--seed-sigma", type=float, help="seed-noise sd for the parametric bootstrap (default: fit residual sd)"
    )


def _seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 20,21,22") from None


def _fractions(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated fractions, e.g. 0.5,0.9") from None
    if not out or not all(0 < f < 1 for f in out):
        raise argparse.ArgumentTypeError(f"{text!r}: every fraction must lie in (0, 1)")
    return out


def _f(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.3f}"


def _f3(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.3g}"


def _format_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"  # no file:line noise for a CLI user


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m analysis <command> ...``: the exit status (0, or 2 after one ``error:`` line)."""
    return run(argv)[0]


def run(argv: Sequence[str] | None = None) -> tuple[int, Any]:
    """One command, in this process, as ``python -m analysis <argv>`` runs it (the same files and printout):
    returns (its exit status, the document it built: a :class:`~analysis.fit_document.FitDocument` for ``fit`` and
    ``paper``, the page's path for ``gallery``, the report's dict for the others; None after an error).
    ``sweeps.study`` reports a study through it and takes the headline from that document."""
    args = _parser().parse_args(argv)
    saved = warnings.formatwarning
    warnings.formatwarning = _format_warning
    command = {
        "fit": _fit,
        "lr": _lr,
        "map": _map,
        "block-size": _fixed_shape,
        "ablations": _fixed_shape,
        "gallery": _gallery,
        "recipe": _recipe,
        "length": _length,
    }.get(args.command, _paper)
    try:
        document = command(args, argv)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2, None
    finally:
        warnings.formatwarning = saved
    return 0, document


def _fit(args: argparse.Namespace, argv: Sequence[str] | None) -> Any:
    """``fit``: fit.json, summary.md and figures, then each multiplier's headline."""
    from .pipeline import Sections, load_any, run_fit
    from .runs import select_dataset, select_seeds
    from .scaling import FitOptions

    df = load_any(args.results, args.wandb, args.wandb_group)
    if args.dataset:
        df = select_dataset(df, args.dataset)
    if args.seeds:
        df = select_seeds(df, args.seeds)
    options = FitOptions(
        baseline=args.baseline,
        study=args.study,
        compute=args.compute,
        B=args.bootstrap,
        seed=args.seed,
        bootstrap_mode=args.bootstrap_mode,
        seed_sigma=args.seed_sigma,
        seed_rho=args.seed_rho,
        form=args.form,
        skip_incomplete=args.skip_incomplete,
        outliers=args.outliers,
    )
    sections = Sections(wallclock=args.wallclock, rollout=args.rollout, e_sensitivity=args.e_sensitivity, nd=args.nd)
    doc = run_fit(df, args.out, options, make_figures=not args.no_figures, sections=sections)
    for v, m in doc.multipliers.items():
        lo, hi = m.m_ci95 or (None, None)
        print(
            f"{v}: m = {_f(m.m)} [{_f(lo)}, {_f(hi)}], P(m<=1) = {_f(m.p_m_le_1)}, "
            f"paper M = {_f(m.paper_M)}, per-size geo-mean = {_f(m.per_size_geomean)}"
        )
        c = m.paper_M_curve
        if m.headline == "curve" and c is not None:
            print(
                f"  exponents differ significantly: M(C) runs from {_f(c.M[0])} at C = {c.C[0]:.3g} "
                f"to {_f(c.M[-1])} at C = {c.C[-1]:.3g} (see fit.json paper_M_curve)"
            )
    from .heterogeneity import rung_headline

    for v, m in doc.multipliers.items():
        for line in rung_headline(m.to_dict(), v):
            print(f"  {line}")
    for line in _section_lines(doc):
        print(line)
    print(f"wrote {', '.join(doc.files)} to {args.out}")
    return doc


def _section_lines(doc) -> list[str]:
    """The optional sections' headline lines (wall-clock multipliers, the rollout's predictions, the E range)."""
    lines: list[str] = []
    if doc.wallclock:
        from .wallclock import wallclock_line

        lines += [wallclock_line(v, e).strip() for v, e in doc.wallclock.items()]
    for v, e in ((doc.rollout or {}).get("variants") or {}).items():
        for p in e["points"]:
            lo, hi = p["prediction_interval95"] or (None, None)
            lines.append(
                f"rollout {v}: {p['arm']} at {p['size']}: predicted {_f(p['predicted'])} [{_f(lo)}, {_f(hi)}], "
                f"measured {_f(p['measured'])} ({'inside' if p['inside'] else 'OUTSIDE'})"
            )
        lo, hi = e.get("m_ci95") or (None, None)
        lines.append(f"rollout {v}: m fitted without the held-out rung(s) = {_f(e['m'])} [{_f(lo)}, {_f(hi)}]")
    for v, e in ((doc.e_sensitivity or {}).get("variants") or {}).items():
        lo, hi = e["m_range"]
        lines.append(f"E sensitivity {v}: m from {_f(lo)} to {_f(hi)} (summary.md has the table)")
    for arm, e in ((doc.nd_fit or {}).get("arms") or {}).items():
        if e.get("error"):
            lines.append(f"nd fit {arm}: {e['error']}")
        else:
            lines.append(f"nd fit {arm}: {e['law']}")
    return lines


def _lr(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """``lr``: the tuned lr per (size, arm), lr.json, lr_summary.md (and the generated config when asked)."""
    from .lr import run_lr
    from .runs import check_one_dataset, load_results, select_dataset

    command = "python -m analysis " + " ".join(argv if argv is not None else sys.argv[1:])
    df = load_results(args.results)
    if args.dataset:
        df = select_dataset(df, args.dataset)
    check_one_dataset(df[df["status"].isin(["completed", "diverged"])] if "status" in df.columns else df)
    doc = run_lr(
        df,
        args.out,
        B=args.bootstrap,
        seed=args.seed,
        seed_sigma=args.seed_sigma,
        write_config=args.write_config,
        command=command,
        make_figures=not args.no_figures,
        rule=args.rule,
    )
    for r in doc["table"].itertuples():
        lo, hi = r.ci95
        edge = f"  ON THE {r.edge.upper()} EDGE OF THE GRID" if r.on_edge else ""
        print(f"{r.variant} {r.size}: lr = {_f3(r.lr)} [{_f3(lo)}, {_f3(hi)}]{edge}")
    print(f"wrote {', '.join(doc['files'])}")
    return doc


def _map(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """``map``: map.json, map_summary.md and the heat map, then each cell's verdict."""
    from pathlib import Path

    from .depth_width_map import MapOptions, analyse_map
    from .runs import check_one_dataset, load_results

    df = load_results(args.results)
    check_one_dataset(df[df["status"] == "completed"] if "status" in df.columns else df)
    opts = MapOptions(arm=args.arm, baseline=args.baseline, B=args.bootstrap, seed=args.seed)
    mdoc = analyse_map(df, Path(args.out), opts)
    for c in mdoc["cells"]:
        lo, hi = c["ci_lo"], c["ci_hi"]
        ci = f"[{lo:+.4f}, {hi:+.4f}]" if lo is not None else "(one pair)"
        print(
            f"L_b {c['n_layers']} x d {c['d_model']}: delta {c['delta']:+.4f} {ci}, "
            f"{c['n_pairs']} pairs, {c['verdict']}"
        )
    print(f"wrote {', '.join(mdoc['files'])} to {args.out}")
    return mdoc


def _fixed_shape(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """``block-size`` and ``ablations``: the study's JSON, Markdown table and figure, then its verdict."""
    from pathlib import Path

    from .ablations import analyse_ablations
    from .block_size import analyse_block_size
    from .runs import check_one_dataset, load_results

    df = load_results(args.results)
    check_one_dataset(df[df["status"] == "completed"] if "status" in df.columns else df)
    analyse = analyse_block_size if args.command == "block-size" else analyse_ablations
    doc = analyse(df, Path(args.out), args.baseline)
    print(doc["verdict"])
    print(f"wrote {', '.join(doc['files'])} to {args.out}")
    return doc


def _recipe(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """``recipe``: recipe.json, recipe_summary.md and figures, then the headline multipliers."""
    from .recipe import RecipeOptions, headline_lines, read_studies, run_recipe
    from .runs import select_seeds
    from .scaling import FitOptions

    df = read_studies(args.results)
    if args.seeds:
        df = select_seeds(df, args.seeds)
    opts = RecipeOptions(
        reference_recipe=args.reference_recipe,
        recipe=args.recipe,
        baseline=args.baseline,
        lr_protocol=args.lr_protocol,
        design_seeds=tuple(args.design_seeds),
        held_out_seeds=tuple(args.held_out_seeds),
        fit=FitOptions(B=args.bootstrap, seed=args.seed),
    )
    timing = read_studies(args.timing) if args.timing else None
    doc = run_recipe(df, args.out, opts, make_figures=not args.no_figures, timing=timing)
    print("\n".join(headline_lines(doc)))
    print(f"wrote {', '.join(doc['files'])} to {args.out}")
    return doc


def _length(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """``length``: the arm's same-seed difference per rung and budget, then one line per row."""
    from pathlib import Path

    from .runs import check_one_dataset, load_results
    from .training_length import analyse_length, headline_lines

    df = load_results(args.results)
    check_one_dataset(df[df["status"] == "completed"] if "status" in df.columns else df)
    doc = analyse_length(
        df,
        Path(args.out),
        args.arm,
        args.baseline,
        make_figures=not args.no_figures,
        fit=not args.no_fit,
        bootstrap=args.bootstrap,
        seed=args.seed,
        frontier_bootstrap=args.frontier_bootstrap,
    )
    print("\n".join(headline_lines(doc)))
    print(f"wrote {', '.join(doc['files'])} to {args.out}")
    return doc


def _gallery(args: argparse.Namespace, argv: Sequence[str] | None) -> Any:
    """``gallery``: the page of every paper item beside ours, from committed results."""
    from pathlib import Path

    from .gallery import GallerySources, gallery_entries, write_gallery

    results = Path(args.results)
    if not results.is_dir():
        raise FileNotFoundError(f"--results {results} is not a directory")
    entries = gallery_entries(GallerySources.committed(results))
    page = write_gallery(entries, Path(args.out) if args.out else results / "README.md")
    for e in entries:
        print(f"{e.item}: {e.verdict}")
    print(f"wrote {page}")
    return page


def _paper(args: argparse.Namespace, argv: Sequence[str] | None) -> Any:
    """``paper``: the paper's own numbers refitted, with the headline."""
    from .paper import headline_numbers, run_paper

    doc = run_paper(args.out, B=args.bootstrap, seed=args.seed, seed_sigma=args.seed_sigma)
    print(headline_numbers(doc))
    print(f"wrote {', '.join(doc.files)} to {args.out}")
    return doc


if __name__ == "__main__":
    sys.exit(main())
