"""The settings reference of docs/sglang.md, generated from ``HybridSettings``.

    python -m sglang_hybrid.tools.settings_doc            # print the Markdown table of every setting
    python -m sglang_hybrid.tools.settings_doc --write    # rewrite the table between the markers in docs/sglang.md
    python -m sglang_hybrid.tools.settings_doc --check    # exit 1 when that table differs from the settings

Why generated: every setting's name, type, default and description already live in one place, the pydantic model
``sglang_hybrid.sglang_plugin.config.HybridSettings``; a hand-kept copy in the docs drifts from it. The table has one
row per field: the name, its environment variable (``SGLANG_HYBRID_<NAME>``), the type with its bounds, the default,
and the field's description. ``tests/test_docs.py::test_settings_doc`` fails when the block in docs/sglang.md is stale.

Each field's description is one line (at most ``MAX_LINE`` characters) followed by its docs anchor,
``(docs/sglang.md#setting-<name>)``: the id this generator gives the setting's row (``anchor``), so the pointer a
reader of the code follows always exists. Longer explanations belong in docs/sglang.md's prose. A description that
breaks the rule stops the generation with the setting's name and the fix.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional, Union, get_args, get_origin

BEGIN = "<!-- settings:begin -->"
END = "<!-- settings:end -->"
#: docs/sglang.md of this checkout
DOC = Path(__file__).resolve().parents[2] / "docs" / "sglang.md"

_BOUNDS = (("ge", "[", None), ("gt", "(", None), ("le", None, "]"), ("lt", None, ")"))
#: the longest description line (its docs anchor aside)
MAX_LINE = 120
_DOCS_ANCHOR = re.compile(r"\s*\(docs/sglang\.md#(?P<id>[A-Za-z0-9_-]+)\)$")


class SettingsDocError(RuntimeError):
    """The doc has no settings block (or a broken one), or a setting's description breaks the one-line rule; the
    message names the fix."""


def _bounds(metadata) -> str:
    """`` in [1, 32]``-style text for annotated_types bounds (Ge, Gt, Le, Lt) found in ``metadata``."""
    low = high = None
    for item in metadata:
        inner = getattr(item, "metadata", None)        # a FieldInfo inside Annotated carries its own constraints
        if inner:
            nested = _bounds(inner)
            if nested:
                return nested
        for attr, opening, closing in _BOUNDS:
            value = getattr(item, attr, None)
            if value is None or isinstance(item, type):
                continue
            if opening:
                low = f"{opening}{value}"
            else:
                high = f"{value}{closing}"
    if low and high:
        return f" in {low}, {high}"
    if low:
        return f" {'>=' if low[0] == '[' else '>'} {low[1:]}"
    if high:
        return f" {'<=' if high[-1] == ']' else '<'} {high[:-1]}"
    return ""


def type_text(annotation: Any, metadata=()) -> str:
    """A reader's name for a field's type: ``int in [1, 32]``, ``choose or merge``, ``list[int] or none``."""
    if annotation is type(None):
        return "none"
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is typing.Annotated:
        return type_text(args[0], args[1:])
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return " or ".join(type_text(a, metadata) for a in args)
    if origin in (list, tuple, set):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]" if args else origin.__name__
    if origin is dict:
        return "dict"
    name = getattr(annotation, "__name__", None) or str(annotation)
    return name + _bounds(metadata)


def default_text(field) -> str:
    """The field's default as the docs and a TOML file spell it (``none`` for None, JSON for the rest)."""
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{json.dumps(value)}`"


def anchor(name: str) -> str:
    """The id of setting ``name``'s row in the reference: link to it as ``docs/sglang.md#setting-<name>``."""
    return f"setting-{name}"


def description_line(name: str, description: Optional[str]) -> str:
    """The one line of setting ``name``'s description, its docs anchor cut off. Raises ``SettingsDocError`` when the
    description does not end with ``(docs/sglang.md#setting-<name>)``, spans lines or runs past ``MAX_LINE``."""
    want = f"(docs/sglang.md#{anchor(name)})"
    found = _DOCS_ANCHOR.search(description or "")
    if found is None or found.group("id") != anchor(name):
        raise SettingsDocError(f"the description of setting {name!r} must end with its docs anchor {want!r}; add it "
                               "in HybridSettings (sglang_hybrid/sglang_plugin/config.py)")
    line = description[:found.start()]
    if "\n" in line or len(line) > MAX_LINE:
        raise SettingsDocError(f"the description of setting {name!r} must be one line of at most {MAX_LINE} "
                               f"characters (it has {len(line)}); move the rest into docs/sglang.md's prose")
    return line


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render_table() -> str:
    """The Markdown table of every ``HybridSettings`` field, in declaration order (no markers)."""
    from sglang_hybrid.sglang_plugin.config import ENV_PREFIX, HybridSettings

    rows = ["| setting | environment variable | type | default | description |", "|---|---|---|---|---|"]
    for name, field in HybridSettings.model_fields.items():
        rows.append("| " + " | ".join([
            f"`{name}`", f"`{ENV_PREFIX}{name.upper()}`", _cell(type_text(field.annotation, field.metadata)),
            _cell(default_text(field)),
            f'<a id="{anchor(name)}"></a>' + _cell(description_line(name, field.description)),
        ]) + " |")
    return "\n".join(rows) + "\n"


def render_block() -> str:
    """The generated block, markers included."""
    return (f"{BEGIN}\n<!-- generated by `python -m sglang_hybrid.tools.settings_doc --write` from HybridSettings "
            f"(sglang_hybrid/sglang_plugin/config.py): edit the descriptions there, then rerun -->\n"
            f"{render_table()}{END}")


def _span(text: str) -> tuple[int, int]:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0 or end < start or text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SettingsDocError(f"expected one {BEGIN!r} followed by one {END!r} in the doc; add both markers where "
                               "the settings table belongs, then run with --write")
    return start, end + len(END)


def current_block(text: str) -> str:
    """The block (markers included) as the doc holds it now."""
    start, end = _span(text)
    return text[start:end]


def rewrite(text: str) -> str:
    """``text`` with its settings block replaced by the generated one."""
    start, end = _span(text)
    return text[:start] + render_block() + text[end:]


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.tools.settings_doc",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the block between the markers in the doc")
    group.add_argument("--check", action="store_true", help="exit 1 when the doc's block is stale")
    ap.add_argument("--doc", type=Path, default=DOC, help=f"the Markdown file holding the block (default: {DOC})")
    args = ap.parse_args(argv)
    try:
        if not (args.write or args.check):
            sys.stdout.write(render_table())
            return 0
        text = args.doc.read_text()
        if args.check:
            if current_block(text) != render_block():
                print(f"{args.doc}: the settings table is stale; run python -m sglang_hybrid.tools.settings_doc "
                      "--write", file=sys.stderr)
                return 1
            print(f"{args.doc}: the settings table is current")
            return 0
        new = rewrite(text)
    except (OSError, SettingsDocError) as e:
        print(f"{args.doc}: {e}", file=sys.stderr)
        return 2
    if new != text:
        args.doc.write_text(new)
        print(f"{args.doc}: settings table rewritten")
    else:
        print(f"{args.doc}: settings table already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
