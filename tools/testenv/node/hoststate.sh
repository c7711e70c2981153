#!/bin/bash
# hoststate.sh record|restore|check RUN: what a node run changes on the host, recorded before and put back after.
# The kubelet sets kernel.panic, kernel.panic_on_oops, vm.overcommit_memory (and more below); the bridge and
# kube-proxy turn on forwarding, bridge netfilter and route_localnet; the kubelet, kube-proxy and the CNI plugins add
# iptables chains. `check` prints what is still different (empty: nothing left behind) and fails if anything is.
set -uo pipefail
CMD=${1:?usage: hoststate.sh record|restore|check RUN}; RUN=${2:?RUN}
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys
         kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.route_localnet
         net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)
TABLES=(filter nat mangle)
IPTABLES=(iptables ip6tables)

sysctls() { for s in "${SYSCTLS[@]}"; do printf '%s=%s\n' "$s" "$(sysctl -n "$s" 2>/dev/null)"; done; }
chains() {  # chains IPT TABLE: the chain names of one table
  "$1" -w -t "$2" -S 2>/dev/null | awk '$1 == "-N" || $1 == "-P" {print $2}' | sort
}
netns() { ls /run/netns 2>/dev/null | sort; }
# only mounts a node makes (pod volumes, container rootfs, network namespaces): other work on the host may mount too
mounts() { awk '{print $5}' /proc/self/mountinfo | grep -E '^(/tmp/sr-node|/var/lib/sr-gateway-node|/run/netns|/var/run/netns|/run/containerd|/var/lib/kubelet)' | sort; }
cgroups() { ls -d /sys/fs/cgroup/*/kubepods 2>/dev/null | sort; }
# directories the runtime makes at fixed paths on first use (shim sockets, runc state, CNI result cache, pod logs)
DIRS=(/run/netns /run/containerd /var/lib/cni /var/log/pods /var/log/containers)
dirs() { for d in "${DIRS[@]}"; do [ -e "$d" ] && echo "$d"; done | sort; }
podlogs() { ls -d /var/log/pods/* /var/log/containers/* 2>/dev/null | sort; }  # the kubelet's fixed log paths
snapshot() {  # snapshot DIR
  mkdir -p "$1"
  sysctls > "$1/sysctls"
  for ipt in "${IPTABLES[@]}"; do for t in "${TABLES[@]}"; do chains "$ipt" "$t" > "$1/$ipt-$t"; done; done
  netns > "$1/netns"; mounts > "$1/mounts"; cgroups > "$1/cgroups"; podlogs > "$1/podlogs"; dirs > "$1/dirs"
  ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort > "$1/links"
}

drop_chains() {  # drop_chains IPT TABLE: delete the chains that were not there before, and every jump to them
  local ipt=$1 t=$2 new rule target
  new=$(comm -13 "$RUN/hoststate/before/$ipt-$t" <(chains "$ipt" "$t"))
  [ -n "$new" ] || return 0
  # rules that jump to a new chain from an old one (e.g. -A INPUT -j KUBE-FIREWALL): delete them one by one
  "$ipt" -w -t "$t" -S 2>/dev/null | grep "^-A " | while read -r rule; do
    target=$(awk '{for (i = 1; i < NF; i++) if ($i == "-j" || $i == "-g") print $(i + 1)}' <<<"$rule")
    chain=$(awk '{print $2}' <<<"$rule")
    if grep -qxF -- "$target" <<<"$new" && ! grep -qxF -- "$chain" <<<"$new"; then
      eval "$ipt -w -t $t -D ${rule#-A }" || true
    fi
  done
  for c in $new; do "$ipt" -w -t "$t" -F "$c" 2>/dev/null || true; done
  for c in $new; do "$ipt" -w -t "$t" -X "$c" 2>/dev/null || true; done
}

case "$CMD" in
  record)
    snapshot "$RUN/hoststate/before" ;;
  restore)
    [ -d "$RUN/hoststate/before" ] || exit 0
    for ipt in "${IPTABLES[@]}"; do for t in "${TABLES[@]}"; do drop_chains "$ipt" "$t"; done; done
    while IFS='=' read -r key value; do
      [ -n "$value" ] || continue
      [ "$(sysctl -n "$key" 2>/dev/null)" = "$value" ] || sysctl -q -w "$key=$value" >/dev/null || true
    done < "$RUN/hoststate/before/sysctls"
    # the fixed-path directories this run made: removed when nothing is left in them (else `check` names them)
    for d in $(comm -13 "$RUN/hoststate/before/dirs" <(dirs)); do find "$d" -depth -type d -empty -delete; done ;;
  check)
    rm -rf "$RUN/hoststate/after"; snapshot "$RUN/hoststate/after"
    diff -r "$RUN/hoststate/before" "$RUN/hoststate/after" ;;
  *) echo "usage: hoststate.sh record|restore|check RUN" >&2; exit 2 ;;
esac
