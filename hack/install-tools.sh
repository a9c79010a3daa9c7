#!/usr/bin/env bash
# install-tools.sh: everything netplane's tests and lab need on a fresh Debian
# machine, as root. Idempotent: packages already present and binaries already
# built at the pinned version are skipped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${NETPLANE_BIN_DIR:-$here/../bin}

# iptables and ipset are for kube-router, the NetworkPolicy benchmark's anchor
# (hack/build-anchors.sh); Debian 12's iptables is the nftables-based one.
packages=(nftables iproute2 conntrack dnsutils dnsperf containerd runc iputils-ping util-linux procps iptables ipset)
missing=()
# flanneld, the overlay benchmark's anchor (hack/build-anchors.sh), runs
# iptables at start even in nftables mode, and exits without it.
packages+=(iptables)
# The userland of upstream's test images (e2e/lab/upstream_images.go):
# what Kubernetes' e2e tests run inside agnhost, busybox, nginx and
# glibc-dns-testing; gcc links the pause container statically.
packages+=(busybox-static netcat-openbsd curl socat nginx-light iperf wget conntrack bash gcc libc6-dev)
# wg configures the standalone wireguard-go of the encryption benchmark
# (e2e/encryption), as a user of WireGuard would by hand.
packages+=(wireguard-tools)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-tools: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-tools: apt-get install ${missing[*]}"
  # Keep the packages' services (containerd) from starting: tests and
  # the lab start their own instances, on their own ports, and stop them.
  guard=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    guard=/usr/sbin/policy-rc.d
  fi
  trap '[ -n "$guard" ] && rm -f "$guard"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# `install-tools.sh demo` builds what the lab needs and no more (the
# demo's first run on a fresh machine waits for it); without it, also the
# programs of upstream's test images, which only upstream's suites run.
kube=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl build/pause/linux/pause.c)
[ "${1:-}" = demo ] || kube+=(test/images/agnhost test/images/regression-issue-74839)
"$here/build-kube.sh" "$bin" "${kube[@]}"
"$here/build-etcd.sh" "$bin"
# helm installs the chart into the lab, as its README tells a user.
"$here/build-helm.sh" "$bin"
# CoreDNS: upstream's agnhost and glibc-dns-testing images carry it as
# /coredns for the DNS tests' own servers; also the upstream stack's DNS.
[ "${1:-}" = demo ] || "$here/build-anchors.sh" "$bin" coredns
