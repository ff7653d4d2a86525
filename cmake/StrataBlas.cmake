# The library of the CPU matrix products (model::Gemm, src/model/gemm_blas.cc), chosen by
# bench/gemm_bench on the GPT's shapes beside OpenBLAS, BLIS and the built-in kernel:
# docs/benchmarks.md, "CPU matrix products: the BLAS choice".
#   onednn (default)  oneDNN's dnnl_sgemm: JIT kernels for the CPU at hand (AVX-512 where
#                     it has it), about twice the others' GFLOP/s on the machine measured
#   none              the built-in kernel (src/model/gemm.cc), no library
# OpenBLAS and BLIS are not offered: besides being slower here, their bits depend on the
# shape of the call, which would break the Linear kernels' promise that a row alone gets
# the bits it has in a batch (oneDNN keeps it; see gemm_blas.cc).
set(STRATA_BLAS onednn CACHE STRING "Library of the CPU matrix products: onednn|none (the built-in kernel)")
set_property(CACHE STRATA_BLAS PROPERTY STRINGS onednn none)

if(STRATA_BLAS STREQUAL "onednn")
  # Debian's oneDNN runs on OpenMP (libgomp); gemm_blas.cc sets the calling thread's
  # OpenMP team size, so it links libgomp itself. No -fopenmp: strata has no OpenMP code.
  find_path(STRATA_DNNL_INC oneapi/dnnl/dnnl.h)
  find_library(STRATA_DNNL_LIB dnnl)
  find_package(OpenMP COMPONENTS CXX)
  if(NOT STRATA_DNNL_INC OR NOT STRATA_DNNL_LIB OR NOT OpenMP_CXX_FOUND)
    message(FATAL_ERROR "STRATA_BLAS=onednn: oneDNN (oneapi/dnnl/dnnl.h, libdnnl) or OpenMP not found. Install "
                        "the Debian package libdnnl-dev (scripts/setup.sh does), or configure with "
                        "-DSTRATA_BLAS=none for the built-in kernel.")
  endif()
  add_library(strata_blas_onednn INTERFACE IMPORTED GLOBAL)
  set_target_properties(strata_blas_onednn PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${STRATA_DNNL_INC}
    INTERFACE_LINK_LIBRARIES "${STRATA_DNNL_LIB};${OpenMP_CXX_LIBRARIES}")
  set(STRATA_BLAS_TARGET strata_blas_onednn)
  set(STRATA_BLAS_DEFINE STRATA_BLAS_ONEDNN=1)
elseif(STRATA_BLAS STREQUAL "none")
  set(STRATA_BLAS_TARGET "")
  set(STRATA_BLAS_DEFINE "")
else()
  message(FATAL_ERROR "STRATA_BLAS=${STRATA_BLAS}: expected onednn or none")
endif()
message(STATUS "strata: CPU matrix products on ${STRATA_BLAS}")
