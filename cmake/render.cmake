# render.cmake -- turn one documentation source into an installable file.
#
#   cmake -DIN=src -DOUT=dst [-DSCDOC=scdoc -DVERSION=x.y.z] [-DGZIP=gzip] -P render.cmake
#
# With SCDOC: replaces @TP_VERSION@ in IN with VERSION and runs scdoc on it
# (a man page). With GZIP: compresses the result with `gzip -n -9` (no name,
# no time stamp: the same source gives the same bytes). Used for the man pages
# (docs/man/CMakeLists.txt).
foreach(var IN ITEMS IN OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "render.cmake: -D${var}=... is required")
  endif()
endforeach()

set(tmp "${OUT}.tmp")
if(SCDOC)
  file(READ "${IN}" text)
  string(REPLACE "@TP_VERSION@" "${VERSION}" text "${text}")
  file(WRITE "${tmp}.scd" "${text}")
  execute_process(COMMAND "${SCDOC}"
    INPUT_FILE "${tmp}.scd" OUTPUT_FILE "${tmp}"
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  file(REMOVE "${tmp}.scd")
  if(NOT rc EQUAL 0)
    file(REMOVE "${tmp}")
    message(FATAL_ERROR "scdoc failed on ${IN}: ${err}")
  endif()
else()
  configure_file("${IN}" "${tmp}" COPYONLY)
endif()

if(GZIP)
  execute_process(COMMAND "${GZIP}" -n -9 -c "${tmp}"
    OUTPUT_FILE "${OUT}" RESULT_VARIABLE rc ERROR_VARIABLE err)
  file(REMOVE "${tmp}")
  if(NOT rc EQUAL 0)
    file(REMOVE "${OUT}")
    message(FATAL_ERROR "gzip failed on ${IN}: ${err}")
  endif()
else()
  file(RENAME "${tmp}" "${OUT}")
endif()
