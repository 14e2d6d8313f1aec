/* libFuzzer target: training data files (exec/data.c). The input is written to a file named
 * .bin (an llm.c token file: a header of 256 int32, then uint16 tokens) and to one named .txt
 * (byte tokens), each opened and validated as a run would with a large and a small vocabulary,
 * and when accepted read at both ends: every token read must lie below the vocabulary, and a
 * read past the end must be refused. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "exec/train/internal.h"
#include "fuzz.h"

enum { GLOBAL_BATCH = 2, SEQ = 8, WINDOW = SEQ + 1 };

static char dir[64], bin_path[96], txt_path[96];

static void cleanup(void)
{
    unlink(bin_path);
    unlink(txt_path);
    rmdir(dir);
}

/* A scratch directory of this process, in memory where there is one. */
static int setup(void)
{
    if (dir[0])
        return 0;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/fuzz_tokens.XXXXXX", base);
    if (!mkdtemp(dir)) {
        dir[0] = '\0';
        return -1;
    }
    snprintf(bin_path, sizeof bin_path, "%s/tokens.bin", dir);
    snprintf(txt_path, sizeof txt_path, "%s/tokens.txt", dir);
    atexit(cleanup);
    return 0;
}

static int put(const char *path, const unsigned char *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return -1;
    while (size > 0) {
        ssize_t w = write(fd, data, size);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        data += w;
        size -= (size_t)w;
    }
    return close(fd);
}

static void check(const char *path, int vocab)
{
    ExecData d;
    PxError err = {0};
    if (exec_data_open(&d, path, vocab, GLOBAL_BATCH, SEQ, &err) == PX_OK) {
        /* accepted: at least one step's tokens, all of them readable and in the vocabulary */
        if (d.ntok < (uint64_t)GLOBAL_BATCH * SEQ + 1)
            abort();
        int32_t tok[WINDOW];
        const uint64_t starts[2] = {0, d.ntok - WINDOW};
        for (int i = 0; i < 2; i++) {
            if (exec_data_read(&d, tok, starts[i], WINDOW, &err) != PX_OK)
                abort();
            for (int k = 0; k < WINDOW; k++)
                if (tok[k] < 0 || tok[k] >= vocab)
                    abort();
        }
        if (exec_data_read(&d, tok, d.ntok - WINDOW + 1, WINDOW, &err) == PX_OK)
            abort();
    }
    exec_data_close(&d);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    px_log_set_quiet(1);
    if (setup() != 0 || put(bin_path, data, size) != 0 || put(txt_path, data, size) != 0)
        return 0;
    check(bin_path, 50257); /* GPT-2's vocabulary */
    check(bin_path, 300);   /* most uint16 tokens beyond it */
    check(txt_path, 256);   /* bytes: every file of enough bytes is text */
    check(txt_path, 100);   /* bytes scanned against a vocabulary below 256 */
    return 0;
}
