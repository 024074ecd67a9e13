#!/usr/bin/env bash
# Installs Quint, the model checker of model/l0.qnt, at a pinned version from the npm
# registry into a cache directory outside the checkout, and prints the path of its
# quint binary. A version already installed is reused, so this is quick after the
# first run. It needs node and npm (Node 18 or later); nothing but the npm registry.
#
#   quint="$(scripts/quint.sh)"
#   "$quint" run model/l0.qnt --main l0 --backend typescript --invariant Invariants
#
# Always pass --backend typescript to `quint run`: the default backend downloads a
# Rust evaluator at run time. `quint verify` needs Java and Apalache;
# the model does not use it. go test ./model/ runs the model (see model_test.go).
set -euo pipefail

QUINT_VERSION=0.33.1
# Quint asks for antlr4ts ^0.5.0-alpha.4, which npm resolves to 0.5.0-dev: that
# release fails to load ("Class extends value undefined"). Pin the one that works.
ANTLR4TS_VERSION=0.5.0-alpha.4
CACHE="${L0_QUINT_CACHE:-$HOME/.cache/l0/quint}"
dir="$CACHE/quint-$QUINT_VERSION"
bin="$dir/node_modules/.bin/quint"

if [[ ! -x "$bin" ]]; then
	for tool in node npm; do
		if ! command -v "$tool" >/dev/null; then
			echo "quint.sh: $tool is not installed; Quint needs Node 18 or later and npm" >&2
			exit 1
		fi
	done
	echo "quint.sh: installing Quint $QUINT_VERSION into $dir (once)" >&2
	mkdir -p "$CACHE"
	tmp="$(mktemp -d "$CACHE/.install-$QUINT_VERSION-XXXXXX")"
	chmod 755 "$tmp"
	trap 'rm -rf "$tmp"' EXIT
	cat >"$tmp/package.json" <<EOF
{
  "private": true,
  "dependencies": { "@informalsystems/quint": "$QUINT_VERSION" },
  "overrides": { "antlr4ts": "$ANTLR4TS_VERSION" }
}
EOF
	# No install scripts: Quint needs none (the one it has, protobufjs's, only
	# prints a notice).
	npm install --prefix "$tmp" --no-audit --no-fund --ignore-scripts --loglevel=error >&2
	got="$("$tmp/node_modules/.bin/quint" --version)"
	if [[ "$got" != "$QUINT_VERSION" ]]; then
		echo "quint.sh: installed Quint says it is version $got, want $QUINT_VERSION" >&2
		exit 1
	fi
	# Another install running at the same time may have won the rename; its copy
	# is as good as ours.
	mv -T "$tmp" "$dir" 2>/dev/null || true
fi
echo "$bin"
