# Sourced by the scripts that compare two builds of cserps
# (tools/check_same_curves.sh, tools/compare_cpu_speed.sh):
#   need_builds USAGE OLD_BUILD NEW_BUILD BINARY...
# exits 2 with USAGE unless both build directories hold every BINARY in
# bin/.
need_builds() {
  local usage=$1
  shift
  if [ $# -lt 2 ] || [ -z "$1" ] || [ -z "$2" ]; then
    echo "usage: $usage" >&2
    exit 2
  fi
  local old=$1 new=$2 b bin
  shift 2
  for b in "$old" "$new"; do
    for bin in "$@"; do
      if [ ! -x "$b/bin/$bin" ]; then
        echo "$(basename "$0"): no $b/bin/$bin" >&2
        exit 2
      fi
    done
  done
}
