# l0 — make test runs the tests, make bench the benchmarks. Both build the emulators
# the tests start (fake-gcs-server, versitygw) on first use; see scripts/emulators.sh.
#
# Two modules: the library (.) and the harness (harness/: l0bench, the integration,
# crash and fault tests, the simulation), a module of its own so that what only it
# needs never reaches the modules that import l0. ./... is one module's packages, so
# each target names the module it runs in; $(HARNESS) runs go in harness/.

GO ?= go
HARNESS = $(GO) -C harness
# Emulator-backed tests find the binaries through these variables.
WITH_EMULATORS = env $$(scripts/emulators.sh)

.PHONY: test vet emulators bench bench-md bench-substrate crash fuzz sim l0ctl

# Every decoder's fuzz target, as package:Target; fuzz-all runs each for $(1).
FUZZ_TARGETS = ./internal/part/:FuzzOpenAndRead ./internal/part/:FuzzDecodeWithValidChecksums \
	./internal/tail/:FuzzDecode ./internal/tail/:FuzzDecodeChain ./manifest/:FuzzDecode ./manifest/:FuzzDamagedManifest \
	./wal/:FuzzDecodePage ./wal/:FuzzDecodeMarks
fuzz-all = for t in $(FUZZ_TARGETS); do GO=$(GO) scripts/fuzz.sh "$${t%%:*}" "$${t\#\#*:}" $(1) || exit 1; done

# The harness's test of a user module's go.sum works offline, from the module
# cache: the go list first puts there what go mod tidy loads (tests of
# dependencies included), once.
#
# The two modules' tests run side by side, one package at a time each: as many
# packages at once as one go test of both would run on two cores, but neither
# module waits for the other's slowest package.
test: vet
	$(HARNESS) list -e -test -deps all > /dev/null
	@$(WITH_EMULATORS) $(GO) test -p 1 -race -count=1 -timeout 20m ./... & lib=$$!; \
	$(WITH_EMULATORS) $(HARNESS) test -p 1 -race -count=1 -timeout 20m ./...; harness=$$?; \
	wait $$lib; lib=$$?; \
	if [ $$lib -ne 0 ] || [ $$harness -ne 0 ]; then echo "make test: the library's tests exited $$lib, the harness's $$harness"; exit 1; fi
	$(call fuzz-all,5s)

# Every decoder's fuzz target (part, tail, manifest, WAL page and watermark), 5 m
# each instead of make test's 5 s.
fuzz:
	$(call fuzz-all,5m)

# staticcheck is pinned in tools/go.mod, a module of its own so that it never
# reaches the modules that import l0. go tool -n builds it there and prints its
# path; it runs here and in harness/, so that ./... is each module's packages.
vet:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(HARNESS) vet ./...
	staticcheck="$$($(GO) -C tools tool -n staticcheck)" && "$$staticcheck" ./... && cd harness && "$$staticcheck" ./...

# l0ctl, the operator's tool (cmd/l0ctl), built into the repository's root:
# ./l0ctl -h lists its commands.
l0ctl:
	$(GO) build -o l0ctl ./cmd/l0ctl

# Builds fake-gcs-server and versitygw at pinned versions into
# $${L0_EMULATOR_CACHE:-~/.cache/l0/emulators}, once per version.
emulators:
	@scripts/emulators.sh

# l0bench's default suite; figures on stdout, one JSON line per result in
# l0bench-results.jsonl. Flags: make bench BENCHFLAGS=-h. It is built in harness/
# and runs here, so that the files it writes land here.
l0bench = @bin="$$(mktemp -d)" && trap 'rm -rf "$$bin"' EXIT && \
	$(HARNESS) build -o "$$bin/l0bench" -ldflags "-X main.commit=$$(git rev-parse --short HEAD 2>/dev/null)" ./cmd/l0bench && \
	"$$bin/l0bench" $(1)
bench:
	$(call l0bench,$(BENCHFLAGS))

# make bench, whose results also replace those in BENCHMARKS.md: each scenario run
# rewrites its section there, the rest of the file stays as it was. make bench-md
# BENCHFLAGS="-scenario open" rewrites one section.
bench-md:
	$(call l0bench,-markdown BENCHMARKS.md $(BENCHFLAGS))

# The substrate drivers' Go benchmarks: 64 KiB objects per driver (and the GCS
# driver against fake-gcs-server served in-process, in harness/).
bench-substrate:
	$(WITH_EMULATORS) $(GO) test -run '^$$' -bench . -benchtime 2s ./substrate/...
	$(HARNESS) test -run '^$$' -bench . -benchtime 2s ./internal/fakegcs/

# The kill -9 campaign: hundreds of kill points instead of make test's 20.
crash:
	$(HARNESS) test -count=1 -timeout 60m -run 'TestKilled|TestAKilled|TestLocalMode' ./tests/ -args -kills 400

# The simulation for SIM_TIME (default 10 minutes) of fresh random seeds, or for
# SIM_SEEDS seeds, after the fixed ones make test runs, every other one in fleet
# mode; each seed prints, and a failure prints its trace and the command that
# replays it.
ifeq ($(SIM_SEEDS),)
SIM_TIME ?= 10m
endif
SIM_SEEDS ?= 0
SIM_TIME ?= 0s
# The models follow: the protocol model with 50 times make test's traces per
# invariant, the chain model with 10 times.
sim:
	$(HARNESS) test -count=1 -timeout 0 -v -run 'TestSimulationHoldsTheInvariants$$' ./internal/sim/ -args -sim.time $(SIM_TIME) -sim.seeds $(SIM_SEEDS)
	$(GO) test -count=1 -timeout 0 -v -run 'TestTheChainModelHoldsItsInvariants$$' ./model/ -args -samples 2000
	$(GO) test -count=1 -timeout 0 -v -run 'TestTheProtocolModelHoldsItsInvariants$$' ./model/ -args -samples 10000
