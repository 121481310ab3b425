# The NCCL stand-in (nccl_standin*.c) and its tests; included from
# tests/standin/CMakeLists.txt. Needs the nccl transport's target (the CUDA
# and NCCL headers, worker/CMakeLists.txt) and the tcp transport, which
# carries its messages (zbworker_core).
if(TARGET zbtransport_nccl)
  set(zb_nccl_standin_sources nccl_standin.c nccl_standin_boot.c nccl_standin_p2p.c)
  if(TARGET zbstandin)
    target_sources(zbstandin PRIVATE ${zb_nccl_standin_sources})
    target_link_libraries(zbstandin PUBLIC zbworker_core ${CMAKE_DL_LIBS})
    set(zb_nccl_standin_lib zbstandin)
  else()
    # TEMPORARY, until the cudart stand-in (branch standin) is merged:
    # a minimal private stream engine (nccl_tmp_cudart.c).
    add_library(zbstandin_nccl_tmp STATIC ${zb_nccl_standin_sources} nccl_tmp_cudart.c)
    target_compile_options(zbstandin_nccl_tmp PRIVATE ${ZB_WARNINGS})
    target_include_directories(zbstandin_nccl_tmp PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
    target_link_libraries(zbstandin_nccl_tmp PUBLIC zbtransport_nccl zbworker_core ${CMAKE_DL_LIBS} Threads::Threads)
    set(zb_nccl_standin_lib zbstandin_nccl_tmp)
  endif()
  foreach(t test_nccl_standin test_transport_nccl)
    add_executable(${t} ${t}.c)
    target_compile_options(${t} PRIVATE ${ZB_WARNINGS})
    target_link_libraries(${t} PRIVATE zbtransport_nccl ${zb_nccl_standin_lib} ${CMAKE_DL_LIBS})
    add_test(NAME ${t} COMMAND ${t})
    set_tests_properties(${t} PROPERTIES LABELS standin TIMEOUT 120)
  endforeach()
endif()
