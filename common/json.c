/* JSON helpers: parsing with positions, typed getters that name key paths, dotted-path overrides. */
#include "common/px.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void px_json_path(char *buf, size_t cap, const char *where, const char *key)
{
    size_t n = strlen(where);
    if (n == 0)
        snprintf(buf, cap, "%s", key);
    else if (where[n - 1] == ':')
        snprintf(buf, cap, "%s %s", where, key);
    else
        snprintf(buf, cap, "%s.%s", where, key);
}

cJSON *px_json_parse(const char *text, const char *origin, PxError *err)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    if (j)
        return j;
    const char *at = end ? end : cJSON_GetErrorPtr();
    int line = 1, col = 1;
    if (at && at >= text) {
        for (const char *p = text; p < at && *p; p++) {
            if (*p == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
    }
    if (!*text)
        px_fail(err, PX_EINPUT, "%s: empty file, expected JSON", origin);
    else
        px_fail(err, PX_EINPUT, "%s: malformed JSON near line %d, column %d", origin, line, col);
    return NULL;
}

cJSON *px_json_read_file(const char *path, PxError *err)
{
    char *text = px_read_file(path, NULL, err);
    if (!text)
        return NULL;
    cJSON *j = px_json_parse(text, path, err);
    free(text);
    return j;
}

int px_json_write_file(const char *path, const cJSON *j, PxError *err)
{
    char *text = cJSON_Print(j);
    if (!text)
        return px_fail(err, PX_ERUNTIME, "%s: cannot serialise JSON", path);
    size_t n = strlen(text);
    char *with_nl = malloc(n + 2);
    if (!with_nl) {
        cJSON_free(text);
        return px_fail(err, PX_ERUNTIME, "%s: out of memory", path);
    }
    memcpy(with_nl, text, n);
    with_nl[n] = '\n';
    with_nl[n + 1] = '\0';
    cJSON_free(text);
    int rc = px_write_file_atomic(path, with_nl, err);
    free(with_nl);
    return rc;
}

static const char *px_json_type_name(const cJSON *v)
{
    if (cJSON_IsNull(v))
        return "null";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "an unknown value";
}

/* Looks key up; returns 1 and sets *v when present, 0 when absent (error if required). */
static int px_json_lookup(const cJSON *obj, const char *where, const char *key, int required,
                          const cJSON **v, int *status, PxError *err)
{
    *status = PX_OK;
    *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (*v)
        return 1;
    if (required) {
        char path[256];
        px_json_path(path, sizeof path, where, key);
        *status = px_fail(err, PX_EINPUT, "%s: missing required key", path);
    }
    return 0;
}

int px_json_int(const cJSON *obj, const char *where, const char *key, int required, long long lo,
                long long hi, int *out, PxError *err)
{
    const cJSON *v;
    int st;
    if (!px_json_lookup(obj, where, key, required, &v, &st, err))
        return st;
    char path[256];
    px_json_path(path, sizeof path, where, key);
    if (!cJSON_IsNumber(v))
        return px_fail(err, PX_EINPUT, "%s: expected an integer, got %s", path,
                       px_json_type_name(v));
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return px_fail(err, PX_EINPUT, "%s: expected an integer, got %g", path, d);
    if (d < (double)lo || d > (double)hi)
        return px_fail(err, PX_EINPUT, "%s: must be between %lld and %lld, got %.0f", path, lo, hi,
                       d);
    *out = (int)d;
    return PX_OK;
}

int px_json_u64(const cJSON *obj, const char *where, const char *key, int required,
                uint64_t *out, PxError *err)
{
    const cJSON *v;
    int st;
    if (!px_json_lookup(obj, where, key, required, &v, &st, err))
        return st;
    char path[256];
    px_json_path(path, sizeof path, where, key);
    if (!cJSON_IsNumber(v))
        return px_fail(err, PX_EINPUT, "%s: expected a non-negative integer, got %s", path,
                       px_json_type_name(v));
    double d = v->valuedouble;
    /* 2^53: beyond it a JSON number no longer holds every integer exactly. */
    if (!isfinite(d) || d != floor(d) || d < 0 || d > 9007199254740992.0)
        return px_fail(err, PX_EINPUT, "%s: expected a non-negative integer, got %g", path, d);
    *out = (uint64_t)d;
    return PX_OK;
}

int px_json_double(const cJSON *obj, const char *where, const char *key, int required, double lo,
                   double hi, double *out, PxError *err)
{
    const cJSON *v;
    int st;
    if (!px_json_lookup(obj, where, key, required, &v, &st, err))
        return st;
    char path[256];
    px_json_path(path, sizeof path, where, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return px_fail(err, PX_EINPUT, "%s: expected a number, got %s", path,
                       px_json_type_name(v));
    if (v->valuedouble < lo || v->valuedouble > hi)
        return px_fail(err, PX_EINPUT, "%s: must be between %g and %g, got %g", path, lo, hi,
                       v->valuedouble);
    *out = v->valuedouble;
    return PX_OK;
}

int px_json_bool(const cJSON *obj, const char *where, const char *key, int required, int *out,
                 PxError *err)
{
    const cJSON *v;
    int st;
    if (!px_json_lookup(obj, where, key, required, &v, &st, err))
        return st;
    if (!cJSON_IsBool(v)) {
        char path[256];
        px_json_path(path, sizeof path, where, key);
        return px_fail(err, PX_EINPUT, "%s: expected true or false, got %s", path,
                       px_json_type_name(v));
    }
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return PX_OK;
}

int px_json_string(const cJSON *obj, const char *where, const char *key, int required, char *out,
                   size_t cap, PxError *err)
{
    const cJSON *v;
    int st;
    if (!px_json_lookup(obj, where, key, required, &v, &st, err))
        return st;
    char path[256];
    px_json_path(path, sizeof path, where, key);
    if (!cJSON_IsString(v))
        return px_fail(err, PX_EINPUT, "%s: expected a string, got %s", path,
                       px_json_type_name(v));
    if (strlen(v->valuestring) >= cap)
        return px_fail(err, PX_EINPUT, "%s: longer than %zu characters", path, cap - 1);
    px_strlcpy(out, v->valuestring, cap);
    return PX_OK;
}

int px_json_enum(const cJSON *obj, const char *where, const char *key, int required,
                 const char *const *names, int count, int *out, PxError *err)
{
    const cJSON *v;
    int st;
    if (!px_json_lookup(obj, where, key, required, &v, &st, err))
        return st;
    char path[256];
    px_json_path(path, sizeof path, where, key);
    if (!cJSON_IsString(v))
        return px_fail(err, PX_EINPUT, "%s: expected a string, got %s", path,
                       px_json_type_name(v));
    for (int i = 0; i < count; i++) {
        if (strcmp(v->valuestring, names[i]) == 0) {
            *out = i;
            return PX_OK;
        }
    }
    char allowed[256] = "";
    for (int i = 0; i < count; i++) {
        size_t n = strlen(allowed);
        snprintf(allowed + n, sizeof allowed - n, "%s%s", i ? "|" : "", names[i]);
    }
    return px_fail(err, PX_EINPUT, "%s: expected one of %s, got '%s'", path, allowed,
                   v->valuestring);
}

int px_json_object(const cJSON *obj, const char *where, const char *key, int required,
                   const cJSON **out, PxError *err)
{
    const cJSON *v;
    int st;
    *out = NULL;
    if (!px_json_lookup(obj, where, key, required, &v, &st, err))
        return st;
    if (!cJSON_IsObject(v)) {
        char path[256];
        px_json_path(path, sizeof path, where, key);
        return px_fail(err, PX_EINPUT, "%s: expected an object, got %s", path,
                       px_json_type_name(v));
    }
    *out = v;
    return PX_OK;
}

void px_json_warn_unknown(const cJSON *obj, const char *where, const char *const *known)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        int found = 0;
        for (const char *const *k = known; *k; k++) {
            if (it->string && strcmp(it->string, *k) == 0) {
                found = 1;
                break;
            }
        }
        if (!found) {
            char path[256];
            px_json_path(path, sizeof path, where, it->string ? it->string : "?");
            px_warn("%s: unknown key ignored", path);
        }
    }
}

int px_json_set_path(cJSON *root, const char *dotted, const char *text, PxError *err)
{
    char buf[256];
    if (strlen(dotted) >= sizeof buf)
        return px_fail(err, PX_EINPUT, "--set %s: key path too long", dotted);
    px_strlcpy(buf, dotted, sizeof buf);
    cJSON *node = root;
    char *save = NULL;
    for (char *part = strtok_r(buf, ".", &save); part; part = strtok_r(NULL, ".", &save)) {
        if (!cJSON_IsObject(node))
            return px_fail(err, PX_EINPUT, "--set %s: '%s' is not inside an object", dotted, part);
        cJSON *next = cJSON_GetObjectItemCaseSensitive(node, part);
        if (!next)
            return px_fail(err, PX_EINPUT, "--set %s: no key '%s' in the profile", dotted, part);
        node = next;
    }
    if (node == root || !cJSON_IsNumber(node))
        return px_fail(err, PX_EINPUT, "--set %s: only numeric figures can be overridden", dotted);
    double v;
    char what[300];
    snprintf(what, sizeof what, "--set %s", dotted);
    int rc = px_parse_double(text, what, &v, err);
    if (rc)
        return rc;
    cJSON_SetNumberValue(node, v);
    return PX_OK;
}
