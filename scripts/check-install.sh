#!/usr/bin/env bash
# What a new user does first, checked on this tree (run by `make test`):
#  1. `make demo` in a fresh copy of the checkout: its own .venv, nothing reused;
#  2. `python -m build` (an sdist, then a wheel built from that sdist), the wheel
#     installed into a fresh virtualenv, and the demo run with that install,
#     which needs the packaged SQL migrations; py.typed must be in the wheel too.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
build_python=${BUILD_PYTHON:-$python}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ninelives-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() { printf '\n==> %s\n' "$*"; }

step "make demo in a fresh copy of the checkout"
mkdir "$tmp/checkout"
if git -C "$here" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # What a clone would hold: tracked and new files, nothing ignored (.venv, demo/).
    (cd "$here" && git ls-files -z --cached --others --exclude-standard) |
        (cd "$here" && while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) |
        (cd "$here" && tar --null -T - -cf -) | tar -xf - -C "$tmp/checkout"
else
    tar -C "$here" --exclude=./.venv --exclude=./demo --exclude=./dist -cf - . |
        tar -xf - -C "$tmp/checkout"
fi
# Without the caller's environment: a fresh shell has no NINELIVES_* or AGENT_* set.
env -u NINELIVES_DB -u NINELIVES_TOOLS -u MAKEFLAGS -u MAKELEVEL \
    make -C "$tmp/checkout" demo PYTHON="$python"
test -f "$tmp/checkout/demo/artifacts/demo-2.md"

step "python -m build: an sdist, and a wheel built from it"
"$build_python" -m build --outdir "$tmp/dist" "$here"
ls "$tmp/dist"
wheel=$(ls "$tmp"/dist/ninelives-*.whl)
ls "$tmp"/dist/ninelives-*.tar.gz >/dev/null

step "the wheel in a fresh virtualenv, running the demo"
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q "$wheel"
"$tmp/venv/bin/python" - <<'PY'
from importlib.resources import files

package = files("ninelives")
assert (package / "py.typed").is_file(), "py.typed is not in the wheel"
migrations = [p.name for p in (package / "store" / "sql" / "migrations").iterdir()]
assert any(n.endswith(".sqlite.sql") for n in migrations), migrations
assert any(n.endswith(".postgres.sql") for n in migrations), migrations
print(f"packaged: py.typed and {len(migrations)} migration files")
PY
env -u NINELIVES_DB -u NINELIVES_TOOLS NINELIVES="$tmp/venv/bin/ninelives" \
    DEMO_DIR="$tmp/wheel-demo" bash "$here/scripts/demo.sh"
step "make demo and the installed wheel both work"
