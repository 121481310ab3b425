# The CBLAS the model links against (docs/model.md, BLAS), chosen with
# -DZB_BLAS=openblas (default) | blis | mkl. Defines the target zb_blas
# (include dirs, library, rpath, and ZB_BLAS_<NAME> for model/zb_blas.h)
# and sets ZB_BLAS_FOUND. A BLAS named on the command line that is not
# found stops the configure with a message saying what is missing; the
# default, OpenBLAS, missing only skips the model, as before the option.
#
#   openblas  Debian's libopenblas-dev (pkg-config openblas, or libopenblas
#             + cblas.h)
#   blis      Debian's libblis-dev (libblis + blis.h and its cblas.h)
#   mkl       Intel's MKL from PyPI: the mkl and mkl-devel wheels in the
#             virtualenv scripts/install-mkl-venv.sh makes, at ZB_MKL_ROOT
#             (default build/venv-mkl); libmkl_rt.so.2, with an rpath there
set(ZB_BLAS openblas CACHE STRING "The CBLAS the model links against: openblas, blis or mkl")
set_property(CACHE ZB_BLAS PROPERTY STRINGS openblas blis mkl)
set(ZB_MKL_ROOT "${CMAKE_SOURCE_DIR}/build/venv-mkl" CACHE PATH
    "ZB_BLAS=mkl: the prefix holding include/mkl_cblas.h and lib/libmkl_rt.so.2 (scripts/install-mkl-venv.sh)")
set(ZB_BLAS_FOUND OFF)

if(NOT ZB_BLAS MATCHES "^(openblas|blis|mkl)$")
  message(FATAL_ERROR "ZB_BLAS: '${ZB_BLAS}' is not a known BLAS; choose openblas, blis or mkl (docs/model.md, BLAS)")
endif()

add_library(zb_blas INTERFACE IMPORTED GLOBAL)
string(TOUPPER "${ZB_BLAS}" zb_blas_upper)
target_compile_definitions(zb_blas INTERFACE ZB_BLAS_${zb_blas_upper}=1)

if(ZB_BLAS STREQUAL "openblas")
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(OPENBLAS IMPORTED_TARGET GLOBAL openblas)
  endif()
  if(OPENBLAS_FOUND)
    target_link_libraries(zb_blas INTERFACE PkgConfig::OPENBLAS)
    set(ZB_BLAS_FOUND ON)
  else()
    find_library(ZB_OPENBLAS_LIBRARY openblas)
    find_path(ZB_OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
    if(ZB_OPENBLAS_LIBRARY AND ZB_OPENBLAS_INCLUDE_DIR)
      target_link_libraries(zb_blas INTERFACE ${ZB_OPENBLAS_LIBRARY})
      target_include_directories(zb_blas SYSTEM INTERFACE ${ZB_OPENBLAS_INCLUDE_DIR})
      set(ZB_BLAS_FOUND ON)
    endif()
  endif()
  if(NOT ZB_BLAS_FOUND)
    message(STATUS "zb: OpenBLAS not found (pkg-config openblas or libopenblas + cblas.h; Debian: libopenblas-dev); "
                   "skipping the model (zbmodel), its tests and benchmark")
  endif()
elseif(ZB_BLAS STREQUAL "blis")
  # Debian installs blis.h and BLIS's cblas.h side by side under a
  # directory named after the threading flavour; the library itself is
  # also reachable through the alternatives link libblis.so.
  find_library(ZB_BLIS_LIBRARY blis PATH_SUFFIXES blis-openmp blis-pthread blis-serial)
  find_path(ZB_BLIS_INCLUDE_DIR blis.h PATH_SUFFIXES blis x86_64-linux-gnu/blis-openmp
            x86_64-linux-gnu/blis-pthread x86_64-linux-gnu/blis-serial)
  if(NOT EXISTS "${ZB_BLIS_LIBRARY}" OR NOT EXISTS "${ZB_BLIS_INCLUDE_DIR}/cblas.h")
    message(FATAL_ERROR "ZB_BLAS=blis: BLIS not found (library: ${ZB_BLIS_LIBRARY}; blis.h and cblas.h in: "
                        "${ZB_BLIS_INCLUDE_DIR}). Debian: apt-get install libblis-dev")
  endif()
  target_link_libraries(zb_blas INTERFACE ${ZB_BLIS_LIBRARY})
  target_include_directories(zb_blas SYSTEM INTERFACE ${ZB_BLIS_INCLUDE_DIR})
  set(ZB_BLAS_FOUND ON)
else() # mkl
  set(zb_mkl_lib "${ZB_MKL_ROOT}/lib/libmkl_rt.so.2")
  if(NOT EXISTS "${ZB_MKL_ROOT}/include/mkl_cblas.h" OR NOT EXISTS "${zb_mkl_lib}")
    message(FATAL_ERROR "ZB_BLAS=mkl: MKL not found under ZB_MKL_ROOT=${ZB_MKL_ROOT} (needs include/mkl_cblas.h "
                        "and lib/libmkl_rt.so.2): run scripts/install-mkl-venv.sh, or pass -DZB_MKL_ROOT=PREFIX")
  endif()
  # libmkl_rt loads its other libraries (cores, threading, libiomp5) from
  # its own directory at run time: the rpath makes them found without
  # LD_LIBRARY_PATH, from the build tree and once installed.
  target_link_libraries(zb_blas INTERFACE "${zb_mkl_lib}" "-Wl,-rpath,${ZB_MKL_ROOT}/lib")
  target_include_directories(zb_blas SYSTEM INTERFACE "${ZB_MKL_ROOT}/include")
  set(ZB_BLAS_FOUND ON)
endif()
