#!/usr/bin/env bash
# demo.sh up|start|down|check: the netplane lab for people (`make demo`,
# `make demo-down`). `up` starts a multi-node cluster in network namespaces
# (see e2e/lab), deploys examples/ and checks the Service scenarios, one line
# per check with its timing; the cluster stays up afterwards. `start` only
# starts the cluster (what `make conformance` runs against). `down` removes
# everything the lab made, also after a crash. Needs root; changes nothing
# in the machine's own network namespace.
set -euo pipefail

cd "$(dirname "$0")/.."
STATE_DIR=${NETPLANE_LAB_DIR:-/var/lib/netplane-lab}
NODES=${NETPLANE_LAB_NODES:-2}
# 2 (the default) puts every second node on a second underlay subnet
# behind a router, which pods cross through the VXLAN overlay; 1 puts every
# node on one subnet.
# NETPLANE_LAB_STACK=upstream runs the systems netplane replaces instead
# (docs/conformance.md), on one subnet.
default_subnets=2
[ "${NETPLANE_LAB_STACK:-}" != upstream ] || default_subnets=1
SUBNETS=${NETPLANE_LAB_SUBNETS:-$default_subnets}
LAB=bin/netplane-lab

if [ "$(id -u)" != 0 ]; then
	echo "demo.sh: the lab needs root (network namespaces, containerd)" >&2
	exit 1
fi

# phase NAME CMD...: runs one phase of the demo and prints how long it took.
phase() {
	local name=$1 started rc=0
	shift
	started=$(date +%s)
	"$@" || rc=$?
	echo "phase: $name took $(( $(date +%s) - started ))s"
	return $rc
}

build() {
	mkdir -p bin
	go build -o "$LAB" ./e2e/lab/cmd/netplane-lab
}

start_lab() {
	# Tools (packages, kube binaries, helm), netplane's binaries and its image:
	# each built once, reused while up to date.
	# The upstream stack runs CoreDNS and upstream's images: all the tools.
	if [ "${NETPLANE_LAB_STACK:-}" = upstream ]; then
		phase tools make --no-print-directory tools
	else
		phase tools ./hack/install-tools.sh demo
	fi
	phase "build and image" make --no-print-directory build image
	phase "lab program" build
	if [ -e "$STATE_DIR/state.json" ]; then
		echo "a lab is already recorded in $STATE_DIR; removing it first (make demo-down)"
		"$LAB" down --state-dir="$STATE_DIR"
	fi
	phase "lab up" "$LAB" up --state-dir="$STATE_DIR" --nodes="$NODES" --subnets="$SUBNETS"
}

case "${1:-}" in
start)
	start_lab
	;;
up)
	start_lab
	echo "deploying examples/ and checking the scenarios:"
	status=0
	phase scenarios "$LAB" check --state-dir="$STATE_DIR" || status=$?
	echo
	cat "$STATE_DIR/ready"
	cat <<MSG

The cluster stays up for your own Services. Try:
  export KUBECONFIG=$STATE_DIR/kubeconfig
  kubectl get nodes -o wide; kubectl get pods -A -o wide; kubectl get endpointslices
  bin/kubectl exec client -- /testimage lookup nginx
  bin/kubectl exec client -- /testimage lookup --type=SRV _http._tcp.web.default.svc.cluster.local
  bin/kubectl exec client -- /testimage get http://nginx:8080/
Remove it with: make demo-down
MSG
	exit $status
	;;
check)
	build
	"$LAB" check --state-dir="$STATE_DIR"
	;;
down)
	if [ ! -x "$LAB" ]; then build; fi
	"$LAB" down --state-dir="$STATE_DIR"
	;;
*)
	echo "usage: $0 up|start|down|check" >&2
	exit 2
	;;
esac
