# ctest driver: compiles every kernel source with -DEPX_PHASE_TRACE to PTX and fails if any holds a
# `trap`. The trace build is for profiling and is not part of the normal build, so without this check a
# phase-trace change that compiles but faults on the GPU (device code reading a host-only table, which
# nvcc turns into a trap) would only show when someone runs epx-bench --trace. No kernel traps on purpose.
# Variables: NVCC, ARCH (e.g. 90a), FLAGS (the project's CUDA flags, EPX_CUDA_FLAGS), SOURCE_DIR (the
# repository), NCCL_INCLUDE_DIR, WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(GLOB kernels "${SOURCE_DIR}/src/kernels/*/*.cu")
list(LENGTH kernels count)
if(count EQUAL 0)
  message(FATAL_ERROR "trace PTX check: no kernel sources under ${SOURCE_DIR}/src/kernels")
endif()
set(failed "")
foreach(source IN LISTS kernels)
  get_filename_component(name "${source}" NAME_WE)
  get_filename_component(dir "${source}" DIRECTORY)
  get_filename_component(group "${dir}" NAME)
  set(ptx "${WORK_DIR}/${group}_${name}.ptx")
  execute_process(
    COMMAND "${NVCC}" -O3 -DNDEBUG -DEPX_PHASE_TRACE -std=c++20 ${FLAGS}
            --generate-code=arch=compute_${ARCH},code=sm_${ARCH} -I "${SOURCE_DIR}/include" -I "${SOURCE_DIR}/src"
            -I "${NCCL_INCLUDE_DIR}" -ptx "${source}" -o "${ptx}"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "trace PTX check: ${source} does not compile with -DEPX_PHASE_TRACE (${rc})")
  endif()
  file(STRINGS "${ptx}" traps REGEX "^[ \t]*trap;")
  if(traps)
    list(APPEND failed "${group}/${name}.cu")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "trace PTX check: a trap in the phase-trace PTX of: ${failed}")
endif()
message(STATUS "trace PTX check: ${count} kernel sources, no trap")
