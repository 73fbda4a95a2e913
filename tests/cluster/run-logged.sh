# shellcheck shell=bash
# run_logged NAME LOGFILE CMD...: runs CMD with its output in LOGFILE and a
# line every 30 s (with the log's last line), so a build of several minutes
# visibly progresses; on failure prints the log's tail and names the command.
# Sourced by the scripts that build (tests/cluster/build.sh,
# tests/companions/build.sh, tests/release/lib.sh); they define log and die.
run_logged() {
  local name=$1 logf=$2; shift 2
  "$@" >"$logf" 2>&1 &
  local pid=$! start=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name: still running ($((SECONDS - start)) s; last: $(tail -n 1 "$logf" | cut -c1-100); log: $logf)"
    fi
  done
  if ! wait "$pid"; then
    tail -n 40 "$logf" >&2
    die "$name failed after $((SECONDS - start)) s: command '$*' (full log: $logf)"
  fi
  log "$name: done in $((SECONDS - start)) s"
}
