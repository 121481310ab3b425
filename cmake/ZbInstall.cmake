# Install rules and the .deb (docs/operations.md, Install): the three
# binaries, the systemd units, the config examples (the coordinator's config
# and the workers' environment file as /etc/zb conffiles), the man pages and
# zbctl's bash completion. `cmake --install build/dev` (DESTDIR= for a
# staging root), `cpack --config build/dev/CPackConfig.cmake` for the .deb.
include(GNUInstallDirs)

set(zb_install_targets zbctl)
if(ZB_SERVICE)
  list(APPEND zb_install_targets zb-coordinator zb-worker)
endif()
# keep the library directories outside the build tree (OpenBLAS's) in the
# installed binaries' run path, as in the build: nothing to rewrite
set_target_properties(${zb_install_targets} PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS ${zb_install_targets} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

if(ZB_SERVICE)
  # systemd looks in /lib/systemd/system (merged /usr on Debian 12)
  install(FILES deploy/systemd/zb-coordinator.service deploy/systemd/zb-worker@.service
          DESTINATION lib/systemd/system)
  # where the units read them, whatever the prefix (a staging install sets
  # DESTDIR; -DZB_INSTALL_CONFDIR=... moves them)
  set(ZB_INSTALL_CONFDIR /etc/zb CACHE PATH "Where the config examples are installed (the units read /etc/zb)")
  install(FILES deploy/zb-coordinator.yaml deploy/systemd/zb-worker.env DESTINATION ${ZB_INSTALL_CONFDIR})
  install(FILES docs/man/zb-coordinator.8 docs/man/zb-worker.8 DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
  install(DIRECTORY deploy/jobs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/jobs)
  # the model configs the example jobs name (as deploy/models/... in the source tree)
  install(DIRECTORY deploy/models/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/models)
endif()
install(FILES docs/man/zbctl.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES deploy/completion/zbctl.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME zbctl)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME zb)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "zb maintainers <zb@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "pipeline-parallel training service with zero-bubble schedules")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
# Debian 12's runtime packages of what the binaries link (ldd, dpkg -S)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libc6, libgrpc29, libprotobuf-c1, libuv1, libyaml-0-2, libsqlite3-0, libmicrohttpd12, libssl3, libopenblas0-pthread | libopenblas0")
if(ZB_CUDA_ENABLED)
  # the worker links the CUDA runtime, cuBLAS and NCCL of the toolkit it was
  # built with; they come from NVIDIA's repository, not Debian's
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "cuda-cudart-13-0, libcublas-13-0, libnccl2")
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/deb/conffiles)
include(CPack)
