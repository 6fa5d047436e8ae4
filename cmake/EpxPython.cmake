# The Python package (pip install ., see pyproject.toml): libepx goes into the package folder `epx`
# beside a generated _build_info.py, which tells the package's loader which NCCL and CUDA runtime the
# library was compiled against (python/epx/_loader.py). Only the install component "python" goes into
# a wheel; the C++ install (lib/, include/, the CMake package) stays out of it.
option(EPX_PYTHON_PACKAGE "Install libepx into the Python package epx (set by pip install .)" OFF)
if(EPX_PYTHON_PACKAGE)
  set(_epx_rpath "${EPX_NCCL_LIBRARY_DIR}" "${CUDAToolkit_LIBRARY_DIR}")
  string(REPLACE "." ";" _epx_nccl_parts "${EPX_NCCL_VERSION}")
  list(GET _epx_nccl_parts 0 _epx_nccl_major)
  list(GET _epx_nccl_parts 1 _epx_nccl_minor)
  list(GET _epx_nccl_parts 2 _epx_nccl_patch)
  math(EXPR _epx_nccl_code "${_epx_nccl_major} * 10000 + ${_epx_nccl_minor} * 100 + ${_epx_nccl_patch}")
  file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/python/_build_info.py" CONTENT [[
# Written by CMake (cmake/EpxPython.cmake) when this copy of epx was built.
version = "@PROJECT_VERSION@"
nccl_version_code = @_epx_nccl_code@  # what ncclGetVersion returns for that version
nccl_library_dir = "@EPX_NCCL_LIBRARY_DIR@"
cuda_version = "@CUDAToolkit_VERSION@"
cuda_library_dir = "@CUDAToolkit_LIBRARY_DIR@"
]] @ONLY)
  # One file under its plain name (a wheel cannot hold the SONAME symlinks); ctypes loads it by path.
  # It is the build-tree file, so it is linked with its final run path: the build's NCCL and CUDA
  # runtime directories (the loader prefers copies already loaded, e.g. by torch).
  list(REMOVE_DUPLICATES _epx_rpath)
  set_target_properties(epx PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH "${_epx_rpath}")
  install(FILES $<TARGET_FILE:epx> DESTINATION epx RENAME libepx.so COMPONENT python)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/python/_build_info.py" DESTINATION epx COMPONENT python)
endif()
