# The NCCL stand-in (nccl_standin*.c) and its tests; included from
# tests/standin/CMakeLists.txt. Needs the nccl transport's target (the CUDA
# and NCCL headers, worker/CMakeLists.txt) and the tcp transport, which
# carries its messages (zbworker_core).
if(TARGET zbtransport_nccl)
  set(zb_nccl_standin_sources nccl_standin.c nccl_standin_boot.c nccl_standin_p2p.c nccl_standin_coll.c)
  target_sources(zbstandin PRIVATE ${zb_nccl_standin_sources})
  target_link_libraries(zbstandin PUBLIC zbworker_core ${CMAKE_DL_LIBS})
  set(zb_nccl_standin_lib zbstandin)
  foreach(t test_nccl_standin test_transport_nccl test_group_comm)
    add_executable(${t} ${t}.c)
    target_compile_options(${t} PRIVATE ${ZB_WARNINGS})
    target_link_libraries(${t} PRIVATE zbtransport_nccl ${zb_nccl_standin_lib} ${CMAKE_DL_LIBS})
    add_test(NAME ${t} COMMAND ${t})
    set_tests_properties(${t} PROPERTIES LABELS standin TIMEOUT 120)
  endforeach()
endif()

# The nccl transport's share of the error-injection sweep (fail_sweep.py).
if(TARGET zbtransport_nccl AND ZB_SWEEP_PYTHON AND ZB_ADDR2LINE)
  add_executable(test_strict_nccl test_strict_nccl.c)
  target_compile_options(test_strict_nccl PRIVATE ${ZB_WARNINGS})
  target_link_libraries(test_strict_nccl PRIVATE zbtransport_nccl ${zb_nccl_standin_lib} ${CMAKE_DL_LIBS})
  add_test(NAME standin_fail_sweep_nccl COMMAND ${ZB_SWEEP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/fail_sweep.py
                                                $<TARGET_FILE:test_strict_nccl>)
  set_tests_properties(standin_fail_sweep_nccl PROPERTIES LABELS standin TIMEOUT 600)
endif()
