# ipcache-agent: see README.md.
GO ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: all build test bench lint generate clean

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

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

generate:
	$(GO) generate ./...

clean:
	rm -rf bin
