#!/usr/bin/env bash
# build-e2e.sh BIN_DIR: builds Kubernetes' networking end-to-end suite
# (e2e.test, from hack/tools/kube/e2e at the pinned k8s.io/kubernetes
# version) and ginkgo, which runs it in parallel, into BIN_DIR. Reused when
# the stamp names the same version and the suite's main is unchanged.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../bin}
mkdir -p "$bin"
bin=$(cd "$bin" && pwd)
cd "$here/tools/kube"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
want="$version $(sha256sum e2e/*.go go.sum | sha256sum | cut -c1-16)"
if [ -x "$bin/e2e.test" ] && [ "$(cat "$bin/.e2e.test.version" 2>/dev/null)" = "$want" ]; then
  echo "build-e2e: e2e.test $version is up to date"
else
  echo "build-e2e: building e2e.test $version (several minutes the first time)"
  CGO_ENABLED=0 go test -c -trimpath -ldflags "$ldflags" -o "$bin/e2e.test.tmp" ./e2e
  mv "$bin/e2e.test.tmp" "$bin/e2e.test"
  echo "$want" > "$bin/.e2e.test.version"
fi
gversion=$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)
if [ -x "$bin/ginkgo" ] && [ "$(cat "$bin/.ginkgo.version" 2>/dev/null)" = "$gversion" ]; then
  echo "build-e2e: ginkgo $gversion is up to date"
else
  CGO_ENABLED=0 go build -trimpath -o "$bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
  echo "$gversion" > "$bin/.ginkgo.version"
fi
