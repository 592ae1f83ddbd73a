"""The walk: how many files a run's config passes through, from ``experiments/train.py:train`` (issue 38).

    python scripts/config_walk.py                  # this checkout
    python scripts/config_walk.py --root DIR -v    # another tree (e.g. `git archive main | tar -x -C DIR`), the trail
    python scripts/config_walk.py --every-call     # every project call followed, not only the config's

A static call graph, read from the source with ``ast`` (nothing is imported or run):

- Start at the function ``train`` of ``experiments/train.py`` with its parameter ``cfg`` and walk depth-first: each
  call in a function's body, in evaluation order (a call's arguments before the call), is followed into its callee
  when the callee is a function or class defined in a project package (attnres, experiments, results, analysis,
  sweeps; a class is entered at its ``__init__``) and the call passes the config on: an argument reads a name that
  holds it, or the method is called on an object that holds it. A callee is found through the caller module's
  imports (module level or inside a function, relative ones resolved, re-exports of a package's ``__init__``
  followed), a ``module.function`` attribute, ``self.method``, or a method on a local whose class is known (an
  annotated parameter, ``x = Cls(...)``, ``with Cls(...) as x``).
- A name holds the config when it is a parameter that received it, or is assigned (anywhere in the function) from an
  expression that reads a name holding it (``model = cfg.model``, ``run = RecordBuilder(cfg, ...)``); ``self.x``
  holds it in every method of a class whose ``__init__`` stored it there.
- A function's body is walked the first time it is called only (the walk is finite; later calls are not followed).
- Not followed: Hydra ``_target_`` strings, Lightning's hooks (what Lightning calls), calls through values whose
  class the source does not say.

The walk is a sequence of positions, each in one file: entering a callee in another file starts a *stay* there, and
returning from it starts a new stay in the caller's file. Counted: stays, files entered (distinct files), and
returns to a file already left (stays - files: every stay after a file's first).
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("attnres", "experiments", "results", "analysis", "sweeps")
Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass
class Module:
    """One parsed module: its top-level definitions (classes with their methods) and the names its imports bind."""

    name: str
    path: Path
    is_package: bool
    defs: dict[str, Def] = field(default_factory=dict)
    methods: dict[str, dict[str, ast.FunctionDef | ast.AsyncFunctionDef]] = field(default_factory=dict)
    # local name -> (module, attribute or None for the module itself)
    names: dict[str, tuple[str, str | None]] = field(default_factory=dict)


class Project:
    """Every module of the project packages under ``root``, parsed once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, Module] = {}
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                is_package = parts[-1] == "__init__"
                name = ".".join(parts[:-1] if is_package else parts)
                self.modules[name] = Module(name, path, is_package)
        for module in self.modules.values():
            self._parse(module)

    def _parse(self, module: Module) -> None:
        tree = ast.parse(module.path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                module.defs[node.name] = node
            if isinstance(node, ast.ClassDef):
                module.methods[node.name] = {
                    n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
        for node in ast.walk(tree):  # module-level and deferred imports alike
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        module.names[alias.asname] = (alias.name, None)
                    else:
                        module.names[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    local = alias.asname or alias.name
                    if f"{base}.{alias.name}" in self.modules:
                        module.names[local] = (f"{base}.{alias.name}", None)
                    else:
                        module.names[local] = (base, alias.name)

    def lookup(self, module_name: str, attr: str, seen: int = 0) -> tuple[Module, Def] | None:
        """The definition ``attr`` of a project module, following re-exports (``from .model import Transformer``)."""
        module = self.modules.get(module_name)
        if module is None or seen > 10:
            return None
        if attr in module.defs:
            return module, module.defs[attr]
        if attr in module.names:
            target, name = module.names[attr]
            if name is not None:
                return self.lookup(target, name, seen + 1)
        return None


@dataclass(frozen=True)
class Frame:
    module: Module
    func: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None  # the enclosing class of a method


def calls_in_order(node: ast.AST) -> Iterator[ast.Call]:
    """The calls under ``node`` in evaluation order (arguments before the call), nested defs and lambdas skipped."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield from calls_in_order(child)
    if isinstance(node, ast.Call):
        yield node


def local_classes(project: Project, frame: Frame) -> dict[str, tuple[Module, str]]:
    """Locals of a function whose class the source states: annotated parameters, ``x = Cls(...)``, ``with Cls(...)
    as x`` (a class defined in the project)."""

    def cls_of(expr: ast.AST | None) -> tuple[Module, str] | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            expr = ast.parse(expr.value, mode="eval").body
        if isinstance(expr, ast.Name):
            found = resolve_name(project, frame, expr.id)
            if found is not None and isinstance(found[1], ast.ClassDef):
                return found[0], found[1].name
        return None

    known: dict[str, tuple[Module, str]] = {}
    args = frame.func.args
    for a in (*args.posonlyargs, *args.args, *args.kwonlyargs):
        if (c := cls_of(a.annotation)) is not None:
            known[a.arg] = c
    for node in ast.walk(frame.func):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            c = cls_of(node.value.func)
            for t in node.targets:
                if c is not None and isinstance(t, ast.Name):
                    known[t.id] = c
        elif isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
            c = cls_of(node.context_expr.func)
            if c is not None and isinstance(node.optional_vars, ast.Name):
                known[node.optional_vars.id] = c
    return known


def resolve_name(project: Project, frame: Frame, name: str) -> tuple[Module, Def] | None:
    module = frame.module
    if name in module.defs:
        return module, module.defs[name]
    if name in module.names:
        target, attr = module.names[name]
        if attr is not None:
            return project.lookup(target, attr)
    return None


def callee(project: Project, frame: Frame, call: ast.Call, known: dict[str, tuple[Module, str]]) -> Frame | None:
    """The project function a call enters, or None."""
    f = call.func
    found: tuple[Module, Def] | None = None
    if isinstance(f, ast.Name):
        found = resolve_name(project, frame, f.id)
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        owner = f.value.id
        if owner == "self" and frame.cls is not None:
            method = frame.module.methods.get(frame.cls, {}).get(f.attr)
            return Frame(frame.module, method, frame.cls) if method is not None else None
        if owner in known:
            module, cls = known[owner]
            method = module.methods.get(cls, {}).get(f.attr)
            return Frame(module, method, cls) if method is not None else None
        if owner in frame.module.names:
            target, attr = frame.module.names[owner]
            if attr is None:
                found = project.lookup(target, f.attr)
            elif f"{target}.{attr}" in project.modules:
                found = project.lookup(f"{target}.{attr}", f.attr)
    if found is None:
        return None
    module, node = found
    if isinstance(node, ast.ClassDef):
        init = module.methods.get(node.name, {}).get("__init__")
        return Frame(module, init, node.name) if init is not None else None
    return Frame(module, node, None)


def mentions(expr: ast.AST, names: set[str]) -> bool:
    """Whether an expression reads the config: a name in ``names``, or ``self.attr`` with "self.attr" in it."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id in names:
            return True
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and f"{node.value.id}.{node.attr}" in names
        ):
            return True
    return False


def config_names(frame: Frame, received: set[str], self_attrs: dict[str, set[str]]) -> set[str]:
    """The names holding the config in a function: the parameters that received it, the ``self`` attributes its
    class's ``__init__`` stored it in, and (to a fixed point, in any order) every name or ``self.attr`` assigned
    from an expression that reads one of them. Stores to ``self.attr`` are remembered for the class."""
    names = set(received)
    if frame.cls is not None:
        names |= {f"self.{a}" for a in self_attrs.get(frame.cls, set())}
    pairs: list[tuple[ast.AST, ast.AST]] = []
    for node in ast.walk(frame.func):
        if isinstance(node, ast.Assign):
            pairs += [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
            pairs.append((node.target, node.value))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            pairs.append((node.optional_vars, node.context_expr))
    changed = True
    while changed:
        changed = False
        for target, value in pairs:
            if not mentions(value, names):
                continue
            for t in ast.walk(target):
                key = None
                if isinstance(t, ast.Name):
                    key = t.id
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    key = f"self.{t.attr}"
                    if frame.cls is not None:
                        self_attrs.setdefault(frame.cls, set()).add(t.attr)
                if key is not None and key not in names:
                    names.add(key)
                    changed = True
    return names


def bound_params(
    func: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, names: set[str], method: bool
) -> set[str]:
    """The callee's parameters that receive an argument reading the config."""
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    if method:
        params = params[1:]
    got = {params[i] for i, a in enumerate(call.args) if i < len(params) and mentions(a, names)}
    if func.args.vararg is not None and any(mentions(a, names) for a in call.args[len(params) :]):
        got.add(func.args.vararg.arg)
    named = [a.arg for a in func.args.kwonlyargs] + params
    for k in call.keywords:
        if k.arg is not None and mentions(k.value, names):
            got.add(k.arg if k.arg in named or func.args.kwarg is None else func.args.kwarg.arg)
    return got


def walk(project: Project, start: Frame, start_params: set[str], every_call: bool = False) -> list[tuple[Path, str]]:
    """The walk's positions: (file, function) at each entry and each return, depth-first from ``start``. Only
    calls that pass the config on (an argument, or the object a method is called on, reads it) are followed,
    unless ``every_call``."""
    trail: list[tuple[Path, str]] = []
    walked: set[int] = set()
    self_attrs: dict[str, set[str]] = {}

    def visit(frame: Frame, received: set[str]) -> None:
        walked.add(id(frame.func))
        here = (frame.module.path, frame.func.name)
        trail.append(here)
        known = local_classes(project, frame)
        names = config_names(frame, received, self_attrs)
        for call in calls_in_order(frame.func):
            nxt = callee(project, frame, call, known)
            if nxt is None or id(nxt.func) in walked:
                continue
            receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
            on_config = receiver is not None and mentions(receiver, names) and nxt.cls is not None
            params = bound_params(nxt.func, call, names, method=nxt.cls is not None)
            if params or on_config or every_call:
                visit(nxt, params)
                trail.append(here)

    visit(start, start_params)
    return trail


def count(trail: list[tuple[Path, str]], root: Path) -> tuple[int, int, int, Counter[str]]:
    """(stays, files, returns to a file already left, stays per file) of a walk."""
    files = [str(p.relative_to(root)) for p, _ in trail]
    stays = [f for i, f in enumerate(files) if i == 0 or f != files[i - 1]]
    per_file = Counter(stays)
    return len(stays), len(per_file), len(stays) - len(per_file), per_file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the tree to walk")
    p.add_argument("--every-call", action="store_true", help="follow every project call, not only the config's")
    p.add_argument("-v", "--verbose", action="store_true", help="print the stays and the files entered most")
    args = p.parse_args(argv)
    root = args.root.resolve()
    project = Project(root)
    start = project.modules["experiments.train"]
    node = start.defs["train"]
    assert isinstance(node, ast.FunctionDef)
    trail = walk(project, Frame(start, node, None), {"cfg"}, every_call=args.every_call)
    stays, files, returns, per_file = count(trail, root)
    if args.verbose:
        last = None
        for path, func in trail:
            rel = str(path.relative_to(root))
            if rel != last:
                print(f"  {rel}:{func}")
            last = rel
        print("  stays per file: " + ", ".join(f"{f} {n}" for f, n in per_file.most_common()))
    print(f"{stays} stays in {files} files, {returns} returns to a file already left")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
