"""The frozen evaluation: the README's and docs' replay tables are rendered from one results file
(`bench.replay.results`), and a stale table fails here."""
from __future__ import annotations

import json

import pytest

from bench.replay import results as R


def test_results_file_tables_in_the_docs_equal_the_file():
    data = json.loads(R.RESULTS.read_text())
    for doc in R.DOCUMENTS:
        text = doc.read_text()
        assert R.render(text, data) == text, f"{doc.name}: run python -m bench.replay.results --write"
    readme = R.DOCUMENTS[0].read_text()
    assert "<!-- results:table -->" in readme and "<!-- results:run -->" in readme
    assert R.main(["--check"]) == 0


def _cell(source, w, b, single, nospec):
    return {"source": source, "mode": "as built", "workload": w, "batch": b, "vs_single": [single, single - 0.1,
            single + 0.1], "vs_nospec": [nospec, nospec - 1, nospec + 1], "single_name": "eagle_fixed_k2",
            "oracle": 3.0, "no_spec": 1.0}


def test_results_file_every_readme_number_comes_from_the_file():
    data = {"realistic": {"cells": [_cell("real", "code", 4, 1.234, 2.5), _cell(R.HEADLINE, "chat", 128, 0.987, 1.5)],
                          "edit_density": {"code": [0.89, 0.6]}, "targets": [["t", True, "d"]],
                          "command": "c", "wall_s": 60, "machine": "m"}}
    table = R.readme_table(data)
    assert "1.23 [1.13, 1.33]" in table and "2.50x" in table and "0.99 [0.89, 1.09]" in table
    assert "EAGLE chain 2" in table and "| 0.89 |" in table and table.count("—") > 10
    doc = "a\n<!-- results:table -->\nold\n<!-- /results:table -->\nb\n"
    assert R.render(doc, data) == f"a\n<!-- results:table -->\n{table}\n<!-- /results:table -->\nb\n"
    with pytest.raises(KeyError, match="unknown results block"):
        R.render("<!-- results:nope -->\nx\n<!-- /results:nope -->", data)


def test_results_file_sections_are_replaced_one_at_a_time(tmp_path):
    path = tmp_path / "r.json"
    R.write_section("realistic", {"a": 1}, path)
    R.write_section("miscalibration", {"b": 2}, path)
    R.write_section("realistic", {"a": 3}, path)
    assert json.loads(path.read_text()) == {"realistic": {"a": 3}, "miscalibration": {"b": 2}}


def test_results_file_host_table_reads_both_accountings_and_marks_missing_ones():
    cell = dict(_cell("real", "code", 4, 1.0, 2.0), vs_single_host_overlapped=[0.91, 0.9, 0.92],
                vs_single_host_added=[1.11, 1.1, 1.12])
    table = R.host_table({"realistic": {"cells": [cell, _cell(R.HEADLINE, "code", 4, 0.95, 1.5)]}})
    lines = table.splitlines()
    assert len(lines) == 2 + 6 and all(line.count("|") == len(R.COLUMNS) + 2 for line in lines)
    assert "0.91 [0.90, 0.92]" in lines[3] and "1.11 [1.10, 1.12]" in lines[4]
    assert "0.95 [0.85, 1.05]" in lines[5] and lines[6].split("|")[2].strip() == "—"   # not priced both ways


def test_results_file_is_written_one_cell_per_line(tmp_path):
    cells = [_cell("real", "code", b, 1.0, 2.0) for b in (4, 32, 128)]
    path = R.write_section("realistic", {"cells": cells, "wall_s": 1.5}, tmp_path / "r.json")
    text = path.read_text()
    assert json.loads(text) == {"realistic": {"cells": cells, "wall_s": 1.5}}
    assert sum(1 for line in text.splitlines() if '"batch"' in line) == 3 and len(text.splitlines()) == 10


def test_results_file_names_the_runs_modes_and_sources_as_the_run_writes_them():
    from bench.replay import realistic as RR

    assert R.RAGGED == RR.RAGGED and R.HEADLINE == RR.label(RR.HEADLINE) and R.REAL == "real"
    cell = dict(_cell("real", "code", 4, 1.0, 2.0), mode=RR.RAGGED, vs_single=[1.08, 1.01, 1.1])
    assert "1.08 [1.01, 1.10]" in R.readme_table({"realistic": {"cells": [cell]}}).splitlines()[3]
