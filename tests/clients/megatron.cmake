# Megatron-LM (docs/exports.md, "Megatron-LM"): parallax's --format megatron, sourced in bash,
# against Megatron-LM's own parse_args + validate_args (clients_megatron_args: the checkout
# MEGATRON_LM names, else megatron-core's wheel from PyPI, which carries megatron/training), and
# against the fixture taken from its parser with the validate_args rules parallax relies on
# (clients_megatron_fixture). Both run in scripts/clients.sh megatron's environment.
add_test(NAME clients_megatron_args
         COMMAND bash -c "py=$(\"$0/scripts/clients.sh\" megatron) || exit $?; exec \"$py\" \"$0/tests/clients/megatron_args.py\" \"$1\""
                 ${PROJECT_SOURCE_DIR} $<TARGET_FILE:parallax>)
add_test(NAME clients_megatron_fixture
         COMMAND bash -c "py=$(\"$0/scripts/clients.sh\" megatron) || exit $?; exec \"$py\" \"$0/tests/clients/megatron_fixture.py\" \"$1\""
                 ${PROJECT_SOURCE_DIR} $<TARGET_FILE:parallax>)
set_tests_properties(clients_megatron_args clients_megatron_fixture PROPERTIES
                     LABELS clients SKIP_RETURN_CODE 77 TIMEOUT 1200)
