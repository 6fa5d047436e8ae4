# Install and export rules: another CMake project does find_package(epx) and links epx::epx.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(epx PROPERTIES INSTALL_RPATH "${EPX_NCCL_LIBRARY_DIR}")
install(TARGETS epx EXPORT epxTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES
          include/epx/epx.h
          include/epx/epx.hpp
          include/epx/error.hpp
          include/epx/export.hpp
          include/epx/ht.hpp
          include/epx/ll.hpp
          include/epx/streams.hpp
          include/epx/team.hpp
          include/epx/tensor.hpp
          include/epx/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/epx)
install(EXPORT epxTargets NAMESPACE epx:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/epx)
configure_package_config_file(cmake/epxConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/epxConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/epx)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/epxConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/epxConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/epxConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/epx)
if(TARGET epx-bench)
  install(TARGETS epx-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
