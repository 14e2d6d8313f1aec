# Megatron-Bridge 0.6.2 (with Megatron-Core 0.19.2; tests/clients/bridge06.txt) takes every plan of
# plans.txt through its own run path: the recipe the export names, process_config_with_overrides on
# its overrides, runtime_config_update and ConfigContainer.validate(); the final container must
# hold the plan's values and Bridge must log no warning on the way (tests/clients/bridge_check.py,
# which documents its stubs and first checks that a warning fails a plan).
add_test(NAME clients_bridge
         COMMAND bash -c "py=$(\"$0/scripts/clients.sh\" bridge06) || exit $?; exec \"$py\" \"$0/tests/clients/bridge_check.py\" \"$1\""
                 ${CMAKE_SOURCE_DIR} $<TARGET_FILE:parallax>)
set_tests_properties(clients_bridge PROPERTIES LABELS clients SKIP_RETURN_CODE 77 TIMEOUT 1800)
