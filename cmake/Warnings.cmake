# Compiler warnings for every target of ours. Third-party headers (LibTorch, gRPC, protobuf,
# yaml-cpp, CUDA) come in as SYSTEM includes, so these flags judge our code only; GoogleTest
# built from source and the protoc-generated sources are compiled with -w (not our code).
option(OMNI_WERROR "Treat compiler warnings as errors (CI sets it; off for users: a newer
compiler may add warnings that should not block a build)" OFF)

set(OMNI_WARNING_FLAGS
  -Wall -Wextra -Wpedantic
  -Wshadow               # a local hiding a member or an outer local has caused real bugs
  -Wnon-virtual-dtor     # a class with virtual functions deleted through a base pointer
  -Wold-style-cast       # casts say which conversion they mean
)
if(OMNI_WERROR)
  list(APPEND OMNI_WARNING_FLAGS -Werror)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${OMNI_WARNING_FLAGS}>")
message(STATUS "Warnings: ${OMNI_WARNING_FLAGS}")
