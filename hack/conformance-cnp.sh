#!/usr/bin/env bash
# conformance-cnp.sh KUBECONFIG OUTDIR: network-policy-api v0.3.0's own
# conformance suite (the ClusterNetworkPolicy profile, every feature)
# against the lab, from the module go.mod pins. Its tests are run as they
# ship; one thing is changed in its build: this kernel has no SCTP, and
# `agnhost porter` serving SCTP in a container of its own (ten of them in
# conformance/base/manifests.yaml, a Go template) cannot start and keeps
# every test pod unready, so those containers are cut from the template,
# as text, in a copy of the module. The SCTP pokes then fail, and only
# they (docs/conformance.md lists which tests hold them).
# The suite needs the experimental CRD (named ports, nodes); the chart
# installs the standard one by default, so it is applied over it here.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBECONFIG_FILE=$1
OUT=$2
BIN=$(realpath -m "${NETPLANE_BIN_DIR:-bin}")
mkdir -p "$OUT"

mod=$(go list -m -f '{{.Dir}}' sigs.k8s.io/network-policy-api)
src=$OUT/network-policy-api
rm -rf "$src"
cp -r "$mod" "$src"
chmod -R u+w "$src"
# Drop each container item (an "        - name:" block) running agnhost porter.
awk '
function flush() { if (buf != "" && buf !~ /agnhost porter/) printf "%s", buf; buf = "" }
/^        - name: / { flush(); buf = $0 "\n"; inblock = 1; next }
inblock && /^         / { buf = buf $0 "\n"; next }
{ flush(); inblock = 0; print }
END { flush() }
' "$mod/conformance/base/manifests.yaml" > "$src/conformance/base/manifests.yaml"
if grep -q 'porter' "$src/conformance/base/manifests.yaml"; then
	echo "conformance-cnp: SCTP containers left in the base manifests" >&2
	exit 1
fi
(cd "$src" && GOFLAGS=-mod=mod go test -c -o "$OUT/cnp-conformance.test" ./conformance)

KUBECONFIG=$KUBECONFIG_FILE "$BIN/kubectl" apply --server-side --force-conflicts \
	-f charts/netplane/files/clusternetworkpolicies-experimental.yaml >/dev/null
cd "$OUT"
KUBECONFIG=$KUBECONFIG_FILE ./cnp-conformance.test -test.run TestConformanceProfiles -test.v -test.timeout 60m \
	-conformance-profiles=ClusterNetworkPolicy -all-features \
	-organization netplane -project netplane -url https://github.com/netplane/netplane -version dev \
	-contact netplane -additional-info "make conformance SUITES=cnp, a lab on one machine" \
	-report-output "$OUT/report.yaml"
