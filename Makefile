# ipcache-agent: see README.md.
GO ?= go
# Go's default install place, for `sudo make ...` whose PATH lacks it.
export PATH := $(PATH):/usr/local/go/bin
STATICCHECK_VERSION ?= v0.8.2

.PHONY: all build test bench lint generate clean demo fuzz

all: build

build:
	$(GO) build -o bin/ipcache-agent ./cmd/ipcache-agent

# All tests, with the race detector. Tests that need root (BPF, TCX, network
# namespaces) skip with a message when not root, and never skip under CI=true.
test:
	$(GO) test -race -count=1 ./...

# Benchmarks only; compare runs with benchstat.
bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./...

# Each fuzz target for FUZZTIME (go test runs their seeds in `make test`).
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./labels
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeCheckpoint$$' -fuzztime $(FUZZTIME) ./identitycell
	$(GO) test -run '^$$' -fuzz '^FuzzIPCacheKey$$' -fuzztime $(FUZZTIME) ./datapathcell
	$(GO) test -run '^$$' -fuzz '^FuzzPolicyKey$$' -fuzztime $(FUZZTIME) ./datapathcell
	$(GO) test -run '^$$' -fuzz '^FuzzParseFile$$' -fuzztime $(FUZZTIME) ./policycell

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
