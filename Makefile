# netplane: the network control plane of a Kubernetes cluster in one binary.
# `make demo` brings up the lab; `make test` runs every test. Both install
# what they need on a fresh Debian machine (as root) through `make tools`.

SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/netplane/netplane/internal/version.Version=$(VERSION) -X github.com/netplane/netplane/internal/version.Commit=$(COMMIT)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
TEST_TIMEOUT ?= 50m

# The image is tagged with the chart's appVersion, so the chart's defaults find it.
IMAGE ?= netplane/netplane:$(shell awk '/^appVersion:/ {gsub(/"/, "", $$2); print $$2}' charts/netplane/Chart.yaml)

.PHONY: all build image tools anchors test unit bench lint demo demo-down conformance clean

all: build

build: ## the two binaries, into bin/
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/netplane ./cmd/netplane
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/netplane-cni ./cmd/netplane-cni

image: build ## bin/netplane-image.tar: the container image, built without Docker or a registry
	cd hack/tools/image && $(GO) run . -bin $(BIN) -ref $(IMAGE) -out $(BIN)/netplane-image.tar
	@echo "load it on a node with: ctr -n k8s.io images import $(BIN)/netplane-image.tar"

tools: ## packages (apt-get) and kube-apiserver & co. built from the pinned module
	@./hack/install-tools.sh

anchors: tools ## the upstream systems the benchmarks compare against
	@./hack/build-anchors.sh $(BIN)

test: ## everything: unit, integration and end-to-end; needs root
	@if [ "$$(id -u)" != 0 ]; then echo "make test needs root (network namespaces, nftables, apt-get)" >&2; exit 1; fi
	@$(MAKE) --no-print-directory tools build image
	@./hack/build-e2e.sh $(BIN)
	NETPLANE_E2E_REQUIRED=1 NETPLANE_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	cd charts && NETPLANE_E2E_REQUIRED=1 NETPLANE_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

unit: ## the fast tests only: no root, no API server
	$(GO) test -count=1 -short ./...
	cd charts && $(GO) test -count=1 -short -run 'Lint|Schema|Render' ./...

bench: anchors build ## benchmarks, each with its ratio against the upstream system built by make anchors
	NETPLANE_BIN_DIR=$(BIN) $(GO) test -v -count=1 -run '^$$' -bench . -benchtime 1x -timeout 60m ./...

lint: ## gofmt, go vet, staticcheck, helm lint (through the Helm SDK)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd charts && $(GO) vet ./... && $(GO) test -count=1 -run TestChartPassesHelmLintStrict ./...

demo: ## the lab: a multi-node cluster in network namespaces, netplane installed by its Helm chart
	@./hack/demo.sh up

conformance: tools build image ## Kubernetes' own [sig-network] e2e suites against the lab (SUITES="conformance netpol network cnp"; LAB=ipv4|dual|ipv6|zones)
	@LAB='$(LAB)' ./hack/conformance.sh $(SUITES)

demo-down: ## remove everything the demo made
	@./hack/demo.sh down

clean:
	rm -rf $(BIN)
