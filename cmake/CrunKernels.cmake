# CrunKernels.cmake — the device math (issue 12), included by CMakeLists.txt
# after libcrunrt and the tests are defined.
#
# Real build (CRUN_HAVE_CUDA; CMakeLists.txt enables the CUDA language and
# adds the launchers runtime/cuda/*.cu to libcrunrt for CMAKE_CUDA_ARCHITECTURES):
# nvcc compiles them without fused multiply-add contraction (-fmad=false) so
# that every body rounds as the CPU kernels do; cuBLAS is dlopen'ed by gemm.cu.
# A build without CUDA gets runtime/cuda/launch_off.c. The C bodies
# (runtime/cuda/kernels/*.h) are also tested on the host in every build:
# c.test_cuda_kernels links the host launchers of tests/gpu_double/launch_host.c.
file(GLOB CRUN_CUDA_KERNEL_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/runtime/cuda/*.cu)

# The .cu files are C++ to the host compiler: without exceptions and
# thread-safe statics their objects need nothing from libstdc++, so a C
# program links the installed static libcrunrt as before.
if(CRUN_HAVE_CUDA AND CRUN_CUDA_KERNEL_SOURCES)
  target_compile_options(crunrt_obj PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false -Xcompiler=-fno-exceptions,-fno-threadsafe-statics>)
  # cuBLAS is opened at the first device GEMM (gemm.cu), not linked
  get_target_property(CRUN_CUBLAS_FILE CUDA::cublas IMPORTED_LOCATION)
  if(NOT CRUN_CUBLAS_FILE)
    get_target_property(CRUN_CUBLAS_FILE CUDA::cublas LOCATION)
  endif()
  target_compile_definitions(crunrt_obj PRIVATE CRUN_CUBLAS_PATH="${CRUN_CUBLAS_FILE}"
    CRUN_CUBLAS_SONAME="libcublas.so.${CUDAToolkit_VERSION_MAJOR}")
  target_link_libraries(crunrt_obj PUBLIC ${CMAKE_DL_LIBS})
endif()

if(TARGET test_cuda_kernels)
  target_sources(test_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR}/tests/gpu_double/launch_host.c)
  target_include_directories(test_cuda_kernels PRIVATE ${CBLAS_INCLUDE})
  target_link_libraries(test_cuda_kernels PRIVATE ${OPENBLAS_LIB})
endif()

