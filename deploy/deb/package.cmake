# package.cmake - the Debian package psd_<version>_<arch>.deb, made by CPack
# from the install rules of the whole tree:
#
#   cmake -S . -B build-deb -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-deb -j2
#   (cd build-deb && cpack -G DEB)
#   apt-get install ./build-deb/psd_*.deb
#
# One package holds psd, psworker and psctl (/usr/bin), libpsclient (shared
# and static, its header and its .pc), the Python package psd (Debian's
# python3 path), the dashboard's files (/usr/share/psd/web), the units
# psd.service and psworker@.service, and /etc/psd/psd.conf and
# /etc/psd/psworker.env as conffiles (dpkg keeps an administrator's edits on
# upgrade and asks). Its maintainer scripts (beside this file) create the
# system user psd at install, reload systemd where it runs, and on purge
# remove psd's state directory. The library dependencies come from
# dpkg-shlibdeps (package dpkg-dev), so they are those of the distribution
# that built the package. docs/operations-engines.md says what the tests
# showed.
#
# CPACK_SET_DESTDIR: cpack installs with DESTDIR=<staging> and the prefix
# /usr, as `DESTDIR=... cmake --install --prefix /usr` would; without it cpack
# would move the prefix into the staging directory and the rules that install
# to absolute paths (the units in /lib/systemd/system, /etc/psd) would miss it.

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "psd")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "psd developers")
set(CPACK_PACKAGE_CONTACT "psd developers <psd@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "parameter server for distributed training (psd, psworker, psctl, libpsclient)")
set(CPACK_PACKAGE_DESCRIPTION
    "psd keeps a model's parameters and optimizer state and serves pushes of\n\
gradients and pulls of parameters from training workers over TCP, in\n\
asynchronous (ASGD), bulk-synchronous (BSP) or stale-synchronous (SSP)\n\
mode. This package holds the daemon psd (a systemd service), the trainer\n\
psworker, the admin tool psctl, the client library libpsclient with its\n\
header and pkg-config file, and the Python package psd.")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
# with CPACK_SET_DESTDIR, cpack installs to CPACK_INSTALL_PREFIX (under
# DESTDIR), which would else be the build's CMAKE_INSTALL_PREFIX
set(CPACK_INSTALL_PREFIX "/usr")
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES OFF)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "science")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
# adduser: the maintainer scripts create the user psd; procps: /bin/kill,
# which psd.service runs for `systemctl reload psd`
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, procps")
# the Python package is pure Python over libpsclient and needs numpy
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3, python3-numpy")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, dataset-fashion-mnist, systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${CMAKE_CURRENT_LIST_DIR}/conffiles"
    "${CMAKE_CURRENT_LIST_DIR}/postinst"
    "${CMAKE_CURRENT_LIST_DIR}/prerm"
    "${CMAKE_CURRENT_LIST_DIR}/postrm")
# only the package: no source package, no test or bench programs
set(CPACK_SOURCE_GENERATOR "")
include(CPack)
