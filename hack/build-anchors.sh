#!/usr/bin/env bash
# build-anchors.sh BIN_DIR [NAME...]: builds the upstream systems netplane's
# benchmarks compare against, and the lab's upstream stack runs (see
# docs/conformance.md), each from its own pinned Go module under hack/tools;
# all of them, or only the NAMEs given:
#   kube-proxy, kube-controller-manager   (k8s.io/kubernetes, hack/tools/kube)
#   coredns                               (github.com/coredns/coredns, hack/tools/coredns)
#   bridge, host-local, portmap           (github.com/containernetworking/plugins, hack/tools/cniplugins), into BIN_DIR/cni
#   kube-router                           (github.com/cloudnativelabs/kube-router/v2, hack/tools/kuberouter)
# kube-router v2.1.0 is the only version the Go module proxy serves, and
# security flaws are reported against it: it is built only as the anchor the
# NetworkPolicy benchmark compares with, runs only inside the benchmark's
# network namespaces, and is never shipped or installed on a node.
# A binary whose stamp names the pinned version is reused.
# Also flanneld (github.com/flannel-io/flannel, hack/tools/flannel), with one
# edit: see build_flanneld; and wireguard-go (golang.zx2c4.com/wireguard)
# from the version netplane's own go.mod pins, the very code the node role
# runs in-process, for the encryption benchmark (e2e/encryption).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(mkdir -p "$1" && cd "$1" && pwd); shift
only=" $* "
# wanted NAME: whether NAME is to be built.
wanted() { [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]; }

# flanneld is built from a copy of its pinned module with one line removed
# from main.go: the blank import of pkg/backend/tencentvpc. That backend's
# SDK (github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc) is not
# served by the Go module proxy (403), so the module does not build as
# published. The overlay benchmark uses only the vxlan backend; every other
# line is Flannel's own, built with Flannel's own go.mod and go.sum.
build_flanneld() {
  local out=$1
  local version
  version=$(awk '$1=="require" && $2=="github.com/flannel-io/flannel" {print $3}' "$here/tools/flannel/go.mod")
  local stamp
  stamp="$(dirname "$out")/.$(basename "$out").version"
  local want="$version without pkg/backend/tencentvpc"
  if [ -x "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "build-anchors: flanneld $version is up to date"
    return
  fi
  echo "build-anchors: building flanneld $version (several minutes the first time)"
  local src
  # Verified against hack/tools/flannel/go.sum.
  src=$(cd "$here/tools/flannel" && go mod download -json github.com/flannel-io/flannel | awk -F'"' '$2=="Dir" {print $4}')
  if [ -z "$src" ] || [ ! -f "$src/main.go" ]; then
    echo "build-anchors: flanneld $version: go mod download gave no module folder" >&2
    exit 1
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  local import='_ "github.com/flannel-io/flannel/pkg/backend/tencentvpc"'
  if [ "$(grep -cxF "	$import" "$work/main.go")" != 1 ]; then
    echo "build-anchors: flanneld $version: main.go no longer has the one import line to remove" >&2
    exit 1
  fi
  grep -vxF "	$import" "$work/main.go" > "$work/main.go.new"
  mv "$work/main.go.new" "$work/main.go"
  mkdir -p "$(dirname "$out")"
  # As Flannel's Makefile builds it for amd64: with cgo (its udp backend is
  # C), linked statically; the linker's warnings about getaddrinfo and
  # getpwnam_r in a static binary are expected (Flannel's build prints them).
  (cd "$work" && CGO_ENABLED=1 go build -trimpath \
    -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$version -extldflags -static" -o "$out.tmp" .)
  mv "$out.tmp" "$out"
  echo "$want" > "$stamp"
}
if wanted flanneld; then build_flanneld "$bin/flanneld"; fi

for k in kube-proxy kube-controller-manager; do
  if wanted $k; then "$here/build-kube.sh" "$bin" $k; fi
done

# build MODULE_DIR PACKAGE OUTPUT [VERSION_VAR]: go build, skipped when the
# stamp matches; VERSION_VAR, when given, is the package variable that gets
# the pinned version, which the binary then prints.
build() {
  local dir=$1 pkg=$2 out=$3 versionvar=${4:-}
  wanted "$(basename "$out")" || return 0
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
build cniplugins github.com/containernetworking/plugins/plugins/meta/portmap "$bin/cni/portmap"
build kuberouter github.com/cloudnativelabs/kube-router/v2/cmd/kube-router "$bin/kube-router" \
  github.com/cloudnativelabs/kube-router/v2/pkg/version.Version

# wireguard-go: its main package at the root of the module netplane links.
if wanted wireguard-go; then
  version=$(cd "$here/.." && go list -m -f '{{.Version}}' golang.zx2c4.com/wireguard)
  stamp="$bin/.wireguard-go.version"
  if [ -x "$bin/wireguard-go" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
    echo "build-anchors: wireguard-go $version is up to date"
  else
    echo "build-anchors: building wireguard-go $version"
    (cd "$here/.." && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/wireguard-go.tmp" golang.zx2c4.com/wireguard)
    mv "$bin/wireguard-go.tmp" "$bin/wireguard-go"
    echo "$version" > "$stamp"
  fi
fi
