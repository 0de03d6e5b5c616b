#!/usr/bin/env bash
# The demo: create the guide's 3-step task, kill it after its artifact is
# published but before that step commits, show the status, resume, and print
# the journal and the single artifact.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ninelives=${NINELIVES:-$here/.venv/bin/ninelives}
work=${DEMO_DIR:-$here/demo}
# Both are used after the cd below: make them absolute first (a relative
# command path is relative to where make ran, not to the demo folder).
case $ninelives in */*) ninelives=$(cd "$(dirname "$ninelives")" && pwd)/$(basename "$ninelives") ;; esac
case $work in /*) ;; *) work=$PWD/$work ;; esac
rm -rf "$work" && mkdir -p "$work" && cd "$work"
cp -r "$here/examples/demo/." .
for name in $(env | grep -o '^AGENT_[A-Z_]*'); do unset "$name"; done
unset NINELIVES_DB NINELIVES_TOOLS NINELIVES_WORKSPACE

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

say ninelives create demo plan.json
"$ninelives" create demo plan.json

say AGENT_CRASH_AT=after_effect:2 ninelives run demo
set +e
AGENT_CRASH_AT=after_effect:2 "$ninelives" run demo
code=$?
set -e
echo "(exit $code: the process SIGKILLed itself after publishing the artifact, before committing step 2)"

say ninelives status demo --json
"$ninelives" status demo --json

say ninelives run demo
"$ninelives" run demo

say ninelives export demo
"$ninelives" export demo

say ls artifacts/
ls artifacts/
say cat artifacts/demo-2.md
cat artifacts/demo-2.md
echo
recovered=$("$ninelives" export demo | grep -c '"kind": "step_recovered"')
count=$(ls artifacts | wc -l | tr -d ' ')
echo
echo "step_recovered events: $recovered; artifacts: $count"
[ "$code" = 137 ] && [ "$recovered" = 1 ] && [ "$count" = 1 ]
