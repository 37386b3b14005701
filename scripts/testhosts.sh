#!/usr/bin/env bash
# Test hosts on this machine: network namespaces with their own addresses, joined by a bridge, for running Tessera
# across a real TCP network without a cluster (tests with the CTest label `network`, `tessera bench comm` across
# hosts). Each host tN is a network namespace "tessera-tN" with the address 198.18.0.(10+N) (198.18.0.0/15 is reserved
# for network benchmark tests); the bridge "tessera-br" has 198.18.0.1 in the root namespace. Commands run on a host
# with its own host name (a UTS namespace), so Open MPI sees N nodes.
#
#   scripts/testhosts.sh up N [--rate 10gbit|1gbit|...]   make hosts t1..tN (again: the same hosts, reshaped)
#   scripts/testhosts.sh down                              remove every test host and the bridge
#   scripts/testhosts.sh status                            list the hosts; exit 1 when there are none
#   scripts/testhosts.sh check                             exit 0 when test hosts can be made here (root, ip netns)
#   scripts/testhosts.sh link HOST down|up                 pull HOST's cable / plug it back (its bridge port's state)
#   scripts/testhosts.sh pids HOST                         the processes running on HOST, one PID a line
#   scripts/testhosts.sh exec HOST COMMAND...              run COMMAND on HOST (Open MPI's launch agent; see mpirun)
#   scripts/testhosts.sh mpirun MPIRUN-ARGS...             mpirun across the hosts over TCP on the test network
#
# Idempotent, and `up` first removes what a crashed run left behind. Only the test hosts' own addresses are used.
set -euo pipefail

readonly prefix=tessera-t
readonly bridge=tessera-br
readonly net=198.18.0
readonly cidr=198.18.0.0/24
self=$(readlink -f "$0")
readonly self

die() {
  echo "testhosts.sh: $*" >&2
  exit 2
}

hosts() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${prefix}[0-9]*$" | sed "s/^${prefix}/t/" | sort -V || true; }

check() {
  [ "$(id -u)" -eq 0 ] || die "test hosts need root (network namespaces); run as root"
  command -v ip >/dev/null || die "ip (iproute2) is missing"
  command -v tc >/dev/null || die "tc (iproute2) is missing"
  command -v unshare >/dev/null || die "unshare (util-linux) is missing"
  local probe="${prefix}probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    die "ip netns is not permitted here (cannot create a network namespace)"
  fi
  # What `up` makes, tried inside the probe namespace (nothing outside it changes): a bridge, a veth pair, a shaper.
  local why=""
  if ! ip netns exec "$probe" ip link add probe-br type bridge 2>/dev/null; then
    why="cannot create a bridge"
  elif ! ip netns exec "$probe" ip link add probe-v0 type veth peer name probe-v1 2>/dev/null; then
    why="cannot create a veth pair"
  elif ! ip netns exec "$probe" tc qdisc add dev probe-v0 root tbf rate 1gbit burst 1mbit latency 50ms 2>/dev/null; then
    why="cannot shape a link with tc tbf"
  fi
  ip netns del "$probe"
  [ -z "$why" ] || die "$why here"
}

down() {
  local h
  for h in $(hosts); do
    ip netns pids "${prefix}${h#t}" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "${prefix}${h#t}" 2>/dev/null || true
    ip link del "tessera-v${h#t}" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}

shape() {  # shape DEVICE RATE [NETNS]: a token bucket at RATE (no netem here: tbf only)
  local dev=$1 rate=$2 ns=${3:-}
  local run=()
  [ -n "$ns" ] && run=(ip netns exec "$ns")
  "${run[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
  [ "$rate" = none ] && return 0
  # Burst 1 Mbit (128 KB): room for a 64 KB TSO segment; tbf needs a burst of at least rate / HZ at high rates.
  "${run[@]}" tc qdisc add dev "$dev" root tbf rate "$rate" burst 1mbit latency 50ms
}

up() {
  local n=$1 rate=$2
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up N: N is a number of hosts, 1 to 200"
  check
  down
  ip link add "$bridge" type bridge
  ip addr add "${net}.1/24" dev "$bridge"
  ip link set "$bridge" up
  local i ns
  for ((i = 1; i <= n; i++)); do
    ns="${prefix}${i}"
    ip netns add "$ns"
    ip link add "tessera-v${i}" type veth peer name eth0 netns "$ns"
    ip link set "tessera-v${i}" master "$bridge" up
    ip netns exec "$ns" ip addr add "${net}.$((10 + i))/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    # A connection whose data goes unacknowledged is given up after about 100 s (tcp_retries2 8, the least RFC 1122
    # allows; Linux's 15 is about 15 minutes). A host cut off while its daemon had data in flight to mpirun, out of
    # the keepalive's reach (see mpi()), then ends its ranks after that. Per namespace: only the hosts change.
    ip netns exec "$ns" sh -c 'echo 8 >/proc/sys/net/ipv4/tcp_retries2' 2>/dev/null ||
      echo "testhosts.sh: cannot set t$i's net.ipv4.tcp_retries2 (read-only /proc/sys?): Linux's default stays" >&2
    shape "tessera-v${i}" "$rate"
    shape eth0 "$rate" "$ns"
  done
  echo "testhosts.sh: $n host(s) t1..t$n on $cidr, links ${rate}"
}

# A host's link is its veth's end on the bridge: the switch port. Down, the host keeps its address and its processes
# run on, but nothing reaches it or leaves it (as when its cable is pulled); its eth0 shows NO-CARRIER.
link() {
  local host=$1 state=$2
  [[ "$host" =~ ^t[0-9]+$ ]] || die "link: '$host' is not a test host (t1, t2, ...)"
  [[ "$state" =~ ^(up|down)$ ]] || die "link: '$state' is not up or down"
  ip link show "tessera-v${host#t}" >/dev/null 2>&1 || die "link: no test host $host (scripts/testhosts.sh up N)"
  ip link set "tessera-v${host#t}" "$state"
}

pids() {
  local host=$1
  [[ "$host" =~ ^t[0-9]+$ ]] || die "pids: '$host' is not a test host (t1, t2, ...)"
  local ns="${prefix}${host#t}"
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "pids: no test host $host (scripts/testhosts.sh up N)"
  ip netns pids "$ns"
}

link_down() {  # HOST: true while HOST exists and its link is down
  [ "$(cat "/sys/class/net/tessera-v${1#t}/operstate" 2>/dev/null)" = down ]
}

run_on() {  # exec HOST COMMAND...: what Open MPI's rsh agent is asked to do ("agent HOST orted ...")
  local host=$1
  shift
  [[ "$host" =~ ^t[0-9]+$ ]] || die "exec: '$host' is not a test host (t1, t2, ...)"
  local ns="${prefix}${host#t}"
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "exec: no test host $host (scripts/testhosts.sh up N)"
  # Open MPI's agent gets the remote command as words to be run by a shell, as ssh would.
  local status=0
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec sh -c "$1"' "$host" "$*" || status=$?
  # ssh reports the end of the remote command over the host's link: while that link is down, its session cannot end
  # (mpirun then learns of the host's loss from its own connection's keepalive, as on a cluster, instead of from an
  # agent that exits at once and reads as a daemon that failed to start). The link back up, or the host removed,
  # ends the wait.
  while link_down "$host"; do sleep 0.2; done
  exit "$status"
}

# mpirun across the test hosts over TCP on the test network only. The hosts share this machine's cores: no binding
# (Open MPI would pin each host's first rank to the same core). One-sided windows (async-easgd) take Open MPI's
# point-to-point component (its default, osc rdma, fails to make one over TCP: "invalid window"); shared-memory
# windows (two-level within a host) keep osc sm. A host whose link dies is noticed by the keepalive of mpirun's
# connection to that host's daemon (oob_tcp_keepalive_*: probes after 2 s without traffic, 3 unanswered 1 s apart),
# and mpirun ends the job naming the host, 6 s after the link went down here; with Open MPI's defaults (300 s, then
# 9 probes 20 s apart) it took 489 s. The ranks' own connections have no keepalive.
mpi() {
  exec mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca plm_rsh_agent "$self exec" \
    --mca btl tcp,self,vader --mca btl_tcp_if_include "$cidr" --mca oob_tcp_if_include "$cidr" \
    --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3 \
    --mca osc sm,pt2pt \
    "$@"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up)
    [ $# -ge 1 ] || die "usage: testhosts.sh up N [--rate RATE]"
    n=$1
    shift
    rate=none
    while [ $# -gt 0 ]; do
      case "$1" in
        --rate) rate=${2:?--rate needs a value, e.g. 10gbit}; shift 2 ;;
        *) die "up: unknown option '$1'" ;;
      esac
    done
    up "$n" "$rate"
    ;;
  down) down ;;
  status)
    list=$(hosts)
    [ -n "$list" ] || { echo "testhosts.sh: no test hosts"; exit 1; }
    for h in $list; do echo "$h ${net}.$((10 + ${h#t}))"; done
    ;;
  check) check && echo "testhosts.sh: test hosts can be made here" ;;
  exec) [ $# -ge 2 ] || die "usage: testhosts.sh exec HOST COMMAND..."; run_on "$@" ;;
  link) [ $# -eq 2 ] || die "usage: testhosts.sh link HOST down|up"; link "$@" ;;
  pids) [ $# -eq 1 ] || die "usage: testhosts.sh pids HOST"; pids "$1" ;;
  mpirun) mpi "$@" ;;
  *)
    die "usage: testhosts.sh up N [--rate RATE] | down | status | check | link HOST down|up | pids HOST" \
      "| exec HOST COMMAND... | mpirun ARGS..."
    ;;
esac
