#!/bin/bash
# node/down.sh RUN: takes down what node/up.sh started and puts the host back: pods first (so the CRI tears down
# their sandboxes, network namespaces and CNI rules the normal way), then kube-proxy's rules, then the processes up.sh
# recorded, then whatever a crash left (containerd shims of this run's socket, mounts under RUN, network namespaces and
# iptables chains that were not there before, the bridge, kubepods cgroups), then the sysctls. Removes RUN.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RUN=${1:?usage: node/down.sh RUN}
case "$RUN" in /tmp/sr-node.*) ;; *) echo "node/down.sh: not a node run directory: $RUN" >&2; exit 2 ;; esac
[ -d "$RUN" ] || exit 0
pid_of() { awk -v n="$1" '$1 == n {print $2}' "$RUN/pids" 2>/dev/null; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
stop() {  # stop NAME: TERM, up to 10 s, then KILL
  local pid; pid=$(pid_of "$1"); alive "$pid" || return 0
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 100); do alive "$pid" || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null; sleep 0.2
}

# 1. pods, through the API, while the kubelet and containerd still run
if alive "$(pid_of kubelet)" && alive "$(pid_of apiserver)"; then
  K=("$(cat "$RUN/kubectl.bin" 2>/dev/null || echo kubectl)" --kubeconfig "$RUN/admin.kubeconfig" --request-timeout=10s)
  "${K[@]}" delete deployments,statefulsets,daemonsets,replicasets,jobs --all --all-namespaces --wait=false >/dev/null 2>&1
  "${K[@]}" delete pods --all --all-namespaces --grace-period=5 --wait=false >/dev/null 2>&1
  for _ in $(seq 1 60); do
    [ -z "$("${K[@]}" get pods --all-namespaces -o name 2>/dev/null)" ] && break
    sleep 1
  done
fi
# 2. kube-proxy's iptables rules, by kube-proxy itself
stop kube-proxy
[ -f "$RUN/kube-proxy.cmd" ] && $(cat "$RUN/kube-proxy.cmd") --cleanup >"$RUN/kube-proxy-cleanup.log" 2>&1
# 3. the kubelet; then what containerd still runs (a pod the kubelet did not get to), through the CRI's own objects
stop kubelet
SOCK="$RUN/containerd/containerd.sock"
if alive "$(pid_of containerd)" && [ -S "$SOCK" ]; then
  CTR=(ctr --address "$SOCK" -n k8s.io)
  for task in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s KILL "$task" >/dev/null 2>&1; done
  sleep 1
  for task in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks delete -f "$task" >/dev/null 2>&1; done
  for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers delete "$c" >/dev/null 2>&1; done
fi
for name in scheduler controller-manager containerd apiserver etcd dns; do stop "$name"; done
# 4. what a crash may have left: this run's shims (found by this run's socket), mounts, namespaces, links, cgroups
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
awk '{print $5}' /proc/self/mountinfo | grep -E "^($RUN|/var/lib/sr-gateway-node/containerd)/" | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null; done
if [ -f "$RUN/hoststate/before/netns" ]; then
  comm -13 "$RUN/hoststate/before/netns" <(ls /run/netns 2>/dev/null | sort) | grep '^cni-' |
    while read -r ns; do ip netns delete "$ns" 2>/dev/null; done
fi
BRIDGE=$(cat "$RUN/bridge" 2>/dev/null)
[ -n "$BRIDGE" ] && [ -e "/sys/class/net/$BRIDGE" ] && ip link delete "$BRIDGE" 2>/dev/null
if [ -f "$RUN/hoststate/before/cgroups" ]; then
  for root in $(comm -13 "$RUN/hoststate/before/cgroups" <(ls -d /sys/fs/cgroup/*/kubepods 2>/dev/null | sort)); do
    find "$root" -depth -type d -exec rmdir {} + 2>/dev/null
  done
fi
if [ -f "$RUN/hoststate/before/podlogs" ]; then  # the kubelet's logs of pods it did not get to remove
  comm -13 "$RUN/hoststate/before/podlogs" <(ls -d /var/log/pods/* /var/log/containers/* 2>/dev/null | sort) |
    while read -r path; do rm -rf "$path"; done
fi
# 5. iptables chains and sysctls as they were
"$HERE/hoststate.sh" restore "$RUN"
# 6. prove it: anything still different from before up.sh is printed, and the exit status says so
rc=0
if ! "$HERE/hoststate.sh" check "$RUN" > "$RUN/leftovers" 2>&1; then
  echo "node/down.sh: left behind (< before, > now):" >&2; cat "$RUN/leftovers" >&2; rc=1
fi
for name in $(awk '{print $1}' "$RUN/pids" 2>/dev/null); do
  alive "$(pid_of "$name")" && { echo "node/down.sh: $name still runs" >&2; rc=1; }
done
if [ "${SR_NODE_KEEP_RUN:-0}" = 1 ]; then echo "node/down.sh: kept $RUN" >&2; else rm -rf "$RUN"; fi
exit $rc
