#!/usr/bin/env bash
# A Slurm cluster on this machine, on the test hosts of scripts/testhosts.sh: Debian's slurm-wlm with munge, one
# controller (slurmctld, root namespace, on the bridge address 198.18.0.1) and one slurmd per test host t1..tN (each
# in its host's network namespace, with its own host name, a private /tmp and a private /dev/shm), for the `slurm`
# tests and for trying the job scripts of examples/slurm/ by hand.
#
#   scripts/testcluster.sh up N      start (again: stop what is there first, also what a crashed run left)
#   scripts/testcluster.sh down      stop every daemon, remove the test hosts and the cluster's folder
#   scripts/testcluster.sh status    the nodes as Slurm sees them; exit 1 when no cluster answers
#   scripts/testcluster.sh check     exit 0 when a cluster can be started here (root, ip netns, slurm, munge)
#   scripts/testcluster.sh env       the settings a shell needs to submit to it: eval "$(scripts/testcluster.sh env)"
#
# Everything Slurm and munge keep (slurm.conf, munge key and socket, state, spool, pid and log files, the nodes'
# private /tmp) lives in one folder the script owns, $TESSERA_CLUSTER_DIR (default /var/tmp/tessera-testcluster), never
# in the repository. Only processes this script started are stopped (by their pid files and the test hosts' own
# process lists).
#
# What makes slurmd run in a network namespace (Slurm 22.05): it is started with nsenter into the host's namespace
# and `unshare --uts --mount`, not `ip netns exec`, which remounts /sys (slurmd then finds no cgroup file system and
# stops); each node bind-mounts its own /tmp (PMIx's client folders of two nodes would collide: "File exists") and
# mounts its own /dev/shm, as every real node has: Open MPI's shared-memory segments are named by host and job, and the
# job IDs of each new cluster start at 1 again, so with one /dev/shm for every cluster a job's ranks could meet the
# segment file a killed rank of an earlier cluster's job of the same number left behind;
# Slurm's state, spool, pid and log files are outside /tmp. proctrack/linuxproc and task/none: no cgroups needed.
# The test cluster notices a dead node after SlurmdTimeout=10 s.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
readonly here
readonly testhosts="$here/testhosts.sh"
readonly dir=${TESSERA_CLUSTER_DIR:-/var/tmp/tessera-testcluster}
readonly conf="$dir/etc/slurm.conf"
readonly munge_socket="$dir/munge/munge.socket"
readonly net=198.18.0

die() {
  echo "testcluster.sh: $*" >&2
  exit 2
}

check() {
  [ "$(id -u)" -eq 0 ] || die "a test cluster needs root (network namespaces, slurmd as root); run as root"
  local tool
  for tool in slurmctld slurmd munged mungekey nsenter unshare sinfo sbatch scontrol; do
    command -v "$tool" >/dev/null || die "$tool is missing (Debian: slurm-wlm, slurm-client, munge, util-linux)"
  done
  "$testhosts" check >/dev/null
}

# A daemon's pid from its pid file, when that process still runs.
pid_of() {
  local file=$1 pid
  [ -f "$file" ] || return 1
  pid=$(cat "$file" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

stop_pid_file() {
  local file=$1 pid i
  pid=$(pid_of "$file") || return 0
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

down() {
  if [ -f "$conf" ] && pid_of "$dir/run/slurmctld.pid" >/dev/null; then
    SLURM_CONF=$conf timeout 10 scontrol shutdown >/dev/null 2>&1 || true
  fi
  local file
  for file in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/run/munged.pid"; do
    [ -e "$file" ] && stop_pid_file "$file"
  done
  # The nodes' processes (slurmd, slurmstepd, tasks) are inside the test hosts' namespaces: testhosts.sh ends them.
  "$testhosts" down
  # The nodes' /tmp and /dev/shm are mounts inside their own mount namespaces, gone with their processes; the folder
  # goes.
  rm -rf "$dir"
}

write_conf() {
  local n=$1 controller
  controller=$(hostname -s)
  {
    echo "# The test cluster of scripts/testcluster.sh (written by it; removed by 'down')."
    echo "ClusterName=tessera-test"
    echo "SlurmctldHost=${controller}(${net}.1)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    # cred_expire: also how long a requeued job waits before it may start again (Slurm's default 120 s).
    echo "AuthInfo=socket=$munge_socket,cred_expire=10"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/slurmd-%n"
    echo "SlurmctldPidFile=$dir/run/slurmctld.pid"
    echo "SlurmdPidFile=$dir/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    echo "SlurmctldPort=6817"
    echo "SlurmdPort=6818"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SchedulerType=sched/backfill"
    echo "MpiDefault=none"
    echo "JobRequeue=1"
    echo "ReturnToService=2"
    echo "SlurmdTimeout=10"
    echo "SlurmctldTimeout=10"
    # KillWait: how long a task that ignores SIGTERM (a rank waiting in a collective for a dead node) runs on;
    # Slurm's default is 30 s.
    echo "KillWait=10"
    echo "MinJobAge=600"
    echo "JobCompType=jobcomp/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    # The hosts share this machine's cores: each node offers 2 CPUs whatever slurmd counts.
    echo "SlurmdParameters=config_overrides"
    local i
    for ((i = 1; i <= n; i++)); do
      echo "NodeName=t$i NodeAddr=${net}.$((10 + i)) NodeHostname=t$i CPUs=2 RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=test Nodes=t[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } >"$conf"
}

# Waits until every node is idle (or `timeout` seconds pass): the daemons have registered.
wait_idle() {
  local n=$1 timeout=$2 i idle
  for ((i = 0; i < timeout * 5; i++)); do
    idle=$(SLURM_CONF=$conf sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 == "idle"' | wc -l)
    [ "$idle" -eq "$n" ] && return 0
    sleep 0.2
  done
  return 1
}

up() {
  local n=$1
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || die "up N: N is a number of nodes, 1 to 64"
  check
  down
  "$testhosts" up "$n" >/dev/null
  mkdir -p "$dir"/{etc,munge,state,run,log}
  chmod 700 "$dir/munge"
  write_conf "$n"
  # munge: a key of the cluster's own; one munged whose Unix socket serves every namespace (the file system is shared).
  mungekey --create --keyfile "$dir/munge/munge.key" --force >/dev/null
  chmod 600 "$dir/munge/munge.key"
  munged --key-file "$dir/munge/munge.key" --socket "$munge_socket" --pid-file "$dir/run/munged.pid" \
    --log-file "$dir/log/munged.log" --seed-file "$dir/munge/munged.seed" --force ||
    die "munged did not start (see $dir/log/munged.log)"
  SLURM_CONF=$conf slurmctld -i ||
    die "slurmctld did not start (see $dir/log/slurmctld.log)"
  local i node
  for ((i = 1; i <= n; i++)); do
    node=t$i
    mkdir -p "$dir/spool/slurmd-$node" "$dir/nodes/$node/tmp"
    chmod 1777 "$dir/nodes/$node/tmp"
    # slurmd daemonizes; the namespaces it was started in stay its own and its tasks'.
    SLURM_CONF=$conf nsenter --net="/var/run/netns/tessera-$node" unshare --uts --mount --propagation private \
      sh -c 'mount --bind "$1" /tmp && mount -t tmpfs -o mode=1777,nosuid,nodev "tessera-shm-$2" /dev/shm &&
        hostname "$2" && exec slurmd -N "$2"' sh "$dir/nodes/$node/tmp" "$node" ||
      die "slurmd on $node did not start (see $dir/log/slurmd-$node.log)"
  done
  if ! wait_idle "$n" 60; then
    SLURM_CONF=$conf sinfo -N >&2 || true
    die "the nodes did not come up within 60 s (logs in $dir/log)"
  fi
  echo "testcluster.sh: Slurm on $n node(s) t1..t$n (partition test, 2 CPUs each); SLURM_CONF=$conf"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up)
    [ $# -eq 1 ] || die "usage: testcluster.sh up N"
    up "$1"
    ;;
  down)
    [ "$(id -u)" -eq 0 ] || die "down needs root (the test hosts are network namespaces)"
    down
    ;;
  status)
    [ -f "$conf" ] || { echo "testcluster.sh: no test cluster"; exit 1; }
    SLURM_CONF=$conf sinfo -N -o '%N %T %c' || exit 1
    ;;
  check) check && echo "testcluster.sh: a test cluster can be started here" ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) die "usage: testcluster.sh up N | down | status | check | env" ;;
esac
