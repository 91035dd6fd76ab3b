# install-files.cmake - run by `cmake --install` (see CMakeLists.txt here),
# when CMAKE_INSTALL_PREFIX is the prefix of this installation. Installs
#   <sysconfdir>/psd/psd.conf and psworker.env, unless they exist (an
#     administrator's settings are never overwritten);
#   the units, with @PSD_BINDIR@ and @PSD_CONFDIR@ filled in.
# Given: PSD_SOURCE_DIR, PSD_WORK_DIR (scratch), PSD_BINDIR, PSD_SYSCONFDIR
# PSD_UNITDIR (relative to the prefix, absolute, or empty: PSD_SYSTEM_UNITDIR,
# systemd's own, for the prefixes / and /usr, else lib/systemd/system under
# the prefix) and PSD_SYSTEM_UNITDIR. DESTDIR is honoured
# by file(INSTALL) and by the existence check.

function(psd_under_prefix out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "${CMAKE_INSTALL_PREFIX}/${dir}" PARENT_SCOPE)
  endif()
endfunction()

psd_under_prefix(PSD_BINDIR "${PSD_BINDIR}")
if(NOT "${PSD_UNITDIR}" STREQUAL "")
  psd_under_prefix(psd_unitdir "${PSD_UNITDIR}")
elseif(CMAKE_INSTALL_PREFIX MATCHES "^/(usr/?)?$")
  set(psd_unitdir "${PSD_SYSTEM_UNITDIR}")
else()
  set(psd_unitdir "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")
endif()
# GNUInstallDirs' rule for sysconfdir: /etc for the prefixes / and /usr,
# /etc/opt/... for /opt/..., else etc under the prefix.
if(IS_ABSOLUTE "${PSD_SYSCONFDIR}")
  set(psd_etc "${PSD_SYSCONFDIR}")
elseif(CMAKE_INSTALL_PREFIX MATCHES "^/(usr/?)?$")
  set(psd_etc "/${PSD_SYSCONFDIR}")
elseif(CMAKE_INSTALL_PREFIX MATCHES "^/opt/(.*)$")
  set(psd_etc "/${PSD_SYSCONFDIR}/opt/${CMAKE_MATCH_1}")
else()
  set(psd_etc "${CMAKE_INSTALL_PREFIX}/${PSD_SYSCONFDIR}")
endif()
string(REGEX REPLACE "/+$" "" psd_etc "${psd_etc}")
set(PSD_CONFDIR "${psd_etc}/psd")

foreach(f psd.conf psworker.env)
  if(EXISTS "$ENV{DESTDIR}${PSD_CONFDIR}/${f}")
    message(STATUS "Keeping: $ENV{DESTDIR}${PSD_CONFDIR}/${f} (exists; the new one is "
                   "${PSD_SOURCE_DIR}/conf/${f})")
  else()
    file(INSTALL DESTINATION "${PSD_CONFDIR}" TYPE FILE FILES "${PSD_SOURCE_DIR}/conf/${f}")
  endif()
endforeach()

foreach(unit psd.service psworker@.service)
  configure_file("${PSD_SOURCE_DIR}/systemd/${unit}.in" "${PSD_WORK_DIR}/${unit}" @ONLY)
  file(INSTALL DESTINATION "${psd_unitdir}" TYPE FILE FILES "${PSD_WORK_DIR}/${unit}")
endforeach()
