"""The project's import graph: no cycles, and the layering of docs/DEVELOPING.md.

Every ``.py`` under the project packages is parsed with ``ast`` (nothing is imported), and every ``import`` statement
counts, wherever it stands: at module level, inside a function (a deferred import still ties the two modules
together), or under ``if TYPE_CHECKING:``. Relative imports are resolved against the importing module. An edge goes
to the module that defines what is imported: ``from attnres import peers`` is an edge to ``attnres.peers`` when
that submodule exists, ``from attnres import Transformer`` an edge to the package ``attnres`` (its ``__init__``).
Names built at run time (``importlib.import_module``, Hydra ``_target_`` strings) are not imports here.

Packages: importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``, but that adds no edge, so a
package whose ``__init__`` re-exports its own submodules is not a cycle by itself. A submodule that imports its own
package (or an ancestor package) back *at import time* (a module-level statement) closes a cycle: it reads a
namespace that is still half built. The same import inside a function runs after the package is complete and
adds no edge.

Layering (docs/DEVELOPING.md): ``attnres`` is pure torch (nothing from the harness: experiments, results, analysis,
sweeps; no Lightning, Hydra, OmegaConf or W&B); ``results``, the record contract, is neutral ground (the standard
library and filelock: nothing from any other project package, no torch, numpy, pandas, Lightning, Hydra, OmegaConf,
W&B or triton); ``analysis`` runs without the training stack (no torch, Lightning or triton, nothing from
attnres/experiments/sweeps; its records come from ``results``); ``experiments`` imports nothing from ``sweeps`` (the
study drives the trainer).

Inside ``experiments``, by stage: ``experiments.config`` (composing and checking the config) imports nothing from a
run or from training, ``experiments.run`` (a run's lifecycle: plan, identity, lock, interrupts, checkpoints, record,
how it ends) nothing from training, and ``experiments.data`` (token shards) none of the three.
"""

from __future__ import annotations

import ast
import graphlib
import itertools
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attnres", "experiments", "results", "analysis", "sweeps")

# top-level distribution names each package must not import (any import: module level, deferred, type-only)
FORBIDDEN_EXTERNAL = {
    "attnres": {"lightning", "pytorch_lightning", "hydra", "omegaconf", "wandb"},
    "results": {"torch", "numpy", "pandas", "scipy", "lightning", "pytorch_lightning", "hydra", "omegaconf", "wandb"}
    | {"triton", "matplotlib"},
    "analysis": {"torch", "lightning", "pytorch_lightning", "triton"},
}
FORBIDDEN_INTERNAL = {
    "attnres": {"experiments", "results", "analysis", "sweeps"},
    "results": {"attnres", "experiments", "analysis", "sweeps"},  # the contract both sides import
    "analysis": {"attnres", "experiments", "sweeps"},
    "experiments": {"sweeps"},  # sweeps drive experiments, never the other way
}


# experiments/ by stage: sub-package -> the sub-packages it must not import (any import, as above)
STAGE_FORBIDDEN = {
    "experiments.config": {"experiments.run", "experiments.training"},
    "experiments.run": {"experiments.training"},
    "experiments.data": {"experiments.config", "experiments.run", "experiments.training"},
}


# analysis/ by role, one way: io (records, documents, report writing) <- laws (fits, statistics) <- render (tables,
# figures, summaries) <- studies (one module per study, and their registry) <- the CLI (analysis.__main__). A layer
# imports only from the layers before it (and itself; a study, though, imports no other study: only the registry,
# STUDY_REGISTRY). The two modules that experiments/ imports stay at the top of the package: analysis.health (the
# outlier rule, a law) and analysis.router (a run's router figure); their layer is given here.
ANALYSIS_LAYERS = ("io", "laws", "render", "studies", "__main__")
ANALYSIS_TOP_LEVEL = {"analysis.health": "laws", "analysis.router": "render"}


def analysis_layer(module: str) -> str | None:
    """The layer of an analysis module (None: the package itself, which imports nothing)."""
    if module in ANALYSIS_TOP_LEVEL:
        return ANALYSIS_TOP_LEVEL[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "analysis" else None


def upward_imports(imports: list[Import], root: Path) -> list[str]:
    """Imports from an analysis module into a later layer (ANALYSIS_LAYERS), or into a module no layer holds."""
    bad = []
    for imp in imports:
        if imp.importer.split(".")[0] != "analysis" or imp.target.split(".")[0] != "analysis":
            continue
        src, dst = analysis_layer(imp.importer), analysis_layer(imp.target)
        if src is None or dst is None or src not in ANALYSIS_LAYERS or dst not in ANALYSIS_LAYERS:
            bad.append(f"{imp.importer} imports {imp.target} (no layer: {src}, {dst})   {imp.where(root)}")
        elif ANALYSIS_LAYERS.index(dst) > ANALYSIS_LAYERS.index(src):
            bad.append(f"{imp.importer} ({src}) imports {imp.target} ({dst})   {imp.where(root)}")
    return bad


def test_analysis_layers_import_one_way():
    imports = scan_imports(ROOT, ("analysis",))
    layers = {analysis_layer(imp.importer) for imp in imports}
    assert set(ANALYSIS_LAYERS) <= layers, f"analysis/ layers without an import: {set(ANALYSIS_LAYERS) - layers}"
    bad = upward_imports(imports, ROOT)
    assert not bad, "analysis/ imports go io <- laws <- render <- studies <- CLI only:\n" + "\n".join(bad)


def test_checker_analysis_layers(tmp_path):
    root = _tree(
        tmp_path,
        {
            "analysis/__init__.py": "",
            "analysis/__main__.py": "from analysis.studies import s\n",
            "analysis/health.py": "",
            "analysis/io/__init__.py": "",
            "analysis/io/r.py": "def f():\n    from ..render import t\n",
            "analysis/laws/__init__.py": "",
            "analysis/laws/l.py": "from ..io import r\nfrom .. import health\n",
            "analysis/render/__init__.py": "",
            "analysis/render/t.py": "from ..laws import l\nfrom ..studies import s\n",
            "analysis/studies/__init__.py": "",
            "analysis/studies/s.py": "from ..render import t\nfrom .. import __main__\n",
        },
    )
    bad = sorted(b.split("   ")[0] for b in upward_imports(scan_imports(root, ("analysis",)), root))
    assert bad == [
        "analysis.io.r (io) imports analysis.render.t (render)",
        "analysis.render.t (render) imports analysis.studies.s (studies)",
        "analysis.studies.s (studies) imports analysis.__main__ (__main__)",
    ]


# A study module imports no other study module (docs/DEVELOPING.md): what two studies share is a law (laws/), a text
# or a report writer (render/), never one study reaching into another. The registry is no study: any study imports it.
STUDIES_PACKAGE = "analysis.studies"
STUDY_REGISTRY = "analysis.studies.study_registry"


def _is_study(module: str) -> bool:
    """A study module: a module below analysis/studies other than the registry (the package itself is none)."""
    return module.startswith(STUDIES_PACKAGE + ".") and module != STUDY_REGISTRY


def study_to_study_imports(imports: list[Import], root: Path) -> list[str]:
    """Imports (module level or in a function, relative or absolute) from a module of analysis/studies other than
    the registry into a study module other than itself."""
    return [
        f"{imp.importer} imports {imp.target}   {imp.where(root)}"
        for imp in imports
        if (imp.importer == STUDIES_PACKAGE or _is_study(imp.importer))
        and _is_study(imp.target)
        and imp.target != imp.importer
    ]


def test_studies_import_no_other_study():
    imports = scan_imports(ROOT, ("analysis",))
    assert any(_is_study(imp.importer) and imp.target == STUDY_REGISTRY for imp in imports)  # the scan sees studies
    bad = study_to_study_imports(imports, ROOT)
    assert not bad, (
        "a study imports another study (shared numbers go to analysis/laws, shared text and report writing to "
        "analysis/render):\n" + "\n".join(bad)
    )


def test_checker_study_to_study_imports(tmp_path):
    root = _tree(
        tmp_path,
        {
            "analysis/__init__.py": "",
            "analysis/laws/__init__.py": "",
            "analysis/laws/l.py": "",
            "analysis/studies/__init__.py": "",
            "analysis/studies/study_registry.py": "from . import a\n",
            "analysis/studies/a.py": "from .study_registry import register\nfrom . import b\n",
            "analysis/studies/b.py": "def f():\n    from analysis.studies.c import g\n    return g\n",
            "analysis/studies/c.py": "import analysis.studies.study_registry\nfrom ..laws import l\ng = 1\n",
            "analysis/studies/d.py": "def f():\n    import analysis.studies.a as a\n    from .. import studies\n",
        },
    )
    bad = sorted(b.split("   ")[0] for b in study_to_study_imports(scan_imports(root, ("analysis",)), root))
    assert bad == [
        "analysis.studies.a imports analysis.studies.b",
        "analysis.studies.b imports analysis.studies.c",
        "analysis.studies.d imports analysis.studies.a",
    ]


# Records cross between training and analysis only through ``results``: what experiments/ takes from analysis/ is
# limited to these modules (the training-curve health rule, which the recorder flags with and the analysis reads).
EXPERIMENTS_MAY_IMPORT_FROM_ANALYSIS = {"analysis.health", "analysis.router"}  # a run's own curve flags and figure


@dataclass(frozen=True)
class Import:
    """One imported module as a statement names it, resolved to an absolute dotted name."""

    importer: str  # dotted name of the importing module
    target: str  # the imported module (for ``from m import name``: ``m.name`` if that is a module, else ``m``)
    path: Path
    line: int
    module_level: bool  # executed when the importer is imported (not inside a function)

    def where(self, root: Path) -> str:
        kind = "module level" if self.module_level else "in a function"
        return f"{self.path.relative_to(root)}:{self.line} ({kind})"


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py below the given packages (``pkg/__init__.py`` is ``pkg``)."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def _function_level_nodes(tree: ast.Module) -> set[int]:
    """ids of the import nodes that stand inside a function or lambda body (run on call, not on import)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return inside


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module of ``from <level dots><name> import ...`` written in ``module``."""
    base = module.split(".") if is_package else module.split(".")[:-1]  # the package the module lives in
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def scan_imports(root: Path, packages: tuple[str, ...]) -> list[Import]:
    """Every import statement in the packages' files, module-level and deferred, relative ones resolved."""
    files = module_files(root, packages)
    found = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deferred = _function_level_nodes(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = _resolve_relative(module, is_package, node.level, node.module)
                # `from pkg import sub` loads the submodule pkg.sub; `from pkg import name` reads pkg's namespace
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):  # one edge per statement and target
                found.append(Import(module, target, path, node.lineno, id(node) not in deferred))
    return found


def _is_ancestor(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def internal_graph(imports: list[Import], packages: tuple[str, ...]) -> dict[str, dict[str, Import]]:
    """importer -> {imported project module -> the statement that ties them}, by the module docstring's rule.

    Of several statements with the same target, the edge names the first module-level one (else the first one).
    """
    graph: dict[str, dict[str, Import]] = {}
    for imp in sorted(imports, key=lambda i: (not i.module_level, i.line)):
        if imp.target.split(".")[0] not in packages or imp.target == imp.importer:
            continue
        if _is_ancestor(imp.target, imp.importer) and not imp.module_level:
            continue  # a deferred import of the own package runs once the package is complete
        graph.setdefault(imp.importer, {}).setdefault(imp.target, imp)
    return graph


def find_cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Cycles of the graph, each as [m0, m1, ..., m0]: graphlib names one cycle; cut its first edge and ask again."""
    edges = {node: set(targets) for node, targets in sorted(graph.items())}
    cycles = []
    while True:
        sorter = graphlib.TopologicalSorter({node: sorted(targets) for node, targets in edges.items()})
        try:
            sorter.prepare()
        except graphlib.CycleError as err:
            # graphlib lists the cycle against the edge direction (each node's predecessor follows it)
            ring = list(reversed(err.args[1]))[:-1]
            start = ring.index(min(ring))  # report each cycle from its first module by name
            cycle = ring[start:] + ring[: start + 1]
            cycles.append(cycle)
            edges[cycle[0]].discard(cycle[1])
        else:
            return cycles


def describe_cycle(cycle: list[str], graph: dict[str, dict[str, Import]], root: Path) -> str:
    hops = [f"  {a} -> {b}   {graph[a][b].where(root)}" for a, b in itertools.pairwise(cycle)]
    return " <-> ".join(dict.fromkeys(cycle)) + "\n" + "\n".join(hops)


def layering_violations(imports: list[Import], root: Path) -> list[str]:
    bad = []
    for imp in imports:
        package, top = imp.importer.split(".")[0], imp.target.split(".")[0]
        if top in FORBIDDEN_EXTERNAL.get(package, ()) or top in FORBIDDEN_INTERNAL.get(package, ()):
            bad.append(f"{imp.importer} imports {imp.target}   {imp.where(root)}")
    return bad


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def stage_violations(imports: list[Import], root: Path, rules: dict[str, set[str]]) -> list[str]:
    """Imports from a sub-package into one that ``rules`` forbids it (``rules``: sub-package -> forbidden ones)."""
    return [
        f"{imp.importer} imports {imp.target}   {imp.where(root)}"
        for imp in imports
        for stage, forbidden in rules.items()
        if _within(imp.importer, stage) and any(_within(imp.target, f) for f in forbidden)
    ]


# ---- the project's own tree --------------------------------------------------------------------------------
def test_every_package_is_scanned():
    imports = scan_imports(ROOT, PACKAGES)
    importers = {imp.importer.split(".")[0] for imp in imports}
    assert importers == set(PACKAGES)
    graph = internal_graph(imports, PACKAGES)
    # edges the project has by construction: the package re-exports its model, the trainer builds on the model
    assert "attnres.model" in graph["attnres"]
    assert any(t.split(".")[0] == "attnres" for t in graph["experiments.training.module"])


def tangles(cycles: list[list[str]]) -> list[set[str]]:
    """The cycles' modules grouped into sets of mutually dependent modules (cycles that share a module merge)."""
    groups: list[set[str]] = []
    for cycle in cycles:
        merged = set(cycle)
        for group in [g for g in groups if g & merged]:
            merged |= group
            groups.remove(group)
        groups.append(merged)
    return groups


def test_no_import_cycles():
    graph = internal_graph(scan_imports(ROOT, PACKAGES), PACKAGES)
    cycles = find_cycles(graph)
    groups = "\n".join("  {" + ", ".join(sorted(g)) + "}" for g in tangles(cycles))
    report = "\n".join(describe_cycle(c, graph, ROOT) for c in cycles)
    assert not cycles, f"{len(cycles)} import cycle(s) among these modules:\n{groups}\n{report}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN_EXTERNAL.keys() | FORBIDDEN_INTERNAL.keys()))
def test_layering(package):
    imports = [imp for imp in scan_imports(ROOT, PACKAGES) if imp.importer.split(".")[0] == package]
    assert imports, f"no imports found in {package}/"
    bad = layering_violations(imports, ROOT)
    assert not bad, f"{package}/ breaks the layering of docs/DEVELOPING.md:\n" + "\n".join(bad)


@pytest.mark.parametrize("stage", sorted(STAGE_FORBIDDEN))
def test_experiments_stages_import_one_way(stage):
    imports = [imp for imp in scan_imports(ROOT, PACKAGES) if _within(imp.importer, stage)]
    assert imports, f"no imports found in {stage}"
    bad = stage_violations(imports, ROOT, {stage: STAGE_FORBIDDEN[stage]})
    assert not bad, f"{stage} breaks the stage layering of docs/DEVELOPING.md:\n" + "\n".join(bad)


def test_records_cross_between_training_and_analysis_only_through_results():
    imports = scan_imports(ROOT, PACKAGES)
    bad = [
        f"{imp.importer} imports {imp.target}   {imp.where(ROOT)}"
        for imp in imports
        if imp.importer.split(".")[0] == "experiments"
        and imp.target.split(".")[0] == "analysis"
        and imp.target not in EXPERIMENTS_MAY_IMPORT_FROM_ANALYSIS
    ]
    assert not bad, "experiments/ reads or writes records through results/, not analysis/:\n" + "\n".join(bad)


def test_module_names_are_unique_across_packages():
    """One name for one thing (docs/DEVELOPING.md): no two modules of the project share a file name."""
    names: dict[str, list[str]] = {}
    for dotted, path in module_files(ROOT, PACKAGES).items():
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.stem, []).append(dotted)
    shared = {name: where for name, where in names.items() if len(where) > 1}
    assert not shared, f"module names used more than once: {shared}"


# ---- the checker on small trees with known answers ---------------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return tmp_path


def _cycles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    return find_cycles(internal_graph(scan_imports(root, packages), packages))


def test_checker_finds_a_deferred_relative_cycle(tmp_path):
    root = _tree(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/a.py": "from .b import f\n",
            "p/b.py": "def f():\n    from . import a\n    return a\n",
        },
    )
    assert _cycles(root, ("p",)) == [["p.a", "p.b", "p.a"]]
    assert internal_graph(scan_imports(root, ("p",)), ("p",))["p.b"]["p.a"].module_level is False


def test_checker_finds_cycles_across_packages_and_reports_every_one(tmp_path):
    root = _tree(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/a.py": "import q.x\nfrom p import b\n",
            "p/b.py": "from ..p.a import thing\n",
            "q/__init__.py": "",
            "q/x.py": "from p.a import thing\n",
        },
    )
    cycles = _cycles(root, ("p", "q"))
    assert sorted(sorted(set(c)) for c in cycles) == [["p.a", "p.b"], ["p.a", "q.x"]]
    for c in cycles:
        assert c[0] == c[-1]


def test_checker_package_init_rule(tmp_path):
    root = _tree(
        tmp_path,
        {
            "p/__init__.py": "from .a import A\nfrom .b import B\n",
            "p/a.py": "class A: ...\n",
            "p/b.py": "from p.a import A\ndef late():\n    from p import A\n    return A\n",
        },
    )
    assert _cycles(root, ("p",)) == []  # re-exports plus a deferred read of the package: no cycle
    (root / "p" / "b.py").write_text("from p import A\n", encoding="utf-8")  # the package's namespace at import time
    assert _cycles(root, ("p",)) == [["p", "p.b", "p"]]


def test_checker_layering(tmp_path):
    root = _tree(
        tmp_path,
        {
            "attnres/__init__.py": "import torch\n",
            "attnres/m.py": "def f():\n    import lightning\n    from experiments import train\n",
            "analysis/__init__.py": "import pandas\nimport typing\nif typing.TYPE_CHECKING:\n    import torch\n",
            "experiments/__init__.py": "",
            "experiments/train.py": "",
        },
    )
    imports = scan_imports(root, ("attnres", "analysis", "experiments"))
    bad = layering_violations(imports, root)
    assert sorted(b.split("   ")[0] for b in bad) == [
        "analysis imports torch",
        "attnres.m imports experiments.train",
        "attnres.m imports lightning",
    ]


def test_checker_stage_layering(tmp_path):
    root = _tree(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/config/__init__.py": "",
            "p/config/a.py": "def f():\n    from ..run import b\n",
            "p/run/__init__.py": "",
            "p/run/b.py": "from p.config.a import f\nfrom p.training import c\n",
            "p/training/__init__.py": "",
            "p/training/c.py": "from ..run.b import f\n",
        },
    )
    rules = {"p.config": {"p.run", "p.training"}, "p.run": {"p.training"}}
    bad = stage_violations(scan_imports(root, ("p",)), root, rules)
    assert sorted(b.split("   ")[0] for b in bad) == ["p.config.a imports p.run.b", "p.run.b imports p.training.c"]
