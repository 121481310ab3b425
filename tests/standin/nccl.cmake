# The NCCL stand-in (nccl_standin*.c) and its tests; included from
# tests/standin/CMakeLists.txt. Needs the nccl transport's target (the CUDA
# and NCCL headers, worker/CMakeLists.txt) and the tcp transport, which
# carries its messages (zbworker_core).
if(TARGET zbtransport_nccl)
  set(zb_nccl_standin_sources nccl_standin.c nccl_standin_boot.c nccl_standin_p2p.c)
  target_sources(zbstandin PRIVATE ${zb_nccl_standin_sources})
  target_link_libraries(zbstandin PUBLIC zbworker_core ${CMAKE_DL_LIBS})
  set(zb_nccl_standin_lib zbstandin)
  foreach(t test_nccl_standin test_transport_nccl)
    add_executable(${t} ${t}.c)
    target_compile_options(${t} PRIVATE ${ZB_WARNINGS})
    target_link_libraries(${t} PRIVATE zbtransport_nccl ${zb_nccl_standin_lib} ${CMAKE_DL_LIBS})
    add_test(NAME ${t} COMMAND ${t})
    set_tests_properties(${t} PROPERTIES LABELS standin TIMEOUT 120)
  endforeach()
endif()
