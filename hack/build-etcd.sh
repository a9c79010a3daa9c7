#!/usr/bin/env bash
# build-etcd.sh BIN_DIR: builds the etcd server pinned in hack/tools/etcd/go.mod
# into BIN_DIR, where the test harness and the lab look first. A binary whose
# stamp file names the same version is reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
mkdir -p "$bin"
version=$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$here/tools/etcd/go.mod")
stamp="$bin/.etcd.version"
if [ -x "$bin/etcd" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
  echo "build-etcd: etcd $version is up to date"
  exit 0
fi
echo "build-etcd: building etcd $version"
(cd "$here/tools/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3)
mv "$bin/etcd.tmp" "$bin/etcd"
echo "$version" > "$stamp"
