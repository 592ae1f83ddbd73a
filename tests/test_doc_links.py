"""Every relative link in README.md and docs/**/*.md resolves: the file or folder it names exists inside the
repository, and an ``#anchor`` into a Markdown file names one of its headings (GitHub's slugs). Also the README's
shape (issue 38): at most 200 lines, the two commands within its first 60. Standard library only; under a second."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), target optionally in <...> and followed by a "title"
_INLINE = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:, ...
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)


def doc_files(repo: Path = REPO) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link inside a code block is an example, not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, without punctuation other than '-' and '_',
    spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's (or image's) text only
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("**", "").replace("~~", "")
    text = re.sub(r"(?<!\w)\*(.+?)\*(?!\w)", r"\1", text)  # *emphasis*
    kept = "".join(c for c in text.lower() if unicodedata.category(c)[0] in "LMN" or c in " -_")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file defines: its headings' slugs (a repeated one gets -1, -2, ...) and HTML anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    text = path.read_text(encoding="utf-8")
    for line in _prose_lines(text):
        m = _HEADING.match(line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        found.update(_HTML_ANCHOR.findall(line))
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image in a Markdown file, outside code."""
    out = []
    for i, line in enumerate(_prose_lines(path.read_text(encoding="utf-8")), 1):
        line = _CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in _INLINE.finditer(line)]
        ref = _REFERENCE.match(line)
        if ref:
            targets.append(ref.group(1))
        out += [(i, t[1:-1] if t.startswith("<") else t) for t in targets]
    return out


def broken_links(path: Path, repo: Path = REPO) -> list[str]:
    """The relative links of one file that do not resolve, as 'file:line: target (why)'."""
    bad = []
    cache: dict[Path, set[str]] = {}
    for line, target in links(path):
        if _SCHEME.match(target):
            continue  # an absolute URL: not checked here (no network)
        where, _, anchor = unquote(target).partition("#")
        dest = (repo / where.lstrip("/")) if where.startswith("/") else (path.parent / where) if where else path
        dest = dest.resolve()
        name = f"{path.relative_to(repo)}:{line}: {target}"
        if not dest.is_relative_to(repo.resolve()):
            bad.append(f"{name} (outside the repository)")
        elif not dest.exists():
            bad.append(f"{name} (no such file or folder)")
        elif anchor and dest.suffix == ".md":
            if dest not in cache:
                cache[dest] = anchors(dest)
            if anchor not in cache[dest]:
                bad.append(f"{name} (no heading with anchor #{anchor})")
    return bad


def test_every_relative_link_in_the_readme_and_docs_resolves():
    files = doc_files()
    assert len(files) > 10
    assert REPO / "docs" / "README.md" in files
    bad = [b for f in files for b in broken_links(f)]
    assert not bad, f"{len(bad)} broken link(s):\n" + "\n".join(bad)


def test_the_checker_finds_a_missing_file_a_missing_anchor_and_skips_code_and_urls(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## The d = 32 ladder (study `tiny`)\n\n## Other\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n\n"
        "[ok](docs/other.md#the-d--32-ladder-study-tiny) [ok too](docs/other.md#other-1) [dir](docs/) [self](#top)\n"
        "[gone](docs/missing.md) [bad anchor](docs/other.md#nowhere) ![img](docs/fig.png)\n"
        "[url](https://example.com/x.md) `[code](docs/nope.md)` [out](../../etc/passwd)\n"
        "```\n[fenced](docs/nope.md)\n```\n"
        "[ref]: docs/also_missing.md\n"
    )
    bad = broken_links(page, tmp_path)
    assert [b.split(": ", 1)[1] for b in bad] == [
        "docs/missing.md (no such file or folder)",
        "docs/other.md#nowhere (no heading with anchor #nowhere)",
        "docs/fig.png (no such file or folder)",
        "../../etc/passwd (outside the repository)",
        "docs/also_missing.md (no such file or folder)",
    ]


def test_github_slugs():
    assert slug("The d = 32 CPU ladder (study `tiny`)") == "the-d--32-cpu-ladder-study-tiny"
    assert (
        slug("The paper's recipe, Muon + WSD (study `deep_recipe`)") == "the-papers-recipe-muon--wsd-study-deep_recipe"
    )
    assert slug("GPU: one H200") == "gpu-one-h200"
    assert slug("Scale-out: DDP, FSDP, multi-node") == "scale-out-ddp-fsdp-multi-node"
    assert slug("Fig. 6: Block size") == "fig-6-block-size"
    assert slug("What `scripts/gpu_suite.sh` measures") == "what-scriptsgpu_suitesh-measures"


def test_the_readme_is_a_front_door():
    """Issue 38: at most 200 lines, the two commands within the first 60, verbatim as .ci/run runs the tests."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, len(lines)
    first = [line.split("#")[0].strip() for line in lines[:60]]
    assert "python -m sweeps.study" in first
    assert "python -m pytest -q -n 2" in first
    assert "python -m pytest -q -n 2" in (REPO / ".ci" / "run").read_text()
    assert "docs/DEVELOPING.md" in "\n".join(lines[:25])  # the code map, from the first screen
