# Small helpers so every target in the tree reads the same way.
#
#   zo_cc_library(NAME zo_common HDRS a.h SRCS a.cc DEPS absl::status)
#   zo_cc_library(NAME zo_server PROTO_PCH SRCS ...)   # with cmake/proto_pch.h precompiled
#   zo_cc_test(NAME fp16_test SRCS fp16_test.cc DEPS zo_common [LABELS gpu])
#   zo_cc_binary(NAME zo-ctl SRCS zo_ctl_main.cc DEPS zo_server)
#
# Include paths are written from the repository root ("common/fp16.h"), so
# every target gets the root and the binary root (generated protos) on its path.

include(CMakeParseArguments)

function(zo_cc_library)
  cmake_parse_arguments(ZO "PROTO_PCH" "NAME" "HDRS;SRCS;DEPS;COPTS" ${ARGN})
  # A library that links GoogleTest is test support: without BUILD_TESTING
  # (pip install ., pyproject.toml) no GTest is looked for and no test uses it.
  if(NOT BUILD_TESTING AND ZO_DEPS MATCHES "(^|;)GTest::")
    return()
  endif()
  if(ZO_SRCS)
    add_library(${ZO_NAME} STATIC ${ZO_SRCS} ${ZO_HDRS})
    target_include_directories(${ZO_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${ZO_NAME} PUBLIC ${ZO_DEPS})
    # nvcc takes host-compiler warnings only through -Xcompiler: CXX only.
    target_compile_options(${ZO_NAME} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${ZO_WARNINGS}>"
                           ${ZO_COPTS})
    # The generated messages, protobuf and Abseil, parsed once per library
    # instead of once per file (cmake/proto_pch.h). Opt-in: a library below
    # the wire protocol has no generated headers to include, and a small
    # file would pay more to load the header than it saves. Per library, not
    # shared: clang refuses a header precompiled with other flags.
    if(ZO_PROTO_PCH AND ZO_PCH)
      target_precompile_headers(${ZO_NAME} PRIVATE
                                "$<$<COMPILE_LANGUAGE:CXX>:${PROJECT_SOURCE_DIR}/cmake/proto_pch.h>")
    endif()
  else()
    add_library(${ZO_NAME} INTERFACE)
    target_include_directories(${ZO_NAME} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${ZO_NAME} INTERFACE ${ZO_DEPS})
  endif()
endfunction()

# A test's own code at -O1 and with line tables only (-g1) in optimised
# builds: the code under test keeps -O2 -g in its libraries, and test files
# (gtest and gmock templates) are most of a CI build.
set(ZO_TEST_COPTS $<$<CONFIG:RelWithDebInfo,Release>:-O1> $<$<CONFIG:RelWithDebInfo>:-g1> -pthread)

# zo_test_pch: cmake/test_pch.h precompiled once with the tests' flags and
# reused by every test (-pthread is in ZO_TEST_COPTS: the header is refused
# where _REENTRANT differs). GCC only: clang refuses a
# precompiled header built with other macro definitions, and a test's own
# definitions (ZO_SERVER_PATH...) differ; a test with its own COPTS compiles
# without it.
function(zo_add_test_pch)
  if(NOT BUILD_TESTING OR NOT ZO_PCH OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  add_library(zo_test_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/test_pch.cc)
  target_link_libraries(zo_test_pch PRIVATE zo_proto GTest::gmock nlohmann_json::nlohmann_json
                        absl::status absl::statusor absl::strings Threads::Threads)
  target_compile_options(zo_test_pch PRIVATE ${ZO_TEST_COPTS} ${ZO_WARNINGS})
  target_precompile_headers(zo_test_pch PRIVATE ${PROJECT_SOURCE_DIR}/cmake/test_pch.h)
  # Compiled as the tests are: an executable's -fPIE, not a library's -fPIC
  # (the header is refused for a different setting).
  if(CMAKE_POSITION_INDEPENDENT_CODE)
    set_target_properties(zo_test_pch PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(zo_test_pch PRIVATE -fPIE)
  endif()
endfunction()

function(zo_cc_test)
  cmake_parse_arguments(ZO "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;COPTS" ${ARGN})
  if(NOT BUILD_TESTING)
    return()
  endif()
  add_executable(${ZO_NAME} ${ZO_SRCS})
  target_link_libraries(${ZO_NAME} PRIVATE ${ZO_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${ZO_NAME} PRIVATE ${ZO_TEST_COPTS} ${ZO_WARNINGS} ${ZO_COPTS})
  if(TARGET zo_test_pch AND NOT ZO_COPTS)
    target_precompile_headers(${ZO_NAME} REUSE_FROM zo_test_pch)
  endif()
  if(NOT ZO_TIMEOUT)
    set(ZO_TIMEOUT 300)
  endif()
  set(props TIMEOUT ${ZO_TIMEOUT})
  if(ZO_LABELS)
    list(APPEND props LABELS "${ZO_LABELS}")
  endif()
  gtest_discover_tests(${ZO_NAME}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES ${props}
    DISCOVERY_TIMEOUT 60)
endfunction()

function(zo_cc_binary)
  cmake_parse_arguments(ZO "" "NAME" "SRCS;DEPS;COPTS" ${ARGN})
  add_executable(${ZO_NAME} ${ZO_SRCS})
  target_link_libraries(${ZO_NAME} PRIVATE ${ZO_DEPS})
  target_compile_options(${ZO_NAME} PRIVATE ${ZO_WARNINGS} ${ZO_COPTS})
  set_target_properties(${ZO_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()
