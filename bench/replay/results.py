"""The frozen evaluation: one results file the README's and docs/benchmarks.md's replay tables are rendered from.

    python -m bench.replay.results --write     # re-render the tables from bench/results/realistic.json
    python -m bench.replay.results --check     # exit 1 when a rendered table differs from the file (a test runs it)

Why: figures copied by hand drift from the run that produced them, and tables stitched from several runs mix
configurations. The realistic replay (``python -m bench.replay --realistic``, and its ``--miscalibration`` sweep)
writes its section of `RESULTS`; every table between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` markers
in `DOCUMENTS` is rendered from that file and nothing else.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
#: the committed results file
RESULTS = ROOT / "bench" / "results" / "realistic.json"
#: the documents holding rendered tables
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md")
#: the README's columns: (title, workload, batch)
COLUMNS = (("code, B=4", "code", 4), ("code, B=128", "code", 128), ("edit-dense code, B=4", "code-edit", 4),
           ("edit-dense code, B=128", "code-edit", 128), ("chat, B=4", "chat", 4), ("chat, B=128", "chat", 128))
REAL = "real"
#: the README launch with ``ragged_verify=on`` (``bench.replay.realistic.RAGGED``)
RAGGED = "as built, ragged"
#: the depth below which the results file writes each value on one line (file > section > list > cell)
FLAT_DEPTH = 3
HEADLINE = "SIM alpha=0.7 copy=0.90"


def write_section(name: str, section: dict, path: Path = RESULTS) -> Path:
    """Replace one section (``realistic`` or ``miscalibration``) of the results file, keeping the others."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[name] = section
    path.write_text(dumps(data) + "\n")
    return path


def dumps(obj, depth: int = 0) -> str:
    """The results file's JSON: sections and their lists laid out one entry per line, each cell and target on one
    line, so a rerun's diff names the cells that changed (indented throughout, the file ran to 7,000 lines)."""
    if depth >= FLAT_DEPTH or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, sort_keys=True, default=str)
    pad = " " * (depth + 1)
    if isinstance(obj, dict):
        body = [f"{pad}{json.dumps(k)}: {dumps(v, depth + 1)}" for k, v in sorted(obj.items())]
        return "{\n" + ",\n".join(body) + "\n" + " " * depth + "}"
    return "[\n" + ",\n".join(pad + dumps(v, depth + 1) for v in obj) + "\n" + " " * depth + "]"


def _cells(section: dict) -> dict:
    return {(c["source"], c["mode"], c["workload"], c["batch"]): c for c in section.get("cells", [])}


def _ci(t) -> str:
    return f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}]"


def _x(t) -> str:
    return f"{t[0]:.2f}x"


def _row(title: str, label: Optional[str], cells: dict, source: str, fmt, mode: str = "as built") -> str:
    """One table row over `COLUMNS` (``mode``: the README's launch, "as built", unless named), with a label column
    unless ``label`` is None."""
    vals = []
    for _, w, b in COLUMNS:
        c = cells.get((source, mode, w, b))
        vals.append(fmt(c) if c is not None else "—")
    return f"| {title} | " + " | ".join(vals) + (f" | {label} |" if label is not None else " |")


def readme_table(data: dict) -> str:
    """The README's results table: the real drafters' rows, then the simulated head's, then how the launch holds
    under a miscalibrated head, each figure labelled."""
    real = data.get("realistic", {})
    cells = _cells(real)
    head = "| figure | " + " | ".join(t for t, _, _ in COLUMNS) + " | label |"
    rows = [head, "|---" * (len(COLUMNS) + 2) + "|"]
    rows.append(_row("real drafters: HYBRID / best single drafter [95% CI]", "SIMULATED step times", cells, REAL,
                     lambda c: _ci(c["vs_single"])))
    rows.append(_row("real drafters, launched with `ragged_verify=on`: HYBRID / best single drafter [95% CI]",
                     "SIMULATED step times", cells, REAL, lambda c: _ci(c["vs_single"]), mode=RAGGED))
    rows.append(_row("real drafters: the best single drafter", "chosen on tuning data", cells, REAL,
                     lambda c: _name(c["single_name"])))
    rows.append(_row("real drafters: HYBRID / no speculation", "SIMULATED step times", cells, REAL,
                     lambda c: _x(c["vs_nospec"])))
    rows.append(_row("simulated head: HYBRID / best single drafter [95% CI]", "SIMULATED", cells, HEADLINE,
                     lambda c: _ci(c["vs_single"])))
    rows.append(_row("simulated head: HYBRID / no speculation", "SIMULATED", cells, HEADLINE,
                     lambda c: _x(c["vs_nospec"])))
    rows.append(_row("simulated head: chain oracle / no speculation", "SIMULATED", cells, HEADLINE,
                     lambda c: f"{c['oracle'] / c['no_spec']:.2f}x"))
    mis = data.get("miscalibration")
    if mis:
        worst: dict = {}
        for c in mis.get("cells", []):
            if c["mode"] != "as built":
                continue
            key = (c["workload"], c["batch"])
            if key not in worst or c["vs_single"][0] < worst[key]["vs_single"][0]:
                worst[key] = c
        vals = [f"{worst[(w, b)]['vs_single'][0]:.2f}" if (w, b) in worst else "—" for _, w, b in COLUMNS]
        rows.append("| miscalibrated head (T 0.5-2, bursty): worst HYBRID / best single drafter | "
                    + " | ".join(vals) + " | SIMULATED |")
    dens = real.get("edit_density", {})
    vals = [f"{dens[w][0]:.2f}" if w in dens else "—" for _, w, _ in COLUMNS]
    rows.append("| simulated head's text: share of copy positions | " + " | ".join(vals) + " | MEASURED |")
    return "\n".join(rows)


def _name(policy: str) -> str:
    """A policy's name for a reader: ``eagle_fixed_k4`` -> "EAGLE chain 4", ``eagle_tree_s5_t8_n16`` -> "EAGLE tree
    5/8/16", ``vllm_ngram_5_5_k16`` -> "prompt lookup 5/5 K16", and so on."""
    m = re.fullmatch(r"eagle_fixed_k(\d+)", policy)
    if m:
        return f"EAGLE chain {m.group(1)}"
    m = re.fullmatch(r"eagle_tree_s(\d+)_t(\d+)_n(\d+)", policy)
    if m:
        return "EAGLE tree " + "/".join(m.groups())
    m = re.fullmatch(r"vllm_ngram_(\d+)_(\d+)(?:_k(\d+))?", policy)
    if m:
        return f"prompt lookup {m.group(1)}/{m.group(2)}" + (f" K{m.group(3)}" if m.group(3) else " K8")
    for prefix, name in (("model_adaptive_k", "model-only adaptive K"), ("ngram_ours", "our n-gram"),
                         ("suffix", "suffix decoding")):
        if policy.startswith(prefix):
            rest = policy[len(prefix):]
            return name + rest if prefix.endswith("_k") else name + (f" K{rest[2:]}" if rest else " K8")
    return policy


def host_table(data: dict) -> str:
    """HYBRID / the best single drafter with the drafters' host work charged where each engine puts it (HYBRID's and
    our n-gram drafter's under the device step, vLLM's and Arctic's proposers after it), then the same way for all:
    overlapped, then added. A cell the run did not price both ways reads "—"."""
    cells = _cells(data.get("realistic", {}))
    rows = ["| HYBRID / best single drafter [95% CI] | " + " | ".join(t for t, _, _ in COLUMNS) + " |",
            "|---" * (len(COLUMNS) + 1) + "|"]
    for source, name in ((REAL, "real drafters"), (HEADLINE, "simulated head")):
        for key, how in (("vs_single", "as each engine places it"),
                         ("vs_single_host_overlapped", "overlapped for every drafter"),
                         ("vs_single_host_added", "added for every drafter")):
            rows.append(_row(f"{name}, host work {how}", None, cells, source,
                             lambda c, key=key: _ci(c[key]) if key in c else "—"))
    return "\n".join(rows)


def targets_table(data: dict) -> str:
    """Every target of the frozen run and its sweep, MET or MISSED, with its detail."""
    rows = ["| target | verdict | detail |", "|---|---|---|"]
    for section in ("realistic", "miscalibration"):
        for name, ok, detail in data.get(section, {}).get("targets", []):
            rows.append(f"| {name} | {'MET' if ok else 'MISSED'} | {detail} |")
    return "\n".join(rows)


def run_line(data: dict) -> str:
    """The line naming the run the tables come from."""
    parts = []
    for section in ("realistic", "miscalibration"):
        s = data.get(section)
        if s:
            parts.append(f"`{s['command']}` ({s['wall_s'] / 60:.1f} min on {s['machine']})")
    return "From " + " and ".join(parts) + "; the results file is `bench/results/realistic.json`."


RENDERERS = {"table": readme_table, "host": host_table, "targets": targets_table, "run": run_line}


def render(text: str, data: dict) -> str:
    """``text`` with every marked block re-rendered from ``data``."""
    def one(m):
        name = m.group(1)
        if name not in RENDERERS:
            raise KeyError(f"unknown results block {name!r} (known: {', '.join(RENDERERS)})")
        return f"<!-- results:{name} -->\n{RENDERERS[name](data)}\n<!-- /results:{name} -->"

    return re.sub(r"<!-- results:(\w+) -->\n.*?<!-- /results:\1 -->", one, text, flags=re.S)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="re-render the marked tables in place")
    ap.add_argument("--check", action="store_true", help="exit 1 when a marked table differs from the results file")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    data = json.loads(Path(args.results).read_text())
    stale = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        new = render(text, data)
        if new != text:
            stale.append(doc)
            if args.write:
                doc.write_text(new)
    if args.check and stale:
        print("stale results tables in " + ", ".join(str(d.relative_to(ROOT)) for d in stale)
              + ": run python -m bench.replay.results --write")
        return 1
    print(("rewrote " if args.write else "up to date: " if not stale else "stale: ")
          + (", ".join(str(d.relative_to(ROOT)) for d in stale) or "every marked table"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
