# Megatron-Bridge 0.3.1 (with Megatron-Core 0.16.1) takes every plan of plans.txt through its own
# run path: the recipe the export names, process_config_with_overrides on its overrides,
# runtime_config_update and ConfigContainer.validate(); the final container must hold the plan's
# values (tests/clients/bridge_check.py, which documents its two stubs).
add_test(NAME clients_bridge
         COMMAND bash -c "py=$(\"$0/scripts/clients.sh\" bridge) || exit $?; exec \"$py\" \"$0/tests/clients/bridge_check.py\" \"$1\""
                 ${CMAKE_SOURCE_DIR} $<TARGET_FILE:parallax>)
set_tests_properties(clients_bridge PROPERTIES LABELS clients SKIP_RETURN_CODE 77 TIMEOUT 1800)
