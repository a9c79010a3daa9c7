#!/usr/bin/env bash
# build-helm.sh BIN_DIR: builds the helm command pinned in
# hack/tools/helm/go.mod into BIN_DIR, for the lab's install of the chart.
# A binary whose stamp file names the same version is reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
mkdir -p "$bin"
bin=$(cd "$bin" && pwd)
cd "$here/tools/helm"
version=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
stamp="$bin/.helm.version"
if [ -x "$bin/helm" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
  echo "build-helm: helm $version is up to date"
  exit 0
fi
echo "build-helm: building helm $version"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" -o "$bin/helm.tmp" helm.sh/helm/v4/cmd/helm
mv "$bin/helm.tmp" "$bin/helm"
echo "$version" > "$stamp"
