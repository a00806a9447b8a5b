"""``python -m sglang_hybrid.check``: input handling, chat rendering and the verdict (fast; the live runs are in
``test_sglang_live.py``)."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_hybrid.check import (EXIT_BAD_INPUT, EXIT_FAIL, EXIT_NOT_CHECKED, EXIT_PASS, CheckInputError, Prompt,
                                 encode, main, not_checked_reason, parse_modes, read_prompts, record, render, verdict)

PROMPTS = Path(__file__).resolve().parents[2] / "sglang_hybrid" / "data" / "check_prompts.jsonl"
USER = {"role": "user", "content": "Explain in two sentences why the sky looks blue."}


def test_shipped_prompts_read():
    """Two code edits as raw text in SmolLM2's format, one ShareGPT question as chat messages."""
    prompts = read_prompts(str(PROMPTS))
    assert len(prompts) == 3
    raw, chat = [p for p in prompts if p.text is not None], [p for p in prompts if p.messages is not None]
    assert len(raw) == 2 and all(p.text.startswith("<|im_start|>") for p in raw)
    assert len(chat) == 1 and chat[0].messages[0]["role"] == "user" and chat[0].where.endswith("line 2")


def test_prompts_and_messages_read_side_by_side(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "raw"}) + "\n\n" + json.dumps({"id": "x", "messages": [USER]}) + "\n")
    raw, chat = read_prompts(str(f))
    assert raw == Prompt(f"--prompts {f}, line 1", text="raw")
    assert chat == Prompt(f"--prompts {f}, line 3", messages=[USER])


@pytest.mark.parametrize("text,message", [
    ('{"text": "x"}\n', 'line 1: expected a "prompt" string .* or a "messages" list'),
    ('["x"]\n', "line 1: expected a JSON object"),
    ('{"prompt": ""}\n', 'line 1: "prompt" must be a non-empty string'),
    ('{"prompt": 3}\n', 'line 1: "prompt" must be a non-empty string'),
    ('\n\n{"prompt": "ok"}\nnot json\n', "line 4: not JSON"),
    ("\n", "no prompts"),
    ('{"prompt": "a", "messages": [{"role": "user", "content": "a"}]}\n', 'line 1: has both "prompt" and "messages"'),
    ('{"messages": []}\n', 'line 1: "messages" must be a non-empty list'),
    ('{"messages": {"role": "user", "content": "a"}}\n', 'line 1: "messages" must be a non-empty list'),
    ('{"prompt": "ok"}\n{"messages": [{"content": "a"}]}\n', 'line 2: message 1 needs a "role" and a "content"'),
    ('{"messages": [{"role": "system", "content": "s"}, {"role": "user"}]}\n', "line 1: message 2 needs a"),
    ('{"messages": ["hello"]}\n', "line 1: message 1 needs a"),
    ('{"messages": [{"role": "", "content": "a"}]}\n', 'message 1: "role" must be a non-empty string'),
    ('{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}\n',
     'message 1: "content" must be a string .* got list.*join text parts'),
    ('{"messages": [{"role": "user", "content": null}]}\n', '"content" must be a string .* got NoneType'),
])
def test_bad_prompt_files_are_named(tmp_path, text, message):
    f = tmp_path / "p.jsonl"
    f.write_text(text)
    with pytest.raises(CheckInputError, match=message) as e:
        read_prompts(str(f))
    assert f"--prompts {f}" in str(e.value)
    with pytest.raises(CheckInputError, match="file not found"):
        read_prompts(str(tmp_path / "missing.jsonl"))


def test_modes_always_start_with_the_baseline():
    assert parse_modes("merge") == ["none", "merge"]
    assert parse_modes("choose,none,choose") == ["none", "choose"]
    with pytest.raises(CheckInputError, match="none, choose, merge"):
        parse_modes("fast")
    with pytest.raises(CheckInputError, match="nothing to check; add choose and/or merge"):
        parse_modes("none")


def test_bad_input_exits_2_before_any_engine_starts(tmp_path, capsys):
    assert main(["--prompts", str(tmp_path / "missing.jsonl")]) == EXIT_BAD_INPUT == 2
    assert "file not found" in capsys.readouterr().err
    assert main(["--prompts", str(PROMPTS), "--max-new-tokens", "1"]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert main(["--prompts", str(PROMPTS), "--modes", "none"]) == 2
    assert main(["--prompts", str(PROMPTS), "--draft-model-path", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"messages": [{"role": "user", "content": 7}]}\n')
    assert main(["--prompts", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--prompts {bad}, line 2: message 1: \"content\" must be a string" in err and "got int" in err


# --- the verdict, on outputs shaped as sglang.Engine.generate returns them (SGLang 0.5.23) ---

def _out(ids, finish, verify_steps=None):
    """One ``Engine.generate`` result. SGLang adds the ``spec_*`` keys only to a speculative request that committed
    at least one verify step (``TokenizerManager._calculate_spec_decoding_metrics``)."""
    meta = {"id": "r", "finish_reason": finish, "prompt_tokens": 40, "weight_version": "default",
            "completion_tokens": len(ids), "cached_tokens": 0, "e2e_latency": 2.5}
    if verify_steps:
        meta.update(spec_accept_rate=0.0, spec_accept_length=len(ids) / verify_steps, spec_num_correct_drafts=0,
                    spec_num_proposed_drafts=verify_steps * 15, spec_verify_ct=verify_steps,
                    spec_correct_drafts_histogram=[verify_steps])
    return {"text": "...", "output_ids": ids, "meta_info": meta}


# A live CPU run (``--max-new-tokens 8 --modes none,merge``, SmolLM2): "Explain in two sentences why the sky looks
# blue." as chat messages gave these 8 ids in both modes, merge after 7 verify steps; as a raw prompt, id 2
# (end-of-sequence) at once in both modes, without spec_* keys.
EIGHT = [504, 6376, 4541, 4461, 975, 282, 253, 980]
STOPPED_AT_ONCE = _out([2], {"type": "stop", "matched": 2})


def test_sglang_sets_spec_verify_ct_only_after_a_verify_step():
    """The pinned SGLang's own code: ``spec_verify_ct`` reaches ``meta_info`` under a ``> 0`` guard, which is what
    ``not_checked_reason`` reads as "no verify step ran"."""
    import sglang.srt.managers.tokenizer_manager as tm

    src = inspect.getsource(tm.TokenizerManager._calculate_spec_decoding_metrics)
    assert "recv_obj.spec_verify_ct[i] > 0" in src and 'meta_info["spec_verify_ct"] = recv_obj.spec_verify_ct[i]' in src


def test_not_checked_reasons_name_the_fix():
    assert not_checked_reason(_out(EIGHT, {"type": "length", "length": 8}, verify_steps=4)["meta_info"]) is None
    why = not_checked_reason(STOPPED_AT_ONCE["meta_info"])
    assert "ended after 1 token(s) (stop token 2)" in why and '"messages"' in why
    why = not_checked_reason(_out([504], {"type": "length", "length": 1})["meta_info"])
    assert "raise --max-new-tokens" in why
    assert "before any verify step" in not_checked_reason(_out([504], {"type": "abort", "message": "x"})["meta_info"])


def test_record_marks_each_pair():
    ref = _out(EIGHT, {"type": "length", "length": 8})
    assert record(0, "none", ref, None, 1.0, None)["check"] == "reference"
    rec = record(0, "merge", _out(EIGHT, {"type": "length", "length": 8}, 7), {}, 1.0, ref, "messages")
    assert (rec["check"], rec["input"], rec["verify_steps"], rec["not_checked_reason"]) == ("matched", "messages", 7,
                                                                                          None)
    assert rec["accept_length"] == 8 / 7 and rec["accepted_drafts"] == 0
    rec = record(1, "merge", STOPPED_AT_ONCE, None, 1.0, STOPPED_AT_ONCE)
    assert rec["check"] == "not checked" and rec["matches_none"] is True and rec["verify_steps"] is None
    differs = _out(EIGHT[:7] + [13], {"type": "length", "length": 8}, 3)
    assert record(0, "choose", differs, {}, 1.0, ref)["check"] == "differs"


def _records(*pairs, ref=(_out(EIGHT, {"type": "length", "length": 8}), STOPPED_AT_ONCE)):
    """Records of a run over prompts 0..n-1: ``none`` (``ref``) first, then each (mode, [spec outputs]) against it."""
    recs = [record(i, "none", o, None, 1.0, None) for i, o in enumerate(ref)]
    for mode, outs in pairs:
        recs += [record(i, mode, o, {}, 1.0, ref[i]) for i, o in enumerate(outs)]
    return recs


def test_verdict_pass_only_when_every_request_was_verified():
    verified = _out(EIGHT, {"type": "length", "length": 8}, 3)
    line, status, message = verdict(_records(("merge", [verified, STOPPED_AT_ONCE])), 2, ["none", "merge"], False)
    assert (line["verdict"], status) == ("NOT CHECKED", EXIT_NOT_CHECKED) and EXIT_NOT_CHECKED == 3
    assert line["not_checked"][0]["prompt_index"] == 1 and line["not_checked"][0]["mode"] == "merge"
    assert (line["checked_pairs"], line["pairs"]) == (1, 2) and "--allow-unchecked" in message
    line, status, message = verdict(_records(("merge", [verified, STOPPED_AT_ONCE])), 2, ["none", "merge"], True)
    assert (line["verdict"], status) == ("NOT CHECKED", EXIT_PASS) and "Accepted by --allow-unchecked" in message
    # a run that checked nothing never succeeds, even with --allow-unchecked
    recs = _records(("merge", [STOPPED_AT_ONCE, STOPPED_AT_ONCE]), ref=(STOPPED_AT_ONCE, STOPPED_AT_ONCE))
    assert verdict(recs, 2, ["none", "merge"], True)[1] == EXIT_NOT_CHECKED
    # a difference is a FAIL whatever else happened
    differs = _out(EIGHT[:7] + [13], {"type": "length", "length": 8}, 3)
    line, status, _ = verdict(_records(("choose", [differs, STOPPED_AT_ONCE])), 2, ["none", "choose"], True)
    assert (line["verdict"], status, line["mismatches"]) == ("FAIL", EXIT_FAIL, [{"prompt_index": 0, "mode": "choose"}])
    # PASS: every speculative request verified and equal
    one = [r for r in _records(("merge", [verified, STOPPED_AT_ONCE])) if r["prompt_index"] == 0]
    line, status, message = verdict(one, 1, ["none", "merge"], False)
    assert (line["verdict"], status, line["not_checked"]) == ("PASS", EXIT_PASS, []) and message.startswith("PASS")


# --- chat messages through the model's own chat template (the embedded SmolLM2's tokenizer, as SGLang loads it) ---

@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from sglang_hybrid.check import load_tokenizer
    from sglang_hybrid.reference.models import ensure_converted

    return load_tokenizer(str(ensure_converted()))


def test_shipped_chat_line_renders_to_smollm2_template(smollm2_tokenizer):
    """The shipped chat line renders to the exact text it held before it became messages (SmolLM2's template adds
    its default system turn), so the live suite's token ids are unchanged; chat ids equal the tokenizer's own
    ``apply_chat_template(tokenize=True)``, raw ids the engine's encoding of the text."""
    chat = read_prompts(str(PROMPTS))[1]
    text = render(chat, smollm2_tokenizer)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>"
                    "\n<|im_start|>user\nhow can i find examples of websites that use omeka<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert encode(chat, smollm2_tokenizer) == smollm2_tokenizer.apply_chat_template(
        chat.messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    raw = Prompt("here", text=text)
    assert render(raw, smollm2_tokenizer) == text and encode(raw, smollm2_tokenizer) == smollm2_tokenizer(text)[
        "input_ids"] == encode(chat, smollm2_tokenizer)


def test_template_errors_name_the_line(smollm2_tokenizer, monkeypatch):
    chat = Prompt("--prompts p.jsonl, line 4", messages=[USER])
    monkeypatch.setattr(smollm2_tokenizer, "chat_template", "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(CheckInputError, match="line 4: the model's chat template rejected .*roles must alternate"):
        render(chat, smollm2_tokenizer)
    monkeypatch.setattr(smollm2_tokenizer, "chat_template", None)
    with pytest.raises(CheckInputError, match="line 4: \"messages\" need the model's chat template .* has none"):
        render(chat, smollm2_tokenizer)


def test_help_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "sglang_hybrid.check", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--prompts" in out.stdout and "--cpu" in out.stdout
    assert "--allow-unchecked" in out.stdout and "messages" in out.stdout
