#!/usr/bin/env bash
# conformance.sh [SUITE...]: runs Kubernetes' own networking end-to-end
# tests (e2e.test, built from the pinned k8s.io/kubernetes module by
# hack/build-e2e.sh) against the lab, unmodified. It reuses the lab in
# $NETPLANE_LAB_DIR when one is up, else brings one up and leaves it up.
#
# Suites (all four by default):
#   conformance  every [sig-network] test tagged [Conformance]
#   netpol       the NetworkPolicy suite ([sig-network] Netpol)
#   network      the rest of [sig-network] that a two-node lab without a
#                cloud can run
#   cnp          network-policy-api v0.3.0's own suite, the
#                ClusterNetworkPolicy profile (hack/conformance-cnp.sh)
# Skipped patterns, each with its reason, are in e2e/conformance/skips.txt.
# With NETPLANE_LAB_STACK=upstream the lab runs the systems netplane
# replaces instead (e2e/lab/stack.go; make anchors builds them), for
# side-by-side results in docs/conformance.md.
# For each suite it prints passed / failed / skipped counts and keeps the
# JUnit report and the whole log in $NETPLANE_CONFORMANCE_DIR (default
# _output/conformance/DATE); it exits non-zero on any failure.
#
# NETPLANE_CONFORMANCE_FOCUS narrows a suite further (a regular
# expression over the test names), for a named subset.
# LAB (make conformance LAB=...) picks one of the labs docs/conformance.md
# records, with its suites unless SUITE is given: ipv4 and ipv6 (that family;
# conformance, netpol), dual (conformance; network with only the
# [Feature:IPv6DualStack] tests) and zones (three nodes in zones a, b, c on
# one subnet; network with only the topology and traffic-distribution
# tests, then conformance). It sets the NETPLANE_LAB_* variables not set.
# NETPLANE_CONFORMANCE_PROCS is the number of ginkgo processes (default 4):
# most tests wait on pods, so several share the 2 cores well; [Serial]
# tests still run alone, at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE_DIR=${NETPLANE_LAB_DIR:-/var/lib/netplane-lab}
OUT=$(realpath -m "${NETPLANE_CONFORMANCE_DIR:-_output/conformance/$(date -u +%Y-%m-%dT%H%M%SZ)}")
BIN=$(realpath -m "${NETPLANE_BIN_DIR:-bin}")
suites=("$@")
# network_focus: the LAB's focus for the network suite.
network_focus=
case ${LAB:-} in
'') lab_suites=(conformance netpol network cnp) ;;
ipv4 | ipv6) lab_suites=(conformance netpol) ;;
dual) lab_suites=(conformance network) network_focus='IPv6DualStack' ;;
zones)
	lab_suites=(network conformance) network_focus='Topology Hints|Traffic Distribution|HealthCheckNodePort correctly'
	export NETPLANE_LAB_NODES=${NETPLANE_LAB_NODES:-3} NETPLANE_LAB_SUBNETS=${NETPLANE_LAB_SUBNETS:-1}
	;;
*) echo "conformance.sh: unknown LAB $LAB (ipv4, dual, ipv6, zones)" >&2; exit 2 ;;
esac
case ${LAB:-} in ipv4 | ipv6 | dual) export NETPLANE_LAB_IP_FAMILY=${NETPLANE_LAB_IP_FAMILY:-$LAB} ;; esac
[ ${#suites[@]} -gt 0 ] || suites=("${lab_suites[@]}")

./hack/build-e2e.sh "$BIN"
if [ ! -e "$STATE_DIR/ready" ]; then
	./hack/demo.sh start
fi
nodes=$(KUBECONFIG=$STATE_DIR/kubeconfig "$BIN/kubectl" get nodes --no-headers 2>/dev/null | wc -l || true)
[ "$nodes" -gt 0 ] || nodes=${NETPLANE_LAB_NODES:-2}
# A lab that was up already is reused only if it is the one asked for.
# With LAB, netplane's stack unless NETPLANE_LAB_STACK says otherwise.
for want in "family=${NETPLANE_LAB_IP_FAMILY:-}" "stack=${NETPLANE_LAB_STACK:-${LAB:+netplane}}"; do
	have=$(grep -oE "\"${want%%=*}\": *\"[^\"]*\"" "$STATE_DIR/state.json" 2>/dev/null | cut -d'"' -f4 || true)
	if [ -n "${want#*=}" ] && [ -n "$have" ] && [ "$have" != "${want#*=}" ]; then
		echo "conformance.sh: the lab up in $STATE_DIR has ${want%%=*} $have, not ${want#*=}: make demo-down first" >&2
		exit 2
	fi
done
if [ -n "${NETPLANE_LAB_NODES:-}" ] && [ "$nodes" != "$NETPLANE_LAB_NODES" ]; then
	echo "conformance.sh: the lab up in $STATE_DIR has $nodes nodes, not $NETPLANE_LAB_NODES: make demo-down first" >&2
	exit 2
fi

# skip_pattern SUITE: the skips.txt patterns that apply to SUITE, joined.
skip_pattern() {
	awk -v s="$1" -F'\t' '!/^#/ && NF >= 3 && ($1 == "*" || $1 == s) {print $2}' e2e/conformance/skips.txt | paste -sd'|'
}

mkdir -p "$OUT"
status=0
for suite in "${suites[@]}"; do
	case $suite in
	conformance) focus='\[sig-network\].*\[Conformance\]' ;;
	netpol) focus='\[sig-network\] Netpol' ;;
	cnp)
		if [ "${NETPLANE_LAB_STACK:-}" = upstream ]; then
			echo "conformance: cnp: not run: the upstream stack enforces no ClusterNetworkPolicy"
			continue
		fi
		dir=$OUT/cnp
		mkdir -p "$dir"
		echo "conformance: cnp: running (log: $dir/cnp.log)"
		start=$(date +%s)
		rc=0
		./hack/conformance-cnp.sh "$STATE_DIR/kubeconfig" "$dir" > "$dir/cnp.log" 2>&1 || rc=$?
		passed=$(grep -cE '^    --- PASS: TestConformanceProfiles/' "$dir/cnp.log" || true)
		failed=$(grep -cE '^    --- FAIL: TestConformanceProfiles/' "$dir/cnp.log" || true)
		echo "conformance: cnp: $passed passed, $failed failed in $(( $(date +%s) - start ))s (the failures are SCTP's: docs/conformance.md)"
		grep -E '^    --- FAIL: TestConformanceProfiles/' "$dir/cnp.log" | sed 's/^ */  /' || true
		[ "$rc" = 0 ] || status=1
		continue
		;;
	network) focus='\[sig-network\]' ;;
	*) echo "conformance.sh: unknown suite $suite (conformance, netpol, network, cnp)" >&2; exit 2 ;;
	esac
	narrow=${NETPLANE_CONFORMANCE_FOCUS:-}
	[ -n "$narrow" ] || [ "$suite" != network ] || narrow=$network_focus
	[ -z "$narrow" ] || focus="$focus.*($narrow)"
	if [ "$suite" = netpol ] && [ "${NETPLANE_LAB_STACK:-}" = upstream ]; then
		echo "conformance: netpol: not run: the upstream stack enforces no NetworkPolicy"
		continue
	fi
	skip=$(skip_pattern "$suite")
	# The rest of [sig-network]: without what the other two suites run.
	[ "$suite" != network ] || skip="${skip:+$skip|}\[Conformance\]|\[sig-network\] Netpol"
	dir=$OUT/$suite
	mkdir -p "$dir"
	args=(--kubeconfig="$STATE_DIR/kubeconfig" --provider=skeleton --num-nodes="$nodes"
		--kubectl-path="$BIN/kubectl" --report-dir="$dir")
	selected=$("$BIN/e2e.test" "${args[@]}" --ginkgo.focus="$focus" --ginkgo.dry-run --ginkgo.no-color 2>/dev/null | grep -oE '^Ran [0-9]+' | grep -oE '[0-9]+' || echo 0)
	gargs=(--procs="${NETPLANE_CONFORMANCE_PROCS:-4}" --no-color --timeout=3h --focus="$focus")
	[ -z "$skip" ] || gargs+=(--skip="$skip")
	echo "conformance: $suite: running (log: $dir/e2e.log)"
	start=$(date +%s)
	rc=0
	# From the module that pins ginkgo, so the CLI finds its own version.
	(cd hack/tools/kube && "$BIN/ginkgo" "${gargs[@]}" "$BIN/e2e.test" -- "${args[@]}") > "$dir/e2e.log" 2>&1 || rc=$?
	summary=$(grep -E '^(SUCCESS|FAIL)! -- ' "$dir/e2e.log" | tail -1 || true)
	passed=$(grep -oE '[0-9]+ Passed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
	failed=$(grep -oE '[0-9]+ Failed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
	ran=$((passed + failed))
	echo "conformance: $suite: $passed passed, $failed failed, $((selected - ran)) skipped of $selected in $(( $(date +%s) - start ))s"
	if [ "$rc" != 0 ] || [ "$failed" != 0 ] || [ -z "$summary" ]; then
		status=1
		grep -E '^\s*\[FAIL\]' "$dir/e2e.log" | sort -u | sed 's/^/  /' || true
		[ -n "$summary" ] || tail -20 "$dir/e2e.log"
	fi
done
echo "conformance: reports in $OUT"
exit $status
