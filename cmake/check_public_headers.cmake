# ctest public_headers: the umbrella header tapegrad.hpp includes every public header (engine/, ops/, inspect/, checker/,
# models/ and their subfolders) but a test framework's (checker/doctest.hpp), and
# each public header includes the others by a path relative to itself that names an existing file ("tape.hpp",
# "../engine/tape.hpp"), never by the top-folder path "engine/tape.hpp", which resolves only where tapegrad's
# source folder is on the include path and could pick up a project's own engine/ or ops/ folder instead.
#   cmake -D SOURCE_DIR=<tapegrad source> -P check_public_headers.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED SOURCE_DIR)
  message(FATAL_ERROR "check_public_headers: -D SOURCE_DIR=... is missing")
endif()

file(STRINGS "${SOURCE_DIR}/tapegrad.hpp" umbrella REGEX "^#include \"")
file(GLOB_RECURSE headers RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/engine/*.hpp" "${SOURCE_DIR}/ops/*.hpp"
     "${SOURCE_DIR}/inspect/*.hpp" "${SOURCE_DIR}/checker/*.hpp" "${SOURCE_DIR}/models/*.hpp")
# Headers for a test framework's programs, which include them beside the framework: the umbrella leaves them out
# (a project that links tapegrad need not have doctest).
set(framework_headers checker/doctest.hpp)
set(problems "")
foreach(h IN LISTS headers)
  if(NOT "#include \"${h}\"" IN_LIST umbrella AND NOT h IN_LIST framework_headers)
    string(APPEND problems "  tapegrad.hpp does not include \"${h}\"\n")
  endif()
  get_filename_component(dir "${SOURCE_DIR}/${h}" DIRECTORY)
  file(STRINGS "${SOURCE_DIR}/${h}" includes REGEX "^#include \"")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" path "${line}")
    if(path MATCHES "^(engine|ops|inspect|checker|models)/")
      string(APPEND problems "  ${h}: #include \"${path}\" is a top-folder path; write it relative to ${h}\n")
    elseif(NOT EXISTS "${dir}/${path}")
      string(APPEND problems "  ${h}: #include \"${path}\" names no file relative to ${h}\n")
    endif()
  endforeach()
endforeach()
foreach(line IN LISTS umbrella)
  string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" path "${line}")
  if(NOT EXISTS "${SOURCE_DIR}/${path}")
    string(APPEND problems "  tapegrad.hpp: #include \"${path}\" names no file\n")
  endif()
endforeach()
list(LENGTH headers count)
if(problems)
  message(FATAL_ERROR "public headers:\n${problems}")
endif()
message(STATUS "public headers: ${count}, all in tapegrad.hpp, all including each other by relative paths")
