"""No function of the shipped code is longer than MAX_LINES lines unless ALLOWED names it with a reason
(docs/DEVELOPING.md, "Standards"). Length: from the ``def`` line to the function's last line (ast's ``lineno`` to
``end_lineno``: docstring, comments and blank lines inside it included; decorators not), every nested function
counted on its own as well as inside its parent.

    python tests/test_function_length.py     # the counts over 60 and over 120 lines, and the longest functions
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("attnres", "experiments", "sweeps", "analysis", "results", "scripts")
MAX_LINES = 120

# "path:qualified name" -> why it may be longer than MAX_LINES. Each entry must still exist and still be too long.
ALLOWED: dict[str, str] = {}


def function_lengths() -> dict[str, int]:
    """Every function and method of the shipped packages, as ``"path:Class.function"`` -> its length in lines."""
    lengths: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            _visit(ast.parse(path.read_text(encoding="utf-8"), filename=rel), rel, "", lengths)
    return lengths


def _visit(node: ast.AST, rel: str, prefix: str, out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            out[f"{rel}:{name}"] = (child.end_lineno or child.lineno) - child.lineno + 1
            _visit(child, rel, f"{name}.", out)
        elif isinstance(child, ast.ClassDef):
            _visit(child, rel, f"{prefix}{child.name}.", out)
        else:
            _visit(child, rel, prefix, out)


def test_no_function_is_longer_than_the_limit_without_a_stated_reason():
    lengths = function_lengths()
    too_long = {name: n for name, n in lengths.items() if n > MAX_LINES and name not in ALLOWED}
    assert not too_long, f"functions over {MAX_LINES} lines (split them, or add them to ALLOWED with why): {too_long}"


def test_every_allowed_function_is_still_there_and_still_too_long():
    lengths = function_lengths()
    stale = [name for name in ALLOWED if lengths.get(name, 0) <= MAX_LINES]
    assert not stale, f"ALLOWED names functions that are gone or now short enough: drop them: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_counter_measures_nested_functions_and_methods(tmp_path):
    source = "class A:\n    def f(self):\n        def g():\n            return 1\n\n        return g\n"
    out: dict[str, int] = {}
    _visit(ast.parse(source), "m.py", "", out)
    assert out == {"m.py:A.f": 5, "m.py:A.f.g": 2}


if __name__ == "__main__":
    found = function_lengths()
    print(
        f"{len(found)} functions; over 60 lines: {sum(n > 60 for n in found.values())}; over {MAX_LINES}: "
        f"{sum(n > MAX_LINES for n in found.values())}"
    )
    for name, n in sorted(found.items(), key=lambda item: -item[1])[: int(sys.argv[1]) if len(sys.argv) > 1 else 15]:
        print(f"{n:5d}  {name}{'  (allowed: ' + ALLOWED[name] + ')' if name in ALLOWED else ''}")
