# install.cmake -- what `cmake --install` puts where, and in which package.
#
# Included from the top-level CMakeLists.txt after the library targets exist.
# Every file belongs to one of two install components, which are also the two
# Debian packages of cmake/packaging.cmake:
#
#   runtime  libtaskpool1     libtaskpool.so.MAJOR and its real file,
#                             share/doc/libtaskpool1/copyright (LICENSE)
#   dev      libtaskpool-dev  taskpool.h, the libtaskpool.so link, libtaskpool.a,
#                             taskpool.pc, the CMake package, the man pages,
#                             share/doc/libtaskpool-dev/copyright
#
# `cmake --install build` installs both; `--component runtime` one of them.
#
# TP_INSTALL (ON at top level, OFF under add_subdirectory/FetchContent) turns
# all of it off, so that a parent project's install and packages contain
# nothing of ours. The parent links taskpool::taskpool or
# taskpool::taskpool_static into its own binaries instead.

option(TP_INSTALL "Generate install rules for libtaskpool (OFF: a parent project installs nothing of ours)"
       ${TP_TOP_LEVEL})
if(NOT TP_INSTALL)
  return()
endif()

set(TP_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/taskpool")
# The Debian package names; also the names of the documentation directories.
set(TP_DEB_RUNTIME "libtaskpool${PROJECT_VERSION_MAJOR}")
set(TP_DEB_DEV "libtaskpool-dev")

# ------------------------------------------------------------ libraries, header
install(TARGETS taskpool
  EXPORT taskpoolTargets
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT runtime
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT runtime
          NAMELINK_COMPONENT dev                 # libtaskpool.so -> .so.MAJOR
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dev)
install(TARGETS taskpool_static
  EXPORT taskpoolTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dev)
install(FILES "${PROJECT_SOURCE_DIR}/include/taskpool.h"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT dev)

# ------------------------------------------------------------ CMake package
install(EXPORT taskpoolTargets
  NAMESPACE taskpool::
  DESTINATION "${TP_CMAKE_DIR}"
  COMPONENT dev)
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/taskpoolConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/taskpoolConfig.cmake"
  INSTALL_DESTINATION "${TP_CMAKE_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/taskpoolConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMajorVersion)
install(FILES
  "${PROJECT_BINARY_DIR}/taskpoolConfig.cmake"
  "${PROJECT_BINARY_DIR}/taskpoolConfigVersion.cmake"
  DESTINATION "${TP_CMAKE_DIR}"
  COMPONENT dev)

# ------------------------------------------------------------ pkg-config
# Relocatable: the prefix is found from the .pc file's own place
# (${pcfiledir}), so the same file works after `cmake --install --prefix DIR`,
# in a .deb, and in a tree unpacked anywhere with `dpkg -x`. Only when the
# install directories are absolute paths is an absolute prefix written.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(TP_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(TP_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(TP_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  # From <prefix>/<libdir>/pkgconfig back up to <prefix>: "../.." for lib,
  # "../../.." for Debian's lib/<multiarch triplet>.
  file(RELATIVE_PATH tp_pc_up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" tp_pc_up "${tp_pc_up}")
  set(TP_PC_PREFIX "\${pcfiledir}/${tp_pc_up}")
  set(TP_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(TP_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/taskpool.pc.in" "${PROJECT_BINARY_DIR}/taskpool.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/taskpool.pc"
  DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig"
  COMPONENT dev)

# ------------------------------------------------------------ licence
# Debian keeps it as /usr/share/doc/<package>/copyright; other installs get it
# under the same name.
foreach(tp_pkg_comp IN ITEMS "${TP_DEB_RUNTIME};runtime" "${TP_DEB_DEV};dev")
  list(GET tp_pkg_comp 0 tp_pkg)
  list(GET tp_pkg_comp 1 tp_comp)
  install(FILES "${PROJECT_SOURCE_DIR}/LICENSE"
    DESTINATION "${CMAKE_INSTALL_DATAROOTDIR}/doc/${tp_pkg}"
    RENAME copyright
    COMPONENT ${tp_comp})
endforeach()

# ------------------------------------------------------------ man pages
# docs/man/*.scd -> share/man/man3 and man7 (component dev); skipped with a
# one-line notice when scdoc is not installed. Compressed when gzip is there.
find_program(TP_GZIP gzip)
mark_as_advanced(TP_GZIP)
add_subdirectory("${PROJECT_SOURCE_DIR}/docs/man" "${PROJECT_BINARY_DIR}/docs/man")
