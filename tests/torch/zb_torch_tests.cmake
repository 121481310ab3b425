# zb.torch (python/zb/torch, docs/pytorch.md) against real PyTorch: label
# torch. The interpreter is $ZB_TORCH_PYTHON, else the checkout's
# build/venv-hf/bin/python; each test exits 77 (a skip) where it or torch is
# missing. zbctl plays zb.plan() until the package's extension is built.
set(zb_torch_python_default "${PROJECT_SOURCE_DIR}/build/venv-hf/bin/python")
set(zb_torch_env "ZBCTL_BIN=$<TARGET_FILE:zbctl>" "PYTHONDONTWRITEBYTECODE=1")
foreach(zb_t test_profile test_torchtitan_settings test_schedule_bridge)
  add_test(NAME torch_${zb_t}
           COMMAND sh -c "py=\${ZB_TORCH_PYTHON:-${zb_torch_python_default}}; [ -x \"$py\" ] || { echo \"SKIP: no python at $py (set ZB_TORCH_PYTHON)\"; exit 77; }; exec \"$py\" \"$0\""
                   ${CMAKE_CURRENT_LIST_DIR}/${zb_t}.py)
  set_tests_properties(torch_${zb_t} PROPERTIES LABELS torch SKIP_RETURN_CODE 77 TIMEOUT 300
                                                ENVIRONMENT "${zb_torch_env}")
endforeach()
