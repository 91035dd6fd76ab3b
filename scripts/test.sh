#!/usr/bin/env bash
# test.sh - the whole test suite: set up (packages, data, build), run every
# ctest test (unit tests with cmocka, integration tests with real psd,
# psworker and psctl processes), then build again with AddressSanitizer and
# UndefinedBehaviorSanitizer and run the suite once more. ctest runs as many
# tests at a time as the machine has cores (PSD_TEST_JOBS to choose); the
# tests that assert a latency run alone (RUN_SERIAL in tests/*/CMakeLists.txt).
#
# Then a clang build in build-fuzz/ runs each libFuzzer target in fuzz/ for
# 20 s. Last, the engine tests (tests/engines/, label engines) run psd for
# real as a Debian package in a clean Debian 12 root, under a Slurm cluster
# on this machine and as a podman image: they need root and Debian's mirror.
# Environment: PSD_SKIP_SANITIZE=1 skips the sanitizer pass,
# PSD_SKIP_FUZZ=1 the fuzz pass, PSD_SKIP_ENGINES=1 the engine tests.
#
# A test that needs what this machine cannot give (root, network
# namespaces, tc, a browser, a tool, Debian's mirror) skips and says why;
# the last lines of the output count and name every skip of each pass, pass
# or fail.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

start=$(date +%s)
scripts/setup.sh

# the tests append `SKIPPED script: test: reason` lines here (harness.py,
# tests/client/conftest.py); printed last, whatever the outcome
skips_plain="$ROOT/build/skipped-tests.txt"
skips_asan="$ROOT/build-asan/skipped-tests.txt"
skips_engines="$ROOT/build/skipped-engines.txt"
rm -f "$skips_plain" "$skips_asan" "$skips_engines"
list_skips() {
    local pass file n
    for pass in plain asan engines; do
        file="$skips_plain"
        [ "$pass" = asan ] && file="$skips_asan"
        [ "$pass" = engines ] && file="$skips_engines"
        [ -f "$file" ] || continue
        n=$(sort -u "$file" | wc -l)
        echo "== skipped ($pass build): $n test(s) or checks, for what this machine lacks"
        sort -u "$file" | sed 's/^SKIPPED /   /'
    done
}
trap list_skips EXIT

jobs="${PSD_TEST_JOBS:-$(nproc)}"
echo "== tests (build/, $jobs at a time)"
: >"$skips_plain"
PSD_TEST_SKIPS="$skips_plain" ctest --test-dir build -LE engines -j"$jobs" --output-on-failure --timeout 600

if [ "${PSD_SKIP_SANITIZE:-0}" != 1 ]; then
    echo "== tests under AddressSanitizer + UBSan (build-asan/, $jobs at a time)"
    PSD_SANITIZE=1 scripts/setup.sh
    : >"$skips_asan"
    PSD_TEST_SKIPS="$skips_asan" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --test-dir build-asan -j"$jobs" --output-on-failure --timeout 900
fi
if [ "${PSD_SKIP_FUZZ:-0}" != 1 ]; then
    echo "== fuzz targets, 20 s each (build-fuzz/)"
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSD_FUZZ=ON >/dev/null
    cmake --build build-fuzz --target fuzz_targets -j"$(nproc)"
    ctest --test-dir build-fuzz -L fuzz -j2 --output-on-failure
fi
if [ "${PSD_SKIP_ENGINES:-0}" != 1 ]; then
    echo "== engines: the Debian package, Slurm, the container image (build/, label engines)"
    : >"$skips_engines"
    PSD_TEST_SKIPS="$skips_engines" ctest --test-dir build -L engines --output-on-failure --timeout 900
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
