# Every include runs downhill: each room of the source tree includes only itself and the rooms it may use
# (docs/architecture.md). From the bottom up:
#   engine/   the core: tensors, the arena, the tape, scratch, the thread pool, the observer interface
#   ops/      the ops (ops/attention/ too), their sheets and the registry of sheets, and the matrix products
#             (ops/products/) their kernels call: engine/
#   inspect/  what watches or draws a tape from outside it: the profile, anomaly detection, the allocation log,
#             scope names, the drawing: engine/, ops/ (the sheets, for names, costs and formulas)
#   checker/  the gradchecker, its diagnoses, claims and their formula language, the edit search, explain:
#             engine/, ops/, inspect/
#   models/   layers, optimizers, the GPT, the training loop: engine/, ops/, inspect/ (not the checker: the
#             trainer and the checker stand side by side)
#   tools/    the tapegrad program: every room above but python/
#   python/   the Python module: every room; nothing includes it
#   web/      the workbook's pages in WebAssembly: engine/, ops/, inspect/, checker/ (not the trainer)
# So the core includes nothing but the core, and no op kernel or node includes the checker, the profile or the
# drawing: an op describes itself in its sheet, plain data (ops/sheet.hpp), which the tooling reads.
# Includes are resolved from the source tree's root ("ops/ops.hpp") or relative to the including file
# ("../../engine/tape.hpp"); system and library headers (<...>) are not looked at.
#   cmake -D SOURCE_DIR=<tapegrad source> -P check_include_floors.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED SOURCE_DIR)
  message(FATAL_ERROR "check_include_floors: -D SOURCE_DIR=... is missing")
endif()

set(rooms engine ops inspect checker models tools python web)
set(may_engine engine)
set(may_ops engine ops)
set(may_inspect engine ops inspect)
set(may_checker engine ops inspect checker)
set(may_models engine ops inspect models)
set(may_tools engine ops inspect checker models tools)
set(may_python engine ops inspect checker models tools python)
set(may_web engine ops inspect checker web)

function(room_of path out)
  set(${out} "" PARENT_SCOPE)  # outside the rooms (tapegrad.hpp, tests, fuzz, examples)
  foreach(room ${rooms})
    if(path MATCHES "^${room}/")
      set(${out} ${room} PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

set(globs "")
foreach(room ${rooms})
  list(APPEND globs "${SOURCE_DIR}/${room}/*.hpp" "${SOURCE_DIR}/${room}/*.cpp")
endforeach()
file(GLOB_RECURSE sources RELATIVE "${SOURCE_DIR}" ${globs})
string(REPLACE ";" "|" room_pattern "${rooms}")
set(uphill "")
set(checked 0)
foreach(source ${sources})
  room_of("${source}" own)
  get_filename_component(dir "${source}" DIRECTORY)
  file(STRINGS "${SOURCE_DIR}/${source}" includes REGEX "^#include \"")
  foreach(line ${includes})
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" target "${line}")
    if(NOT target MATCHES "^(${room_pattern})/")
      cmake_path(SET target NORMALIZE "${dir}/${target}")
    endif()
    room_of("${target}" room)
    math(EXPR checked "${checked} + 1")
    if(room AND NOT room IN_LIST may_${own})
      string(APPEND uphill "  ${source} (${own}/, which may include ${may_${own}}) includes ${target}\n")
    endif()
  endforeach()
endforeach()
if(uphill)
  message(FATAL_ERROR "includes that run uphill:\n${uphill}")
endif()
message(STATUS "${checked} includes checked: every room includes only itself and the rooms below it")
