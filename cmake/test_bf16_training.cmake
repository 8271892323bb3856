# ctest bf16_training: the default model trained 2000 steps with bf16 products ends within 0.03 of the validation
# loss of the same run in float32 (same seed, data and thread count), on a CPU with bf16 units; on one without,
# `--precision bf16` is refused with exit 2 and a one-line reason before anything runs.
#   cmake -D TAPEGRAD=<the tapegrad program> -D WORK_DIR=<scratch> -P test_bf16_training.cmake
foreach(var TAPEGRAD WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "test_bf16_training: -D ${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# The validation loss of the run's last line, "done: N steps, train loss X, val loss Y, ...".
function(train precision out_var)
  execute_process(COMMAND "${TAPEGRAD}" train --precision ${precision} --out "${WORK_DIR}" --name ${precision}
                          --sample-tokens 0 --log-interval 500
                  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_var}_status ${status} PARENT_SCOPE)
  set(${out_var}_err "${err}" PARENT_SCOPE)
  if(status EQUAL 0)
    if(NOT out MATCHES "done: 2000 steps, train loss [0-9.]+, val loss ([0-9.]+)")
      message(FATAL_ERROR "${precision}: no final validation loss in:\n${out}")
    endif()
    set(${out_var} ${CMAKE_MATCH_1} PARENT_SCOPE)
  endif()
endfunction()

execute_process(COMMAND "${TAPEGRAD}" --version OUTPUT_VARIABLE version)
message(STATUS "${version}")
train(bf16 bf16)
if(NOT bf16_status EQUAL 0)
  # Only a CPU without bf16 units (or a build without oneDNN) may refuse, and then in one line, with exit 2.
  if(NOT bf16_status EQUAL 2 OR NOT bf16_err MATCHES "^tapegrad: error: bf16 products: [^\n]*(AVX512_BF16|oneDNN)[^\n]*\n$")
    message(FATAL_ERROR "--precision bf16 failed (exit ${bf16_status}):\n${bf16_err}")
  endif()
  file(READ /proc/cpuinfo cpuinfo)
  if(cpuinfo MATCHES "avx512_bf16|amx_bf16" AND NOT bf16_err MATCHES "oneDNN")
    message(FATAL_ERROR "this CPU has bf16 units, but --precision bf16 was refused:\n${bf16_err}")
  endif()
  message(STATUS "refused as expected on this machine: ${bf16_err}")
  return()
endif()
train(f32 f32)
if(NOT f32_status EQUAL 0)
  message(FATAL_ERROR "--precision f32 failed (exit ${f32_status}):\n${f32_err}")
endif()
# math() has no floats: the losses are printed with four decimals, so compare them in units of 1e-4
string(REPLACE "." "" bf16_int "${bf16}")
string(REPLACE "." "" f32_int "${f32}")
math(EXPR diff "${bf16_int} - ${f32_int}")
if(diff LESS 0)
  math(EXPR diff "-${diff}")
endif()
message(STATUS "validation loss after 2000 steps: bf16 ${bf16}, f32 ${f32}, |difference| ${diff}e-4 (bound 300e-4)")
if(diff GREATER 300)
  message(FATAL_ERROR "bf16's validation loss ${bf16} is more than 0.03 from float32's ${f32}")
endif()
