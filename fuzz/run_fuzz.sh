#!/bin/sh
# run_fuzz.sh - one bounded fuzz pass, as ctest runs it:
#
#   run_fuzz.sh TARGET CORPUS SECONDS RUNS [libFuzzer options...]
#
# Fuzzes TARGET for at most SECONDS seconds and RUNS executions, starting
# from the seeds in CORPUS (read only: new inputs go to a temporary
# directory). Exits 0 when nothing was found; otherwise with libFuzzer's
# code, keeping the temporary directory with the input that failed
# (crash-*, leak-*, timeout-*, oom-*) and saying where it is.
set -u
if [ $# -lt 4 ]; then
    echo "usage: $0 TARGET CORPUS SECONDS RUNS [libFuzzer options...]" >&2
    exit 2
fi
bin=$1 corpus=$2 secs=$3 runs=$4
shift 4
name=$(basename "$bin")
work=$(mktemp -d "${TMPDIR:-/tmp}/psd-$name.XXXXXX") || exit 1
mkdir "$work/new" || exit 1

# The targets that read files (config, checkpoint) write each input to a
# scratch directory: in memory when /dev/shm is there (several times faster).
scratch=$(mktemp -d "/dev/shm/psd-$name.XXXXXX" 2>/dev/null || mktemp -d "$work/scratch.XXXXXX") || exit 1
TMPDIR=$scratch UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    "$bin" -max_total_time="$secs" -runs="$runs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/new" "$corpus"
rc=$?
rm -rf "$scratch"
if [ "$rc" -ne 0 ]; then
    echo "run_fuzz: $name failed (exit $rc); what it found is in $work/:" >&2
    ls "$work" >&2
    exit "$rc"
fi
rm -rf "$work"
