/* Framework profiles (profiles/frameworks/<name>.json, built in): what the framework that runs a
 * job does beyond the layout's knobs (docs/profiles.md, "Frameworks"). */
#include "profiles/profile.h"

#include <string.h>

extern const PxEmbedded prof_framework_data[];
extern const int prof_framework_data_count;

/* "zero_stages": [0, 3] into bit z for each stage z (absent: 0, every stage). */
static int zero_mask(const cJSON *j, const char *where, const char *key, unsigned *mask, PxError *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    *mask = 0;
    if (!a)
        return PX_OK;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0)
        return px_fail(err, PX_EINPUT, "%s %s: expected a non-empty array of ZeRO stages 0-3", where, key);
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsNumber(v) || v->valueint < 0 || v->valueint > 3 || v->valuedouble != v->valueint)
            return px_fail(err, PX_EINPUT, "%s %s: expected ZeRO stages 0-3", where, key);
        *mask |= 1u << v->valueint;
    }
    return PX_OK;
}

/* key: an array of up to 3 of names[3] (absent: every one) into out[*n]. */
static int name_list(const cJSON *j, const char *where, const char *key, const char *const names[3],
                     char out[4][16], int *n, PxError *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!a)
        return PX_OK;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0 || cJSON_GetArraySize(a) > 3)
        return px_fail(err, PX_EINPUT, "%s %s: expected an array of %s, %s, %s", where, key, names[0],
                       names[1], names[2]);
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        int ok = 0;
        for (int i = 0; i < 3 && cJSON_IsString(v); i++)
            ok |= strcmp(v->valuestring, names[i]) == 0;
        if (!ok)
            return px_fail(err, PX_EINPUT, "%s %s: expected %s, %s or %s", where, key, names[0], names[1],
                           names[2]);
        px_strlcpy(out[(*n)++], v->valuestring, sizeof out[0]);
    }
    return PX_OK;
}

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
    if (!rc)
        rc = zero_mask(j, where, "zero_stages", &out->zero_stages, err);
    if (!rc)
        rc = zero_mask(j, where, "zero_stages_pp", &out->zero_stages_pp, err);
    if (!rc)
        rc = zero_mask(j, where, "zero_stages_cp", &out->zero_stages_cp, err);
    static const char *const cp_names[3] = {"p2p", "allgather", "a2a"};
    static const char *const moe_names[3] = {"alltoall", "allgather", "flex"};
    if (!rc)
        rc = name_list(j, where, "cp_comm_types", cp_names, out->cp_comm_types, &out->n_cp_comm_types, err);
    if (!rc)
        rc = name_list(j, where, "moe_dispatchers", moe_names, out->moe_dispatchers, &out->n_moe_dispatchers,
                       err);
    if (!rc)
        rc = px_json_bool(j, where, "dp_only", 0, &out->dp_only, err);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "overlap_dp");
    if (!rc && o && !cJSON_IsNull(o)) {
        int v = 0;
        rc = px_json_bool(j, where, "overlap_dp", 1, &v, err);
        out->overlap_dp = v;
    }
    cJSON_Delete(j);
    return rc;
}
