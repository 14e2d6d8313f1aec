/* Training data: the built-in text, a text file (byte-level tokens, vocabulary 256) or an llm.c
 * token file (.bin: 256 int32 of header — magic 20240520, version 1, token count — then uint16
 * tokens), and the loader thread that reads the next step's batch while the current step
 * computes.
 *
 * Sequence g of the run (g = step * global_batch + i) is the window of seq_len + 1 tokens that
 * starts at a position drawn from (seed, g); the inputs are its first seq_len tokens and the
 * targets its last seq_len. Which rank and micro-batch read sequence g changes with the layout;
 * the sequences of a step do not.
 *
 * The batches: the loader reads into host staging buffers, copied to data.batch ahead of their
 * step; the CPU's data.batch is host memory already, so there the loader fills its two halves
 * directly and the batches take no memory beyond the workspace arena. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/train/internal.h"

enum { EXEC_BIN_HEADER_BYTES = EXEC_BIN_HEADER_INTS * 4, EXEC_TEXT_MIN = 1 << 20 };

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Reads exactly n bytes at off; 0 on success, else errno (or EIO for a short file). */
static int read_at(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? errno : EIO;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Every token below the vocabulary? One pass over the file in blocks at open, so that a bad
 * token is an input error now rather than a crash in the middle of a run. */
static int scan_tokens(ExecData *d, uint64_t off, int width, int vocab, PxError *err)
{
    enum { BLOCK = 1 << 16 };
    unsigned char *buf = malloc(BLOCK);
    if (!buf)
        return px_fail(err, PX_ERUNTIME, "out of memory reading %s", d->path);
    uint64_t total = d->ntok * (uint64_t)width, done = 0;
    int rc = PX_OK;
    while (done < total && !rc) {
        size_t n = total - done < BLOCK ? (size_t)(total - done) : BLOCK;
        int e = read_at(d->fd, buf, n, off + done);
        if (e) {
            rc = px_fail(err, PX_EINPUT, "%s: cannot read: %s", d->path, strerror(e));
            break;
        }
        for (size_t i = 0; i + (size_t)width <= n; i += (size_t)width) {
            unsigned tok = width == 2 ? (unsigned)buf[i] | (unsigned)buf[i + 1] << 8 : buf[i];
            if (tok >= (unsigned)vocab) {
                rc = px_fail(err, PX_EINPUT,
                             "%s: token %u at position %llu is beyond the model's vocabulary of %d",
                             d->path, tok, (unsigned long long)((done + i) / (uint64_t)width), vocab);
                break;
            }
        }
        done += n;
    }
    free(buf);
    return rc;
}

int exec_data_open(ExecData *d, const char *path, int vocab, int global_batch, int seq_len,
                   PxError *err)
{
    memset(d, 0, sizeof *d);
    d->fd = -1;
    const uint64_t need = (uint64_t)global_batch * (uint64_t)seq_len + 1;
    if (!path || !*path) {
        d->kind = EXEC_DATA_BUILTIN;
        px_strlcpy(d->path, "the built-in text", sizeof d->path);
        if (vocab < 128)
            return px_fail(err, PX_EINPUT,
                           "the built-in text is ASCII and needs a vocabulary of at least 128 "
                           "tokens; the model has %d (give --data)",
                           vocab);
        /* twice one step's tokens at least, so windows of different steps differ */
        uint64_t bytes = 2 * need > EXEC_TEXT_MIN ? 2 * need : EXEC_TEXT_MIN;
        d->text = malloc((size_t)bytes);
        if (!d->text)
            return px_fail(err, PX_ERUNTIME, "out of memory for %llu bytes of built-in text",
                           (unsigned long long)bytes);
        d->ntok = exec_text_generate(d->text, (size_t)bytes);
        return PX_OK;
    }
    px_strlcpy(d->path, path, sizeof d->path);
    d->fd = open(path, O_RDONLY);
    if (d->fd < 0)
        return px_fail(err, PX_EINPUT, "%s: cannot open the training data: %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(d->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return px_fail(err, PX_EINPUT, "%s: the training data is not a regular file", path);
    uint64_t size = (uint64_t)st.st_size;
    int rc;
    if (size == 0)
        return px_fail(err, PX_EINPUT, "%s: the training data is an empty file", path);
    if (ends_with(path, ".bin")) {
        d->kind = EXEC_DATA_TOKENS;
        int32_t hdr[EXEC_BIN_HEADER_INTS];
        if (size < EXEC_BIN_HEADER_BYTES)
            return px_fail(err, PX_EINPUT,
                           "%s: %llu bytes are too short for an llm.c token file (a %d-byte header, "
                           "then uint16 tokens)",
                           path, (unsigned long long)size, EXEC_BIN_HEADER_BYTES);
        int e = read_at(d->fd, hdr, sizeof hdr, 0);
        if (e)
            return px_fail(err, PX_EINPUT, "%s: cannot read: %s", path, strerror(e));
        if (hdr[0] != EXEC_BIN_MAGIC)
            return px_fail(err, PX_EINPUT,
                           "%s: wrong magic number %d: not an llm.c token file (expected %d; a text "
                           "file should not end in .bin)",
                           path, hdr[0], EXEC_BIN_MAGIC);
        if (hdr[1] != EXEC_BIN_VERSION)
            return px_fail(err, PX_EINPUT, "%s: token file version %d is not supported (expected %d)",
                           path, hdr[1], EXEC_BIN_VERSION);
        if (hdr[2] < 0)
            return px_fail(err, PX_EINPUT, "%s: negative token count %d in the header", path, hdr[2]);
        d->ntok = (uint64_t)hdr[2];
        uint64_t want = EXEC_BIN_HEADER_BYTES + 2 * d->ntok;
        if (size < want)
            return px_fail(err, PX_EINPUT,
                           "%s: truncated: the header promises %llu tokens (%llu bytes) but the "
                           "file has %llu bytes",
                           path, (unsigned long long)d->ntok, (unsigned long long)want,
                           (unsigned long long)size);
        /* as llm.c's loader: the file is the header and the tokens, nothing more (an odd
         * byte count is a token cut in half) */
        if (size > want)
            return px_fail(err, PX_EINPUT,
                           "%s: %llu bytes beyond the %llu tokens the header promises (%llu "
                           "bytes)%s",
                           path, (unsigned long long)(size - want), (unsigned long long)d->ntok,
                           (unsigned long long)want,
                           (size - want) % 2 ? ": an odd byte count, a token cut in half" : "");
        if ((rc = scan_tokens(d, EXEC_BIN_HEADER_BYTES, 2, vocab, err)))
            return rc;
    } else {
        d->kind = EXEC_DATA_TEXT;
        d->ntok = size;
        if (vocab < 256 && (rc = scan_tokens(d, 0, 1, vocab, err)))
            return rc;
    }
    if (d->ntok < need)
        return px_fail(err, PX_EINPUT,
                       "%s: %llu tokens are too few: one step's batch reads %llu (global batch %d x "
                       "sequence %d + 1)",
                       path, (unsigned long long)d->ntok, (unsigned long long)need, global_batch,
                       seq_len);
    return PX_OK;
}

int exec_data_read(const ExecData *d, int32_t *dst, uint64_t start, int count, PxError *err)
{
    if (count <= 0)
        return PX_OK;
    if (start + (uint64_t)count > d->ntok)
        return px_fail(err, PX_ERUNTIME, "%s: read past the end (token %llu)", d->path,
                       (unsigned long long)(start + (uint64_t)count));
    if (d->kind == EXEC_DATA_BUILTIN) {
        for (int i = 0; i < count; i++)
            dst[i] = (unsigned char)d->text[start + (uint64_t)i];
        return PX_OK;
    }
    /* read the narrow tokens into the front of dst, then widen from the back: element i's
     * 4 bytes only overlap narrow tokens at index >= i, already widened */
    const int width = d->kind == EXEC_DATA_TOKENS ? 2 : 1;
    uint64_t off = d->kind == EXEC_DATA_TOKENS ? EXEC_BIN_HEADER_BYTES + 2 * start : start;
    int e = read_at(d->fd, dst, (size_t)count * (size_t)width, off);
    if (e)
        return px_fail(err, PX_ERUNTIME, "%s: cannot read tokens at %llu: %s", d->path,
                       (unsigned long long)start, strerror(e));
    const unsigned char *raw = (const unsigned char *)dst;
    for (int i = count - 1; i >= 0; i--) {
        int32_t v = width == 2 ? (int32_t)((unsigned)raw[2 * i] | (unsigned)raw[2 * i + 1] << 8)
                               : (int32_t)raw[i];
        dst[i] = v;
    }
    return PX_OK;
}

void exec_data_close(ExecData *d)
{
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    free(d->text);
    d->text = NULL;
}

/* ---- the loader ---- */

uint64_t exec_loader_window(const ExecLoader *l, long long g)
{
    uint64_t span = l->src->ntok - (uint64_t)l->seq_len; /* >= 1: ntok > seq_len */
    return px_mix64(l->key ^ px_mix64((uint64_t)g)) % span;
}

static int load_step(ExecLoader *l, long step, int32_t *dst, PxError *err)
{
    long long first = (long long)step * l->global_batch + l->first_seq;
    for (int r = 0; r < l->rows; r++) {
        int rc = exec_data_read(l->src, dst + (size_t)r * l->row_len,
                                exec_loader_window(l, first + r), l->row_len, err);
        if (rc)
            return rc;
    }
    return PX_OK;
}

static void *loader_main(void *arg)
{
    ExecLoader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int b = -1;
        while (!l->quit && !l->rc) {
            for (int i = 0; i < 2 && b < 0; i++)
                if (l->want[i] >= 0 && l->want[i] != l->have[i])
                    b = i;
            if (b >= 0)
                break;
            pthread_cond_wait(&l->cv, &l->mu);
        }
        if (l->quit || l->rc)
            break;
        long step = l->want[b];
        pthread_mutex_unlock(&l->mu);
        /* the main thread never reads buffer b while want[b] != have[b] */
        PxError e = {0};
        int rc = load_step(l, step, l->buf[b], &e);
        pthread_mutex_lock(&l->mu);
        if (rc) {
            l->rc = rc;
            l->err = e;
        } else {
            l->have[b] = step;
        }
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int exec_loader_start(ExecLoader *l, int threaded, PxError *err)
{
    l->want[0] = l->want[1] = -1;
    l->have[0] = l->have[1] = -1;
    l->quit = l->rc = 0;
    l->threaded = 0;
    if (pthread_mutex_init(&l->mu, NULL) != 0)
        return px_fail(err, PX_ERUNTIME, "cannot create the data loader's mutex");
    if (pthread_cond_init(&l->cv, NULL) != 0) {
        pthread_mutex_destroy(&l->mu);
        return px_fail(err, PX_ERUNTIME, "cannot create the data loader's condition variable");
    }
    if (threaded) {
        if (pthread_create(&l->thread, NULL, loader_main, l) != 0) {
            pthread_cond_destroy(&l->cv);
            pthread_mutex_destroy(&l->mu);
            return px_fail(err, PX_ERUNTIME, "cannot start the data loader thread");
        }
        l->threaded = 1;
    }
    return PX_OK;
}

int exec_loader_get(ExecLoader *l, long step, const int32_t **batch, PxError *err)
{
    const int b = (int)(step % 2);
    if (!l->threaded) {
        if (l->have[b] != step) {
            l->have[b] = -1;
            int rc = load_step(l, step, l->buf[b], err);
            if (rc)
                return rc;
            l->have[b] = step;
        }
        *batch = l->buf[b];
        return PX_OK;
    }
    pthread_mutex_lock(&l->mu);
    l->want[b] = step;
    pthread_cond_broadcast(&l->cv);
    while (l->have[b] != step && !l->rc)
        pthread_cond_wait(&l->cv, &l->mu);
    int rc = l->rc;
    if (rc) {
        *err = l->err;
    } else {
        /* prefetch: the next step's batch into the other buffer, while this one computes */
        l->want[1 - b] = step + 1;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    *batch = l->buf[b];
    return rc;
}

int exec_loader_ready(ExecLoader *l, long step, const int32_t **batch)
{
    const int b = (int)(step % 2);
    int ready;
    if (!l->threaded)
        return 0;
    pthread_mutex_lock(&l->mu);
    ready = l->have[b] == step && !l->rc;
    pthread_mutex_unlock(&l->mu);
    if (ready)
        *batch = l->buf[b];
    return ready;
}

void exec_loader_stop(ExecLoader *l)
{
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        l->quit = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        l->threaded = 0;
    }
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
}

/* ---- the batches ---- */

int exec_batches_bind(ExecBatches *B, const ModelTensor *t, void *p, PxError *err)
{
    if (t->dtype != PX_INT32)
        return exec_bind_wrong_dtype(t, PX_INT32, err);
    B->batch[0] = p;
    B->batch[1] = p ? (int32_t *)p + t->numel / 2 : NULL;
    return PX_OK;
}

int exec_batches_open(ExecBatches *B, const ExecCtx *c, PxError *err)
{
    B->staged = -1;
    if (!c->g.has_data)
        return PX_OK;
    return exec_data_open(&B->data, c->spec.job.data, c->spec.model.vocab,
                          c->spec.job.global_batch, c->d.s, err);
}

/* the loader's rows: whole sequences and their next tokens */
static size_t batch_bytes(const ExecCtx *c)
{
    return (size_t)c->d.m * c->d.b * (size_t)(c->d.s + 1) * sizeof(int32_t);
}

/* data.batch's rows (exec_cp_tok_row), then the tokens past their parts that the prediction
 * modules read (mtp_tokens.c) */
static size_t local_bytes(const ExecCtx *c)
{
    const int rows = c->d.m * c->d.b;
    return ((size_t)rows * (size_t)exec_cp_tok_row(c) + exec_mtp_lookahead_ints(c, rows)) *
           sizeof(int32_t);
}

/* The step's rows from the loader's host buffer to data.batch's buffer dst; with context
 * parallelism this rank's parts of each sequence first, picked into pick[i]. */
static void put_batch(ExecBatches *B, const ExecCtx *c, int32_t *dst, const int32_t *host, int i)
{
    if (c->d.c == 1) {
        c->k->to_device_async(dst, host, batch_bytes(c));
        return;
    }
    const int rows = c->d.m * c->d.b;
    exec_cp_pick_rows(c, B->pick[i], host, rows);
    exec_mtp_pick_lookahead(c, B->pick[i] + (size_t)rows * exec_cp_tok_row(c), host, rows);
    c->k->to_device_async(dst, B->pick[i], local_bytes(c));
}

int exec_batches_start(ExecBatches *B, const ExecCtx *c, PxError *err)
{
    ExecLoader *ld = &B->loader;
    const ModelDims *d = &c->d;
    /* the loader writes whole rows: straight into data.batch on the CPU without context
     * parallelism, else into host staging */
    const int direct = strcmp(c->k->name, "cpu") == 0 && d->c == 1;
    if (c->g.has_data && !direct) {
        const size_t bytes = batch_bytes(c);
        for (int i = 0; i < 2; i++)
            if (!(B->stage_buf[i] = c->k->host_alloc(bytes)) ||
                (d->c > 1 && !(B->pick[i] = c->k->host_alloc(local_bytes(c)))))
                return px_fail(err, PX_ERUNTIME, "out of host memory for the batches (%zu bytes)",
                               bytes);
    }
    ld->src = &B->data;
    ld->buf[0] = direct ? B->batch[0] : B->stage_buf[0];
    ld->buf[1] = direct ? B->batch[1] : B->stage_buf[1];
    ld->rows = d->m * d->b;
    ld->row_len = d->s + 1;
    ld->seq_len = d->s;
    ld->global_batch = c->spec.job.global_batch;
    /* data-parallel rank r reads sequences r*m*b ... of each step (cp ranks share them) */
    ld->first_seq = (long long)c->g.dp_rank * d->m * d->b;
    ld->key = exec_hash_name(c->spec.job.seed, "data");
    if (!c->g.has_data)
        return PX_OK;
    return exec_batches_restart(B, 0, err);
}

int exec_batches_restart(ExecBatches *B, int threaded, PxError *err)
{
    exec_batches_stop(B);
    int rc = exec_loader_start(&B->loader, threaded, err);
    B->loader_started = rc == PX_OK;
    return rc;
}

void exec_batches_stop(ExecBatches *B)
{
    if (B->loader_started)
        exec_loader_stop(&B->loader);
    B->loader_started = 0;
}

int exec_batches_get(ExecBatches *B, const ExecCtx *c, int step, const int32_t **out,
                     PxError *err)
{
    /* The loader fills host buffer step % 2; before it may refill the other one, every copy
     * from it must be over (copy_sync: they are, the previous step waited for it). */
    const int b = step % 2;
    const int32_t *host = NULL;
    c->k->copy_sync();
    int rc = exec_loader_get(&B->loader, step, &host, err);
    if (rc)
        return rc;
    if (B->staged != step) {
        if (host != B->batch[b]) /* else the loader wrote it in place (the CPU) */
            put_batch(B, c, B->batch[b], host, b);
        if (B->staged >= 0 && B->staged % 2 == b)
            B->staged = -1; /* its device buffer now holds this step */
    }
    c->k->copy_wait();
    *out = B->batch[b];
    return PX_OK;
}

void exec_batches_stage_next(ExecBatches *B, const ExecCtx *c, int next)
{
    const int32_t *host = NULL;
    if (!c->g.has_data || next >= c->steps || B->staged == next ||
        !exec_loader_ready(&B->loader, next, &host) || host == B->batch[next % 2])
        return;
    put_batch(B, c, B->batch[next % 2], host, next % 2);
    B->staged = next;
}

void exec_batches_free(ExecBatches *B, const ExecCtx *c)
{
    exec_batches_stop(B);
    exec_data_close(&B->data);
    for (int i = 0; i < 2; i++)
        if (c->k && B->stage_buf[i]) {
            c->k->copy_sync(); /* no copy may still read it */
            c->k->host_free(B->stage_buf[i]);
            c->k->host_free(B->pick[i]);
            B->stage_buf[i] = NULL;
            B->pick[i] = NULL;
        }
}
