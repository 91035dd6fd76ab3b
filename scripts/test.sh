#!/usr/bin/env bash
# test.sh - the whole test suite: set up (packages, data, build), run every
# ctest test (unit tests with cmocka, integration tests with real psd,
# psworker and psctl processes), then build again with AddressSanitizer and
# UndefinedBehaviorSanitizer and run the suite once more.
#
# Environment: PSD_SKIP_SANITIZE=1 skips the sanitizer pass.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

start=$(date +%s)
scripts/setup.sh

echo "== tests (build/)"
ctest --test-dir build --output-on-failure --timeout 600

if [ "${PSD_SKIP_SANITIZE:-0}" != 1 ]; then
    echo "== tests under AddressSanitizer + UBSan (build-asan/)"
    PSD_SANITIZE=1 scripts/setup.sh
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --test-dir build-asan --output-on-failure --timeout 900
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
