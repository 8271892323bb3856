# The installed program stands on its own: install into a fresh prefix, move the prefix, and run the program from
# a scratch folder with no source tree in reach of what it reads (train with the bundled text, explain with its
# derivation sections, claim with a shipped file of claims, graph, bench --quick); then take its share folder away
# and check that train says which file it cannot find, and where it looked.
#   cmake -D BUILD_DIR=<tapegrad build> -D WORK_DIR=<scratch> -P test_installed_program.cmake
include(${CMAKE_CURRENT_LIST_DIR}/installed_package.cmake)
require_defined(test_installed_program BUILD_DIR WORK_DIR)

set(first "${WORK_DIR}/prefix")
set(prefix "${WORK_DIR}/moved-prefix")
set(elsewhere "${WORK_DIR}/elsewhere")
install_tapegrad("${BUILD_DIR}" "${first}")
file(REMOVE_RECURSE "${prefix}" "${elsewhere}")
file(RENAME "${first}" "${prefix}")  # a moved prefix: nothing may depend on where it was installed
file(MAKE_DIRECTORY "${elsewhere}")
unset(ENV{TAPEGRAD_SHARE_DIR})
set(tapegrad "${prefix}/bin/tapegrad")

# expect_in(TEXT WHAT PATTERN): TEXT matches PATTERN, or the test fails naming WHAT.
function(expect_in text what pattern)
  if(NOT text MATCHES "${pattern}")
    message(FATAL_ERROR "${what}: expected to match '${pattern}'")
  endif()
endfunction()

run(COMMAND "${tapegrad}" train --max-iters 3 --eval-interval 3 --eval-iters 1 --n-layer 1 --out runs
    ALL_OUTPUT out WORKING_DIRECTORY "${elsewhere}")
expect_in("${out}" "train" "share/tapegrad/data/tinyshakespeare.txt")
file(GLOB_RECURSE checkpoints "${elsewhere}/runs/*.safetensors")
if(NOT checkpoints)
  message(FATAL_ERROR "train wrote no checkpoint under ${elsewhere}/runs")
endif()

run(COMMAND "${tapegrad}" explain row_normalize ALL_OUTPUT out WORKING_DIRECTORY "${elsewhere}")
expect_in("${out}" "explain" "share/tapegrad/docs/derivations.md § [0-9.]+ [^\n]*[a-zA-Z]")
if(out MATCHES "warning")
  message(FATAL_ERROR "explain warned: the derivations were not found")
endif()

run(COMMAND "${tapegrad}" claim --file "${prefix}/share/tapegrad/docs/claims/beta-derivative.txt" ALL_OUTPUT out
    WORKING_DIRECTORY "${elsewhere}")
expect_in("${out}" "claim" "claims?: [0-9]+ holds?, 0 wrong")

run(COMMAND "${tapegrad}" graph --op softmax --format dot -o graph.dot ALL_OUTPUT out WORKING_DIRECTORY "${elsewhere}")
file(READ "${elsewhere}/graph.dot" dot)
expect_in("${dot}" "graph" "digraph")

run(COMMAND "${tapegrad}" bench --quick ALL_OUTPUT out WORKING_DIRECTORY "${elsewhere}")
expect_in("${out}" "bench" "backend")

# Without its share folder, train names the file and the places it looked in, and exits 2 (an input error, as for a --data that does not exist).
file(RENAME "${prefix}/share/tapegrad" "${prefix}/share/tapegrad-away")
run(COMMAND "${tapegrad}" train --max-iters 1 EXPECT 2 ALL_OUTPUT out WORKING_DIRECTORY "${elsewhere}")
expect_in("${out}" "train without its share folder" "cannot find tapegrad's data/tinyshakespeare.txt: looked in")
file(RENAME "${prefix}/share/tapegrad-away" "${prefix}/share/tapegrad")
message(STATUS "the installed program ran from a moved prefix, away from the sources")
