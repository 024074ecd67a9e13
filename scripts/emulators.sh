#!/usr/bin/env bash
# Builds the emulators the tests start as processes, at pinned versions, into a cache
# directory outside the checkout. A version already built is reused, so a fresh clone on
# the same machine does not rebuild it. Prints the binaries' paths as make variables.
set -euo pipefail

FAKE_GCS_VERSION=v1.56.1
VERSITYGW_VERSION=v1.8.0
CACHE="${L0_EMULATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/l0/emulators}"

build() { # name version package
	local dir="$CACHE/$1-$2"
	if [[ -x "$dir/$1" ]]; then
		return
	fi
	echo "emulators: building $1 $2 into $dir (takes a few minutes once)" >&2
	local tmp
	tmp="$(mktemp -d "$CACHE/.build-$1-XXXXXX")"
	GOBIN="$tmp" GOFLAGS=-mod=mod go install "$3@$2" >&2
	mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp" # a concurrent build won the rename
}

mkdir -p "$CACHE"
build fake-gcs-server "$FAKE_GCS_VERSION" github.com/fsouza/fake-gcs-server &
gcs=$!
build versitygw "$VERSITYGW_VERSION" github.com/versity/versitygw/cmd/versitygw &
s3=$!
wait "$gcs"
wait "$s3"

echo "L0_FAKE_GCS_SERVER=$CACHE/fake-gcs-server-$FAKE_GCS_VERSION/fake-gcs-server"
echo "L0_VERSITYGW=$CACHE/versitygw-$VERSITYGW_VERSION/versitygw"
