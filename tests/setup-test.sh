#!/usr/bin/env bash
# Checks tests/setup.sh itself on this machine (make test's set-up stage):
# with jq hidden from PATH it must report jq MISSING in --check (exit 1),
# and as a non-root user stop before anything is built, naming jq and the one
# command that installs it. Installs nothing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fail() { echo "setup-test: FAIL: $*" >&2; exit 1; }

# A PATH like this one without jq: every other command linked into a temp dir.
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  [ -d "$d" ] || continue
  for f in "$d"/*; do
    n=$(basename "$f")
    [ "$n" != jq ] && [ -x "$f" ] && [ ! -e "$bin/$n" ] && ln -s "$f" "$bin/$n"
  done
done

out=$(PATH="$bin" bash "$here/setup.sh" --check 2>&1) && fail "--check exited 0 with jq missing:
$out"
grep -Eq '^  MISSING  jq ' <<<"$out" || fail "--check did not report jq MISSING:
$out"

out=$(PATH="$bin" NMO_SETUP_AS_USER=1000 bash "$here/setup.sh" 2>&1) && fail "as a user it exited 0 with jq missing:
$out"
grep -q 'sudo apt-get update && sudo apt-get install -y jq' <<<"$out" ||
  fail "as a user it did not name the one install command:
$out"
echo "setup-test: ok (a missing jq is reported by --check, and as a user with the one command: sudo apt-get install -y jq)"
