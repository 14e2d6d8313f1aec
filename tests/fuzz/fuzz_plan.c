/* libFuzzer target: plans (the hand-off to the executor), then the exports of a valid one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "export/export.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (!text)
        return 0;
    PxError err = {0};
    cJSON *j = px_json_parse(text, "fuzz", &err);
    free(text);
    if (!j)
        return 0;
    ModelPlan p;
    if (model_plan_from_json(j, "fuzz", &p, &err) == PX_OK) {
        cJSON_Delete(model_plan_to_json(&p));
        FILE *sink = fopen("/dev/null", "w");
        if (sink) {
            for (int f = 0; f < 3; f++)
                (void)export_plan(sink, &p, (ExportFormat)f, &err);
            fclose(sink);
        }
    }
    model_plan_free(&p);
    cJSON_Delete(j);
    return 0;
}
