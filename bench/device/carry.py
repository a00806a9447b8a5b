"""Does the device run fit the lent machine's 64 MiB transfer? Sizes of the working tree and the carried wheels.

    python -m bench.device.carry [--wheels dist/device]

What travels to the GPU machine: tracked files, untracked files git does not ignore, ``shared/`` if present, and the
carried paths (here ``dist/device``: the wheels ``bash bench/device_run.sh --prepare`` put there). The machine has
Python 3.12 and torch but no pydantic (``HybridSettings``) and no build of our Rust extension, so the wheel set must
hold pydantic and its four dependencies for cp312 manylinux x86_64 and, for the reference-loop check, the abi3 wheel
of ``sglang_hybrid`` (``scripts/build_wheel.sh``). Exit status 1 when the total is over the limit or a required wheel
is missing; the abi3 wheel is optional (its checks are then skipped on the device, and this says so).
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2 ** 20
#: (pattern, why); pydantic_core must be the cp312 manylinux x86_64 build
REQUIRED = (("pydantic-*.whl", "HybridSettings (sglang_plugin.config)"),
            ("pydantic_core-*-cp312-*manylinux*x86_64*.whl", "pydantic's compiled core for Python 3.12 x86_64"),
            ("annotated_types-*.whl", "pydantic dependency"),
            ("typing_inspection-*.whl", "pydantic dependency"),
            ("typing_extensions-*.whl", "pydantic dependency (newer than the machine's may be needed)"))
OPTIONAL = (("sglang_hybrid-*abi3*.whl", "the Rust extension (n-gram drafter) for the reference-loop check"),)


def _git_files(root: Path, *args) -> list:
    out = subprocess.run(["git", "ls-files", "-z", *args], cwd=root, capture_output=True, check=True).stdout
    return [root / p for p in out.decode().split("\0") if p]


def _size(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def _tree(path: Path) -> list:
    return [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else ([path] if path.is_file() else [])


def mib(n: int) -> str:
    return f"{n / 2 ** 20:.2f} MiB"


def check(root: Path, wheels: Path, log=print) -> int:
    tracked = _size(_git_files(root))
    untracked = _size(_git_files(root, "--others", "--exclude-standard"))
    shared = _size(_tree(root / "shared"))
    whl = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    carried = _size(_tree(wheels))
    total = tracked + untracked + shared + carried
    log(f"carry check (limit {mib(LIMIT)} for everything that travels):")
    log(f"  tracked files                {mib(tracked):>12}")
    log(f"  untracked, not ignored       {mib(untracked):>12}")
    log(f"  shared/                      {mib(shared):>12}")
    shown = wheels.relative_to(root) if wheels.is_relative_to(root) else wheels
    log(f"  carried {str(shown) + '/':<20} {mib(carried):>12}")
    for w in whl:
        log(f"    {w.name:<78} {mib(w.stat().st_size):>10}")
    log(f"  total                        {mib(total):>12}  ({100 * total / LIMIT:.0f} % of the limit)")
    status = 0
    names = [w.name for w in whl]
    for pattern, why in REQUIRED:
        hits = fnmatch.filter(names, pattern)
        if len(hits) != 1:
            log(f"  MISSING wheel {pattern} ({why})" if not hits else f"  TWO versions of {pattern}: {hits}")
            status = 1
    for pattern, why in OPTIONAL:
        if not fnmatch.filter(names, pattern):
            log(f"  no {pattern}: {why} will be SKIPPED on the device (build it with scripts/build_wheel.sh, then "
                "bash bench/device_run.sh --prepare)")
    if total > LIMIT:
        log(f"  OVER THE LIMIT by {mib(total - LIMIT)}")
        status = 1
    log("  fits" if status == 0 else "  NOT READY")
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", default=os.environ.get("HYBRID_DEVICE_WHEELS", "dist/device"))
    args = ap.parse_args(argv)
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    return check(root, root / args.wheels)


if __name__ == "__main__":
    sys.exit(main())
