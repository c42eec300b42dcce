# smoke.cmake -- CTest's bench_smoke: every scenario of tp_bench with tiny
# sizes, in table and JSON form, plus its option validation.
#
#   cmake -DTP_BENCH=<path to tp_bench> -P smoke.cmake
#
# Checks exit statuses, that the table names every scenario, and that --json
# prints one object that parses (string(JSON), CMake >= 3.19; older CMake
# checks the shape with regular expressions) with a result for every
# scenario and an allocs/task of 0 -- or null (n/a) in a sanitized build.
# Only CMake is needed: CI machines may lack python.
cmake_minimum_required(VERSION 3.16)
if(NOT TP_BENCH)
  message(FATAL_ERROR "usage: cmake -DTP_BENCH=<tp_bench> -P smoke.cmake")
endif()

set(scenarios throughput users submit_wait wake load cancel allocs batch)
set(tiny --rounds=2 --tasks=3000 --queue=64 --producers=1,2 --users=8 --batch=16 --samples=20
         --gap=50us --load-tasks=400 --load-body=spin:20us --alloc-tasks=2000)

function(run_bench out_var)
  execute_process(COMMAND "${TP_BENCH}" ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tp_bench ${ARGN}: exit status ${rc}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# ------------------------------------------------------------ the table
run_bench(table ${tiny})
message("${table}")
foreach(s limits ${scenarios})
  if(NOT table MATCHES "\n${s}[ \n]")
    message(FATAL_ERROR "the table has no row of scenario '${s}'")
  endif()
endforeach()
# Two workers (the default): the ring of the pool's shape, and P=1 against it.
if(NOT table MATCHES "\nlimits +ring 1:W ns/item " OR NOT table MATCHES "\nthroughput P=1 +ns/task / ring 1:W ")
  message(FATAL_ERROR "the table has no ring of W consumers, or no P=1 ratio to it")
endif()
if(NOT table MATCHES "\nallocs +allocs/task +(0 +0 +0|n/a +n/a +n/a) ")
  message(FATAL_ERROR "allocs/task is neither 0 nor n/a")
endif()

# The other task bodies, briefly.
run_bench(ignored --rounds=1 --tasks=300 --queue=16 --producers=2 --samples=5
          --scenario=throughput,submit_wait --body=sleep:10us)
run_bench(ignored --rounds=1 --tasks=300 --queue=16 --producers=1 --samples=5
          --scenario=users --body=spin:1us)

# ------------------------------------------------------------ JSON
run_bench(json ${tiny} --json)
if(CMAKE_VERSION VERSION_LESS 3.19)
  if(NOT json MATCHES "^{.*\"results\": \\[.*\\]\n}\n$")
    message(FATAL_ERROR "--json does not print one object with results:\n${json}")
  endif()
else()
  string(JSON ok ERROR_VARIABLE jerr GET "${json}" ok)
  if(jerr)
    message(FATAL_ERROR "--json output does not parse: ${jerr}\n${json}")
  endif()
  if(NOT ok STREQUAL "ON")
    message(FATAL_ERROR "--json says ok: ${ok}")
  endif()
  string(JSON n LENGTH "${json}" results)
  math(EXPR last "${n} - 1")
  set(seen "")
  foreach(i RANGE ${last})
    string(JSON sc GET "${json}" results ${i} scenario)
    string(JSON metric GET "${json}" results ${i} metric)
    string(JSON type TYPE "${json}" results ${i} median)
    list(APPEND seen ${sc})
    if(metric STREQUAL "allocs/task")
      if(type STREQUAL "NUMBER")
        string(JSON median GET "${json}" results ${i} median)
        if(NOT median EQUAL 0)
          message(FATAL_ERROR "allocs/task is ${median}, not 0")
        endif()
      elseif(NOT type STREQUAL "NULL") # n/a under a sanitizer
        message(FATAL_ERROR "allocs/task is a ${type}")
      endif()
    elseif(NOT type STREQUAL "NUMBER")
      message(FATAL_ERROR "${sc} ${metric}: the median is a ${type}")
    endif()
  endforeach()
  foreach(s limits ${scenarios})
    if(NOT s IN_LIST seen)
      message(FATAL_ERROR "--json has no result of scenario '${s}'")
    endif()
  endforeach()
endif()

# ------------------------------------------------------------ usage
execute_process(COMMAND "${TP_BENCH}" --help RESULT_VARIABLE rc OUTPUT_VARIABLE help)
if(NOT rc EQUAL 0 OR NOT help MATCHES "--body=BODY" OR NOT help MATCHES "--scenario")
  message(FATAL_ERROR "--help: exit status ${rc}\n${help}")
endif()
foreach(bad "--workers=0" "--queue=-1" "--tasks=12x" "--body=spin" "--body=spin:0"
            "--body=nap:1us" "--scenario=nope" "--scenario=wake," "--producers=1,,2"
            "--producers=65" "--gap=3h" "--rounds" "--json=1" "--nope" "--batch=0"
            "--batch=4097")
  execute_process(COMMAND "${TP_BENCH}" ${bad} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 30)
  if(NOT rc EQUAL 2 OR err STREQUAL "")
    message(FATAL_ERROR "tp_bench ${bad}: expected exit status 2 and a message, got ${rc}: ${err}")
  endif()
endforeach()
