# ctest model_examples: the four model examples as outside projects against the INSTALLED tapegrad package.
#   cmake -D BUILD_DIR=<tapegrad build> -D SOURCE_DIR=<tapegrad source> -D WORK_DIR=<scratch> -D GENERATOR=<gen>
#         -D CXX=<compiler> -P test_model_examples.cmake
# Installs the build into WORK_DIR/prefix, then for each example configures it with only that prefix to search,
# builds it and runs it: each exits 0 only when it reaches its figure (two moons: accuracy ≥ 97%; reverse: exact
# match ≥ 95% on 1000 new sequences; sine: final MSE < 1e-4; sharpness: λ_max within 20% of 2/η), and the printed
# figures are checked here too.
include(${CMAKE_CURRENT_LIST_DIR}/installed_package.cmake)
require_defined(test_model_examples BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX)

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
install_tapegrad("${BUILD_DIR}" "${prefix}")

# check_example(NAME PROGRAM EXPECTED ARGS...): builds examples/NAME, runs PROGRAM with ARGS, and checks that its
# output matches the regular expression EXPECTED.
function(check_example name program expected)
  set(build "${WORK_DIR}/${name}")
  build_outside_project("${SOURCE_DIR}/examples/${name}" "${build}" "${prefix}")
  run(COMMAND "${build}/${program}" ${ARGN} OUTPUT out)
  if(NOT out MATCHES "${expected}")
    message(FATAL_ERROR "${name}: the output does not show '${expected}'")
  endif()
endfunction()

check_example(two-moons two_moons "final accuracy (9[7-9]|100)\\.[0-9]%" 300 "${WORK_DIR}/two_moons.svg")
check_example(reverse reverse "exact match on 1000 new sequences: (9[5-9]|100)\\.[0-9]%" softmax 600)
check_example(sine sine "final mse [0-9.]+e-0[5-9]" 2000 "${WORK_DIR}/sine.svg")
check_example(sharpness sharpness "λ_max rose from [0-9.]+ to a peak of [0-9.]+ \\(2/η = 4\\)" 600 0.5 "${WORK_DIR}")
foreach(svg two_moons.svg sine.svg sharpness.svg)
  file(READ "${WORK_DIR}/${svg}" text)
  if(NOT text MATCHES "^<svg " OR NOT text MATCHES "</svg>\n$")
    message(FATAL_ERROR "${svg} is not a whole SVG file")
  endif()
endforeach()
