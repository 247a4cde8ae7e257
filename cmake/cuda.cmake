# The CUDA backend (kernels/cuda): kernels compiled by nvcc into the kiri library, the CUDA
# runtime linked statically (libcudart_static), the driver (libcuda.so.1) found at run time by
# the runtime library, so a binary built with the backend runs where there is no NVIDIA driver.
# Options:
#   KIRI_CUDA            build the backend (default ON when nvcc and the target's cudart_static are found)
#   KIRI_CUDA_ARCHS      real architectures compiled to machine code (default 80;87;90;110;
#                        80 alone in sanitizer builds)
#   KIRI_CUDA_PTX        the architecture also embedded as PTX for newer GPUs (default 90)
#   KIRI_CUDA_TARGET_DIR the CUDA targets/ folder of a cross build (aarch64-linux for JetPack)
# The .cu files are compiled by custom commands (not CMake's CUDA language) so the C flags of the
# project (warnings, sanitizers) never reach nvcc. Include from the top-level CMakeLists.txt after
# the kiri library and the tests block: include(cmake/cuda.cmake)
# Sanitizer builds (tests only) compile one architecture plus its PTX, which runs on every GPU the
# backend supports, to keep `make test` short.
if(KIRI_SANITIZE)
  set(_cu_archs "80")
  set(_cu_ptx "80")
else()
  set(_cu_archs "80;87;90;110")
  set(_cu_ptx "90")
endif()
set(KIRI_CUDA_ARCHS "${_cu_archs}" CACHE STRING "CUDA architectures compiled to machine code (sm_XX)")
set(KIRI_CUDA_PTX "${_cu_ptx}" CACHE STRING "CUDA architecture embedded as PTX (empty: none)")
set(KIRI_CUDA_TARGET_DIR "" CACHE STRING "CUDA targets/ subfolder for cross builds (aarch64-linux)")

find_program(KIRI_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_PATH PATH_SUFFIXES bin NO_CMAKE_FIND_ROOT_PATH)
set(_cu_found OFF)
if(KIRI_NVCC)
  get_filename_component(_cu_root "${KIRI_NVCC}" DIRECTORY)
  get_filename_component(_cu_root "${_cu_root}" DIRECTORY)
  if(KIRI_CUDA_TARGET_DIR)
    set(_cu_lib_dirs ${_cu_root}/targets/${KIRI_CUDA_TARGET_DIR}/lib)
    set(_cu_inc_dirs ${_cu_root}/targets/${KIRI_CUDA_TARGET_DIR}/include)
  else()
    set(_cu_lib_dirs ${_cu_root}/lib64 ${_cu_root}/lib)
    set(_cu_inc_dirs ${_cu_root}/include)
  endif()
  find_library(KIRI_CUDART_STATIC NAMES libcudart_static.a HINTS ${_cu_lib_dirs} NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
  find_path(KIRI_CUDA_INCLUDE_DIR cuda_runtime_api.h HINTS ${_cu_inc_dirs} NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
  # A cross build needs the target's CUDA libraries: only with KIRI_CUDA_TARGET_DIR. The fuzz
  # build (parsers only) leaves the backend out.
  if(KIRI_CUDART_STATIC AND KIRI_CUDA_INCLUDE_DIR AND (NOT CMAKE_CROSSCOMPILING OR KIRI_CUDA_TARGET_DIR) AND
     NOT KIRI_FUZZ)
    set(_cu_found ON)
  endif()
endif()
option(KIRI_CUDA "Build the CUDA backend (needs nvcc and the target's libcudart_static.a)" ${_cu_found})

if(NOT _cu_found AND NOT KIRI_FUZZ)
  message(STATUS "kiri: CUDA backend skipped: no nvcc, or no libcudart_static.a and CUDA headers for "
                 "this target (cross builds: KIRI_CUDA_TARGET_DIR, see ports/jetson)")
  set(KIRI_CUDA OFF)
elseif(KIRI_CUDA)
  set(_cu_dir ${CMAKE_SOURCE_DIR}/kernels/cuda)
  set(_cu_out ${CMAKE_BINARY_DIR}/cuda_kernels)
  file(MAKE_DIRECTORY ${_cu_out})
  # What the kernels and the host-compiled unit checks share; the kernels add -O3 and the GPU targets.
  set(_cu_base_flags -std=c++17 -fmad=false -Xcompiler=-fPIE,-fno-exceptions,-fno-threadsafe-statics
      -I${CMAKE_SOURCE_DIR}/runtime -I${CMAKE_SOURCE_DIR}/base -I${CMAKE_SOURCE_DIR}/include)
  set(_cu_flags -O3 ${_cu_base_flags})
  foreach(_a ${KIRI_CUDA_ARCHS})
    list(APPEND _cu_flags -gencode=arch=compute_${_a},code=sm_${_a})
  endforeach()
  if(KIRI_CUDA_PTX)
    list(APPEND _cu_flags -gencode=arch=compute_${KIRI_CUDA_PTX},code=compute_${KIRI_CUDA_PTX})
  endif()
  if(CMAKE_CROSSCOMPILING)
    # nvcc compiles the host side of the .cu files with the target's C++ compiler.
    string(REGEX REPLACE "gcc$" "g++" _cu_host_cxx "${CMAKE_C_COMPILER}")
    list(APPEND _cu_flags -ccbin=${_cu_host_cxx})
  endif()
  if(KIRI_CUDA_TARGET_DIR)
    list(APPEND _cu_flags --target-directory=${KIRI_CUDA_TARGET_DIR})
  endif()
  set(_cu_headers ${_cu_dir}/common.cuh ${_cu_dir}/cuda_kernels.h ${CMAKE_SOURCE_DIR}/runtime/backend.h)
  set(_cu_objs "")
  foreach(_name quantize matvec get_rows rows store_kv attention recurrent)
    add_custom_command(
      OUTPUT ${_cu_out}/${_name}.o
      COMMAND ${KIRI_NVCC} ${_cu_flags} -c ${_cu_dir}/${_name}.cu -o ${_cu_out}/${_name}.o
      DEPENDS ${_cu_dir}/${_name}.cu ${_cu_headers}
      COMMENT "nvcc ${_name}.cu"
      VERBATIM)
    list(APPEND _cu_objs ${_cu_out}/${_name}.o)
  endforeach()
  set_source_files_properties(${_cu_objs} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  target_sources(kiri PRIVATE ${_cu_dir}/cuda_backend.c ${_cu_objs})
  target_include_directories(kiri SYSTEM PRIVATE ${KIRI_CUDA_INCLUDE_DIR})
  target_compile_definitions(kiri PRIVATE KIRI_WITH_CUDA)
  # libkiri.a takes cudart_static's members in (ar's MRI ADDLIB keeps members of the same name
  # apart), so a program embedding kiri links libkiri.a as before, CUDA or not (README.md,
  # "Embedding kiri"). cudart opens the driver with dlopen and uses POSIX clocks and threads; the
  # kernels' host code is C++ built without exceptions and needs no C++ library.
  set(_cu_mri ${_cu_out}/merge_cudart.mri)
  file(GENERATE OUTPUT ${_cu_mri} CONTENT
    "CREATE $<TARGET_FILE:kiri>.merged\nADDLIB $<TARGET_FILE:kiri>\nADDLIB ${KIRI_CUDART_STATIC}\nSAVE\nEND\n")
  add_custom_command(TARGET kiri POST_BUILD
    COMMAND sh -c "\"$0\" -M < \"$1\" && mv \"$2.merged\" \"$2\"" ${CMAKE_AR} ${_cu_mri} $<TARGET_FILE:kiri>
    COMMENT "adding cudart_static to libkiri.a"
    VERBATIM)
  find_library(KIRI_RT_LIBRARY rt)
  target_link_libraries(kiri PUBLIC ${CMAKE_DL_LIBS} Threads::Threads)
  if(KIRI_RT_LIBRARY)
    target_link_libraries(kiri PUBLIC ${KIRI_RT_LIBRARY})
  endif()
  string(REPLACE ";" " " _cu_arch_list "${KIRI_CUDA_ARCHS}")
  message(STATUS "kiri: CUDA backend on (sm ${_cu_arch_list}, PTX ${KIRI_CUDA_PTX}, ${KIRI_NVCC})")

  if(KIRI_TESTS)
    # Every op against the CPU reference, whole-model greedy equality and decode speed: needs a
    # GPU, so it is built here and run by scripts/cuda-check.sh where there is one.
    add_executable(cuda_check tests/cuda_check.c tests/backend_check.c)
    target_link_libraries(cuda_check PRIVATE kiri)
    target_include_directories(cuda_check SYSTEM PRIVATE ${KIRI_CUDA_INCLUDE_DIR})
    target_compile_definitions(cuda_check PRIVATE KIRI_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
    # Runs everywhere: without a GPU it checks that the backend is skipped with its reason and
    # that kiri falls back to the CPU; with one, that the probe finds it.
    add_test(NAME cuda_probe COMMAND cuda_check --probe WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    # The kernels' per-block arithmetic (compiled for the host as well) against the CPU reference:
    # runs everywhere, no GPU needed.
    add_custom_command(
      OUTPUT ${_cu_out}/cuda_units.o
      COMMAND ${KIRI_NVCC} -O2 ${_cu_base_flags} -c ${CMAKE_SOURCE_DIR}/tests/cuda_units.cu -o ${_cu_out}/cuda_units.o
      DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda_units.cu ${_cu_headers} ${CMAKE_SOURCE_DIR}/kernels/cpu/cpu_kernels.h
      COMMENT "nvcc cuda_units.cu"
      VERBATIM)
    set_source_files_properties(${_cu_out}/cuda_units.o PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    add_executable(cuda_units ${_cu_out}/cuda_units.o)
    set_target_properties(cuda_units PROPERTIES LINKER_LANGUAGE C)
    target_link_libraries(cuda_units PRIVATE kiri)
    add_test(NAME cuda_units COMMAND cuda_units WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  endif()
endif()
