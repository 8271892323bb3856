# What the tests of outside projects share (test_installed_example.cmake, test_model_examples.cmake): run a step and
# show its output, and install the tapegrad build into a fresh prefix.

# require_defined(SCRIPT VAR...): each VAR was given as -D VAR=... on the command line of SCRIPT.
function(require_defined script)
  foreach(var ${ARGN})
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "${script}: -D ${var}=... is missing")
    endif()
  endforeach()
endfunction()

# run(COMMAND ... [EXPECT CODE] [OUTPUT VAR] [ALL_OUTPUT VAR] [WORKING_DIRECTORY DIR]): runs COMMAND (in DIR),
# prints it with its output, fails unless it exits with CODE (0 by default); OUTPUT receives its standard output,
# ALL_OUTPUT its standard output and error.
function(run)
  cmake_parse_arguments(R "" "EXPECT;OUTPUT;ALL_OUTPUT;WORKING_DIRECTORY" "COMMAND" ${ARGN})
  if(NOT DEFINED R_EXPECT)
    set(R_EXPECT 0)
  endif()
  if(NOT DEFINED R_WORKING_DIRECTORY)
    set(R_WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  endif()
  execute_process(COMMAND ${R_COMMAND} WORKING_DIRECTORY "${R_WORKING_DIRECTORY}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${R_COMMAND}\n${out}${err}")
  if(NOT rc EQUAL R_EXPECT)
    message(FATAL_ERROR "exit code ${rc}, expected ${R_EXPECT}: ${R_COMMAND}")
  endif()
  if(R_OUTPUT)
    set(${R_OUTPUT} "${out}" PARENT_SCOPE)
  endif()
  if(R_ALL_OUTPUT)
    set(${R_ALL_OUTPUT} "${out}${err}" PARENT_SCOPE)
  endif()
endfunction()

# install_tapegrad(BUILD_DIR PREFIX): a clean PREFIX holding `cmake --install BUILD_DIR`.
function(install_tapegrad build_dir prefix)
  file(REMOVE_RECURSE "${prefix}")
  run(COMMAND ${CMAKE_COMMAND} --install "${build_dir}" --prefix "${prefix}")
endfunction()

# build_outside_project(SOURCE BUILD PREFIX): configures SOURCE in BUILD with only PREFIX to search for packages
# (no package registry, no system tapegrad, never the build tree), with GENERATOR and CXX, checks that
# find_package(tapegrad) took the package installed there, and builds it.
function(build_outside_project source build prefix)
  run(COMMAND ${CMAKE_COMMAND} -S "${source}" -B "${build}" -G "${GENERATOR}"
              -D CMAKE_CXX_COMPILER=${CXX} -D CMAKE_BUILD_TYPE=Release -D CMAKE_PREFIX_PATH=${prefix}
              -D CMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -D CMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
  file(STRINGS "${build}/CMakeCache.txt" found REGEX "^tapegrad_DIR:")
  string(REPLACE "tapegrad_DIR:PATH=" "" found "${found}")
  file(REAL_PATH "${found}" found)
  file(REAL_PATH "${prefix}" real_prefix)
  string(FIND "${found}" "${real_prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "find_package(tapegrad) took '${found}', not the installed package under '${real_prefix}'")
  endif()
  run(COMMAND ${CMAKE_COMMAND} --build "${build}")
endfunction()
