# nccl_double.cmake — builds the runtime a second time with the nccl backend
# linked against the test doubles of NCCL and of the CUDA runtime calls it
# makes (tests/gpu_double/*_double.c), and runs the backend's C test through
# it as gpudouble.c.test_nccl. Needs only the toolkit's headers; without them
# the test reports itself skipped. Included from the top CMakeLists.txt.
set(CRUN_DOUBLE_CUDA_INCLUDE "")
find_path(CRUN_DOUBLE_NCCL_H nccl.h HINTS /usr/local/cuda/include ${CUDAToolkit_INCLUDE_DIRS})
find_path(CRUN_DOUBLE_CUDART_H cuda_runtime.h HINTS /usr/local/cuda/include ${CUDAToolkit_INCLUDE_DIRS})
if(CRUN_DOUBLE_NCCL_H AND CRUN_DOUBLE_CUDART_H)
  file(GLOB_RECURSE crun_double_rt CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/runtime/*.c)
  if(NOT CRUN_HAVE_MPI)
    list(FILTER crun_double_rt EXCLUDE REGEX "/runtime/backend/mpi/")
  endif()
  add_library(crunrt_nccldouble STATIC ${crun_double_rt}
    ${PROJECT_SOURCE_DIR}/tests/gpu_double/nccl_double.c
    ${PROJECT_SOURCE_DIR}/tests/gpu_double/cudart_nccl_double.c)
  target_include_directories(crunrt_nccldouble PUBLIC ${PROJECT_SOURCE_DIR}/runtime/include
    PRIVATE ${PROJECT_SOURCE_DIR}/runtime ${CBLAS_INCLUDE} ${CRUN_DOUBLE_NCCL_H} ${CRUN_DOUBLE_CUDART_H})
  target_compile_definitions(crunrt_nccldouble PUBLIC CRUN_HAVE_MPI=$<BOOL:${CRUN_HAVE_MPI}> CRUN_HAVE_NCCL=1)
  target_link_libraries(crunrt_nccldouble PUBLIC PkgConfig::UV PkgConfig::SODIUM Threads::Threads ${OPENBLAS_LIB} m rt)
  if(CRUN_HAVE_MPI)
    target_link_libraries(crunrt_nccldouble PUBLIC MPI::MPI_C)
  endif()
  target_link_options(crunrt_nccldouble INTERFACE "LINKER:--undefined=crun__shm_engine_open"
    "LINKER:--undefined=crun__backend_nccl")
  set_target_properties(crunrt_nccldouble PROPERTIES ARCHIVE_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/gpudouble)
  add_executable(test_nccl_double ${PROJECT_SOURCE_DIR}/tests/gpu_double/test_nccl.c ${PROJECT_SOURCE_DIR}/tests/c/harness.c)
  target_include_directories(test_nccl_double PRIVATE ${PROJECT_SOURCE_DIR}/tests/c ${PROJECT_SOURCE_DIR}/runtime
    ${CRUN_DOUBLE_NCCL_H} ${CRUN_DOUBLE_CUDART_H})
  target_link_libraries(test_nccl_double PRIVATE crunrt_nccldouble)
  set_target_properties(test_nccl_double PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/gpudouble)
  add_test(NAME gpudouble.c.test_nccl COMMAND ${CRUN_SAN_WRAP} $<TARGET_FILE:test_nccl_double>)
  set_tests_properties(gpudouble.c.test_nccl PROPERTIES TIMEOUT 300 ENVIRONMENT "${CRUN_TEST_ENV}")
else()
  add_test(NAME gpudouble.c.test_nccl COMMAND sh -c "echo 'SKIPPED: nccl.h / cuda_runtime.h not found (CUDA toolkit and NCCL headers needed to build the nccl backend against its test double)'; exit 77")
  set_tests_properties(gpudouble.c.test_nccl PROPERTIES SKIP_RETURN_CODE 77)
endif()
