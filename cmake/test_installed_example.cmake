# ctest custom_op_example: an outside project built against the INSTALLED tapegrad package.
#   cmake -D BUILD_DIR=<tapegrad build> -D SOURCE_DIR=<tapegrad source> -D WORK_DIR=<scratch> -D GENERATOR=<gen>
#         -D CXX=<compiler> -D LIBDIR=<lib folder under the prefix> -P test_installed_example.cmake
# Installs the build into WORK_DIR/prefix, configures examples/custom-op with only that prefix to search, checks
# that find_package took the package from there, builds it, and runs its gradcheck: both ops pass, softsign (built
# by pointwise) in forward mode too (exit 0); the claimed derivative is rejected (exit 1) with its diagnosis; its
# doctest suite passes.
include(${CMAKE_CURRENT_LIST_DIR}/installed_package.cmake)
require_defined(test_installed_example BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX LIBDIR)

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
install_tapegrad("${BUILD_DIR}" "${prefix}")
foreach(f include/tapegrad/tapegrad.hpp include/tapegrad/engine/tape.hpp include/tapegrad/checker/cli.hpp
          include/tapegrad/ops/sheet.hpp include/tapegrad/engine/no_jvp.hpp include/tapegrad/ops/all_ops.hpp
          include/tapegrad/ops/ops.hpp include/tapegrad/ops/pointwise.hpp ${LIBDIR}/pkgconfig/tapegrad.pc)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
# The imported target's include folder is <prefix>/include (headers as <tapegrad/...>), not include/tapegrad.
file(READ "${prefix}/${LIBDIR}/cmake/tapegrad/tapegradTargets.cmake" targets)
string(FIND "${targets}" "INTERFACE_INCLUDE_DIRECTORIES \"\${_IMPORT_PREFIX}/include\"" at)
if(at EQUAL -1 OR targets MATCHES "include/tapegrad")
  message(FATAL_ERROR "tapegrad::tapegrad should give <prefix>/include as its include folder:\n${targets}")
endif()

build_outside_project("${SOURCE_DIR}/examples/custom-op" "${WORK_DIR}/build" "${prefix}")
file(REAL_PATH "${prefix}" real_prefix)

set(program "${WORK_DIR}/build/custom_op")
run(COMMAND ${program} gradcheck --list)
run(COMMAND ${program} gradcheck -v OUTPUT passed)
if(NOT passed MATCHES "2 ops, 3 cases: 3 passed, 0 failed" OR NOT passed MATCHES "softsign +matrix +x +jvp +[0-9.e+-]+ +[0-9.e+-]+ +ok")
  message(FATAL_ERROR "custom_op: rms_norm and softsign (its JVP too, from pointwise) should pass")
endif()
run(COMMAND ${program} gradcheck --order 2 -v OUTPUT second)
if(NOT second MATCHES "2 ops, 3 cases: 3 passed, 0 failed" OR NOT second MATCHES "rms_norm +rows +w +hvp .* ok")
  message(FATAL_ERROR "custom_op: rms_norm's and softsign's second-order rules should pass gradcheck --order 2")
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
# Its test suite (doctest, <tapegrad/checker/doctest.hpp>): the ops' rules pass to second order, and the claim's
# test case fails as it declares, its message the report with the diagnosis before the table.
if(NOT EXISTS "${WORK_DIR}/build/custom_op_tests")
  message(FATAL_ERROR "custom_op_tests was not built: the example finds doctest as tapegrad's tests do")
endif()
run(COMMAND "${WORK_DIR}/build/custom_op_tests" OUTPUT tested)
if(NOT tested MATCHES "test cases: +2 \\| +2 passed \\| +0 failed"
   OR NOT tested MATCHES "rms_norm_constant_rms / rows: FAILED\n  diagnosis:\n.*\\[per-row term\\] x, vjp.*\n  input +check")
  message(FATAL_ERROR "custom_op_tests: the ops should pass and the claim's test fail, diagnosis first:\n${tested}")
endif()

# The pkg-config file gives the same include folder: the example built with its flags alone, and gradchecked.
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  set(pc_env ${CMAKE_COMMAND} -E env "PKG_CONFIG_PATH=${prefix}/${LIBDIR}/pkgconfig")
  run(COMMAND ${pc_env} ${PKG_CONFIG} --cflags tapegrad OUTPUT cflags)
  run(COMMAND ${pc_env} ${PKG_CONFIG} --libs tapegrad OUTPUT libs)
  string(STRIP "${cflags}" cflags)
  string(STRIP "${libs}" libs)
  separate_arguments(cflags UNIX_COMMAND "${cflags}")
  separate_arguments(libs UNIX_COMMAND "${libs}")
  set(include_flag "")
  foreach(flag IN LISTS cflags)
    if(flag MATCHES "^-I(.+)$")
      file(REAL_PATH "${CMAKE_MATCH_1}" dir)
      if(dir STREQUAL "${real_prefix}/include")
        set(include_flag "${dir}")
      endif()
    endif()
  endforeach()
  if(NOT include_flag)
    message(FATAL_ERROR "pkg-config --cflags tapegrad should give -I${real_prefix}/include, gave: ${cflags}")
  endif()
  set(example "${SOURCE_DIR}/examples/custom-op")
  run(COMMAND ${CXX} -std=c++20 -O1 -I${example} ${cflags} ${example}/main.cpp ${example}/rms_norm.cpp
              ${example}/softsign.cpp ${libs} -o "${WORK_DIR}/custom_op_pkg_config")
  run(COMMAND "${WORK_DIR}/custom_op_pkg_config" gradcheck OUTPUT passed)
  if(NOT passed MATCHES "2 ops, 3 cases: 3 passed, 0 failed")
    message(FATAL_ERROR "custom_op built with pkg-config's flags: rms_norm and softsign should pass")
  endif()
else()
  message(STATUS "pkg-config not found: the pkg-config file is installed but not exercised")
endif()
