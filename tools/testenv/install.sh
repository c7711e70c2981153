#!/bin/bash
# install.sh [--node]: installs the Debian packages the controlplane test environment needs (idempotent,
# non-interactive); --node adds what the one-node cluster (tools/testenv/node) runs: containerd with the CRI plugin,
# runc, the CNI plugins, iptables/conntrack for kube-proxy, buildah for the images, and the static catatonit and
# busybox binaries its own small images are made of.
# Why apt: kube-apiserver is built from Debian's `kubernetes` source package, and etcd, Keystone and
# PostgreSQL come from Debian too; nothing is downloaded from anywhere else.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# One install at a time: `make test` prepares this environment in the background (Makefile, `testenv-build`) while
# the gateway's targets run, and the control plane's up.sh runs this script again when its turn comes.
mkdir -p /run/lock
exec 8>/run/lock/sr-gateway-testenv-install.lock
flock 8
# An install killed half-way (an interrupted run) leaves dpkg asking for this before any other apt-get works.
if [ -n "$(dpkg --audit 2>/dev/null)" ]; then dpkg --configure -a >/dev/null; fi

PKGS=(etcd-server python3-keystone gunicorn postgresql prometheus openssl golang-go rsync jq dpkg-dev
      golang-github-modern-go-reflect2-dev curl)
if [ "${1:-}" = --node ]; then
  PKGS+=(containerd runc containernetworking-plugins iptables conntrack buildah debootstrap catatonit busybox-static dnsmasq-base)
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# deb-src is not configured on the image: derive it from the machine's own Debian sources file
# (same mirror, Types: deb -> deb-src), so no host name is ever written into the repository.
need_update=0
if ! ls /etc/apt/sources.list.d/*-src.sources >/dev/null 2>&1 && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      > /etc/apt/sources.list.d/debian-src.sources
  elif [ -f /etc/apt/sources.list ]; then
    grep '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' > /etc/apt/sources.list.d/debian-src.list
  fi
  need_update=1
fi

if [ "${#missing[@]}" -gt 0 ] || [ "$need_update" = 1 ]; then
  apt-get update -qq
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "testenv: installing ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
