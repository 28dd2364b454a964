# Install-time step of python/CMakeLists.txt: copies the shared libraries
# that MOE_BUNDLE_TOOLS load into MOE_BUNDLE_DIR/lib, each under its soname,
# and their Debian copyright files into MOE_BUNDLE_DIR/licenses.
#
# Left out: the C library's own (every Linux has a glibc, and one glibc must
# serve a process), and libfabric, which moe-exec and expert-parallel layers
# take from the system, since a NIC's provider comes with its own.
file(GET_RUNTIME_DEPENDENCIES
  EXECUTABLES ${MOE_BUNDLE_TOOLS}
  RESOLVED_DEPENDENCIES_VAR libraries
  UNRESOLVED_DEPENDENCIES_VAR missing
  PRE_EXCLUDE_REGEXES
    "^ld-linux" "^libc\\.so" "^libm\\.so" "^libdl\\.so" "^libpthread\\.so"
    "^librt\\.so" "^libresolv\\.so" "^libutil\\.so" "^libfabric\\.so")
if(missing)
  message(FATAL_ERROR "the tools need libraries not found here: ${missing}")
endif()

file(MAKE_DIRECTORY "${MOE_BUNDLE_DIR}/lib" "${MOE_BUNDLE_DIR}/licenses")
find_program(dpkg dpkg)
foreach(library IN LISTS libraries)
  get_filename_component(name "${library}" NAME)
  file(REAL_PATH "${library}" real)
  message(STATUS "Bundling: ${MOE_BUNDLE_DIR}/lib/${name} (${real})")
  file(COPY_FILE "${real}" "${MOE_BUNDLE_DIR}/lib/${name}")
  if(NOT dpkg)
    continue()
  endif()
  # dpkg knows a file by the path its package installed, /usr/lib or /lib.
  string(REGEX REPLACE "^/usr/lib/" "/lib/" alias "${real}")
  foreach(path IN ITEMS "${real}" "${alias}")
    execute_process(COMMAND ${dpkg} -S "${path}" OUTPUT_VARIABLE owner
                    RESULT_VARIABLE status ERROR_QUIET)
    if(status EQUAL 0)
      string(REGEX REPLACE ":.*" "" package "${owner}")
      set(copyright "/usr/share/doc/${package}/copyright")
      if(EXISTS "${copyright}")
        file(COPY_FILE "${copyright}"
             "${MOE_BUNDLE_DIR}/licenses/${package}.copyright")
      endif()
      break()
    endif()
  endforeach()
endforeach()
