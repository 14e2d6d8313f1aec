/* libFuzzer target: device and cluster profiles. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "profiles/profile.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (!text)
        return 0;
    PxError err = {0};
    ProfCluster c;
    if (prof_cluster_parse(text, "fuzz", &c, &err) == PX_OK) {
        cJSON_Delete(prof_cluster_to_json(&c));
        (void)prof_peak_flops(&c.device, PX_BF16);
        (void)prof_rank_memory(&c, prof_node_size(&c, 16));
    }
    ProfDevice d;
    (void)prof_device_parse(text, "fuzz", &d, &err);
    free(text);
    return 0;
}
