"""``python -m sglang_hybrid.check``: input handling (fast; the live runs are in ``test_sglang_live.py``)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_hybrid.check import CheckInputError, main, parse_modes, read_prompts

PROMPTS = Path(__file__).resolve().parents[1] / "sglang_hybrid" / "data" / "check_prompts.jsonl"


def test_shipped_prompts_read():
    prompts = read_prompts(str(PROMPTS))
    assert len(prompts) == 3 and all(p.startswith("<|im_start|>") for p in prompts)


@pytest.mark.parametrize("text,message", [
    ('{"text": "x"}\n', 'line 1: expected an object with a non-empty "prompt"'),
    ('{"prompt": ""}\n', "line 1"),
    ('\n\n{"prompt": "ok"}\nnot json\n', "line 4: not JSON"),
    ("\n", "no prompts"),
])
def test_bad_prompt_files_are_named(tmp_path, text, message):
    f = tmp_path / "p.jsonl"
    f.write_text(text)
    with pytest.raises(CheckInputError, match=message):
        read_prompts(str(f))
    with pytest.raises(CheckInputError, match="file not found"):
        read_prompts(str(tmp_path / "missing.jsonl"))


def test_modes_always_start_with_the_baseline():
    assert parse_modes("merge") == ["none", "merge"]
    assert parse_modes("choose,none,choose") == ["none", "choose"]
    with pytest.raises(CheckInputError, match="none, choose, merge"):
        parse_modes("fast")


def test_bad_input_exits_2_before_any_engine_starts(tmp_path, capsys):
    assert main(["--prompts", str(tmp_path / "missing.jsonl")]) == 2
    assert "file not found" in capsys.readouterr().err
    assert main(["--prompts", str(PROMPTS), "--max-new-tokens", "0"]) == 2
    assert main(["--prompts", str(PROMPTS), "--draft-model-path", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_help_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "sglang_hybrid.check", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--prompts" in out.stdout and "--cpu" in out.stdout
