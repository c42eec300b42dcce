# packaging.cmake -- Debian packages with CPack.
#
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr
#   cmake --build build -j2
#   (cd build && cpack -G DEB)     # libtaskpool1_<v>_<arch>.deb, libtaskpool-dev_<v>_<arch>.deb
#
# One package per install component of cmake/install.cmake:
#   libtaskpool1     (runtime) the shared library and its SONAME link
#   libtaskpool-dev  (dev)     header, .so link, static library, pkg-config,
#                              CMake package, man pages; depends on libtaskpool1
#                              of the same version
# Both carry LICENSE as /usr/share/doc/<package>/copyright. The runtime
# package's dependencies come from dpkg-shlibdeps (dpkg-dev) when it is
# installed, else from a hand-written "libc6 (>= 2.34)" (pthreads in libc).
# Configure with CMAKE_INSTALL_PREFIX=/usr to get Debian's multiarch library
# directory (lib/<triplet>) in the packages; they install under /usr either way.
# The deb_packages test builds both, unpacks them with `dpkg -x` and builds
# tests/install against the unpacked tree.

if(NOT TP_INSTALL)
  return()
endif()

set(TP_DEB_MAINTAINER "libtaskpool maintainers <maintainers@libtaskpool.invalid>"
    CACHE STRING "Maintainer field of the .deb packages")
mark_as_advanced(TP_DEB_MAINTAINER)

set(CPACK_PACKAGE_NAME "libtaskpool")
set(CPACK_PACKAGE_VENDOR "The libtaskpool authors")
set(CPACK_PACKAGE_CONTACT "${TP_DEB_MAINTAINER}")
# The synopsis of both packages (the first line of Description; Debian wants
# no leading article); each component's description is the extended text.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "bounded worker pool for C services")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_PACKAGE_CHECKSUM SHA256)
set(CPACK_STRIP_FILES ON) # as Debian ships libraries; static archives are left alone
set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES "/\\\\.git/" "/\\\\.git$" "/build[^/]*/")

set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # <package>_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

# The extended description both packages share.
set(TP_DEB_ABOUT
  "libtaskpool is an embeddable C11 thread pool (libc and pthreads only):
fixed or elastic workers on a bounded FIFO queue, per-user slots,
non-blocking admission with clear refusal codes, budgeted blocking submit,
cooperative cancellation, run timeouts and deadlines, retries, drain and
shutdown with a deadline, and atomic statistics.")

# libtaskpool1: the shared library. A shlibs file (so that packages built
# against it depend on it) and the ldconfig trigger come with GENERATE_SHLIBS.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME "${TP_DEB_RUNTIME}")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_RUNTIME_DISPLAY_NAME "${TP_DEB_RUNTIME}")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "${TP_DEB_ABOUT}\n.\nThis package contains the shared library.")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
# CPack's postinst/postrm call ldconfig; dpkg's trigger is what Debian expects.
file(WRITE "${PROJECT_BINARY_DIR}/deb/runtime/triggers" "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA "${PROJECT_BINARY_DIR}/deb/runtime/triggers")
find_program(TP_DPKG_SHLIBDEPS dpkg-shlibdeps)
mark_as_advanced(TP_DPKG_SHLIBDEPS)
if(TP_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "libc6 (>= 2.34)")
endif()

# libtaskpool-dev: everything needed to build against it.
set(CPACK_DEBIAN_DEV_PACKAGE_NAME "${TP_DEB_DEV}")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DISPLAY_NAME "${TP_DEB_DEV}")
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "${TP_DEB_ABOUT}\n.\nThis package contains the header, the static library, the pkg-config and
CMake package files and the manual pages (taskpool(7), tp_submit(3), ...).")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${TP_DEB_RUNTIME} (= ${PROJECT_VERSION}), libc6-dev | libc-dev")

include(CPack)
