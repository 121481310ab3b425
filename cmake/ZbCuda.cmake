# ZbCuda.cmake — finds what the GPU path needs (docs/model.md, Devices) and
# says whether it is built.
#
# ZB_CUDA (cache): AUTO (default) builds the GPU path when nvcc, the CUDA
# toolkit (cudart, cuBLAS) and NCCL are all found; ON requires them and
# stops with the list of what is missing; OFF never looks.
#
# Sets ZB_CUDA_ENABLED (ON/OFF), and when ON: the CUDA language, the
# imported targets CUDA::cudart, CUDA::cublas (FindCUDAToolkit) and
# zb::nccl, and the function zb_cuda_options(TARGET) that every target with
# .cu sources calls (architectures, warnings as errors).
#
# nvcc is looked for in /usr/local/cuda/bin when CMAKE_CUDA_COMPILER and
# CUDACXX are both unset, since CI's PATH may not hold it.

set(ZB_CUDA AUTO CACHE STRING "Build the CUDA device and the GPU tools (AUTO, ON, OFF)")
set_property(CACHE ZB_CUDA PROPERTY STRINGS AUTO ON OFF)
if(NOT ZB_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "ZB_CUDA is '${ZB_CUDA}': expected AUTO, ON or OFF")
endif()

set(ZB_CUDA_ENABLED OFF)
if(ZB_CUDA STREQUAL "OFF")
  message(STATUS "zb: ZB_CUDA=OFF: not building the CUDA device")
  return()
endif()

set(zb_cuda_missing "")

if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "The CUDA compiler")
endif()
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  # Before enable_language, which otherwise picks nvcc's default target.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90")
  endif()
  # libcudart.so, not the static runtime: ldd shows it, and a driver
  # upgrade needs no rebuild.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit)
  if(NOT CUDAToolkit_FOUND)
    list(APPEND zb_cuda_missing "the CUDA toolkit (FindCUDAToolkit)")
  else()
    foreach(t CUDA::cudart CUDA::cublas)
      if(NOT TARGET ${t})
        list(APPEND zb_cuda_missing "${t}")
      endif()
    endforeach()
  endif()
else()
  list(APPEND zb_cuda_missing "nvcc (set CMAKE_CUDA_COMPILER or CUDACXX, or put it on PATH)")
endif()

# NCCL: nccl.h and libnccl, beside the toolkit or in the standard paths.
find_path(ZB_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
          DOC "Directory of nccl.h")
find_library(ZB_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/local/cuda/lib
             DOC "libnccl")
if(NOT ZB_NCCL_INCLUDE_DIR OR NOT ZB_NCCL_LIBRARY)
  list(APPEND zb_cuda_missing "NCCL (nccl.h and libnccl: set ZB_NCCL_INCLUDE_DIR and ZB_NCCL_LIBRARY)")
endif()

if(zb_cuda_missing)
  list(JOIN zb_cuda_missing "; " zb_cuda_missing_text)
  if(ZB_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZB_CUDA=ON but the GPU path cannot be built: missing ${zb_cuda_missing_text}")
  endif()
  message(STATUS "zb: not building the CUDA device (ZB_CUDA=AUTO): missing ${zb_cuda_missing_text}")
  return()
endif()

if(NOT TARGET zb::nccl)
  add_library(zb::nccl SHARED IMPORTED GLOBAL)
  set_target_properties(zb::nccl PROPERTIES IMPORTED_LOCATION "${ZB_NCCL_LIBRARY}"
                                            INTERFACE_INCLUDE_DIRECTORIES "${ZB_NCCL_INCLUDE_DIR}")
  # nccl.h includes cuda_runtime.h
  target_link_libraries(zb::nccl INTERFACE CUDA::toolkit)
endif()

set(ZB_CUDA_ENABLED ON)
message(STATUS "zb: building the CUDA device: nvcc ${CMAKE_CUDA_COMPILER_VERSION} (${CMAKE_CUDA_COMPILER}), "
               "toolkit ${CUDAToolkit_VERSION}, NCCL ${ZB_NCCL_LIBRARY}")

# zb_cuda_options(TARGET): sm_80 and sm_90 code plus compute_90 PTX, nvcc
# and host-compiler warnings as errors. The fatbinary is left uncompressed
# so its targets can be read as plain strings (tests/check_cuda_binary.sh;
# the toolkit ships no cuobjdump): "-arch sm_80", "-arch sm_90" in the SASS
# and ".target sm_90" in the PTX.
function(zb_cuda_options target)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "80-real;90" CUDA_STANDARD 17
                                             CUDA_STANDARD_REQUIRED ON CUDA_RUNTIME_LIBRARY Shared)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:--Werror;all-warnings;-Xcompiler=-Wall,-Wextra,-Werror;--compress-mode=none>")
endfunction()
