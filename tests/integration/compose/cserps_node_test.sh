#!/usr/bin/env bash
# deploy/docker/cserps-node.sh, the GPU container's entrypoint, with a stub
# in place of cserps-worker that records its arguments: one process per
# local rank with --backend=cuda and --local_rank=J, cluster.local_size
# appended to --set (or added), metrics ports spread over the local ranks,
# the first failing status returned, and a bad CSERPS_LOCAL_SIZE refused.
set -euo pipefail
NODE=$(cd "$(dirname "$0")/../../.." && pwd)/deploy/docker/cserps-node.sh
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cat >"$WORK/stub" <<'STUB'
#!/usr/bin/env bash
for a in "$@"; do [[ "$a" == --local_rank=* ]] && j=${a#--local_rank=}; done
printf '%s\n' "$@" >"$STUB_OUT/rank$j"
if [ "$j" = "${STUB_FAIL_RANK:-}" ]; then exit 3; fi
STUB
chmod +x "$WORK/stub"
export CSERPS_WORKER="$WORK/stub" STUB_OUT="$WORK"

fail() { echo "cserps_node_test: $*" >&2; exit 1; }
expect_args() {  # file, expected lines
  local file=$1; shift
  diff <(printf '%s\n' "$@") "$file" >/dev/null || {
    echo "== $file:"; cat "$file"; fail "arguments of ${file##*/} differ"; }
}

CSERPS_LOCAL_SIZE=3 "$NODE" --config=job --metrics_address=0.0.0.0:9100 \
  '--set=cluster.servers=a:1,b:2;output_dir=/o' || fail "3 local ranks: status $?"
for j in 0 1 2; do
  expect_args "$WORK/rank$j" --config=job "--metrics_address=0.0.0.0:$((9100 + j))" \
    '--set=cluster.servers=a:1,b:2;output_dir=/o;cluster.local_size=3' \
    --backend=cuda "--local_rank=$j"
done
[ ! -e "$WORK/rank3" ] || fail "a fourth process was started"

rm -f "$WORK"/rank*
"$NODE" --config=job || fail "default local size: status $?"
expect_args "$WORK/rank0" --config=job --set=cluster.local_size=1 --backend=cuda --local_rank=0
[ ! -e "$WORK/rank1" ] || fail "CSERPS_LOCAL_SIZE unset started more than one process"

rc=0
STUB_FAIL_RANK=1 CSERPS_LOCAL_SIZE=2 "$NODE" --config=job || rc=$?
[ "$rc" = 3 ] || fail "local rank 1 exited 3 but the node exited $rc"

rc=0
CSERPS_LOCAL_SIZE=two "$NODE" --config=job 2>"$WORK/err" || rc=$?
[ "$rc" = 2 ] && grep -q 'CSERPS_LOCAL_SIZE="two"' "$WORK/err" ||
  fail "a bad CSERPS_LOCAL_SIZE gave status $rc: $(cat "$WORK/err")"
echo "cserps_node_test: ok"
