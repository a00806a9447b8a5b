# Sourced by scripts/setup.sh, test.sh and demo.sh: every later `python` is the project's environment.
#
# Why: a new user's system Python is often externally managed (PEP 668 refuses `pip install` into it), and a
# machine's system packages can hide a missing install step. So the project lives in the virtual environment that is
# active or, when none is, in `.venv` at the repository's root, created on first use. Sets HYBRID_VENV_NOTE to say
# which (scripts/setup.sh prints it).
_hybrid_venv="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    HYBRID_VENV_NOTE="the active virtual environment $VIRTUAL_ENV"
else
    HYBRID_VENV_NOTE="$_hybrid_venv (no virtual environment was active)"
    if [ ! -x "$_hybrid_venv/bin/python" ]; then
        python3 -m venv "$_hybrid_venv" || {
            echo "error: 'python3 -m venv $_hybrid_venv' failed: on Debian or Ubuntu install python3-venv" \
                 "(apt-get install python3-venv), or activate a virtual environment of your own and rerun" >&2
            return 1
        }
        HYBRID_VENV_NOTE="$_hybrid_venv, created now (no virtual environment was active)"
    fi
    # shellcheck disable=SC1091
    . "$_hybrid_venv/bin/activate"
fi
unset _hybrid_venv
