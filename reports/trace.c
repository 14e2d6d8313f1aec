/* Perfetto / Chrome trace JSON ("traceEvents"): complete events ("ph": "X") in microseconds,
 * one thread per track, named by metadata events. chrome://tracing and ui.perfetto.dev read it. */
#include "reports/report.h"

#include <stdio.h>

int rpt_trace_write(const char *path, const char *process, const RptSpan *spans, int n,
                    const char *const *track_names, int tracks, PxError *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
    cJSON *ev = cJSON_AddArrayToObject(root, "traceEvents");
    cJSON *pm = cJSON_CreateObject();
    cJSON_AddStringToObject(pm, "ph", "M");
    cJSON_AddStringToObject(pm, "name", "process_name");
    cJSON_AddNumberToObject(pm, "pid", 0);
    cJSON_AddItemToObject(pm, "args", cJSON_CreateObject());
    cJSON_AddStringToObject(cJSON_GetObjectItem(pm, "args"), "name", process);
    cJSON_AddItemToArray(ev, pm);
    for (int t = 0; t < tracks; t++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "ph", "M");
        cJSON_AddStringToObject(m, "name", "thread_name");
        cJSON_AddNumberToObject(m, "pid", 0);
        cJSON_AddNumberToObject(m, "tid", t);
        cJSON *a = cJSON_AddObjectToObject(m, "args");
        char nm[64];
        if (track_names)
            snprintf(nm, sizeof nm, "%s", track_names[t]);
        else
            snprintf(nm, sizeof nm, "rank %d", t);
        cJSON_AddStringToObject(a, "name", nm);
        cJSON_AddItemToArray(ev, m);
    }
    static const char *const cats[3] = {"forward", "backward", "other"};
    for (int i = 0; i < n; i++) {
        const RptSpan *s = &spans[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", s->label[0] ? s->label : cats[s->kind % 3]);
        cJSON_AddStringToObject(e, "cat", cats[s->kind % 3]);
        cJSON_AddStringToObject(e, "ph", "X");
        cJSON_AddNumberToObject(e, "ts", s->start_s * 1e6);
        cJSON_AddNumberToObject(e, "dur", (s->end_s - s->start_s) * 1e6);
        cJSON_AddNumberToObject(e, "pid", 0);
        cJSON_AddNumberToObject(e, "tid", s->track);
        cJSON_AddItemToArray(ev, e);
    }
    int rc = px_json_write_file(path, root, err);
    cJSON_Delete(root);
    return rc;
}
