# Hosts on one machine, for tests and benchmarks: each host is a network
# namespace with one interface, eth0, joined by a veth pair to a bridge (the
# switch) in another namespace. Sourced by tests/netns_cluster_test.sh and
# scripts/emulated_links.sh. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and
# iproute2.
#
#   netns_switch SWITCH            creates the switch namespace and bridge
#   netns_host SWITCH NS IP/PREFIX PORT
#                                  creates host NS with eth0 at IP/PREFIX,
#                                  plugged into the switch port PORT (the
#                                  switch-side interface, at most 15 chars)
#   netns_remove NS...             kills every process in each namespace,
#                                  then deletes it (missing ones are fine)
#
# Each function returns non-zero on the first failing command.

netns_switch() {
  ip netns add "$1" &&
    ip -n "$1" link add br0 type bridge &&
    ip -n "$1" link set br0 up &&
    ip -n "$1" link set lo up
}

netns_host() {
  local switch="$1" ns="$2" addr="$3" port="$4"
  ip netns add "$ns" &&
    ip link add "${port}h" type veth peer name "$port" &&
    ip link set "${port}h" netns "$ns" &&
    ip link set "$port" netns "$switch" &&
    ip -n "$ns" link set "${port}h" name eth0 &&
    ip -n "$ns" addr add "$addr" dev eth0 &&
    ip -n "$ns" link set eth0 up &&
    ip -n "$ns" link set lo up &&
    ip -n "$switch" link set "$port" master br0 &&
    ip -n "$switch" link set "$port" up
}

netns_remove() {
  local ns pid
  for ns in "$@"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid"; done
    ip netns del "$ns" 2>/dev/null
  done
  return 0
}
