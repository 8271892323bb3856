# ctest custom_op_example: an outside project built against the INSTALLED tapegrad package.
#   cmake -D BUILD_DIR=<tapegrad build> -D SOURCE_DIR=<tapegrad source> -D WORK_DIR=<scratch> -D GENERATOR=<gen>
#         -D CXX=<compiler> -P test_installed_example.cmake
# Installs the build into WORK_DIR/prefix, configures examples/custom-op with only that prefix to search, checks
# that find_package took the package from there, builds it, and runs its gradcheck: the op and the op without a
# JVP pass (exit 0), the claimed derivative is rejected (exit 1) with its diagnosis.
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "test_installed_example: -D ${var}=... is missing")
  endif()
endforeach()

function(run)
  cmake_parse_arguments(R "" "EXPECT;OUTPUT" "COMMAND" ${ARGN})
  if(NOT DEFINED R_EXPECT)
    set(R_EXPECT 0)
  endif()
  execute_process(COMMAND ${R_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${R_COMMAND}\n${out}${err}")
  if(NOT rc EQUAL R_EXPECT)
    message(FATAL_ERROR "exit code ${rc}, expected ${R_EXPECT}: ${R_COMMAND}")
  endif()
  if(R_OUTPUT)
    set(${R_OUTPUT} "${out}" PARENT_SCOPE)
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f include/tapegrad/engine/tape.hpp include/tapegrad/engine/gradcheck/cli.hpp include/tapegrad/ops/ops.hpp)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# Only the fresh prefix: no package registry, no system tapegrad, never the build tree.
run(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/custom-op" -B "${WORK_DIR}/build" -G "${GENERATOR}"
            -D CMAKE_CXX_COMPILER=${CXX} -D CMAKE_BUILD_TYPE=Release -D CMAKE_PREFIX_PATH=${prefix}
            -D CMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -D CMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
file(STRINGS "${WORK_DIR}/build/CMakeCache.txt" found REGEX "^tapegrad_DIR:")
string(REPLACE "tapegrad_DIR:PATH=" "" found "${found}")
file(REAL_PATH "${found}" found)
file(REAL_PATH "${prefix}" real_prefix)
string(FIND "${found}" "${real_prefix}/" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "find_package(tapegrad) took '${found}', not the installed package under '${real_prefix}'")
endif()
run(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build")

set(program "${WORK_DIR}/build/custom_op")
run(COMMAND ${program} gradcheck --list)
run(COMMAND ${program} gradcheck -v OUTPUT passed)
if(NOT passed MATCHES "2 ops, [0-9]+ cases: [0-9]+ passed, 0 failed" OR NOT passed MATCHES "skipped \\(no JVP\\)")
  message(FATAL_ERROR "custom_op: rms_norm and softsign should pass, softsign without a JVP")
endif()
run(COMMAND ${program} explain rms_norm --shape x=3,8 --shape w=8 OUTPUT explained)
if(NOT explained MATCHES "forward    per row: y = w⊙x/ρ" OR NOT explained MATCHES "rms_norm.cpp:[0-9]+"
   OR NOT explained MATCHES "inputs x \\(3, 8\\), w \\(8\\)" OR NOT explained MATCHES "rms_norm / rows: passed")
  message(FATAL_ERROR "custom_op: explain rms_norm should show its forward, its file and its gradcheck at (3, 8)")
endif()
run(COMMAND ${program} claims --op rms_norm_constant_rms EXPECT 1 OUTPUT rejected)
if(NOT rejected MATCHES "\\[per-row term\\] x, vjp")
  message(FATAL_ERROR "custom_op: the claimed VJP should be rejected with a per-row-term diagnosis")
endif()
