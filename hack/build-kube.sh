#!/usr/bin/env bash
# build-kube.sh BIN_DIR COMMAND...: builds upstream Kubernetes programs from
# the version of k8s.io/kubernetes pinned in hack/tools/kube/go.mod into
# BIN_DIR. A COMMAND is a name under cmd/ (kube-apiserver, kubelet, ...), a
# package path inside the module (test/images/agnhost), or a C file of it
# (build/pause/linux/pause.c, linked statically with gcc); the binary is
# named after its last element. A binary whose stamp file names the same
# version is reused, so a second run costs nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1; shift
mkdir -p "$bin"
bin=$(cd "$bin" && pwd)
cd "$here/tools/kube"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
# On a fresh machine the module is not in the cache yet, and its folder,
# which the C sources are read from, is empty until it is.
go mod download k8s.io/kubernetes
moddir=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
# The Go programs that are out of date are built by one go build, which
# compiles their shared packages once and links them side by side.
pkgs=()
names=()
for cmd in "$@"; do
  name=$(basename "$cmd" .c)
  stamp="$bin/.$name.version"
  if [ -x "$bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
    echo "build-kube: $name $version is up to date"
    continue
  fi
  case $cmd in
  *.c)
    echo "build-kube: building $name $version"
    gcc -Os -Wall -static -DVERSION="$version" -o "$bin/$name.tmp" "$moddir/$cmd"
    mv "$bin/$name.tmp" "$bin/$name"
    echo "$version" > "$stamp"
    ;;
  */*) pkgs+=("k8s.io/kubernetes/$cmd"); names+=("$name") ;;
  *) pkgs+=("k8s.io/kubernetes/cmd/$cmd"); names+=("$name") ;;
  esac
done
[ ${#pkgs[@]} -gt 0 ] || exit 0
echo "build-kube: building ${names[*]} $version (several minutes the first time)"
out=$(mktemp -d "$bin/.build-kube.XXXXXX")
trap 'rm -rf "$out"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}"
for name in "${names[@]}"; do
  mv "$out/$name" "$bin/$name"
  echo "$version" > "$bin/.$name.version"
done
