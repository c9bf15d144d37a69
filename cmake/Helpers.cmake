# add_omni_test(NAME SOURCES... LIBS ...): one GoogleTest binary per component.
function(add_omni_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  omni_use_pch(${name})
  # Label each test with its component folder (cpu_offload, model_runner, ...) so that a
  # build of some suites only (scripts/tsan.sh) can run exactly those: ctest -L cpu_offload.
  get_filename_component(component "${CMAKE_CURRENT_SOURCE_DIR}" NAME)
  # Every suite runs the simulated device in strict mode (CUDA's ordering rules enforced, a
  # breach aborts: cpu_offload/src/sim_device_rules.h), and so do the processes it starts.
  # Sanitized builds run two to four times slower: their tests get three times the time.
  set(timeout 300)
  if(OMNI_SANITIZE)
    set(timeout 900)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT ${timeout} LABELS ${component}
                       ENVIRONMENT "OMNI_SIM_STRICT=1")
  if(NOT TARGET ${component}_tests)
    add_custom_target(${component}_tests)
  endif()
  add_dependencies(${component}_tests ${name})
endfunction()

# Shares one precompiled LibTorch header across targets: including ATen/torch headers costs
# 10-20 s per translation unit on 2 cores, the PCH makes that once per build.
function(omni_use_pch target)
  if(OMNI_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM omni_pch)
  endif()
endfunction()
