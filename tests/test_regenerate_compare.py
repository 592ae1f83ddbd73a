"""scripts/regenerate_reports.py's comparison of a regenerated report with the committed one: bytes outside the
numbers as they are, JSON numbers within 1e-6 relative (JSON_RTOL), Markdown numbers within one unit of the last digit
printed, figures within anti-aliasing (a PNG through the PDF it rasterises)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_plans import regenerate_reports

DOC = {"study": "cpu_deep_12345678901234", "variants": {"baseline": {"A": 412.3456789012345, "E": 1.7}}, "n": 24}


def _json(a_scale: float = 1.0, **changes: object) -> bytes:
    doc = json.loads(json.dumps(DOC))
    doc["variants"]["baseline"]["A"] *= a_scale
    doc.update(changes)
    return (json.dumps(doc, indent=2) + "\n").encode()


def test_json_numbers_are_equal_within_1e_6_relative_and_different_beyond():
    compare_text = regenerate_reports().compare_text
    assert compare_text(_json(1 + 5e-8), _json(), "json") == "equal within 1e-06 relative: 1 number(s) differ below it"
    assert compare_text(_json(1 + 1e-5), _json(), "json") == (
        f"DIFFERENT: line 5: committed {DOC['variants']['baseline']['A']!r}, "
        f"regenerated {DOC['variants']['baseline']['A'] * (1 + 1e-5)!r}"
    )
    assert compare_text(_json(n=25), _json(), "json") == "DIFFERENT: line 9: committed 24, regenerated 25"


def test_json_text_compares_byte_for_byte_digits_in_strings_included():
    compare_text = regenerate_reports().compare_text
    near = _json(study="cpu_deep_12345678901235")  # as numbers these digits would be within 1e-9
    assert compare_text(near, _json(), "json") == (
        'DIFFERENT: line 2: committed \'  "study": "cpu_deep_12345678901234",\', '
        'regenerated \'  "study": "cpu_deep_12345678901235",\''
    )
    spaced = json.dumps(DOC, indent=1).encode() + b"\n"  # the same document, laid out otherwise
    assert compare_text(spaced, _json(), "json").startswith("DIFFERENT: line 2")
    assert compare_text(_json()[:-20], _json(), "json").startswith("DIFFERENT")


TABLE = """| arm | Δ val loss | 95% CI | steps |
|---|---|---|---|
| block_attnres | {d} | {lo}-{hi} | 24 |
"""


def test_markdown_numbers_compare_at_the_digits_printed():
    compare_text = regenerate_reports().compare_text
    committed = TABLE.format(d="-0.021", lo="-0.030", hi="-0.012").encode()
    assert compare_text(committed, committed, "md") == "equal within the printed digits: 0 number(s) differ below it"
    rounded = TABLE.format(d="-0.022", lo="-0.030", hi="-0.012").encode()  # -0.0215 +- rounding: one unit apart
    assert compare_text(rounded, committed, "md").startswith("equal within the printed digits: 1 number(s)")
    digit = TABLE.format(d="-0.023", lo="-0.030", hi="-0.012").encode()
    assert compare_text(digit, committed, "md") == "DIFFERENT: line 3: committed -0.021, regenerated -0.023"
    zero = TABLE.format(d="0.000", lo="-0.030", hi="-0.012").encode()
    signed = TABLE.format(d="-0.000", lo="-0.030", hi="-0.012").encode()
    assert compare_text(signed, zero, "md").startswith("equal within the printed digits: 1 number(s)")
    worded = committed.replace(b"block_attnres", b"full_attnres")
    assert compare_text(worded, committed, "md").startswith("DIFFERENT: line 3: committed '")


@pytest.mark.parametrize(
    ("suffix", "first"), [(".json", "equal within 1e-06"), (".md", "DIFFERENT"), (".csv", "DIFFERENT")]
)
def test_compare_files_by_kind(tmp_path: Path, suffix: str, first: str):
    """A JSON file within tolerance is equal; a Markdown one whose printed digit moved and any other file that is not
    byte-identical are different; a byte-identical file is identical."""
    compare = regenerate_reports().compare
    old, new = tmp_path / f"old{suffix}", tmp_path / f"new{suffix}"
    old.write_bytes(_json() if suffix == ".json" else b"| m | 1.234 |\n")
    new.write_bytes(_json(1 + 1e-7) if suffix == ".json" else b"| m | 1.236 |\n")
    assert compare(new, old).startswith(first)
    assert compare(old, old) == "identical"


def test_files_drawn_from_run_directories_leave_the_files_list_and_nothing_else(tmp_path: Path):
    """A regeneration that could not draw a report's declared run-directory figures lists fewer ``files``: equal once
    those are left out of the committed list (and said so); an undeclared missing file, or any other change, is not."""
    compare = regenerate_reports().compare
    doc = {"m": 1.25, "files": ["fig4.png", "fig5.png", "loss.png", "fit.json"]}
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(doc, indent=2))
    new.write_text(json.dumps({**doc, "files": ["fig4.png", "fit.json"]}, indent=2))
    assert compare(new, old, ("fig5.png", "loss.png")).startswith("identical, 2 file(s) drawn from run directories")
    assert compare(new, old, ("fig5.png",)).startswith("DIFFERENT")
    assert compare(new, old).startswith("DIFFERENT")
    new.write_text(json.dumps({"m": 1.5, "files": ["fig4.png", "fit.json"]}, indent=2))
    assert compare(new, old, ("fig5.png", "loss.png")).startswith("DIFFERENT")


def test_only_a_directory_without_a_report_is_an_error_naming_the_reports(capsys):
    with pytest.raises(SystemExit) as stop:
        regenerate_reports().main(["--only", "cpu_map,cpu_ladder"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--only cpu_ladder: no report there; the reports: " in err
    assert "cpu_map," in err


def _figure(path: Path, shift: float) -> None:
    """A line plot whose curve is moved up by ``shift`` (data units of a 0-1 axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    x = [0.0, 0.3, 0.6, 1.0]
    ax.plot(x, [0.1 + shift, 0.5 + shift, 0.3 + shift, 0.8 + shift])
    ax.set_ylim(0, 1)
    fig.savefig(path, dpi=80, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    plt.close(fig)


@pytest.mark.parametrize("suffix", [".png", ".pdf"])
def test_a_figure_whose_curve_moved_by_rounding_is_equal_and_one_that_moved_visibly_is_not(tmp_path, suffix):
    """A curve moved by 1e-6 of its axis (a fit's last digits) draws the same figure within tolerance (PNG:
    anti-aliasing levels; PDF: its coordinates within 1e-2 pt); moved by 5% of its axis, it is a different figure."""
    compare = regenerate_reports().compare
    old, same, moved = (tmp_path / f"{name}{suffix}" for name in ("old", "same", "moved"))
    _figure(old, 0.0)
    _figure(same, 1e-6)
    _figure(moved, 0.05)
    assert compare(same, old).startswith(("identical", "equal within"))
    assert compare(moved, old).startswith("DIFFERENT")


def test_a_png_whose_edges_moved_more_is_equal_through_its_pdf_and_only_then(tmp_path):
    """A band whose edge moved by a hundredth of a point changes its anti-aliased edge pixels by several levels: the
    PNG is equal when the PDF it rasterises is; a PNG without that PDF, or beside a PDF that moved, is different."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def band(stem: Path, shift: float) -> None:
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.fill_between([0.0, 1.0], [0.2 + shift, 0.4 + shift], [0.6, 0.9], alpha=0.3)
        ax.set_ylim(0, 1)
        for suffix in (".png", ".pdf"):
            fig.savefig(
                stem.with_suffix(suffix), dpi=200, metadata={"CreationDate": None} if suffix == ".pdf" else None
            )
        plt.close(fig)

    compare = regenerate_reports().compare
    (tmp_path / "old").mkdir(), (tmp_path / "near").mkdir(), (tmp_path / "far").mkdir()
    band(tmp_path / "old" / "f", 0.0)
    band(tmp_path / "near" / "f", 4e-5)  # ~0.005 pt on a 1.3-inch axis
    band(tmp_path / "far" / "f", 0.05)
    near = compare(tmp_path / "near" / "f.png", tmp_path / "old" / "f.png")
    assert near.startswith("equal through its PDF (equal within 0.01 pt): ")
    assert compare(tmp_path / "far" / "f.png", tmp_path / "old" / "f.png").startswith("DIFFERENT")
    (tmp_path / "near" / "f.pdf").unlink()
    assert compare(tmp_path / "near" / "f.png", tmp_path / "old" / "f.png").startswith("DIFFERENT")


def test_png_pixels_within_one_level_on_few_pixels_are_equal(tmp_path):
    """Anti-aliasing: a few pixels one intensity level apart are equal; two levels, or one level on many pixels,
    are different."""
    import numpy as np
    from matplotlib.image import imsave

    compare_png = regenerate_reports().compare_png
    base = np.full((100, 100, 3), 128, np.uint8)
    old, new = tmp_path / "old.png", tmp_path / "new.png"
    imsave(old, base)
    cases = ((1, 5, "equal within 1 level: 5 pixel(s)"), (2, 5, "DIFFERENT"), (1, 500, "DIFFERENT"))
    for change, n_pixels, first in cases:
        moved = base.copy()
        moved.reshape(-1, 3)[:n_pixels] += np.uint8(change)
        imsave(new, moved)
        assert compare_png(new.read_bytes(), old.read_bytes()).startswith(first)
