# ipcache-agent: see README.md.
GO ?= go
# Go's default install place, for `sudo make ...` whose PATH lacks it.
export PATH := $(PATH):/usr/local/go/bin
STATICCHECK_VERSION ?= v0.8.2

.PHONY: all build test bench bench-scale lint generate clean demo fuzz corpus

all: build

build:
	$(GO) build -o bin/ipcache-agent ./cmd/ipcache-agent
	$(GO) build -o bin/ipcache-agent-cni ./cmd/ipcache-agent-cni

# The public policy corpus (test/corpus/README.md): materializes the files of
# test/corpus/sources.tsv from the mirrors in CORPUS_MIRRORS (colon-separated)
# into CORPUS_OUT, validates each, and (as root) loads the accepted ones into
# the agent. Prints the report; CORPUS_FLAGS="" skips the agent runs.
CORPUS_MIRRORS ?=
CORPUS_OUT ?= /tmp/ipcache-agent-corpus
CORPUS_FLAGS ?= -enforce
corpus: build
	@test -n "$(CORPUS_MIRRORS)" || { echo "usage: make corpus CORPUS_MIRRORS=DIR[:DIR...] (test/corpus/README.md)"; exit 2; }
	$(GO) run ./test/corpus -mirrors $(CORPUS_MIRRORS) -out $(CORPUS_OUT) $(CORPUS_FLAGS)

# All tests, with the race detector. Tests that need root (BPF, TCX, network
# namespaces) skip with a message when not root, and never skip under CI=true.
# The timeout is go test's per package: cmd/ipcache-agent's binary tests,
# which wait on agents and traffic, come near its default of 10 minutes on
# a busy 2-core machine; a hung test still ends the run.
# The packages whose tests take longest are named first, longest first:
# go test builds and runs the packages in the order given (./... adds the
# others once), so each starts as soon as it is built and the short ones
# fill the slots beside them, rather than one long package (test/soak,
# last in ./...) running alone at the end.
test:
	$(GO) test -race -count=1 -timeout 25m ./cmd/ipcache-agent/ ./datapathcell/ ./test/soak/ \
		./cmd/bench-peer/ ./policyfile/ ./policycell/ ./ipcachecell/ ./...

# Benchmarks only; compare runs with benchstat.
bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./...

# The scale benchmark (as root; about 6 minutes on 2 vCPUs): 100k and 1M
# prefixes, IPv4 and mixed, against the raw BPF write floor. Its last line
# is the 1M IPv4 summary (see cmd/bench-scale/doc.go). BENCH_SCALE_FLAGS
# picks other sizes, e.g. BENCH_SCALE_FLAGS="-sizes 100000 -families ipv4".
BENCH_SCALE_FLAGS ?=
bench-scale:
	$(GO) build -o bin/bench-scale ./cmd/bench-scale
	./bin/bench-scale $(BENCH_SCALE_FLAGS)

# The agent against nftables (as root; needs nft): no filter, the agent
# binary and an nft inet table of interval sets, on the same namespaces and
# policy, for each size and family: traffic, load, change under load,
# memory (see cmd/bench-peer/doc.go). BENCH_PEER_FLAGS adds flags, e.g.
# BENCH_PEER_FLAGS="-o json" or "-lengths mixed". About 10 minutes, most
# of it at 1M ("Against nftables" in docs/SCALE.md).
BENCH_PEER_SIZES ?= 1000 100000 1000000
BENCH_PEER_FAMILIES ?= ipv4 mixed
BENCH_PEER_FLAGS ?=
.PHONY: bench-peer
bench-peer: build
	$(GO) build -o bin/bench-peer ./cmd/bench-peer
	./bin/bench-peer -agent bin/ipcache-agent -sizes "$(BENCH_PEER_SIZES)" -families "$(BENCH_PEER_FAMILIES)" $(BENCH_PEER_FLAGS)

# The endpoints benchmark (as root; about 6 minutes): 1,000 endpoint files
# to their policy in the kernel, p50/p99 against a baseline, and memory per
# endpoint (see cells/endpoints_bench_test.go).
.PHONY: bench-endpoints
bench-endpoints:
	$(GO) test -run='^$$' -bench=EndpointFileToKernel -benchtime=1x ./cells/

# The label peers benchmarks (the second as root; about 2 minutes): one
# endpoint relabelled under 500 policies with label peers, in the selector
# engine at 1x, 2x and 4x the whole (policycell), and from the endpoint
# source's Upsert to the kernel against a baseline without the policies
# (cells). See policycell/peers_bench_test.go, cells/peers_bench_test.go.
.PHONY: bench-peers
bench-peers:
	$(GO) test -run='^$$' -bench=PeerRelabel -benchmem -benchtime=200x ./policycell/
	$(GO) test -run='^$$' -bench=PeerLabelChangeToKernel -benchtime=1x ./cells/

# Each fuzz target for FUZZTIME (go test runs their seeds in `make test`;
# CI runs `make fuzz FUZZTIME=3s` after it). Every Fuzz function in the
# tree must be listed here as package:Target, or `make fuzz` fails. All
# targets run; the failing ones are listed at the end, their inputs are in
# <package>/testdata/fuzz/<Target>/. A target that fails with nothing but
# "context deadline exceeded" and writes no input hit the race of Go's fuzz
# coordinator at the end of -fuzztime (golang/go#75804, fixed in Go 1.27),
# which is reported and not counted.
# Each package's instrumented test binary is built once (`go test -c
# -fuzz`), one package after another: builds at once would each compile
# the shared dependencies on an empty build cache, and run for each of its
# targets from the package's directory,
# with the fuzz cache `go test -fuzz` would give it: `go test -fuzz` per
# target linked the same binary again for every target of a package.
FUZZTIME ?= 30s
FUZZ_TARGETS = \
	labels:FuzzParse labels:FuzzCIDRLabel \
	identitycell:FuzzDecodeCheckpoint \
	bpfmaps:FuzzIPCacheKey bpfmaps:FuzzIPCacheValue \
	bpfmaps:FuzzPolicyKey bpfmaps:FuzzPolicyValue \
	datapathcell:FuzzEnforceParser \
	policyfile:FuzzParse policyfile:FuzzParseCIDR \
	policyfile:FuzzParseCNP policyfile:FuzzParseNetworkPolicy \
	endpointfile:FuzzParse \
	fqdn:FuzzAnswer \
	internal/yamlread:FuzzReader
fuzz:
	@found=$$(grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | \
		sed 's|^\./\(.*\)/[^/]*:func |\1:|' | sort); \
	listed=$$(printf '%s\n' $(FUZZ_TARGETS) | sort); \
	if [ "$$found" != "$$listed" ]; then \
		echo "FUZZ_TARGETS lists:"; echo "$$listed"; \
		echo "but the fuzz targets in the tree are:"; echo "$$found"; exit 1; fi
	@work=$$(mktemp -d); trap 'rm -rf "$$work"' EXIT; log=$$work/log; failed=""; \
	cache=$$($(GO) env GOCACHE)/fuzz/$$($(GO) list -m); \
	for target in $(FUZZ_TARGETS); do \
		pkg=$${target%%:*}; name=$${target#*:}; inputs=$$pkg/testdata/fuzz/$$name; \
		bin=$$work/$$(echo "$$pkg" | tr / _).test; \
		if [ ! -e "$$bin" ] && ! $(GO) test -c -fuzz . -o "$$bin" ./$$pkg >"$$log" 2>&1; then \
			cat "$$log"; echo "fuzz $$name: ./$$pkg does not build"; failed="$$failed $$target"; continue; fi; \
		before=$$(ls "$$inputs" 2>/dev/null | wc -l); \
		echo "fuzz $$name in ./$$pkg for $(FUZZTIME)"; \
		status=0; (cd "$$pkg" && "$$bin" -test.run '^$$' -test.fuzz "^$$name\$$" -test.fuzztime $(FUZZTIME) \
			-test.fuzzcachedir "$$cache/$$pkg") >"$$log" 2>&1 || status=$$?; \
		grep -v '^fuzz: elapsed' "$$log"; \
		if [ $$status -ne 0 ]; then \
			after=$$(ls "$$inputs" 2>/dev/null | wc -l); \
			if [ "$$before" = "$$after" ] && grep -qx '    context deadline exceeded' "$$log" && \
				! grep -q 'Failing input written' "$$log"; then \
				echo "fuzz $$name: stopped by golang/go#75804 at the end of $(FUZZTIME), no failing input: not a failure"; \
			else failed="$$failed $$target"; fi; \
		fi; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz targets failed:$$failed"; exit 1; fi

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

generate:
	$(GO) generate ./...

# A narrated end-to-end run in network namespaces (as root): policy, allowed
# and denied traffic, a restart with the same identities and no lost packet,
# an expired restore released; cleans up after itself, also on failure.
demo: build
	bash demo/demo.sh

clean:
	rm -rf bin
