/* Framework profiles (profiles/frameworks/<name>.json, built in): what the framework that runs a
 * job does beyond the layout's knobs (docs/profiles.md, "Frameworks"). */
#include "profiles/profile.h"

#include <string.h>

extern const PxEmbedded prof_framework_data[];
extern const int prof_framework_data_count;

int prof_framework_load(const char *name, ProfFramework *out, PxError *err)
{
    memset(out, 0, sizeof *out);
    out->overlap_dp = -1;
    const PxEmbedded *e = NULL;
    for (int i = 0; i < prof_framework_data_count && !e; i++)
        if (strcmp(prof_framework_data[i].name, name) == 0)
            e = &prof_framework_data[i];
    if (!e)
        return px_fail(err, PX_EINPUT, "unknown framework '%s' (profiles/frameworks/ has no %s.json)",
                       name, name);
    char origin[96];
    snprintf(origin, sizeof origin, "frameworks/%s.json", e->name);
    cJSON *j = px_json_parse(e->text, origin, err);
    if (!j)
        return PX_EINPUT;
    char where[128];
    snprintf(where, sizeof where, "%s:", origin);
    static const char *const kinds[] = {"layer", "op"};
    int rc = px_json_string(j, where, "name", 1, out->name, sizeof out->name, err);
    if (!rc)
        rc = px_json_enum(j, where, "recompute_selective", 1, kinds, 2, &out->recompute_op, err);
    if (!rc)
        rc = px_json_bool(j, where, "eager_norms", 1, &out->eager_norms, err);
    if (!rc)
        rc = px_json_bool(j, where, "flash_attention_2", 0, &out->flash_attention_2, err);
    if (!rc)
        rc = px_json_double(j, where, "eager_rope_bytes", 0, 0, 1024, &out->eager_rope_bytes, err);
    if (!rc)
        rc = px_json_int(j, where, "eager_rope_kernels", 0, 0, 64, &out->eager_rope_kernels, err);
    if (!rc)
        rc = px_json_double(j, where, "adamw_step_bytes", 0, 0, 1024, &out->adamw_step_bytes, err);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "overlap_dp");
    if (!rc && o && !cJSON_IsNull(o)) {
        int v = 0;
        rc = px_json_bool(j, where, "overlap_dp", 1, &v, err);
        out->overlap_dp = v;
    }
    cJSON_Delete(j);
    return rc;
}
