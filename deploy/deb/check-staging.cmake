# check-staging.cmake - run by cpack (CPACK_PRE_BUILD_SCRIPTS) after it has
# installed the tree into its staging directory and before it makes the
# package: a package without the dashboard's charts or without the man
# pages is refused, with what to do, rather than shipped.

file(GLOB_RECURSE psd_uplot "${CPACK_TEMPORARY_DIRECTORY}/*/uPlot.iife.min.js")
if(NOT psd_uplot)
  message(FATAL_ERROR "uPlot, the dashboard's chart library, is not in the build: the package would "
                      "have a dashboard without charts. Run `scripts/setup.sh uplot` (it fetches the "
                      "npm package uplot into data/uplot/), then configure and build again.")
endif()
file(GLOB_RECURSE psd_man "${CPACK_TEMPORARY_DIRECTORY}/*.1.gz")
foreach(prog psd psworker psctl)
  if(NOT psd_man MATCHES "/man1/${prog}\\.1\\.gz")
    message(FATAL_ERROR "no man page ${prog}.1 in the build: install help2man (Debian package "
                        "help2man), then configure and build again.")
  endif()
endforeach()
