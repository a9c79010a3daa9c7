#!/usr/bin/env bash
# build-anchors.sh BIN_DIR: builds the upstream systems netplane's benchmarks
# compare against, each from its own pinned Go module under hack/tools:
#   kube-proxy, kube-controller-manager   (k8s.io/kubernetes, hack/tools/kube)
#   coredns                               (github.com/coredns/coredns, hack/tools/coredns)
#   cni/bridge, cni/host-local            (github.com/containernetworking/plugins, hack/tools/cniplugins)
#   kube-router                           (github.com/cloudnativelabs/kube-router/v2, hack/tools/kuberouter)
# kube-router v2.1.0 is the only version the Go module proxy serves, and
# security flaws are reported against it: it is built only as the anchor the
# NetworkPolicy benchmark compares with, runs only inside the benchmark's
# network namespaces, and is never shipped or installed on a node.
# A binary whose stamp names the pinned version is reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
"$here/build-kube.sh" "$bin" kube-proxy kube-controller-manager

# build MODULE_DIR PACKAGE OUTPUT [VERSION_VAR]: go build, skipped when the
# stamp matches; VERSION_VAR, when given, is the package variable that gets
# the pinned version, which the binary then prints.
build() {
  local dir=$1 pkg=$2 out=$3 versionvar=${4:-}
  local version
  version=$(cd "$here/tools/$dir" && go list -m -f '{{.Version}}' "$(awk '$1=="require" {print $2; exit}' go.mod)")
  local stamp
  stamp="$(dirname "$out")/.$(basename "$out").version"
  if [ -x "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
    echo "build-anchors: $(basename "$out") $version is up to date"
    return
  fi
  echo "build-anchors: building $(basename "$out") $version"
  mkdir -p "$(dirname "$out")"
  local ldflags="-s -w"
  [ -n "$versionvar" ] && ldflags="$ldflags -X $versionvar=$version"
  (cd "$here/tools/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  echo "$version" > "$stamp"
}
build coredns github.com/coredns/coredns "$bin/coredns"
build cniplugins github.com/containernetworking/plugins/plugins/main/bridge "$bin/cni/bridge"
build cniplugins github.com/containernetworking/plugins/plugins/ipam/host-local "$bin/cni/host-local"
build kuberouter github.com/cloudnativelabs/kube-router/v2/cmd/kube-router "$bin/kube-router" \
  github.com/cloudnativelabs/kube-router/v2/pkg/version.Version
