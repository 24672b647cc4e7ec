# Upstream Mooncake's build options that have no switch of their own here: each one a user
# passes is read (so CMake never calls it unused) and answered with one line saying what it
# does here. Included by the top-level CMakeLists.txt after WITH_STORE, USE_ETCD, USE_REDIS,
# USE_HTTP and BUILD_EXAMPLES (real options, defined there).

# BUILD_UNIT_TESTS is upstream's name for MC_BUILD_TESTS; given, it sets it.
if(DEFINED BUILD_UNIT_TESTS)
  set(MC_BUILD_TESTS ${BUILD_UNIT_TESTS} CACHE BOOL "Build the tests" FORCE)
  message(STATUS "BUILD_UNIT_TESTS=${BUILD_UNIT_TESTS}: MC_BUILD_TESTS=${BUILD_UNIT_TESTS}")
endif()

# Device support needs nothing at build time: the device seam (src/platform) loads each vendor
# runtime with dlopen when it is first used, so one build runs with or without the hardware.
foreach(_opt USE_CUDA USE_ASCEND USE_ASCEND_DIRECT)
  if(DEFINED ${_opt})
    message(STATUS "${_opt}=${${_opt}}: no build-time effect here: device memory is reached "
                   "through the device seam, which loads the vendor runtime (libcudart.so, "
                   "libascendcl.so) at run time; no CUDA or CANN header or library is needed to "
                   "build, and without the runtime, device memory fails with a message naming it")
  endif()
endforeach()
if(DEFINED USE_ASCEND_DIRECT)
  message(STATUS "USE_ASCEND_DIRECT: the seed's tool, transfer_engine_ascend_direct_perf, is "
                 "built with BUILD_EXAMPLES (now ${BUILD_EXAMPLES}), into "
                 "${CMAKE_BINARY_DIR}/mooncake-transfer-engine/example/")
endif()

# Upstream components this project does not provide: OFF asks for nothing, ON cannot be met.
foreach(_opt WITH_STORE_RUST WITH_EP WITH_P2P_STORE)
  if(DEFINED ${_opt})
    if(${_opt})
      message(WARNING "${_opt}=ON: this project does not provide that upstream component; "
                      "the option is ignored")
    else()
      message(STATUS "${_opt}=OFF: nothing to turn off (not provided by this project)")
    endif()
  endif()
endforeach()

if(NOT BUILD_EXAMPLES)
  message(STATUS "BUILD_EXAMPLES=OFF: no transfer_engine_bench, transfer_engine_ascend_direct_perf "
                 "or store_bench (nor their tests)")
endif()
if(NOT WITH_STORE)
  message(STATUS "WITH_STORE=OFF: no Store (mooncake_master, mooncake_client, store_bench, the "
                 "Store's tests), so no protobuf or re2 is needed")
  if(MC_BUILD_PYTHON)
    message(FATAL_ERROR "MC_BUILD_PYTHON=ON needs WITH_STORE=ON: the Python package includes "
                        "mooncake.store")
  endif()
endif()
foreach(_b ETCD REDIS HTTP)
  if(NOT USE_${_b})
    string(TOLOWER ${_b} _name)
    message(STATUS "USE_${_b}=OFF: no ${_name} metadata store; asking for one (a '${_name}://' "
                   "metadata connection string) fails with a message naming USE_${_b}")
  endif()
endforeach()
if(NOT USE_HTTP AND NOT WITH_STORE)
  message(STATUS "USE_HTTP=OFF: mooncake_http_metadata_server not built (no cpp-httplib needed)")
endif()
