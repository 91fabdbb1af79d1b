# `cmake --install`: the library, its public headers, the a2d program and a CMake package, so that
# another project's find_package(attention2d) and target_link_libraries(app attention2d::attention2d)
# work (tests/package builds such a project against an installed tree).
include(CMakePackageConfigHelpers)
set(A2D_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/attention2d)

install(TARGETS attention2d EXPORT attention2dTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS a2d RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The public headers (the umbrella attention2d.hpp and what it includes, group_comm.hpp's C table
# group_ops.h); tools/ is the programs'
# (attention2d_tools), not the library's, and is not installed.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/attention2d
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h"
        PATTERN "tools" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/generated/attention2d/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attention2d)
install(EXPORT attention2dTargets NAMESPACE attention2d:: DESTINATION ${A2D_CMAKE_INSTALL_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/attention2dConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/attention2dConfig.cmake
                              INSTALL_DESTINATION ${A2D_CMAKE_INSTALL_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attention2dConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/attention2dConfig.cmake
              ${PROJECT_BINARY_DIR}/attention2dConfigVersion.cmake
        DESTINATION ${A2D_CMAKE_INSTALL_DIR})
