#!/usr/bin/python3
"""prepare.py - what the engine tests share, made once per run of the group.

    prepare.py --build-dir BUILD --prepared DIR

DIR/pkg/psd_<version>_<arch>.deb: the Debian package (cpack -G DEB from the
build directory), and DIR/bookworm.tar: a minimal Debian 12 (mmdebstrap
--variant=apt) from Debian's mirror. test_deb.py installs the one in the
other; test_image.py imports the tar as the image's base and builds the
image from the package. ctest runs this first (fixture engines) and removes
DIR after the group.
"""

import os
import shutil

import engines
from engines import Failure, log

ARGS = engines.parse_args()


def body():
    engines.need_root()
    engines.need_debian12()
    if not ARGS.prepared:
        raise Failure("--prepared DIR is required")
    if os.path.isdir(ARGS.prepared):
        shutil.rmtree(ARGS.prepared)
    os.makedirs(ARGS.prepared)
    deb = engines.make_package(ARGS.build_dir, os.path.join(ARGS.prepared, "pkg"))
    tar = os.path.join(ARGS.prepared, "bookworm.tar")
    engines.mmdebstrap(tar)
    log("prepared %s and %s (%d MB)" % (deb, tar, os.path.getsize(tar) >> 20))


def cleanup():
    pass


if __name__ == "__main__":
    engines.main(body, cleanup)
