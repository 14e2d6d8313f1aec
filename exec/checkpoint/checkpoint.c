/* Checkpoints and resume: every N steps each rank writes its shard of the training state, and
 * rank 0 commits a JSON manifest once every shard is on disk; --resume continues from the
 * latest committed checkpoint so that the run goes on exactly as if it had not stopped.
 *
 * What the state is. The executor's training semantics make everything but a few arenas and
 * counters a function of the step: the batch of step k is drawn from (seed, k), dropout streams
 * from (seed, step, sequence, layer, site), the learning rate from (k, steps). So a rank's state
 * is its weights arena (act dtype: the ZeRO-3 shard, or the full replicated weights), its fp32
 * master arena and its optimizer arena (AdamW's m and v, or momentum: the ZeRO shard), plus
 * AdamW's step count and fp16's loss-scaler state. Gradients are zeroed at every step, and
 * activations and communication buffers hold nothing across steps.
 *
 * Layout on disk (docs/executor.md has the formats):
 *   DIR/step-00000012/rank-00000.bin ... rank-<world-1>.bin   the shards
 *   DIR/step-00000012/manifest.json                           written last: the commit point
 * A shard is a 128-byte little-endian header (magic, version, rank, world, step, counters,
 * section sizes), the weights, master and optimizer arenas byte for byte, and a CRC-32 (zlib's)
 * of everything before it. Every file is written to a temporary name, fsync'ed, renamed and its
 * directory fsync'ed. The ranks agree (gather + control reduction) that every shard is written
 * before rank 0 commits the manifest; only then are older checkpoints removed, so a crash at
 * any moment leaves the last committed checkpoint intact. */
#include <dirent.h>
#include <stdio.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "exec/checkpoint/checkpoint.h"
#include "exec/comm/comm.h"
#include "kernels/kernels.h"

enum { CK_PATH = 512 };

struct Ckpt {
    char dir[CK_PATH];
    int every;        /* steps between checkpoints (0: none) */
    int resume;
    int resumed_from; /* the step of the checkpoint this run resumed from (0: none) */
    char resumed_dir[CK_PATH + 32];
    char note[256];   /* the settings that differ from the checkpoint's run */
    struct {
        int step;       /* steps completed when it was written */
        uint64_t bytes; /* every rank's shards (rank 0), this rank's (the others) */
        double seconds; /* from the first shard byte to the agreed commit */
    } *written;       /* [cap_written] the checkpoints this run wrote */
    int n_written, cap_written;
    uint8_t *bounce;  /* host staging between the regions and the files */
};

enum {
    CK_VERSION = 1,
    CK_HEADER_BYTES = 128,
    CK_TRAILER_BYTES = 4,
    CK_CHUNK = 4 << 20 /* host staging between the device and the file */
};
static const char ck_magic[8] = {'P', 'X', 'C', 'K', 'P', 'T', 'S', 'H'};
static const char *const ck_format = "parallax-checkpoint";

/* ---- little-endian fields ---- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint64_t dbl_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double bits_dbl(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* The header's fields, at fixed offsets. */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HEADER_BYTES = 12, H_RANK = 16, H_WORLD = 20, H_STAGE = 24,
    H_DTYPE = 28, H_STEP = 32, H_OPT_STEPS = 40, H_SECTIONS = 48, /* 3 x u64 */
    H_LOSS_SCALE = 72, H_SCALE_CLEAN = 80, H_SKIPPED = 88
};

/* ---- files and directories ---- */

/* 0 when n bytes were read; 1 at a short file; -1 on an error (errno) */
static int read_full(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return 1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* A rename is durable only once its directory's entry is on disk. */
static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* "step-00000012" -> 12; -1 for any other name */
static int step_of_name(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || !name[5])
        return -1;
    long v = 0;
    for (const char *s = name + 5; *s; s++) {
        if (*s < '0' || *s > '9' || v > 100000000)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return (int)v;
}

/* out = a/b; -1 when it does not fit */
static int path_join(char *out, size_t cap, const char *a, const char *b)
{
    int n = snprintf(out, cap, "%s/%s", a, b);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static void step_dir(const Ckpt *c, int step, char *out, size_t cap)
{
    snprintf(out, cap, "%s/step-%08d", c->dir, step);
}

/* The latest committed checkpoint of dir (a step-N directory holding manifest.json): its step,
 * or 0 when there is none. */
static int latest_complete(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int best = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s = step_of_name(e->d_name);
        if (s <= best)
            continue;
        char s_dir[CK_PATH + 300], m[CK_PATH + 340];
        struct stat st;
        if (!path_join(s_dir, sizeof s_dir, dir, e->d_name) &&
            !path_join(m, sizeof m, s_dir, "manifest.json") && stat(m, &st) == 0 &&
            S_ISREG(st.st_mode))
            best = s;
    }
    closedir(d);
    return best;
}

/* Removes a step directory: its files, then itself. */
static int remove_step_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char f[CK_PATH + 600];
        if (path_join(f, sizeof f, path, e->d_name) || unlink(f) != 0)
            rc = -1;
    }
    closedir(d);
    return rmdir(path) != 0 ? -1 : rc;
}

/* After the checkpoint of `keep` is committed: every older step directory, and any newer one
 * without a manifest (left by a run that stopped while writing), goes. A failure only warns:
 * the new checkpoint is safe either way. */
static void prune(const Ckpt *c, int keep)
{
    DIR *d = opendir(c->dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s = step_of_name(e->d_name);
        if (s < 0 || s == keep)
            continue;
        char p[CK_PATH + 300], m[CK_PATH + 340];
        if (path_join(p, sizeof p, c->dir, e->d_name) || path_join(m, sizeof m, p, "manifest.json"))
            continue;
        if ((s < keep || !px_file_exists(m)) && is_dir(p) && remove_step_dir(p) != 0)
            px_warn("%s: cannot remove an old checkpoint: %s", p, strerror(errno));
    }
    closedir(d);
}

/* ---- the shard of this rank ---- */

static uint64_t shard_bytes(const CkptState *st)
{
    uint64_t n = CK_HEADER_BYTES + CK_TRAILER_BYTES;
    for (int i = 0; i < CKPT_SECTIONS; i++)
        n += st->region[i].bytes;
    return n;
}

static void shard_header(const CkptState *st, int step, uint8_t h[CK_HEADER_BYTES])
{
    memset(h, 0, CK_HEADER_BYTES);
    memcpy(h + H_MAGIC, ck_magic, sizeof ck_magic);
    put_u32(h + H_VERSION, CK_VERSION);
    put_u32(h + H_HEADER_BYTES, CK_HEADER_BYTES);
    put_u32(h + H_RANK, (uint32_t)st->rank);
    put_u32(h + H_WORLD, (uint32_t)st->world);
    put_u32(h + H_STAGE, (uint32_t)st->stage);
    put_u32(h + H_DTYPE, (uint32_t)st->k->act);
    put_u64(h + H_STEP, (uint64_t)step);
    put_u64(h + H_OPT_STEPS, (uint64_t)st->opt_steps);
    for (int i = 0; i < CKPT_SECTIONS; i++)
        put_u64(h + H_SECTIONS + 8 * i, st->region[i].bytes);
    put_u64(h + H_LOSS_SCALE, dbl_bits(st->loss_scale));
    put_u64(h + H_SCALE_CLEAN, (uint64_t)st->scale_clean);
    put_u64(h + H_SKIPPED, (uint64_t)st->skipped);
}

/* Writes this rank's shard into sdir: a temporary file, fsync, rename, fsync of sdir. The
 * arenas are read from the device through the staging buffer. */
static int write_shard(Ckpt *c, const CkptState *st, const char *sdir, int step, uint64_t *bytes,
                       uint32_t *crc_out, PxError *err)
{
    char path[CK_PATH + 64];
    snprintf(path, sizeof path, "%s/rank-%05d.bin", sdir, st->rank);
    PxAtomicFile f;
    PxError ferr = {0};
    if (px_atomic_open(&f, path, &ferr))
        return px_fail(err, PX_ERUNTIME, "%s: cannot write the shard: %s", path, ferr.msg);
    uint8_t h[CK_HEADER_BYTES];
    shard_header(st, step, h);
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, h, CK_HEADER_BYTES);
    int bad = fwrite(h, 1, CK_HEADER_BYTES, f.f) != CK_HEADER_BYTES;
    st->k->sync();
    for (int i = 0; i < CKPT_SECTIONS && !bad; i++) {
        const CkptRegion *a = &st->region[i];
        for (uint64_t off = 0; off < a->bytes && !bad; off += CK_CHUNK) {
            size_t n = (size_t)(a->bytes - off < CK_CHUNK ? a->bytes - off : CK_CHUNK);
            if (a->host)
                memcpy(c->bounce, (const uint8_t *)a->base + off, n);
            else
                st->k->to_host(c->bounce, (const uint8_t *)a->base + off, n);
            crc = crc32(crc, c->bounce, (uInt)n);
            bad = fwrite(c->bounce, 1, n, f.f) != n;
        }
    }
    uint8_t t[CK_TRAILER_BYTES];
    put_u32(t, (uint32_t)crc);
    if (!bad)
        bad = fwrite(t, 1, sizeof t, f.f) != sizeof t;
    if (bad) {
        const int e = errno;
        px_atomic_abort(&f);
        return px_fail(err, PX_ERUNTIME, "%s: cannot write the shard: %s", path, strerror(e));
    }
    /* synced and renamed over the path, then the directory's entry made durable */
    if (px_atomic_commit(&f, &ferr))
        return px_fail(err, PX_ERUNTIME, "%s", ferr.msg);
    if (fsync_dir(sdir) != 0)
        return px_fail(err, PX_ERUNTIME, "%s: cannot sync the directory: %s", sdir, strerror(errno));
    *bytes = shard_bytes(st);
    *crc_out = (uint32_t)crc;
    return PX_OK;
}

/* Checks this rank's shard whole against its CRC-32 (the file's trailer and the manifest's),
 * before anything is loaded: a corrupt file changes nothing. */
static int check_shard_crc(Ckpt *c, int fd, const char *path, uint64_t size, uint32_t want,
                           PxError *err)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    const uint64_t body = size - CK_TRAILER_BYTES;
    for (uint64_t off = 0; off < body; off += CK_CHUNK) {
        size_t n = (size_t)(body - off < CK_CHUNK ? body - off : CK_CHUNK);
        if (read_full(fd, c->bounce, n) != 0)
            return px_fail(err, PX_EINPUT, "%s: read error: %s", path, strerror(errno));
        crc = crc32(crc, c->bounce, (uInt)n);
    }
    uint8_t t[CK_TRAILER_BYTES];
    if (read_full(fd, t, sizeof t) != 0)
        return px_fail(err, PX_EINPUT, "%s: read error: %s", path, strerror(errno));
    const uint32_t stored = get_u32(t);
    if ((uint32_t)crc != stored || stored != want)
        return px_fail(err, PX_EINPUT,
                       "%s: CRC-32 mismatch: the data hash to 0x%08x, the shard records 0x%08x and "
                       "the manifest 0x%08x: %s",
                       path, (unsigned)crc, (unsigned)stored, (unsigned)want,
                       (uint32_t)crc == stored ? "the shard is not the one this manifest lists"
                                               : "the file is corrupt");
    return PX_OK;
}

/* The state a manifest records, which every shard's header must repeat. */
typedef struct {
    int step, opt_steps;
    double loss_scale;
    long long scale_clean, skipped;
} CkState;

/* Loads this rank's shard: size, CRC-32, then the header against this rank and the manifest,
 * then the arenas onto the device. PX_EINPUT names the file and what is wrong with it. */
static int load_shard(Ckpt *c, const CkptState *st, const char *path, uint64_t bytes, uint32_t crc,
                      const CkState *s, PxError *err)
{
    const int rank = st->rank;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return px_fail(err, PX_EINPUT, "%s: cannot open the shard of rank %d: %s", path, rank,
                       strerror(errno));
    struct stat sb;
    int rc = PX_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = px_fail(err, PX_EINPUT, "%s: not a regular file", path);
        goto done;
    }
    if ((uint64_t)sb.st_size != bytes) {
        rc = px_fail(err, PX_EINPUT, "%s: %llu bytes, but the manifest says %llu: the shard is "
                     "truncated or not this checkpoint's",
                     path, (unsigned long long)sb.st_size, (unsigned long long)bytes);
        goto done;
    }
    if (bytes != shard_bytes(st)) {
        rc = px_fail(err, PX_EINPUT, "%s: %llu bytes, but rank %d's state takes %llu: written for "
                     "another layout",
                     path, (unsigned long long)bytes, rank, (unsigned long long)shard_bytes(st));
        goto done;
    }
    if ((rc = check_shard_crc(c, fd, path, bytes, crc, err)))
        goto done;
    uint8_t h[CK_HEADER_BYTES];
    if (lseek(fd, 0, SEEK_SET) != 0 || read_full(fd, h, sizeof h) != 0) {
        rc = px_fail(err, PX_EINPUT, "%s: read error: %s", path, strerror(errno));
        goto done;
    }
    if (memcmp(h + H_MAGIC, ck_magic, sizeof ck_magic) != 0 || get_u32(h + H_VERSION) != CK_VERSION ||
        get_u32(h + H_HEADER_BYTES) != CK_HEADER_BYTES) {
        rc = px_fail(err, PX_EINPUT, "%s: not a parallax checkpoint shard of version %d", path,
                     CK_VERSION);
        goto done;
    }
    const char *what = NULL;
    if (get_u32(h + H_RANK) != (uint32_t)rank || get_u32(h + H_WORLD) != (uint32_t)st->world ||
        get_u32(h + H_STAGE) != (uint32_t)st->stage)
        what = "rank, world or stage";
    else if (get_u32(h + H_DTYPE) != (uint32_t)st->k->act)
        what = "dtype of the weights";
    for (int i = 0; i < CKPT_SECTIONS && !what; i++)
        if (get_u64(h + H_SECTIONS + 8 * i) != st->region[i].bytes)
            what = "section sizes";
    if (what) {
        rc = px_fail(err, PX_EINPUT, "%s: its %s differ from rank %d's in this run", path, what,
                     rank);
        goto done;
    }
    if (get_u64(h + H_STEP) != (uint64_t)s->step || get_u64(h + H_OPT_STEPS) != (uint64_t)s->opt_steps ||
        bits_dbl(get_u64(h + H_LOSS_SCALE)) != s->loss_scale ||
        get_u64(h + H_SCALE_CLEAN) != (uint64_t)s->scale_clean ||
        get_u64(h + H_SKIPPED) != (uint64_t)s->skipped) {
        rc = px_fail(err, PX_EINPUT, "%s: its step and counters disagree with the manifest's", path);
        goto done;
    }
    for (int i = 0; i < CKPT_SECTIONS && !rc; i++) {
        const CkptRegion *a = &st->region[i];
        for (uint64_t off = 0; off < a->bytes; off += CK_CHUNK) {
            size_t n = (size_t)(a->bytes - off < CK_CHUNK ? a->bytes - off : CK_CHUNK);
            if (read_full(fd, c->bounce, n) != 0) {
                rc = px_fail(err, PX_EINPUT, "%s: read error: %s", path, strerror(errno));
                break;
            }
            if (a->host)
                memcpy((uint8_t *)a->base + off, c->bounce, n);
            else
                st->k->to_device((uint8_t *)a->base + off, c->bounce, n);
        }
    }
    st->k->sync();
done:
    close(fd);
    return rc;
}

/* ---- the manifest ---- */

/* adds "what.key" to the list of settings that differ */
static void note(Ckpt *c, const char *what, const char *key)
{
    size_t n = strlen(c->note);
    if (n + strlen(what) + strlen(key) + 4 < sizeof c->note)
        snprintf(c->note + n, sizeof c->note - n, "%s%s.%s", n ? ", " : "", what, key);
}

/* obj.key as text for a message ("64", "\"tiny\""); absent: "nothing" */
static void json_text(const cJSON *v, char *out, size_t cap)
{
    char *t = v ? cJSON_PrintUnformatted(v) : NULL;
    px_strlcpy(out, t ? t : "nothing", cap);
    free(t);
}

/* The layout keys that shape a rank's state: the grid and ZeRO (always in a manifest), then
 * the experts' split and HSDP's (absent: their defaults, which shaping_value fills in). */
static const char *const shaping_keys[] = {"dp", "tp", "pp", "cp", "vpp", "zero",
                                           "ep", "etp", "dp_shard", "dp_replicate"};
enum { N_GRID = 6, N_SHAPING = sizeof shaping_keys / sizeof shaping_keys[0] };

static int layout_int(const cJSON *lay, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(lay, key);
    return cJSON_IsNumber(v) ? v->valueint : 0;
}

/* shaping_keys[i] of a layout, 0 or absent read as ModelLayout reads it: ep 1, etp tp,
 * dp_shard dp, dp_replicate 1 */
static int shaping_value(const cJSON *lay, int i)
{
    const int v = layout_int(lay, shaping_keys[i]);
    if (v > 0 || i < N_GRID)
        return v;
    if (!strcmp(shaping_keys[i], "etp"))
        return layout_int(lay, "tp");
    if (!strcmp(shaping_keys[i], "dp_shard"))
        return layout_int(lay, "dp");
    return 1;
}

/* "dp 2 tp 1 pp 2 cp 1 vpp 1 zero 0 ep 2 etp 1": lay's shaping keys that it or the layout it
 * is compared with has, for a message */
static void layout_words(const cJSON *lay, const cJSON *other, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < N_SHAPING && n < cap; i++)
        if (i < N_GRID || cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(lay, shaping_keys[i])) ||
            cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(other, shaping_keys[i])))
            n += (size_t)snprintf(out + n, cap - n, "%s%s %d", n ? " " : "", shaping_keys[i],
                                  shaping_value(lay, i));
}

static const char *const ck_tail =
    "a checkpoint resumes only the model and layout that wrote it (no resharding)";

/* The checkpoint's model (mm) against this run's: every key, both ways (name first: another
 * model is said as such); inside an object (moe) the key that differs is named. */
static int check_model(const CkptState *st, const cJSON *mm, const char *where, PxError *err)
{
    const char *const tail = ck_tail;
    char a[128], b[128];
    cJSON *mine = model_config_to_json(&st->spec->model);
    const cJSON *item;
    int n_mine = 0;
    int rc = PX_OK;
    cJSON_ArrayForEach(item, mine)
    {
        n_mine++;
        const cJSON *other = cJSON_GetObjectItemCaseSensitive(mm, item->string);
        if (!other || !cJSON_Compare(item, other, 1)) {
            /* an object (moe): the first key inside that differs, e.g. model.moe.experts */
            const cJSON *mine_in = item, *sub = NULL;
            if (cJSON_IsObject(item) && cJSON_IsObject(other))
                cJSON_ArrayForEach(sub, item)
                {
                    const cJSON *o = cJSON_GetObjectItemCaseSensitive(other, sub->string);
                    if (!o || !cJSON_Compare(sub, o, 1)) {
                        mine_in = sub;
                        other = o;
                        break;
                    }
                }
            json_text(other, a, sizeof a);
            json_text(mine_in, b, sizeof b);
            rc = px_fail(err, PX_EINPUT, "%s model.%s%s%s: the checkpoint has %s, this run %s: %s",
                         where, item->string, sub ? "." : "", sub ? sub->string : "", a, b, tail);
            break;
        }
    }
    if (!rc && cJSON_GetArraySize(mm) != n_mine) {
        cJSON_ArrayForEach(item, mm) if (!cJSON_GetObjectItemCaseSensitive(mine, item->string))
        {
            json_text(item, a, sizeof a);
            rc = px_fail(err, PX_EINPUT, "%s model.%s: the checkpoint has %s, this run nothing: %s",
                         where, item->string, a, tail);
            break;
        }
    }
    cJSON_Delete(mine);
    return rc;
}

/* The FP8 settings that shape the state (PX_EINPUT naming the first that differs, else PX_OK):
 * the recipe (which copies, scales and histories the weights arena holds), the FP8 parameters
 * (--fp8-param-gather: the FP8 weights held in place of the act ones) and the transposed
 * copies; under delayed scaling the histories' length and the columns FP8 attention and the
 * FP8 dispatch add. Without this the shard's size would refuse most of these, naming neither
 * the setting nor the values. A job without FP8 records none of these keys (its recipe reads
 * as none); past the recipe a manifest without a key is not checked on it. */
static int check_fp8(const cJSON *job, const cJSON *mt, const char *where, PxError *err)
{
    static const char *const keys[] = {"fp8_recipe",       "fp8_param_gather", "fp8_transpose",
                                       "fp8_amax_history", "fp8_attention",    "fp8_dispatch"};
    enum { N_ALWAYS = 3 };
    /* the recipe: a job without FP8 has none of these keys */
    const char *have = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "fp8_recipe"));
    const char *was = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(mt, "fp8_recipe"));
    have = have ? have : "none";
    was = was ? was : "none";
    if (strcmp(have, was) != 0)
        return px_fail(err, PX_EINPUT, "%s training.fp8_recipe: the checkpoint has \"%s\", this run "
                       "\"%s\": %s", where, was, have, ck_tail);
    const int on = strcmp(have, "none") != 0, delayed = !strcmp(have, "delayed");
    for (int i = 1; i < (int)(sizeof keys / sizeof keys[0]); i++) {
        if (!on || (i >= N_ALWAYS && !delayed))
            break;
        const cJSON *mine = cJSON_GetObjectItemCaseSensitive(job, keys[i]);
        const cJSON *other = cJSON_GetObjectItemCaseSensitive(mt, keys[i]);
        if (!other || cJSON_Compare(mine, other, 1))
            continue;
        char a[128], b[128];
        json_text(other, a, sizeof a);
        json_text(mine, b, sizeof b);
        return px_fail(err, PX_EINPUT, "%s training.%s: the checkpoint has %s, this run %s: %s",
                       where, keys[i], a, b, ck_tail);
    }
    return PX_OK;
}

/* Refuses a checkpoint whose state another layout or model wrote (the key that differs named);
 * notes the training settings that differ, which change the trajectory but not the state. */
static int check_compat(Ckpt *c, const CkptState *st, const cJSON *m, const char *where,
                        PxError *err)
{
    const cJSON *mm, *ml, *mt;
    int rc;
    if ((rc = px_json_object(m, where, "model", 1, &mm, err)) ||
        (rc = px_json_object(m, where, "layout", 1, &ml, err)) ||
        (rc = px_json_object(m, where, "training", 1, &mt, err)))
        return rc;
    const char *const tail = ck_tail;
    if ((rc = check_model(st, mm, where, err)))
        return rc;
    char a[128], b[128];
    const cJSON *item;
    /* the layout: the grid, the experts' split and ZeRO's (HSDP's) shape the state; the rest
     * only the arithmetic's order */
    const ModelLayout *l = &st->spec->layout;
    cJSON *lay = model_layout_to_json(l);
    char lw[CK_PATH + 96];
    snprintf(lw, sizeof lw, "%s layout", where);
    for (int i = 0; i < N_SHAPING; i++) {
        int v = 0;
        if (i < N_GRID && (rc = px_json_int(ml, lw, shaping_keys[i], 1, 0, 1 << 30, &v, err))) {
            cJSON_Delete(lay);
            return rc;
        }
        v = shaping_value(ml, i);
        const int have = shaping_value(lay, i);
        if (v != have) {
            char was[160], is[160];
            layout_words(ml, lay, was, sizeof was);
            layout_words(lay, ml, is, sizeof is);
            cJSON_Delete(lay);
            return px_fail(err, PX_EINPUT, "%s layout.%s: the checkpoint was written with %d, this "
                           "run has %d (the checkpoint's layout %s, this run's %s): %s",
                           where, shaping_keys[i], v, have, was, is, tail);
        }
    }
    cJSON_ArrayForEach(item, lay)
    {
        const cJSON *other = cJSON_GetObjectItemCaseSensitive(ml, item->string);
        if (strncmp(item->string, "overlap", 7) != 0 && (!other || !cJSON_Compare(item, other, 1)))
            note(c, "layout", item->string);
    }
    cJSON_Delete(lay);
    /* the training job: the dtypes and optimizer shape the state; the rest is noted */
    cJSON *job = model_job_to_json(&st->spec->job, st->d);
    char tw[CK_PATH + 96];
    snprintf(tw, sizeof tw, "%s training", where);
    static const char *const shaping[] = {"precision", "optimizer", "vocab_padded"};
    for (size_t i = 0; i < sizeof shaping / sizeof shaping[0] && !rc; i++) {
        const cJSON *have = cJSON_GetObjectItemCaseSensitive(job, shaping[i]);
        const cJSON *other = cJSON_GetObjectItemCaseSensitive(mt, shaping[i]);
        if (!other) {
            char p[CK_PATH + 96];
            px_json_path(p, sizeof p, tw, shaping[i]);
            rc = px_fail(err, PX_EINPUT, "%s: missing required key", p);
        } else if (!cJSON_Compare(have, other, 1)) {
            json_text(other, a, sizeof a);
            json_text(have, b, sizeof b);
            rc = px_fail(err, PX_EINPUT, "%s training.%s: the checkpoint has %s, this run %s: %s",
                         where, shaping[i], a, b, tail);
        }
    }
    if (!rc)
        rc = check_fp8(job, mt, where, err);
    if (!rc)
        cJSON_ArrayForEach(item, job)
        {
            const cJSON *other = cJSON_GetObjectItemCaseSensitive(mt, item->string);
            if (!other || !cJSON_Compare(item, other, 1))
                note(c, "training", item->string);
        }
    cJSON_Delete(job);
    return rc;
}

static int load(Ckpt *c, CkptState *st, int step, PxError *err)
{
    char sdir[CK_PATH + 32], path[CK_PATH + 64], where[CK_PATH + 72];
    step_dir(c, step, sdir, sizeof sdir);
    snprintf(path, sizeof path, "%s/manifest.json", sdir);
    snprintf(where, sizeof where, "%s:", path);
    cJSON *m = px_json_read_file(path, err);
    if (!m)
        return PX_EINPUT; /* the message names the file, the line and the column */
    int rc, version = 0, mstep = 0, world = 0;
    char format[64] = "";
    CkState s = {0, 0, 1.0, 0, 0};
    const cJSON *sj = NULL, *shards = NULL;
    char sw[CK_PATH + 80];
    snprintf(sw, sizeof sw, "%s state", where);
    if ((rc = px_json_int(m, where, "schema_version", 1, 1, 1, &version, err)) ||
        (rc = px_json_string(m, where, "format", 1, format, sizeof format, err)))
        goto done;
    if (strcmp(format, ck_format) != 0) {
        rc = px_fail(err, PX_EINPUT, "%s format: expected \"%s\", got \"%s\"", where, ck_format,
                     format);
        goto done;
    }
    if ((rc = px_json_int(m, where, "step", 1, 1, 1 << 30, &mstep, err)))
        goto done;
    if (mstep != step) {
        rc = px_fail(err, PX_EINPUT, "%s step: %d, but its directory is step %d", where, mstep, step);
        goto done;
    }
    if ((rc = check_compat(c, st, m, where, err)) ||
        (rc = px_json_int(m, where, "world", 1, 1, 1 << 30, &world, err)))
        goto done;
    if (world != st->world) {
        rc = px_fail(err, PX_EINPUT, "%s world: the checkpoint has %d ranks, this run %d", where,
                     world, st->world);
        goto done;
    }
    s.step = mstep;
    int every = 0;
    if ((rc = px_json_int(m, where, "every", 0, 0, 1 << 30, &every, err)) ||
        (rc = px_json_object(m, where, "state", 1, &sj, err)) ||
        (rc = px_json_int(sj, sw, "optimizer_steps", 1, 0, 1 << 30, &s.opt_steps, err)) ||
        (rc = px_json_double(sj, sw, "loss_scale", 1, 0x1p-30, 0x1p120, &s.loss_scale, err)))
        goto done;
    {
        int clean = 0, skipped = 0;
        if ((rc = px_json_int(sj, sw, "loss_scale_clean", 1, 0, 1 << 30, &clean, err)) ||
            (rc = px_json_int(sj, sw, "skipped_steps", 1, 0, 1 << 30, &skipped, err)))
            goto done;
        s.scale_clean = clean;
        s.skipped = skipped;
    }
    shards = cJSON_GetObjectItemCaseSensitive(m, "shards");
    if (!shards) {
        rc = px_fail(err, PX_EINPUT, "%s shards: missing required key", where);
        goto done;
    }
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) != world) {
        rc = px_fail(err, PX_EINPUT, "%s shards: expected an array of %d shards, one per rank",
                     where, world);
        goto done;
    }
    {
        const int rank = st->rank;
        const cJSON *e = cJSON_GetArrayItem(shards, rank);
        char ew[CK_PATH + 96], file[128] = "";
        snprintf(ew, sizeof ew, "%s shards[%d]", where, rank);
        int r = -1;
        uint64_t bytes = 0, crc = 0;
        if ((rc = px_json_int(e, ew, "rank", 1, 0, 1 << 30, &r, err)) ||
            (rc = px_json_string(e, ew, "file", 1, file, sizeof file, err)) ||
            (rc = px_json_u64(e, ew, "bytes", 1, &bytes, err)) ||
            (rc = px_json_u64(e, ew, "crc32", 1, &crc, err)))
            goto done;
        if (r != rank || crc > 0xffffffffull || !file[0] || strchr(file, '/') ||
            !strcmp(file, "..")) {
            rc = px_fail(err, PX_EINPUT, "%s: expected rank %d, a file name within the "
                         "checkpoint's directory and a 32-bit crc32", ew, rank);
            goto done;
        }
        char spath[CK_PATH + 200];
        snprintf(spath, sizeof spath, "%s/%s", sdir, file);
        if ((rc = load_shard(c, st, spath, bytes, (uint32_t)crc, &s, err)))
            goto done;
    }
    st->opt_steps = s.opt_steps;
    st->loss_scale = s.loss_scale;
    st->scale_clean = (int)s.scale_clean;
    st->skipped = (long)s.skipped;
    c->resumed_from = step;
    px_strlcpy(c->resumed_dir, sdir, sizeof c->resumed_dir);
    if (c->every == 0)
        c->every = every; /* the interval goes on as it was */
done:
    cJSON_Delete(m);
    return rc;
}

/* ---- the trainer's hooks ---- */

int ckpt_open(Ckpt **out, const CkptOptions *o, CkptState *st, PxError *err)
{
    *out = NULL;
    if (o->every < 0)
        return px_fail(err, PX_EINPUT, "--checkpoint-every: must be at least 1, got %d", o->every);
    if (!o->dir || !o->dir[0]) {
        if (o->every > 0 || o->resume)
            return px_fail(err, PX_EINPUT, "%s needs --checkpoint-dir DIR",
                           o->resume ? "--resume" : "--checkpoint-every");
        return PX_OK;
    }
    if (!o->every && !o->resume)
        return px_fail(err, PX_EINPUT, "--checkpoint-dir %s: give --checkpoint-every N to write "
                       "checkpoints, or --resume to continue from one", o->dir);
    Ckpt *c = calloc(1, sizeof *c);
    if (!c)
        return px_fail(err, PX_ERUNTIME, "out of memory for the checkpoints");
    int rc = PX_OK;
    if (strlen(o->dir) >= sizeof c->dir - 1) {
        rc = px_fail(err, PX_EINPUT, "--checkpoint-dir: the path is longer than %zu characters",
                     sizeof c->dir - 2);
        goto out;
    }
    px_strlcpy(c->dir, o->dir, sizeof c->dir);
    for (size_t n = strlen(c->dir); n > 1 && c->dir[n - 1] == '/'; n--)
        c->dir[n - 1] = '\0';
    c->every = o->every;
    c->resume = o->resume;
    if (o->resume && !is_dir(c->dir)) {
        rc = px_fail(err, PX_EINPUT, "%s: no such checkpoint directory: nothing to resume from",
                     c->dir);
        goto out;
    }
    /* a directory that cannot take the checkpoints is found out now, not at step N */
    PxError derr = {0};
    if (px_mkdir_p(c->dir, &derr)) {
        rc = px_fail(err, PX_EINPUT, "%s: cannot create the checkpoint directory: %s", c->dir,
                     strerror(errno));
        goto out;
    }
    if (access(c->dir, W_OK | X_OK) != 0) {
        rc = px_fail(err, PX_EINPUT, "%s: cannot write into the checkpoint directory: %s", c->dir,
                     strerror(errno));
        goto out;
    }
    const int latest = latest_complete(c->dir);
    if (!o->resume && latest > 0) {
        rc = px_fail(err, PX_EINPUT, "%s already holds a checkpoint (step %d): give --resume to "
                     "continue from it, or another --checkpoint-dir", c->dir, latest);
        goto out;
    }
    if (o->resume && latest == 0) {
        rc = px_fail(err, PX_EINPUT, "%s: --resume, but the directory holds no complete "
                     "checkpoint (a step-N directory with its manifest.json)", c->dir);
        goto out;
    }
    if (o->resume && latest >= st->steps) {
        rc = px_fail(err, PX_EINPUT, "%s: the latest checkpoint is at step %d and the run has %d "
                     "steps: nothing left to run (give --steps N above %d)",
                     c->dir, latest, st->steps, latest);
        goto out;
    }
    c->bounce = malloc(CK_CHUNK);
    c->cap_written = c->every > 0 ? st->steps / c->every + 1 : 1;
    c->written = calloc((size_t)c->cap_written, sizeof *c->written);
    if (!c->bounce || !c->written) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory for the checkpoints");
        goto out;
    }
    rc = o->resume ? load(c, st, latest, err) : PX_OK;
    if (!rc && o->resume && c->every > 0 && st->steps / c->every + 1 > c->cap_written) {
        /* the interval came from the manifest */
        free(c->written);
        c->cap_written = st->steps / c->every + 1;
        if (!(c->written = calloc((size_t)c->cap_written, sizeof *c->written)))
            rc = px_fail(err, PX_ERUNTIME, "out of memory for the checkpoints");
    }
out:
    if (rc)
        ckpt_free(c);
    else
        *out = c;
    return rc;
}

int ckpt_resumed_from(const Ckpt *c) { return c ? c->resumed_from : 0; }

void ckpt_free(Ckpt *c)
{
    if (!c)
        return;
    free(c->bounce);
    free(c->written);
    free(c);
}

/* This rank's line of the manifest (or its failure), as rank 0 gathers it. */
static char *shard_entry(const CkptState *st, int ok, uint64_t bytes, uint32_t crc,
                         const PxError *werr)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "rank", st->rank);
    if (ok) {
        char file[32];
        snprintf(file, sizeof file, "rank-%05d.bin", st->rank);
        cJSON_AddNumberToObject(e, "stage", st->stage);
        cJSON_AddNumberToObject(e, "tp", st->tp_rank);
        cJSON_AddNumberToObject(e, "dp", st->dp_rank);
        cJSON_AddStringToObject(e, "file", file);
        cJSON_AddNumberToObject(e, "bytes", (double)bytes);
        cJSON_AddNumberToObject(e, "crc32", crc);
        cJSON *sec = cJSON_AddObjectToObject(e, "sections");
        for (int i = 0; i < CKPT_SECTIONS; i++)
            cJSON_AddNumberToObject(sec, model_category_name(st->region[i].cat),
                                    (double)st->region[i].bytes);
    } else {
        cJSON_AddStringToObject(e, "error", werr->msg);
    }
    char *t = cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    return t;
}

/* Rank 0: the manifest of step from the gathered shard entries, committed atomically. */
static int commit_manifest(const Ckpt *c, const CkptState *st, const char *sdir, int step,
                           cJSON *shards, PxError *err)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddNumberToObject(m, "schema_version", 1);
    cJSON_AddStringToObject(m, "format", ck_format);
    cJSON_AddNumberToObject(m, "step", step);
    cJSON_AddNumberToObject(m, "every", c->every);
    cJSON_AddStringToObject(m, "plan_path", st->plan_path);
    cJSON_AddNumberToObject(m, "world", st->world);
    cJSON_AddItemToObject(m, "model", model_config_to_json(&st->spec->model));
    cJSON_AddItemToObject(m, "layout", model_layout_to_json(&st->spec->layout));
    cJSON_AddItemToObject(m, "training", model_job_to_json(&st->spec->job, st->d));
    cJSON *be = cJSON_AddObjectToObject(m, "backend");
    cJSON_AddStringToObject(be, "compute", st->k->name);
    cJSON_AddStringToObject(be, "precision", px_dtype_name(st->k->act));
    cJSON *sj = cJSON_AddObjectToObject(m, "state");
    cJSON_AddNumberToObject(sj, "optimizer_steps", st->opt_steps);
    cJSON_AddNumberToObject(sj, "loss_scale", st->loss_scale);
    cJSON_AddNumberToObject(sj, "loss_scale_clean", st->scale_clean);
    cJSON_AddNumberToObject(sj, "skipped_steps", (double)st->skipped);
    /* the data and the dropout streams are functions of (seed, step): their position is the
     * step, recorded here for people */
    cJSON_AddNumberToObject(sj, "data_sequences", (double)step * st->spec->job.global_batch);
    cJSON_AddNumberToObject(sj, "seed", (double)st->spec->job.seed);
    if (st->have_loss)
        cJSON_AddNumberToObject(sj, "loss", st->last_loss);
    cJSON_AddItemToObject(m, "shards", shards);
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    if (!text)
        return px_fail(err, PX_ERUNTIME, "out of memory writing the checkpoint's manifest");
    size_t n = strlen(text);
    char *full = malloc(n + 2);
    int rc = full ? PX_OK : px_fail(err, PX_ERUNTIME, "out of memory");
    if (full) {
        memcpy(full, text, n);
        full[n] = '\n';
        full[n + 1] = '\0';
        char path[CK_PATH + 64];
        snprintf(path, sizeof path, "%s/manifest.json", sdir);
        /* the commit point: a temporary file, fsync, rename; then the directory's entry */
        rc = px_write_file_atomic(path, full, err);
        if (!rc && fsync_dir(sdir) != 0)
            rc = px_fail(err, PX_ERUNTIME, "%s: cannot sync the directory: %s", sdir,
                         strerror(errno));
    }
    free(full);
    free(text);
    return rc;
}

/* The checkpoint of `step` (steps completed): every rank writes its shard, rank 0 gathers
 * their entries and commits the manifest only when all are written, and one control
 * reduction tells every rank the verdict. A failure is every rank's (collective): the run
 * ends with status 1 and the previous checkpoint is kept. */
static int write_checkpoint(Ckpt *c, const CkptState *st, int step, int quiet, int *collective,
                            PxError *err)
{
    const double t0 = px_now_s();
    char sdir[CK_PATH + 32];
    step_dir(c, step, sdir, sizeof sdir);
    PxError werr = {0};
    uint64_t bytes = 0;
    uint32_t crc = 0;
    PxError derr = {0};
    int wrc = px_mkdir_p(sdir, &derr)
                  ? px_fail(&werr, PX_ERUNTIME, "%s: cannot create the checkpoint's directory: %s",
                            sdir, strerror(errno))
                  : PX_OK;
    if (!wrc && st->rank == 0 && fsync_dir(c->dir) != 0)
        wrc = px_fail(&werr, PX_ERUNTIME, "%s: cannot sync the directory: %s", c->dir,
                      strerror(errno));
    if (!wrc)
        wrc = write_shard(c, st, sdir, step, &bytes, &crc, &werr);
    char *entry = shard_entry(st, !wrc, bytes, crc, &werr);
    char **all = NULL;
    int rc = entry ? comm_gather_text(st->comm, entry, &all, err)
                   : px_fail(err, PX_ERUNTIME, "out of memory");
    free(entry);
    if (rc)
        return rc; /* the communication failed: this rank alone knows */
    uint64_t total = 0;
    int failed = wrc != PX_OK;
    if (all) { /* rank 0 */
        const int W = st->world;
        cJSON *shards = cJSON_CreateArray();
        for (int r = 0; r < W; r++) {
            cJSON *e = cJSON_Parse(all[r]);
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "error");
            if (!e || msg) {
                if (!failed)
                    px_fail(&werr, PX_ERUNTIME, "rank %d: %s", r,
                            msg ? cJSON_GetStringValue(msg) : "an unreadable shard entry");
                failed = 1;
            }
            total += (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "bytes"));
            if (e)
                cJSON_AddItemToArray(shards, e);
            free(all[r]);
        }
        free(all);
        if (!failed && commit_manifest(c, st, sdir, step, shards, &werr))
            failed = 1;
        else if (failed)
            cJSON_Delete(shards);
        if (!failed)
            prune(c, step);
    }
    double v = failed ? 1.0 : 0.0;
    if ((rc = comm_control(st->comm, &v, 1, COMM_SUM, err)))
        return rc;
    if (v > 0) {
        *collective = 1; /* every rank knows: the job ends normally, with status 1 */
        char prev[CK_PATH + 64] = "no earlier checkpoint";
        const int last = c->n_written > 0 ? c->written[c->n_written - 1].step : c->resumed_from;
        if (last > 0)
            snprintf(prev, sizeof prev, "the checkpoint of step %d is kept", last);
        if (st->rank == 0 || wrc)
            return px_fail(err, PX_ERUNTIME, "checkpoint of step %d not written: %s; %s", step,
                           werr.msg, prev);
        return px_fail(err, PX_ERUNTIME, "checkpoint of step %d not written by another rank; %s",
                       step, prev);
    }
    const double dt = px_now_s() - t0;
    if (c->n_written < c->cap_written) {
        c->written[c->n_written].step = step;
        c->written[c->n_written].bytes = st->rank == 0 ? total : bytes;
        c->written[c->n_written].seconds = dt;
        c->n_written++;
    }
    if (!quiet)
        printf("checkpoint step %d: %d shard%s, %.2f MiB in %.3f s (%.1f MB/s): %s\n", step,
               st->world, st->world == 1 ? "" : "s", (double)total / (1 << 20), dt,
               dt > 0 ? (double)total / dt / 1e6 : 0.0, sdir);
    return PX_OK;
}

int ckpt_after_step(Ckpt *c, const CkptState *st, int steps_done, int quiet, int *collective,
                    PxError *err)
{
    if (!c || c->every <= 0 || !c->dir[0] || steps_done % c->every != 0)
        return PX_OK;
    return write_checkpoint(c, st, steps_done, quiet, collective, err);
}

void ckpt_print_resume(const Ckpt *c, const CkptState *st)
{
    if (!c || c->resumed_from <= 0)
        return;
    printf("resume    from %s: step %d done (%d optimizer steps, data at sequence %lld); steps "
           "%d-%d to run\n",
           c->resumed_dir, c->resumed_from, st->opt_steps,
           (long long)c->resumed_from * st->spec->job.global_batch, c->resumed_from + 1, st->steps);
    if (c->note[0])
        printf("note      not as in the checkpoint's run: %s; the losses will not follow an "
               "uninterrupted run\n", c->note);
}

void ckpt_json(const Ckpt *c, cJSON *run)
{
    if (!c || !c->dir[0])
        return;
    cJSON *j = cJSON_AddObjectToObject(run, "checkpoint");
    cJSON_AddStringToObject(j, "dir", c->dir);
    cJSON_AddNumberToObject(j, "every", c->every);
    if (c->resumed_from > 0) {
        cJSON_AddNumberToObject(j, "resumed_from_step", c->resumed_from);
        cJSON_AddStringToObject(j, "resumed_from", c->resumed_dir);
    }
    cJSON *w = cJSON_AddArrayToObject(j, "written");
    for (int i = 0; i < c->n_written; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "step", c->written[i].step);
        cJSON_AddNumberToObject(e, "bytes", (double)c->written[i].bytes);
        cJSON_AddNumberToObject(e, "seconds", c->written[i].seconds);
        cJSON_AddItemToArray(w, e);
    }
}
