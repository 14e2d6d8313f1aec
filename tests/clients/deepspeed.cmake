# DeepSpeed 0.19.8's DeepSpeedConfig parses every plan's `export --format deepspeed`, its
# WarmupCosineLR steps the schedule; the parsed values must be the plan's
# (tests/clients/deepspeed_check.py).
add_test(NAME clients_deepspeed
         COMMAND bash -c "py=$(\"$0/scripts/clients.sh\" deepspeed) || exit $?; exec \"$py\" \"$0/tests/clients/deepspeed_check.py\" \"$1\""
                 ${CMAKE_SOURCE_DIR} $<TARGET_FILE:parallax>)
set_tests_properties(clients_deepspeed PROPERTIES LABELS clients SKIP_RETURN_CODE 77 TIMEOUT 1800)
