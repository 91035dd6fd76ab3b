#!/usr/bin/env bash
# run-mnist.sh - the main job: set up, start psd, train two ASGD workers on
# MNIST on this machine with the recommended W1 settings of docs/settings.md (Adam, lr
# 2e-3, a cosine schedule over the run, batch 64 per worker), show progress
# and the operator's view, print the final test accuracy and stop psd.
#
# Environment (all optional):
#   PSD_EPOCHS=4  PSD_BATCH=64  PSD_MODEL=mlp:256,128  PSD_MODE=asgd
#   PSD_OPTIMIZER=adam  PSD_LR=0.002  PSD_SCHEDULE=cosine  PSD_MOMENTUM=0.9
#   PSD_WORKERS=2  PSD_DATASET=mnist
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

EPOCHS="${PSD_EPOCHS:-4}"
BATCH="${PSD_BATCH:-64}"
MODEL="${PSD_MODEL:-mlp:256,128}"
MODE="${PSD_MODE:-asgd}"
OPTIMIZER="${PSD_OPTIMIZER:-adam}"
LR="${PSD_LR:-0.002}"
SCHEDULE="${PSD_SCHEDULE:-cosine}"
MOMENTUM="${PSD_MOMENTUM:-0.9}"
WORKERS="${PSD_WORKERS:-2}"
DATASET="${PSD_DATASET:-mnist}"

scripts/setup.sh job   # only what building psd and running the job need
BIN="${PSD_BUILD_DIR:-build}"

run="$(mktemp -d)"
psd_pid=""
cleanup() {
    local rc=$?
    if [ -n "$psd_pid" ] && kill -0 "$psd_pid" 2>/dev/null; then
        kill -TERM "$psd_pid" 2>/dev/null || true
        wait "$psd_pid" 2>/dev/null || true
    fi
    jobs -p | xargs -r kill 2>/dev/null || true
    rm -rf "$run"
    exit "$rc"
}
trap cleanup EXIT INT TERM

# The schedule runs over the whole job: one model version per ASGD push, one
# per BSP round (whose M pushes share one step).
per_version=$BATCH
[ "$MODE" = bsp ] && per_version=$((BATCH * WORKERS))
VERSIONS=$((EPOCHS * ((60000 + per_version - 1) / per_version)))

echo "== starting psd ($MODE, $WORKERS workers, $OPTIMIZER lr $LR, $SCHEDULE schedule over $VERSIONS versions)"
"$BIN/server/psd" --listen 127.0.0.1:0 --port-file "$run/port" --mode "$MODE" --workers "$WORKERS" \
    --set optimizer="$OPTIMIZER" --set lr="$LR" --set momentum="$MOMENTUM" --set lr_schedule="$SCHEDULE" \
    --set lr_decay_versions="$VERSIONS" --set warmup_versions=0 2> >(sed -u 's/^/  psd | /' >&2) &
psd_pid=$!
for _ in $(seq 1 100); do
    [ -s "$run/port" ] && break
    kill -0 "$psd_pid" 2>/dev/null || { echo "psd failed to start" >&2; exit 1; }
    sleep 0.1
done
[ -s "$run/port" ] || { echo "psd did not report its port" >&2; exit 1; }
SERVER="127.0.0.1:$(cat "$run/port")"

echo "== training $MODEL on $DATASET: $WORKERS workers, batch $BATCH each, $EPOCHS epochs"
pids=()
for k in $(seq 0 $((WORKERS - 1))); do
    "$BIN/worker/psworker" --server "$SERVER" --shard "$k/$WORKERS" --dataset "$DATASET" --model "$MODEL" \
        --epochs "$EPOCHS" --batch "$BATCH" --eval >"$run/worker$k.json" &
    pids+=($!)
done

# The operator's view while the job runs.
for _ in $(seq 1 50); do
    sleep 0.2
    n=$("$BIN/psctl/psctl" --server "$SERVER" status --json 2>/dev/null |
        grep -o '"state": "connected"' | wc -l || true)
    [ "$n" -ge "$WORKERS" ] && break
done
# then until the first epoch's report (it carries the test accuracy), at
# most 10 s: the recommended job trains an epoch in well under a second
for _ in $(seq 1 200); do
    "$BIN/psctl/psctl" --server "$SERVER" status --json 2>/dev/null | grep -q '"epoch": [1-9]' && break
    kill -0 "${pids[0]}" 2>/dev/null || break
    sleep 0.05
done
echo "== psctl status (while training)"
"$BIN/psctl/psctl" --server "$SERVER" status || true

fail=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "worker $i failed" >&2; fail=1; }
done
[ "$fail" = 0 ] || exit 1

echo "== psctl status (after training)"
"$BIN/psctl/psctl" --server "$SERVER" status || true
kill -TERM "$psd_pid"
wait "$psd_pid" || { echo "psd exited with an error" >&2; exit 1; }
psd_pid=""

echo "== result"
for k in $(seq 0 $((WORKERS - 1))); do
    echo "  worker $k: $(tail -n1 "$run/worker$k.json")"
done
acc=$(tail -n1 "$run/worker0.json" | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
secs=$(tail -n1 "$run/worker0.json" | sed -n 's/.*"seconds": \([0-9.]*\).*/\1/p')
printf 'final test accuracy: %.2f%% after %s epochs (%s s of training)\n' \
    "$(echo "$acc * 100" | bc -l 2>/dev/null || awk "BEGIN{print $acc*100}")" "$EPOCHS" "$secs"
