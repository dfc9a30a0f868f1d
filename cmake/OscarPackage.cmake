# Install and packaging: GNU install dirs, versioned shared libraries with
# relocatable RPATHs ($ORIGIN), plugins in <libdir>/oscar (where the registry
# looks beside the installed liboscar), tools, docs, an exported CMake package
# (find_package(oscar CONFIG): oscar::oscar, oscar::calib) and pkg-config
# files (oscar, oscar-calib). Included from the top-level CMakeLists.txt after
# every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# ------------------------------------------------------------ symbol versions
# The public ABI is what include/oscar/oscar.h declares with OSCAR_API; the
# names are read from the header so the map cannot drift from it. liboscar.so
# exports them as OSCAR_0. liboscar_calib.so shares the error state, the
# parameter allocator and the reference codec with liboscar.so (one copy of
# the thread-local error, one parameter layout), so liboscar's other oscar_*
# functions are exported too, as OSCAR_PRIVATE_0: not in any installed header,
# no stability promise, for liboscar_calib only. Everything else stays local.
file(READ ${CMAKE_SOURCE_DIR}/include/oscar/oscar.h OSCAR_HEADER_TEXT)
# A function added to the header must reach the map without a manual reconfigure.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/include/oscar/oscar.h)
string(REGEX MATCHALL "OSCAR_API[^(;]*\\(" OSCAR_API_DECLS "${OSCAR_HEADER_TEXT}")
set(OSCAR_PUBLIC_SYMS "")
set(OSCAR_CALIB_SYMS "")
foreach(decl IN LISTS OSCAR_API_DECLS)
  string(REGEX MATCH "(oscar_[A-Za-z0-9_]+)\\($" m "${decl}")
  if(NOT m)
    continue()
  endif()
  set(sym ${CMAKE_MATCH_1})
  if(sym MATCHES "^oscar_calib_")
    string(APPEND OSCAR_CALIB_SYMS "    ${sym};\n")
  else()
    string(APPEND OSCAR_PUBLIC_SYMS "    ${sym};\n")
  endif()
endforeach()
set(OSCAR_MAP ${CMAKE_BINARY_DIR}/liboscar.map)
set(OSCAR_CALIB_MAP ${CMAKE_BINARY_DIR}/liboscar_calib.map)
file(CONFIGURE OUTPUT ${OSCAR_MAP} CONTENT
"/* Generated from include/oscar/oscar.h by cmake/OscarPackage.cmake. */
OSCAR_0 {
  global:
${OSCAR_PUBLIC_SYMS}};
OSCAR_PRIVATE_0 {
  global:
    oscar_*;
  local:
    *;
};
")
file(CONFIGURE OUTPUT ${OSCAR_CALIB_MAP} CONTENT
"/* Generated from include/oscar/oscar.h by cmake/OscarPackage.cmake. */
OSCAR_CALIB_0 {
  global:
${OSCAR_CALIB_SYMS}  local:
    *;
};
")
# liboscar: default visibility so the map decides; -Bsymbolic-functions keeps
# its own calls inside it (no interposition of internals).
set_target_properties(oscar PROPERTIES C_VISIBILITY_PRESET default LINK_DEPENDS ${OSCAR_MAP})
target_link_options(oscar PRIVATE "LINKER:--version-script=${OSCAR_MAP}" "LINKER:-Bsymbolic-functions")
set(OSCAR_LIBS oscar)
if(TARGET oscar_calib)
  list(APPEND OSCAR_LIBS oscar_calib)
  set_target_properties(oscar_calib PROPERTIES LINK_DEPENDS ${OSCAR_CALIB_MAP} EXPORT_NAME calib
                        INSTALL_RPATH "$ORIGIN")  # finds liboscar beside it
  target_link_options(oscar_calib PRIVATE "LINKER:--version-script=${OSCAR_CALIB_MAP}")
endif()
if(NOT OSCAR_SANITIZE)
  # A symbol liboscar_calib needs but liboscar does not export fails here, not at load time.
  foreach(t IN LISTS OSCAR_LIBS)
    target_link_options(${t} PRIVATE "LINKER:--no-undefined")
  endforeach()
endif()
target_include_directories(oscar INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# ---------------------------------------------------------------- locations
# Plugins live in <libdir>/oscar; runtime/registry.c searches that folder
# beside the liboscar it is in, so a moved prefix still finds them.
set(OSCAR_PLUGIN_SUBDIR oscar)
set(OSCAR_PLUGIN_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/${OSCAR_PLUGIN_SUBDIR})
file(RELATIVE_PATH OSCAR_BIN_TO_LIB /${CMAKE_INSTALL_BINDIR} /${CMAKE_INSTALL_LIBDIR})

# liboscar needs no RPATH (libc only).
set_target_properties(oscar PROPERTIES INSTALL_RPATH "")
# Components: runtime (libraries, plugins; all the Python package takes), dev
# (header, namelinks, CMake and pkg-config files), tools, docs.
install(TARGETS ${OSCAR_LIBS} EXPORT oscarTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/oscar/oscar.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/oscar COMPONENT dev)

foreach(plugin oscar_backend_opencl oscar_backend_cuda oscar_backend_hip)
  if(TARGET ${plugin})
    # Vendor runtimes outside the system folders (e.g. /usr/local/cuda) stay findable.
    set_target_properties(${plugin} PROPERTIES INSTALL_RPATH "" INSTALL_RPATH_USE_LINK_PATH TRUE)
    install(TARGETS ${plugin} LIBRARY DESTINATION ${OSCAR_PLUGIN_INSTALL_DIR} COMPONENT runtime)
  endif()
endforeach()

# Tools that calibrate link the calibration library.
# oscar-eval, oscar-copy-probe: the calibration drivers (tools/lib) for the model hash
foreach(tool oscar-bench oscar-calibrate oscar-eval oscar-copy-probe)
  if(TARGET ${tool} AND TARGET oscar_calib)
    target_link_libraries(${tool} PRIVATE oscar_calib)
  endif()
endforeach()
foreach(tool oscar-bench oscar-inspect oscar-calibrate oscar-eval oscar-ppl)
  if(TARGET ${tool})
    set_target_properties(${tool} PROPERTIES INSTALL_RPATH "$ORIGIN/${OSCAR_BIN_TO_LIB}")
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
  endif()
endforeach()

file(GLOB OSCAR_DOC_FILES ${CMAKE_SOURCE_DIR}/docs/*.md)
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${OSCAR_DOC_FILES} DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT docs)

# ------------------------------------------------------------ CMake package
set(OSCAR_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/oscar)
install(EXPORT oscarTargets NAMESPACE oscar:: DESTINATION ${OSCAR_CMAKE_INSTALL_DIR} COMPONENT dev)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/oscarConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/oscarConfig.cmake
                              INSTALL_DESTINATION ${OSCAR_CMAKE_INSTALL_DIR}
                              PATH_VARS OSCAR_PLUGIN_INSTALL_DIR)
# Within a major version the ABI only grows (the SONAME is the major version,
# include/oscar/oscar.h and docs/API.md "ABI stability"): find_package(oscar 0.1)
# takes any 0.x from 0.1 on, as the dynamic loader takes any liboscar.so.0.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/oscarConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/oscarConfig.cmake ${CMAKE_BINARY_DIR}/oscarConfigVersion.cmake
        DESTINATION ${OSCAR_CMAKE_INSTALL_DIR} COMPONENT dev)

# --------------------------------------------------------------- pkg-config
# Relocatable: prefix from ${pcfiledir} when the dirs are relative.
set(OSCAR_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(OSCAR_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH rel /${OSCAR_PC_DIR} /)
  string(REGEX REPLACE "/$" "" rel "${rel}")
  set(OSCAR_PC_PREFIX "\${pcfiledir}/${rel}")
endif()
foreach(pc oscar oscar-calib)
  configure_file(${CMAKE_SOURCE_DIR}/cmake/${pc}.pc.in ${CMAKE_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/${pc}.pc DESTINATION ${OSCAR_PC_DIR} COMPONENT dev)
endforeach()
