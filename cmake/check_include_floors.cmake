# Every include runs downhill: a file of one floor includes only its own floor and those below it.
#   engine/        0  tensors, the tape, products, the registry and the gradchecker's core
#   ops/           1  the ops (ops/attention/ too)
#   ops/formulas/  2  the formula language and claims, which build ops
#   models/        3  layers, optimizers, the GPT, the training loop
#   tools/         4  the tapegrad program
#   python/        5  the Python module (python/CMakeLists.txt), above everything: nothing includes it
# Within the floors, math below and tooling above: the op kernels and nodes (ops/, ops/attention/) include nothing
# of the tooling — engine/gradcheck/ (the registry, the checker, explain), the profile, the tape's drawing
# (engine/profile.hpp, engine/tape_dot.hpp, engine/graphviz.hpp). An op describes itself in its sheet, plain data
# (engine/op_sheet.hpp), which the tooling reads; ops/formulas/, the floor above, joins the two.
# Includes are resolved from the source tree's root ("ops/ops.hpp") or relative to the including file
# ("../../engine/tape.hpp"); system and library headers (<...>) are not looked at.
#   cmake -D SOURCE_DIR=<tapegrad source> -P check_include_floors.cmake
if(NOT DEFINED SOURCE_DIR)
  message(FATAL_ERROR "check_include_floors: -D SOURCE_DIR=... is missing")
endif()

function(floor_of path out)
  if(path MATCHES "^engine/")
    set(${out} 0 PARENT_SCOPE)
  elseif(path MATCHES "^ops/formulas/")
    set(${out} 2 PARENT_SCOPE)
  elseif(path MATCHES "^ops/")
    set(${out} 1 PARENT_SCOPE)
  elseif(path MATCHES "^models/")
    set(${out} 3 PARENT_SCOPE)
  elseif(path MATCHES "^tools/")
    set(${out} 4 PARENT_SCOPE)
  elseif(path MATCHES "^python/")
    set(${out} 5 PARENT_SCOPE)
  else()
    set(${out} -1 PARENT_SCOPE)  # outside the floors (tapegrad.hpp, tests, fuzz, examples)
  endif()
endfunction()

set(globs "")
foreach(floor engine ops models tools python)
  list(APPEND globs "${SOURCE_DIR}/${floor}/*.hpp" "${SOURCE_DIR}/${floor}/*.cpp")
endforeach()
file(GLOB_RECURSE sources RELATIVE "${SOURCE_DIR}" ${globs})
set(uphill "")
set(tooling "")
set(checked 0)
foreach(source ${sources})
  floor_of("${source}" own)
  get_filename_component(dir "${source}" DIRECTORY)
  file(STRINGS "${SOURCE_DIR}/${source}" includes REGEX "^#include \"")
  foreach(line ${includes})
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" target "${line}")
    if(NOT target MATCHES "^(engine|ops|models|tools|python)/")
      cmake_path(SET target NORMALIZE "${dir}/${target}")
    endif()
    floor_of("${target}" floor)
    math(EXPR checked "${checked} + 1")
    if(floor GREATER own)
      string(APPEND uphill "  ${source} (floor ${own}) includes ${target} (floor ${floor})\n")
    endif()
    if(source MATCHES "^ops/" AND NOT source MATCHES "^ops/formulas/"
       AND target MATCHES "^engine/(gradcheck/|profile\\.|tape_dot\\.|graphviz\\.)")
      string(APPEND tooling "  ${source} includes ${target}\n")
    endif()
  endforeach()
endforeach()
if(uphill)
  message(FATAL_ERROR "includes that run uphill:\n${uphill}")
endif()
if(tooling)
  message(FATAL_ERROR "ops that include the tooling (an op describes itself in its sheet, engine/op_sheet.hpp; "
                      "the tooling reads it):\n${tooling}")
endif()
message(STATUS "${checked} includes checked: every one runs downhill or stays on its floor, and no op includes the tooling")
