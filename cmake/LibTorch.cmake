# Finds LibTorch inside the `torch` wheel (pip) and defines imported targets:
#   omni::torch       ATen/c10/torch C++ frontend, CPU only (libtorch_cpu + libc10)
#   omni::torch_cuda  the CUDA part (libtorch_cuda + libc10_cuda + cudart), when present
# We do not use the wheel's TorchConfig.cmake because it links libtorch_cuda whenever it
# sees a CUDA toolkit, and a CPU-only build must not need the CUDA runtime libraries.
#
# Input: OMNI_TORCH_DIR (cache), else $TORCH_DIR, else asked from python3 without importing
# torch (importing needs every CUDA library the wheel depends on).

set(OMNI_TORCH_DIR "$ENV{TORCH_DIR}" CACHE PATH "torch package directory (site-packages/torch)")
if(NOT OMNI_TORCH_DIR)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"
    OUTPUT_VARIABLE _omni_torch_dir OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(OMNI_TORCH_DIR "${_omni_torch_dir}" CACHE PATH "torch package directory" FORCE)
endif()
if(NOT EXISTS "${OMNI_TORCH_DIR}/lib/libtorch_cpu.so")
  message(FATAL_ERROR
    "LibTorch not found (looked in '${OMNI_TORCH_DIR}'). Run scripts/setup.sh, which installs "
    "the torch==2.11.0 wheel, or pass -DOMNI_TORCH_DIR=/path/to/site-packages/torch.")
endif()
message(STATUS "LibTorch: ${OMNI_TORCH_DIR}")

# C++ ABI: libstdc++'s dual ABI must match between LibTorch and everything we link (Debian's
# gRPC/yaml-cpp are built with the new ABI). The wheel's symbols tell which one it uses.
execute_process(COMMAND nm -D --defined-only "${OMNI_TORCH_DIR}/lib/libc10.so"
                OUTPUT_VARIABLE _omni_c10_syms ERROR_QUIET)
string(FIND "${_omni_c10_syms}" "__cxx11" _omni_cxx11_pos)
if(_omni_cxx11_pos GREATER -1)
  set(OMNI_TORCH_CXX11_ABI 1)
else()
  set(OMNI_TORCH_CXX11_ABI 0)
endif()
message(STATUS "LibTorch _GLIBCXX_USE_CXX11_ABI=${OMNI_TORCH_CXX11_ABI}")

add_library(omni_torch INTERFACE)
add_library(omni::torch ALIAS omni_torch)
# The wheel's include folder also carries headers of an old protobuf (google/protobuf), which
# would shadow the system protobuf that gRPC and our generated stage service code need. The
# include path is therefore a folder of links to every entry of the wheel's but `google`
# (LibTorch's own headers do not include protobuf).
set(_omni_torch_include "${CMAKE_BINARY_DIR}/omni_torch_include")
file(MAKE_DIRECTORY "${_omni_torch_include}")
file(GLOB _omni_torch_entries RELATIVE "${OMNI_TORCH_DIR}/include" "${OMNI_TORCH_DIR}/include/*")
foreach(_entry IN LISTS _omni_torch_entries)
  if(NOT _entry STREQUAL "google" AND NOT EXISTS "${_omni_torch_include}/${_entry}")
    file(CREATE_LINK "${OMNI_TORCH_DIR}/include/${_entry}" "${_omni_torch_include}/${_entry}"
         SYMBOLIC)
  endif()
endforeach()
target_include_directories(omni_torch SYSTEM INTERFACE
  "${_omni_torch_include}" "${OMNI_TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(omni_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${OMNI_TORCH_CXX11_ABI})
target_link_libraries(omni_torch INTERFACE
  "${OMNI_TORCH_DIR}/lib/libtorch_cpu.so" "${OMNI_TORCH_DIR}/lib/libc10.so" Threads::Threads)

set(OMNI_TORCH_HAS_CUDA OFF)
if(EXISTS "${OMNI_TORCH_DIR}/lib/libtorch_cuda.so")
  set(OMNI_TORCH_HAS_CUDA ON)
endif()

# The CUDA version the wheel was built with, from its version.py (`cuda: Optional[str] =
# '13.0'`, older wheels `cuda = '12.1'`; None for a CPU wheel). Its runtime is the one
# libtorch_cuda loads, so it is the only one our CUDA code may use (CMakeLists.txt compares it
# with the toolkit's). Empty when the wheel does not say.
set(OMNI_TORCH_CUDA_VERSION "")
set(OMNI_TORCH_CUDA_VERSION_MAJOR "")
if(EXISTS "${OMNI_TORCH_DIR}/version.py")
  file(STRINGS "${OMNI_TORCH_DIR}/version.py" _omni_cuda_line REGEX "^cuda[ \t]*[:=]")
  if(_omni_cuda_line MATCHES "['\"]([0-9]+)\\.([0-9]+)")
    set(OMNI_TORCH_CUDA_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    set(OMNI_TORCH_CUDA_VERSION_MAJOR "${CMAKE_MATCH_1}")
  endif()
endif()

# The CUDA runtime (libcudart.so.N) the wheel loads: the one the dynamic loader resolves for
# libtorch_cuda (its RUNPATH points at the nvidia-* wheels next to torch), else one of those
# wheels' copies. Our CUDA code links this very file, so the process holds one runtime: a
# second one (another major, another SONAME) would have its own context state, and streams,
# events and memory of one would be invalid in the other. Empty when none is found.
set(OMNI_TORCH_CUDART "")
if(OMNI_TORCH_HAS_CUDA)
  execute_process(COMMAND ldd "${OMNI_TORCH_DIR}/lib/libtorch_cuda.so"
                  OUTPUT_VARIABLE _omni_ldd ERROR_QUIET)
  if(_omni_ldd MATCHES "libcudart\\.so[.0-9]* => (/[^ \t\n]+)")
    set(OMNI_TORCH_CUDART "${CMAKE_MATCH_1}")
  else()
    file(GLOB _omni_wheel_cudart
         "${OMNI_TORCH_DIR}/../nvidia/cuda_runtime/lib/libcudart.so.*"
         "${OMNI_TORCH_DIR}/../nvidia/cu*/lib/libcudart.so.*")
    if(_omni_wheel_cudart)
      list(SORT _omni_wheel_cudart)
      list(GET _omni_wheel_cudart 0 OMNI_TORCH_CUDART)
    endif()
  endif()
  if(OMNI_TORCH_CUDART)
    get_filename_component(OMNI_TORCH_CUDART "${OMNI_TORCH_CUDART}" ABSOLUTE)
  endif()
  set(_omni_cudart_text "${OMNI_TORCH_CUDART}")
  if(NOT _omni_cudart_text)
    set(_omni_cudart_text "not found")
  endif()
  set(_omni_cuda_text "${OMNI_TORCH_CUDA_VERSION}")
  if(NOT _omni_cuda_text)
    set(_omni_cuda_text "unknown (no cuda entry in version.py)")
  endif()
  message(STATUS "LibTorch CUDA: ${_omni_cuda_text}, runtime ${_omni_cudart_text}")
else()
  message(STATUS "LibTorch CUDA: none (CPU-only wheel)")
endif()

# Returns in OUT_VAR the shared libraries libtorch_cuda needs that the dynamic loader cannot
# find (empty when the CUDA part of the wheel is loadable).
function(omni_torch_cuda_missing_libs out_var)
  execute_process(COMMAND ldd "${OMNI_TORCH_DIR}/lib/libtorch_cuda.so"
                  OUTPUT_VARIABLE _ldd ERROR_QUIET)
  string(REGEX MATCHALL "[^ \t\n]+ => not found" _missing "${_ldd}")
  string(REPLACE " => not found" "" _missing "${_missing}")
  set(${out_var} "${_missing}" PARENT_SCOPE)
endfunction()

function(omni_define_torch_cuda_target)
  add_library(omni_torch_cuda INTERFACE)
  add_library(omni::torch_cuda ALIAS omni_torch_cuda)
  # The wheel's own runtime (see OMNI_TORCH_CUDART above), not the toolkit's: the same file
  # libtorch_cuda loads. CUDA::cudart is the fallback when the wheel's cannot be found; the
  # caller has checked that its major matches the wheel's.
  if(OMNI_TORCH_CUDART)
    set(_cudart "${OMNI_TORCH_CUDART}")
    message(STATUS "CUDA runtime: ${OMNI_TORCH_CUDART} (the torch wheel's)")
  else()
    set(_cudart CUDA::cudart)
    message(STATUS "CUDA runtime: the toolkit's CUDA::cudart (${CUDAToolkit_LIBRARY_DIR}); "
                   "the torch wheel's libcudart was not found")
  endif()
  # --no-as-needed: libtorch_cuda registers the CUDA backend from static initializers; a
  # binary that calls no symbol of it directly would otherwise drop it.
  target_link_libraries(omni_torch_cuda INTERFACE omni::torch
    -Wl,--no-as-needed "${OMNI_TORCH_DIR}/lib/libtorch_cuda.so"
    "${OMNI_TORCH_DIR}/lib/libc10_cuda.so" -Wl,--as-needed "${_cudart}")
  target_include_directories(omni_torch_cuda SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_definitions(omni_torch_cuda INTERFACE OMNI_WITH_CUDA=1)
endfunction()
