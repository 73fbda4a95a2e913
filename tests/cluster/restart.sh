#!/usr/bin/env bash
# Restarts one component of the running local plane the way a crash or a cluster
# upgrade does: SIGKILL, stay down for N seconds, start it again with the exact
# command line up.sh used (recorded in .cluster/pids/<component>.cmd: same binary,
# flags, ports, certificates and data directory), and wait until it is healthy.
#
#   tests/cluster/restart.sh kube-apiserver --down-seconds 8
#   tests/cluster/restart.sh etcd --down-seconds 5
#
# Components: etcd kube-apiserver kube-controller-manager kube-scheduler kwok.
# Healthy means what up.sh waits for (etcd /health, API server /readyz, ...);
# after etcd it also waits for the API server's /readyz, which checks etcd.
# The last line on stdout is for scripts and tests, times in seconds:
#   restarted kube-apiserver: down_s=8.00 start_to_ready_s=2.41 outage_s=10.47
# (outage_s: from the kill until the API server answers /readyz again).
#
# A component that is not running (it crashed) is just started again.
#
# It holds the plane's lock throughout, so a concurrent up.sh waits instead of
# taking the missing component for a dead plane and replacing the whole plane.
# Other users of the plane see the outage: run it only where that is intended.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
export LC_ALL=C # a '.' in $EPOCHREALTIME and in printf's numbers

usage() {
  echo "usage: $0 {$(IFS="|"; echo "${COMPONENTS[*]}")} [--down-seconds N]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
component=$1; shift
down=0
while [ $# -gt 0 ]; do
  case $1 in
    --down-seconds) [ $# -ge 2 ] || usage; down=$2; shift 2 ;;
    --down-seconds=*) down=${1#*=}; shift ;;
    *) usage ;;
  esac
done
[[ " ${COMPONENTS[*]} " == *" $component "* ]] ||
  die "unknown component '$component'; one of: ${COMPONENTS[*]}"
[[ "$down" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--down-seconds wants a number of seconds, got '$down'"

[ -f "$STATE_FILE" ] || die "no running plane ($STATE_FILE is missing); start it with tests/cluster/up.sh"
# shellcheck disable=SC1090
source "$STATE_FILE"
COMPONENT_TIMEOUT="${COMPONENT_TIMEOUT:-120}"
fix_no_proxy

exec 9>"$CLUSTER_DIR/.lock"
flock 9

pid="$(pid_of "$component")" || pid=""
[ -s "$PIDS/$component.cmd" ] ||
  die "$PIDS/$component.cmd is missing, so the command line is unknown; restart the plane with tests/cluster/down.sh && tests/cluster/up.sh"
# start_component wrote it with printf %q: eval reads back the very same words.
eval "cmd=($(<"$PIDS/$component.cmd"))"

# component_healthy NAME: the check up.sh waits on for that component.
component_healthy() {
  case $1 in
    etcd) etcd_ok ;;
    kube-apiserver) apiserver_ready ;;
    kube-controller-manager) https_healthz "$KCM_PORT" ;;
    kube-scheduler) https_healthz "$SCHED_PORT" ;;
    kwok) kwok_ok ;;
  esac
}
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
# The ports the component listens on (from state.env, as up.sh picked them).
component_ports() {
  case $1 in
    etcd) echo "$ETCD_PORT $ETCD_PEER_PORT" ;;
    kube-apiserver) echo "$API_PORT" ;;
    kube-controller-manager) echo "$KCM_PORT" ;;
    kube-scheduler) echo "$SCHED_PORT" ;;
    kwok) echo "$KWOK_PORT" ;;
  esac
}
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# ports_closed: none of the component's ports accepts a connection. A killed
# process's sockets close only when its last thread is gone, which can be
# after the process already shows as a zombie.
ports_closed() {
  local p
  for p in $(component_ports "$component"); do
    if answers "$p"; then return 1; fi
  done
}
# A port is free while its component is down, and another clone's up.sh may
# pick it: then the component could not come back, and this plane's clients
# would talk to someone else's server. Say so instead of starting it.
check_ports_free() {
  local p who
  for p in $(component_ports "$component"); do
    if answers "$p"; then
      who="$(ss -Hltnp "sport = :$p" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p')"
      die "port $p of $component was taken by another process (${who:-unknown}) while it was down; this plane cannot get it back: tests/cluster/down.sh && tests/cluster/up.sh start a fresh one"
    fi
  done
}

t_kill=$EPOCHREALTIME
if [ -n "$pid" ]; then
  log "killing $component (pid $pid) with SIGKILL"
  kill -KILL "$pid"
  for _ in $(seq 100); do
    if ! is_ours "$pid" && ports_closed; then break; fi
    sleep 0.1
  done
  ! is_ours "$pid" || die "$component (pid $pid) still alive 10 s after SIGKILL"
  ports_closed || die "$component (pid $pid) was killed but its ports $(component_ports "$component") still accept connections after 10 s"
  log "$component down; starting it again in $down s"
  sleep "$down"
else
  # e.g. kube-controller-manager exits when the API server goes away while it starts
  log "$component is not running (it exited; see $LOGS/$component.log); starting it"
fi
check_ports_free
# Keep the log of the killed process for post-mortems (one generation).
[ ! -f "$LOGS/$component.log" ] || mv -f "$LOGS/$component.log" "$LOGS/$component.before-restart.log"
t_start=$EPOCHREALTIME
down_s=$(awk -v a="$t_kill" -v b="$t_start" 'BEGIN { printf "%.2f", b - a }')
start_component "$component" "${cmd[@]}"
wait_healthy "$component" component_healthy "$component"
ready_s=$(since "$t_start")
if [ "$component" != kube-apiserver ]; then
  wait_healthy kube-apiserver apiserver_ready
fi
outage_s=$(since "$t_kill")
log "$component: down $down_s s, healthy $ready_s s after its start, API server ready $outage_s s after the kill"
echo "restarted $component: down_s=$down_s start_to_ready_s=$ready_s outage_s=$outage_s"
