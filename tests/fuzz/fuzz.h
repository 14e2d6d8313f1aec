/* What every fuzz target starts with: the input as a NUL-terminated string, warnings quiet. */
#ifndef PX_FUZZ_H
#define PX_FUZZ_H

#include <stdlib.h>
#include <string.h>

#include "common/px.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

/* A copy of the input with a terminating NUL (the caller frees it); NULL when out of memory. */
static inline char *fuzz_text(const unsigned char *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text) {
        memcpy(text, data, size);
        text[size] = '\0';
    }
    px_log_set_quiet(1);
    return text;
}

#endif
