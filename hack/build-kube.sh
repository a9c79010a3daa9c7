#!/usr/bin/env bash
# build-kube.sh BIN_DIR COMMAND...: builds upstream Kubernetes commands
# (kube-apiserver, kube-controller-manager, kube-proxy, kube-scheduler) from
# the version pinned in hack/tools/kube/go.mod into BIN_DIR. A binary whose
# stamp file names the same version is reused, so a second run costs nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1; shift
mkdir -p "$bin"
version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/tools/kube/go.mod")
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
for cmd in "$@"; do
  stamp="$bin/.$cmd.version"
  if [ -x "$bin/$cmd" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
    echo "build-kube: $cmd $version is up to date"
    continue
  fi
  echo "build-kube: building $cmd $version (the first kube-apiserver build takes several minutes)"
  (cd "$here/tools/kube" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
  mv "$bin/$cmd.tmp" "$bin/$cmd"
  echo "$version" > "$stamp"
done
