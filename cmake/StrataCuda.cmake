# Decides whether the CUDA parts are built (STRATA_CUDA=AUTO|ON|OFF) and whether the NCCL
# communicator is (STRATA_NCCL=AUTO|ON|OFF), and says so. Sets STRATA_HAVE_CUDA and
# STRATA_HAVE_NCCL; with CUDA, the targets CUDA::cudart_static and CUDA::cublas exist, and
# strata_nccl with NCCL.
#
# NCCL is separate from CUDA because only the device communicator (several GPUs) needs it:
# a machine with the toolkit but no NCCL still builds and runs every one-GPU path, and
# CreateNcclCommunicator then refuses with "built without NCCL".
set(STRATA_HAVE_CUDA OFF)
set(STRATA_HAVE_NCCL OFF)

# Where NCCL is: the toolkit's folders, the usual system ones, or STRATA_NCCL_ROOT (a
# prefix with include/ and lib/). Sets STRATA_HAVE_NCCL and the strata_nccl target.
function(strata_find_nccl)
  if(STRATA_NCCL STREQUAL "OFF")
    message(STATUS "strata: NCCL not used (STRATA_NCCL=OFF): no device communicator")
    return()
  endif()
  set(roots ${STRATA_NCCL_ROOT} $ENV{NCCL_HOME})
  find_path(STRATA_NCCL_INCLUDE nccl.h
            HINTS ${roots} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include /usr/include
            PATH_SUFFIXES include)
  find_library(STRATA_NCCL_LIB nccl
               HINTS ${roots} ${CUDAToolkit_LIBRARY_DIR} /usr/local/lib /usr/lib/x86_64-linux-gnu
               PATH_SUFFIXES lib lib64)
  if(NOT STRATA_NCCL_INCLUDE OR NOT STRATA_NCCL_LIB)
    if(STRATA_NCCL STREQUAL "ON")
      message(FATAL_ERROR "STRATA_NCCL=ON but NCCL (nccl.h, libnccl) was not found "
                          "(set STRATA_NCCL_ROOT or NCCL_HOME, or STRATA_NCCL=AUTO to build without it)")
    endif()
    message(STATUS "strata: NCCL not found: building CUDA without the device communicator "
                   "(one GPU per process only; CreateNcclCommunicator says so)")
    return()
  endif()
  add_library(strata_nccl INTERFACE)
  target_include_directories(strata_nccl SYSTEM INTERFACE ${STRATA_NCCL_INCLUDE})
  target_link_libraries(strata_nccl INTERFACE ${STRATA_NCCL_LIB})
  set(STRATA_HAVE_NCCL ON PARENT_SCOPE)
endfunction()

if(NOT STRATA_CUDA STREQUAL "OFF")
  # Look where the toolkit usually is: CUDA_HOME, nvcc on PATH, the standard folder.
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(STRATA_NVCC nvcc HINTS $ENV{CUDA_HOME}/bin $ENV{CUDA_PATH}/bin /usr/local/cuda/bin)
    if(STRATA_NVCC)
      set(CMAKE_CUDA_COMPILER ${STRATA_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # the H200
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    if(NOT TARGET CUDA::cublas)
      # The model's matrix products are cuBLAS calls; without it there is no CUDA model.
      if(STRATA_CUDA STREQUAL "ON")
        message(FATAL_ERROR "STRATA_CUDA=ON but the CUDA toolkit in ${CUDAToolkit_LIBRARY_DIR} has no cuBLAS")
      endif()
      message(STATUS "strata: CUDA toolkit found without cuBLAS; building without CUDA")
    else()
      set(STRATA_HAVE_CUDA ON)
      strata_find_nccl()
      if(STRATA_HAVE_NCCL)
        set(nccl_note "NCCL ${STRATA_NCCL_LIB}")
      else()
        set(nccl_note "no NCCL")
      endif()
      message(STATUS "strata: building CUDA parts with ${CMAKE_CUDA_COMPILER} "
                     "(CUDA ${CUDAToolkit_VERSION}, sm_${CMAKE_CUDA_ARCHITECTURES}, cuBLAS, ${nccl_note})")
    endif()
  elseif(STRATA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_CUDA=ON but no CUDA toolkit was found (set CUDA_HOME or put nvcc on PATH)")
  endif()
endif()
if(NOT STRATA_HAVE_CUDA)
  message(STATUS "strata: building without CUDA (STRATA_CUDA=${STRATA_CUDA}); only the sim device")
endif()
