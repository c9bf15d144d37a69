# add_omni_test(NAME SOURCES... LIBS ...): one GoogleTest binary per component.
function(add_omni_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  omni_use_pch(${name})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT 300)
endfunction()

# Shares one precompiled LibTorch header across targets: including ATen/torch headers costs
# 10-20 s per translation unit on 2 cores, the PCH makes that once per build.
function(omni_use_pch target)
  if(OMNI_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM omni_pch)
  endif()
endfunction()
