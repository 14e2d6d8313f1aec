# torchtitan (docs/exports.md#torchtitan---format-torchtitan): each version's own config manager
# reads what parallax exports for every plan of plans.txt; 0.3.0 the command line (--format
# torchtitan), 0.2.1 the TOML job file (--format torchtitan-toml).
foreach(v 0.3 0.2)
  string(REPLACE "." "" vv ${v})
  add_test(NAME clients_torchtitan${vv}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/clients/torchtitan.sh ${v} $<TARGET_FILE:parallax>)
  set_tests_properties(clients_torchtitan${vv} PROPERTIES LABELS clients SKIP_RETURN_CODE 77 TIMEOUT 1800)
endforeach()
# the exact lines of both forms for two plans (label unit; kept here beside the client check)
px_test(test_export_titan unit)
