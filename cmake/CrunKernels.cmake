# CrunKernels.cmake — the device math (issue 12), included by CMakeLists.txt
# after libcrunrt and the tests are defined.
#
# Real build (CRUN_HAVE_CUDA, set where the CUDA language is enabled): the
# launchers runtime/cuda/*.cu are compiled by nvcc into libcrunrt, for sm_90
# with compute_90 PTX as the fallback, without fused multiply-add contraction
# (-fmad=false) so that every body rounds as the CPU kernels do, and linked
# with cuBLAS. The C bodies (runtime/cuda/kernels/*.h) are also tested on the
# host in every build: c.test_cuda_kernels links the host launchers of
# tests/gpu_double/launch_host.c.
file(GLOB CRUN_CUDA_KERNEL_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/runtime/cuda/*.cu)

if(CRUN_HAVE_CUDA)
  target_sources(crunrt_obj PRIVATE ${CRUN_CUDA_KERNEL_SOURCES})
  set_source_files_properties(${CRUN_CUDA_KERNEL_SOURCES} PROPERTIES LANGUAGE CUDA)
  set_target_properties(crunrt_obj PROPERTIES CUDA_ARCHITECTURES 90 CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_compile_options(crunrt_obj PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
  target_link_libraries(crunrt_obj PUBLIC CUDA::cublas)
endif()

if(TARGET test_cuda_kernels)
  target_sources(test_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR}/tests/gpu_double/launch_host.c)
  target_include_directories(test_cuda_kernels PRIVATE ${CBLAS_INCLUDE})
  target_link_libraries(test_cuda_kernels PRIVATE ${OPENBLAS_LIB})
endif()
