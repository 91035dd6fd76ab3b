# package.cmake - the Debian package psd_<version>_<arch>.deb, and its
# debug symbols psd-dbgsym_<version>_<arch>.ddeb, made by CPack from the
# install rules of the whole tree:
#
#   scripts/setup.sh uplot    # the dashboard's charts: cpack refuses a package without them
#   cmake -S . -B build-deb -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr
#   cmake --build build-deb -j2
#   (cd build-deb && cpack -G DEB)
#   apt-get install ./build-deb/psd_*.deb
#
# One package holds psd, psworker and psctl (/usr/bin) with their man pages
# (help2man, man/), libpsclient (shared and static, its header and its
# .pc), the Python package psd (Debian's python3 path), the dashboard's
# files (/usr/share/psd/web), get-mnist.sh (/usr/share/psd), the units
# psd.service and psworker@.service, /etc/psd/psd.conf and
# /etc/psd/psworker.env as conffiles (dpkg keeps an administrator's edits on
# upgrade and asks), and in /usr/share/doc/psd the copyright file (Debian's
# machine-readable format: psd's licence and uPlot's) and the changelog.
# The binaries are stripped; their debug symbols go to the -dbgsym package
# (a RelWithDebInfo build has them). Its maintainer scripts (beside this
# file) create the system user psd and /srv/psd/data at install, compile
# and clean the Python package's byte code (py3compile, py3clean), tell
# systemd of the units as debhelper's snippets do (deb-systemd-helper,
# deb-systemd-invoke), and on purge remove psd's state directory; the
# triggers file runs ldconfig. The library dependencies come from
# dpkg-shlibdeps (package dpkg-dev), so they are those of the distribution
# that built the package. `lintian` passes it but for the findings
# docs/operations-engines.md justifies one by one; the engine test
# (tests/engines/test_deb.py) fails on any other.
#
# CPACK_SET_DESTDIR: cpack installs with DESTDIR=<staging> and the prefix
# /usr, as `DESTDIR=... cmake --install --prefix /usr` would; without it cpack
# would move the prefix into the staging directory and the rules that install
# to absolute paths (the units in /lib/systemd/system, /etc/psd) would miss it.
#
# -DCMAKE_INSTALL_PREFIX=/usr at configure time (as above) gives libpsclient
# Debian's multiarch directory; with the default prefix it goes to /usr/lib.

# /usr/share/doc/psd: copyright and changelog.gz (gzip -9n: no name, no date)
find_program(PSD_DEB_GZIP gzip)
set(psd_changelog_gz "${PROJECT_BINARY_DIR}/deb/changelog.gz")
add_custom_command(OUTPUT "${psd_changelog_gz}"
                   COMMAND ${CMAKE_COMMAND} -E make_directory "${PROJECT_BINARY_DIR}/deb"
                   COMMAND ${CMAKE_COMMAND} -E copy "${CMAKE_CURRENT_LIST_DIR}/changelog" "${PROJECT_BINARY_DIR}/deb/changelog"
                   COMMAND ${PSD_DEB_GZIP} -9nf "${PROJECT_BINARY_DIR}/deb/changelog"
                   DEPENDS "${CMAKE_CURRENT_LIST_DIR}/changelog" VERBATIM)
add_custom_target(psd_deb_changelog ALL DEPENDS "${psd_changelog_gz}")
install(FILES "${CMAKE_CURRENT_LIST_DIR}/copyright" "${psd_changelog_gz}" DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(PROGRAMS "${PROJECT_SOURCE_DIR}/deploy/get-mnist.sh" DESTINATION ${CMAKE_INSTALL_DATADIR}/psd)

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
# stripped binaries, their debug symbols apart in psd-dbgsym (a .ddeb; the
# DEB generator strips them itself: CPACK_STRIP_FILES would strip the
# symbols away before it could keep them)
set(CPACK_STRIP_FILES OFF)
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "science")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
# adduser: the maintainer scripts create the user psd; procps: /bin/kill,
# which psd.service runs for `systemctl reload psd`
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, procps")
# the Python package is pure Python over libpsclient and needs numpy
# dataset-fashion-mnist: psworker reads it from /usr/share/datasets, so an
# installed psworker trains without data of its own
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3, python3-numpy, dataset-fashion-mnist")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, systemd, curl")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${CMAKE_CURRENT_LIST_DIR}/conffiles"
    "${CMAKE_CURRENT_LIST_DIR}/triggers"
    "${CMAKE_CURRENT_LIST_DIR}/postinst"
    "${CMAKE_CURRENT_LIST_DIR}/prerm"
    "${CMAKE_CURRENT_LIST_DIR}/postrm")
# only the package: no source package, no test or bench programs
set(CPACK_SOURCE_GENERATOR "")
# refuses a package without uPlot or the man pages, saying what to do
set(CPACK_PRE_BUILD_SCRIPTS "${CMAKE_CURRENT_LIST_DIR}/check-staging.cmake")
include(CPack)
