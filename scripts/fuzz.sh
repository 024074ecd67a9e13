#!/usr/bin/env bash
# fuzz.sh PACKAGE TARGET TIME: go test -fuzz TARGET for TIME in PACKAGE.
#
# Go 1.26's fuzz coordinator can fail a run whose -fuzztime ends while a worker is
# mid-call with a bare "context deadline exceeded" and no failing input
# (golang/go#75804, fixed in Go 1.27). A real finding always writes its input to
# testdata/fuzz and says so; a run that fails with the bare error and no input is
# the coordinator's race, and passes if the target's corpus replays clean.
set -uo pipefail
pkg=$1 target=$2 time=$3
GO=${GO:-go}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime "$time" "$pkg" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
	exit 0
fi
if grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written\|panic:\|_test\.go:[0-9]' "$out"; then
	echo "fuzz.sh: $target: the coordinator's deadline race (golang/go#75804), no failing input; replaying the corpus"
	exec "$GO" test -run "^${target}\$" -count=1 "$pkg"
fi
exit "$rc"
