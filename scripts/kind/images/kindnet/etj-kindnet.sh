#!/bin/bash
# Pod networking for a kind cluster whose nodes share one Docker network (what kindnetd does, minus
# masquerading to the outside, which this offline bed has no use for):
#  - writes /etc/cni/net.d/10-kindnet.conflist (ptp + host-local on this node's spec.podCIDR, portmap);
#  - keeps one route per other node: its podCIDR via its InternalIP;
#  - with NETPOL_NFQUEUE set, keeps the iptables rule that hands every new forwarded connection to
#    kube-network-policies (the second container) on that netfilter queue. kube-network-policies installs an
#    nftables `queue` statement for this itself, but a kernel without CONFIG_NFT_QUEUE (this VM's) refuses
#    it; the xtables NFQUEUE target (CONFIG_NETFILTER_XT_TARGET_NFQUEUE, through nft_compat) reaches the same
#    queue. --queue-bypass: while no engine listens, traffic passes (kindnetd's fail-open behaviour).
# Runs in a hostNetwork pod; kubectl uses the pod's service account (KUBERNETES_SERVICE_HOST/PORT, patched to
# the control plane's address by kind's "would you kindly patch" mechanism so it needs no kube-proxy).
set -uo pipefail
: "${NODE_NAME:?}"
CNI_CONF=/etc/cni/net.d/10-kindnet.conflist
if [ -n "${CONTROL_PLANE_ENDPOINT:-}" ]; then
  export KUBERNETES_SERVICE_HOST="${CONTROL_PLANE_ENDPOINT%:*}" KUBERNETES_SERVICE_PORT="${CONTROL_PLANE_ENDPOINT##*:}"
fi
log() { echo "$(date -u +%FT%TZ) $*"; }
write_conf() {
  local cidr=$1 tmp
  tmp=$(mktemp /etc/cni/net.d/.kindnet.XXXXXX)
  cat > "$tmp" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "kindnet",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": ${MTU:-1500},
      "ipam": {
        "type": "host-local",
        "dataDir": "/run/cni-ipam-state",
        "routes": [{"dst": "0.0.0.0/0"}],
        "ranges": [[{"subnet": "${cidr}"}]]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  chmod 644 "$tmp" && mv "$tmp" "$CNI_CONF"
  log "wrote $CNI_CONF for $cidr"
}
ensure_netpol_queue() {
  [ -n "${NETPOL_NFQUEUE:-}" ] || return 0
  local rule=(FORWARD -m conntrack --ctstate NEW -j NFQUEUE --queue-num "$NETPOL_NFQUEUE" --queue-bypass)
  iptables -C "${rule[@]}" 2>/dev/null && return 0
  iptables -I "${rule[@]:0:1}" 1 "${rule[@]:1}" && log "iptables: new forwarded connections -> NetworkPolicy queue $NETPOL_NFQUEUE"
}
while true; do
  ensure_netpol_queue
  if nodes=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}'); then
    while read -r name cidr ip; do
      [ -n "$cidr" ] && [ -n "$ip" ] || continue
      if [ "$name" = "$NODE_NAME" ]; then
        grep -q "\"${cidr}\"" "$CNI_CONF" 2>/dev/null || write_conf "$cidr"
      else
        current=$(ip route show "$cidr" 2>/dev/null)
        if [[ "$current" != *"via $ip "* ]]; then
          ip route replace "$cidr" via "$ip" && log "route $cidr via $ip ($name)"
        fi
      fi
    done <<< "$nodes"
  else
    log "listing nodes failed; retrying"
  fi
  sleep "${RESYNC_SECONDS:-5}"
done
