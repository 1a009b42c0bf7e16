#!/usr/bin/env bash
# cserps-node: one GPU node of a job in one container (docker-compose.yml's
# `worker`): CSERPS_LOCAL_SIZE (default 1) processes of cserps-worker, one per
# GPU, with --backend=cuda and --local_rank=J, and cluster.local_size set to
# match, so that together they are one member of the job
# (docs/node_groups.md). Every argument goes to every process, except that
# the local_size is appended to a --set=... argument (or added as one) and
# local rank J serves its metrics on the port of --metrics_address plus J.
#
# A signal to this script (docker stop) goes to every process; the script
# exits with the first non-zero status of its processes, else 0.
set -euo pipefail

worker=${CSERPS_WORKER:-/usr/local/bin/cserps-worker}
local_size=${CSERPS_LOCAL_SIZE:-1}
if ! [[ "$local_size" =~ ^[1-9][0-9]*$ ]]; then
  echo "cserps-node: CSERPS_LOCAL_SIZE=\"$local_size\" is not a positive integer" >&2
  exit 2
fi

args=()
have_set=0
for a in "$@"; do
  if [[ "$a" == --set=* ]]; then
    a="$a;cluster.local_size=$local_size"
    have_set=1
  fi
  args+=("$a")
done
if [ "$have_set" = 0 ]; then args+=("--set=cluster.local_size=$local_size"); fi

pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
for ((j = 0; j < local_size; ++j)); do
  mine=()
  for a in "${args[@]}"; do
    if [[ "$a" =~ ^--metrics_address=(.*):([0-9]+)$ ]]; then
      a="--metrics_address=${BASH_REMATCH[1]}:$((BASH_REMATCH[2] + j))"
    fi
    mine+=("$a")
  done
  "$worker" "${mine[@]}" --backend=cuda --local_rank="$j" &
  pids+=("$!")
done

status=0
for pid in "${pids[@]}"; do
  # `wait` returns early (status > 128) when a trapped signal arrives: wait
  # for the process again until it has really ended.
  while true; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  if [ "$status" = 0 ] && [ "$rc" != 0 ]; then status=$rc; fi
done
exit "$status"
