# CTest `consumer_package`: install the already-built project into a scratch prefix, build
# tests/consumer against it with find_package(dsa CONFIG REQUIRED), run the result.
#   cmake -DSOURCE_DIR=... -DBINARY_DIR=... -DWORK_DIR=... -P check_package.cmake
foreach(var SOURCE_DIR BINARY_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_package.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${prefix} ${build})

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer_package: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  message(STATUS "consumer_package: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# The build tree's configuration (Debug, Release, ...; -DBUILD_CONFIG=$<CONFIG> from ctest):
# the install holds that configuration's export files, and the consumer builds the same one
# (an installed Debug package has no Release location to import).
if(NOT BUILD_CONFIG)
  set(BUILD_CONFIG Release)
endif()
# The build tree is already built by the time tests run. --config covers multi-config generators.
step("install to ${prefix}" ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix} --config ${BUILD_CONFIG})
foreach(f include/dsa/dsa.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "consumer_package: ${f} is not installed")
  endif()
endforeach()
file(GLOB_RECURSE config_files ${prefix}/*/dsaConfig.cmake)
if(NOT config_files)
  message(FATAL_ERROR "consumer_package: no dsaConfig.cmake under ${prefix}")
endif()

# The consumer sees nothing of the source or build tree: only the prefix.
step("configure the consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${build}
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=${BUILD_CONFIG})
step("build the consumer" ${CMAKE_COMMAND} --build ${build} --config ${BUILD_CONFIG})
find_program(consumer dsa_consumer PATHS ${build} ${build}/${BUILD_CONFIG} NO_DEFAULT_PATH REQUIRED)
step("run the consumer" ${consumer})
message(STATUS "${step_output}")

# The installed CLI runs too (when the tools were built).
if(EXISTS ${prefix}/bin/dsa)
  step("run the installed dsa info" ${prefix}/bin/dsa info)
endif()
