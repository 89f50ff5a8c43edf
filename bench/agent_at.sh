#!/bin/bash
# The verifier agent's zipapp as an earlier commit built it, for bench/verify_figures.py's A/B
# (--old; bench/verify_levers.sh's OLD): writes .abold/agent-REV.pyz (git-ignored; carry it), or
# into $ABOLD.
#
#   bench/agent_at.sh REV
set -eu -o pipefail
rev=${1:?usage: bench/agent_at.sh REV}
root=$(cd "$(dirname "$0")/.." && pwd)
short=$(git -C "$root" rev-parse -q --verify --short=7 "$rev^{commit}") || {
    echo "agent_at.sh: no commit '$rev' in $root" >&2
    exit 2
}
out=${ABOLD:-$root/.abold}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$short" umprov | tar -x -C "$work"
built=$(cd "$work" && python3 -c "
from pathlib import Path
from umprov.verify.bundle import agent_zipapp
print(agent_zipapp(cache=Path('cache').resolve()))")
mkdir -p "$out"
cp "$built" "$out/agent-$short.pyz"
echo "$out/agent-$short.pyz"
