# SPDX-License-Identifier: Apache-2.0
# cmake --install: header, versioned library with its symlinks (or the
# static library), pkg-config file and a CMake package
# (find_package(flashdecode CONFIG) -> flashdecode::flashdecode), compatible
# within one major version.
include(CMakePackageConfigHelpers)

# The exported include directory comes from the target's INSTALL_INTERFACE
# (src/CMakeLists.txt); an INCLUDES DESTINATION here would list it twice.
install(TARGETS flashdecode EXPORT flashdecodeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# What a static library's users link besides it (src/CMakeLists.txt): in
# flashdecode.pc's Libs, since it is the only library installed, and as
# dependencies the CMake package finds for its imported target.
set(FD_PC_LIBS_EXTRA "")
set(FD_PACKAGE_DEPENDENCIES "")
if(FLASHDECODE_STATIC)
  if(FD_WITH_CUDA)
    string(APPEND FD_PC_LIBS_EXTRA " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
    string(APPEND FD_PACKAGE_DEPENDENCIES "find_dependency(CUDAToolkit)\n")
  endif()
  foreach(runtime IN LISTS FD_CXX_RUNTIME)
    string(APPEND FD_PC_LIBS_EXTRA " -l${runtime}")
  endforeach()
  if(CMAKE_THREAD_LIBS_INIT)
    string(APPEND FD_PC_LIBS_EXTRA " ${CMAKE_THREAD_LIBS_INIT}")
  endif()
  string(APPEND FD_PACKAGE_DEPENDENCIES "find_dependency(Threads)\n")
endif()
install(FILES ${PROJECT_SOURCE_DIR}/include/flashdecode.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})

# pkg-config: paths relative to the .pc file when the install dirs are
# relative, so a staged or relocated install still resolves.
set(FD_PKGCONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(FD_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(FD_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(FD_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH _fd_pc_to_prefix "/root/${FD_PKGCONFIG_DIR}" "/root")
  string(REGEX REPLACE "/$" "" _fd_pc_to_prefix "${_fd_pc_to_prefix}")
  set(FD_PC_PREFIX "\${pcfiledir}/${_fd_pc_to_prefix}")
  set(FD_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(FD_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/flashdecode.pc.in ${PROJECT_BINARY_DIR}/flashdecode.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/flashdecode.pc DESTINATION ${FD_PKGCONFIG_DIR})

set(FD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashdecode)
install(EXPORT flashdecodeTargets NAMESPACE flashdecode:: DESTINATION ${FD_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/flashdecodeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flashdecodeConfig.cmake INSTALL_DESTINATION ${FD_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashdecodeConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flashdecodeConfig.cmake ${PROJECT_BINARY_DIR}/flashdecodeConfigVersion.cmake
  DESTINATION ${FD_CMAKE_DIR})
