# transformers 5.24.0's AutoConfig and the model it builds on the meta device against parallax's
# import of the same Hugging Face configs: parameters, architecture, rotary base and scaling, the
# planning sequence (tests/clients/transformers_check.py).
add_test(NAME clients_transformers
         COMMAND bash -c "py=$(\"$0/scripts/clients.sh\" transformers) || exit $?; exec \"$py\" \"$0/tests/clients/transformers_check.py\" \"$1\""
                 ${CMAKE_SOURCE_DIR} $<TARGET_FILE:parallax>)
set_tests_properties(clients_transformers PROPERTIES LABELS clients SKIP_RETURN_CODE 77 TIMEOUT 1200)
