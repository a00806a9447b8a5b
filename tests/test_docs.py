"""The documentation says what holds now: a settings reference generated from the code, and no internal references.

* ``test_settings_doc``: the settings table in docs/sglang.md is what ``python -m sglang_hybrid.tools.settings_doc``
  generates from ``HybridSettings``; a stale table fails with the command that fixes it.
* ``test_no_internal_references``: no team issue numbers and no run dates in README.md, docs/ (but the one history
  file, docs/history.md, where past runs are dated) or the Python sources; a failure lists every offending file:line.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_hybrid.tools import settings_doc

# the checkout's root (the folder holding pyproject.toml), wherever under tests/ this module lives
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
HISTORY = ROOT / "docs" / "history.md"
# Built from pieces, so that this file does not match its own patterns.
ISSUE_REFERENCE = re.compile("[Ii]ssue" + r" [0-9]+")
RUN_DATE = re.compile("20[0-9][0-9]" + "-[0-9][0-9]" * 2)


def test_settings_doc():
    text = settings_doc.DOC.read_text()
    assert settings_doc.current_block(text) == settings_doc.render_block(), (
        "docs/sglang.md's settings table differs from HybridSettings: run "
        "python -m sglang_hybrid.tools.settings_doc --write")


def test_settings_doc_catches_a_stale_table(tmp_path, capsys):
    """Positive control: a table that lost a row, or a doc without the markers, is reported, and --write mends it."""
    doc = tmp_path / "doc.md"
    fresh = f"# Settings\n\n{settings_doc.render_block()}\n\nmore text\n"
    stale = fresh.replace(next(line for line in fresh.splitlines() if line.startswith("| `ngram_k`")) + "\n", "")
    assert stale != fresh
    doc.write_text(stale)
    assert settings_doc.main(["--check", "--doc", str(doc)]) == 1
    assert settings_doc.main(["--write", "--doc", str(doc)]) == 0
    assert doc.read_text() == fresh
    assert settings_doc.main(["--check", "--doc", str(doc)]) == 0
    doc.write_text("# no markers\n")
    assert settings_doc.main(["--check", "--doc", str(doc)]) == 2
    assert "settings:begin" in capsys.readouterr().err


def test_settings_doc_lists_every_field_with_its_variable():
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX, HybridSettings

    table = settings_doc.render_table()
    for name in HybridSettings.model_fields:
        assert f"| `{name}` | `{ENV_PREFIX}{name.upper()}` |" in table, name
    assert len(table.strip().splitlines()) == 2 + len(HybridSettings.model_fields)


def _docs() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted(p for p in (ROOT / "docs").rglob("*.md") if p != HISTORY)
    return files


def _python() -> list[Path]:
    files: list[Path] = []
    for folder in ("sglang_hybrid", "bench", "tests", "scripts"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def _offences(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            hits = ISSUE_REFERENCE.findall(line) + RUN_DATE.findall(line)
            if hits:
                found.append(f"{path.relative_to(ROOT)}:{number}: {', '.join(hits)}")
    return found


def test_patterns_catch_what_they_are_for():
    assert ISSUE_REFERENCE.search("as issue" + " 25 asks") and ISSUE_REFERENCE.search("Issue" + " 7")
    assert RUN_DATE.search("the run of 2026" + "-12-06 05:36")
    assert not ISSUE_REFERENCE.search("an issue with 3 cells") and not RUN_DATE.search("1.10-1.62x, 2048-token")


@pytest.mark.parametrize("group", ["docs", "python"])
def test_no_internal_references(group):
    """No "issue N" and no run date outside docs/history.md: README.md and docs/**/*.md ("docs"), and every *.py
    under sglang_hybrid/, bench/, tests/ and scripts/ ("python")."""
    files = _docs() if group == "docs" else _python()
    assert files
    found = _offences(files)
    print("\n".join(found))
    assert not found, (f"{len(found)} line(s) with an issue number or a run date (move dated history to "
                       "docs/history.md; say what holds now):\n" + "\n".join(found))
