# NeMo 1.x (docs/exports.md, "NeMo 1.x"): the NeMo 1.x overrides of --format nemo composed into
# NeMo's megatron_gpt_config.yaml (fixtures of NeMo 8cfedd72 and 1.23.0) by Hydra in struct
# mode, the composed model compared with the plan; hydra-core and omegaconf from
# scripts/clients.sh nemo.
add_test(NAME clients_nemo
         COMMAND bash -c "py=$(\"$0/scripts/clients.sh\" nemo) || exit $?; exec \"$py\" \"$0/tests/clients/nemo_hydra.py\" \"$1\""
                 ${PROJECT_SOURCE_DIR} $<TARGET_FILE:parallax>)
set_tests_properties(clients_nemo PROPERTIES LABELS clients SKIP_RETURN_CODE 77 TIMEOUT 1200)
