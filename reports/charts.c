/* Charts: each writes its data and a gnuplot script next to the images, runs gnuplot once for
 * a PNG and an SVG, and checks both images exist and are not empty. */
#include "reports/report.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

extern char **environ;

/* A growing text buffer for scripts and data. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} Buf;

static void bput(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void bput(Buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* gnuplot strings are single-quoted: a quote inside would end them. */
static int quotable(const char *s) { return strchr(s, '\'') == NULL; }

int rpt_dir_make(const char *dir, PxError *err)
{
    /* a report directory that cannot be made fails the run (exit 1), as it always has */
    return px_mkdir_p(dir, err) ? PX_ERUNTIME : PX_OK;
}

static int file_nonempty(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

/* Writes <dir>/<name>.dat and .gp, runs gnuplot, checks the images. The script's own body
 * is `plot`; this adds the terminals around it (own_svg: the body draws the SVG itself, as a
 * multiplot must, since `replot` repeats only its last panel). */
static int draw_ex(const RptOutput *o, const char *name, const Buf *data, const Buf *body,
                   int own_svg, int height, PxError *err)
{
    int rc;
    if (data->oom || body->oom)
        return px_fail(err, PX_ERUNTIME, "%s: out of memory drawing the chart", name);
    if (!quotable(o->dir) || !quotable(name))
        return px_fail(err, PX_EINPUT, "%s/%s: a chart path cannot contain a single quote", o->dir, name);
    if ((rc = rpt_dir_make(o->dir, err)))
        return rc;
    char dat[1200], gp[1200], png[1200], svg[1200];
    snprintf(dat, sizeof dat, "%s/%s.dat", o->dir, name);
    snprintf(gp, sizeof gp, "%s/%s.gp", o->dir, name);
    snprintf(png, sizeof png, "%s/%s.png", o->dir, name);
    snprintf(svg, sizeof svg, "%s/%s.svg", o->dir, name);
    if ((rc = px_write_file_atomic(dat, data->s ? data->s : "", err)))
        return rc;
    Buf script = {0};
    bput(&script, "# drawn by parallax report: gnuplot %s.gp\n", name);
    bput(&script, "set terminal pngcairo size 960,%d font 'sans,10' noenhanced\nset output '%s'\n", height, png);
    bput(&script, "datafile = '%s'\n", dat);
    bput(&script, "set linetype 1 lc rgb '#4C72B0' lw 2 pt 7\nset linetype 2 lc rgb '#DD8452' lw 2 pt 5\n");
    bput(&script, "set linetype 3 lc rgb '#55A868' lw 2 pt 9\nset linetype 4 lc rgb '#C44E52' lw 2 pt 11\n");
    bput(&script, "set linetype 5 lc rgb '#8172B3' lw 2\nset linetype 6 lc rgb '#937860' lw 2\n");
    bput(&script, "set linetype 7 lc rgb '#DA8BC3' lw 2\nset linetype 8 lc rgb '#8C8C8C' lw 2\n");
    bput(&script, "%s", body->s ? body->s : "");
    if (!own_svg)
        bput(&script, "set terminal svg size 960,%d fixed font 'sans,10' noenhanced\nset output '%s'\nreplot\n", height,
             svg);
    if (script.oom) {
        free(script.s);
        return px_fail(err, PX_ERUNTIME, "%s: out of memory", name);
    }
    rc = px_write_file_atomic(gp, script.s, err);
    free(script.s);
    if (rc)
        return rc;
    remove(png);
    remove(svg);
    pid_t pid;
    char *argv[] = {"gnuplot", gp, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    /* gnuplot's warnings go to its own log beside the script */
    char log[1200];
    snprintf(log, sizeof log, "%s/%s.log", o->dir, name);
    posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e)
        return px_fail(err, PX_ERUNTIME,
                       "cannot run gnuplot (%s): install gnuplot-nox (scripts/install-deps.sh)",
                       strerror(e));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return px_fail(err, PX_ERUNTIME, "waiting for gnuplot: %s", strerror(errno));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return px_fail(err, PX_ERUNTIME, "gnuplot failed on %s (exit %d): see %s", gp,
                       WIFEXITED(status) ? WEXITSTATUS(status) : -1, log);
    if (!file_nonempty(png) || !file_nonempty(svg))
        return px_fail(err, PX_ERUNTIME, "gnuplot wrote no image for %s: see %s", gp, log);
    remove(log);
    return PX_OK;
}

static int draw(const RptOutput *o, const char *name, const Buf *data, const Buf *body, PxError *err)
{
    return draw_ex(o, name, data, body, 0, 560, err);
}

/* Titles and labels go into single-quoted gnuplot strings: quotes become back-quotes. */
static void clean(char *dst, size_t cap, const char *src)
{
    px_strlcpy(dst, src ? src : "", cap);
    for (char *p = dst; *p; p++)
        if (*p == '\'')
            *p = '`';
}

int rpt_line_chart(const RptOutput *o, const char *name, const char *title, const char *xlabel,
                   const char *ylabel, const char *y2label, int logx, const RptSeries *s, int n,
                   PxError *err)
{
    Buf data = {0}, body = {0};
    char t[256], xl[128], yl[128], y2[128];
    clean(t, sizeof t, title);
    clean(xl, sizeof xl, xlabel);
    clean(yl, sizeof yl, ylabel);
    clean(y2, sizeof y2, y2label);
    for (int i = 0; i < n; i++) {
        bput(&data, "# %s\n", s[i].title);
        for (int k = 0; k < s[i].n; k++)
            bput(&data, "%.10g %.10g\n", s[i].x[k], s[i].y[k]);
        bput(&data, "\n\n");
    }
    bput(&body, "set title '%s'\nset xlabel '%s'\nset ylabel '%s'\nset grid\nset key below\n", t, xl, yl);
    if (logx)
        bput(&body, "set logscale x 2\n");
    if (y2label) {
        bput(&body, "set y2label '%s'\nset ytics nomirror\nset y2tics\n", y2);
    }
    bput(&body, "plot ");
    for (int i = 0; i < n; i++) {
        char st[128];
        clean(st, sizeof st, s[i].title);
        bput(&body, "%sdatafile index %d using 1:2 with linespoints lt %d title '%s' axes x1y%d", i ? ", " : "",
             i, i % 8 + 1, st, s[i].axis2 ? 2 : 1);
    }
    bput(&body, "\n");
    int rc = draw(o, name, &data, &body, err);
    free(data.s);
    free(body.s);
    return rc;
}

int rpt_stacked_bars(const RptOutput *o, const char *name, const char *title, const char *ylabel,
                     const char *const *labels, int rows, const char *const *names, int cols,
                     const double *values, PxError *err)
{
    Buf data = {0}, body = {0};
    char t[256], yl[128];
    clean(t, sizeof t, title);
    clean(yl, sizeof yl, ylabel);
    for (int r = 0; r < rows; r++) {
        char lab[64];
        clean(lab, sizeof lab, labels[r]);
        for (char *p = lab; *p; p++)
            if (*p == ' ')
                *p = '-';
        bput(&data, "%s", lab);
        for (int c = 0; c < cols; c++)
            bput(&data, " %.10g", values[r * cols + c]);
        bput(&data, "\n");
    }
    bput(&body, "set title '%s'\nset ylabel '%s'\nset grid ytics\nset key outside right top\n", t, yl);
    bput(&body, "set style data histograms\nset style histogram rowstacked\n");
    bput(&body, "set style fill solid 0.85 border -1\nset boxwidth 0.75\nset yrange [0:*]\n");
    if (rows > 16)
        bput(&body, "set xtics rotate by -60\n");
    bput(&body, "plot ");
    for (int c = 0; c < cols; c++) {
        char nm[64];
        clean(nm, sizeof nm, names[c]);
        if (c == 0)
            bput(&body, "datafile using 2:xtic(1) lt 1 title '%s'", nm);
        else
            bput(&body, ", '' using %d lt %d title '%s'", c + 2, c % 8 + 1, nm);
    }
    bput(&body, "\n");
    int rc = draw(o, name, &data, &body, err);
    free(data.s);
    free(body.s);
    return rc;
}

/* Pixels of the plot area across the 960-pixel image, and of a character of the 8-point tags:
 * a tag is drawn only inside a bar wide enough to hold it. */
enum { TIMELINE_PLOT_PX = 820, TIMELINE_CHAR_PX = 6 };

int rpt_timeline_chart(const RptOutput *o, const char *name, const char *title,
                       const RptSpan *const *spans, const int *counts, const char *const *titles,
                       int panels, PxError *err)
{
    Buf data = {0}, body = {0};
    char t[256];
    clean(t, sizeof t, title);
    int tracks = 1;
    for (int p = 0; p < panels; p++)
        for (int i = 0; i < counts[p]; i++)
            if (spans[p][i].track + 1 > tracks)
                tracks = spans[p][i].track + 1;
    for (int p = 0; p < panels; p++) {
        double t0 = 0, t1 = 0;
        for (int i = 0; i < counts[p]; i++) {
            t0 = i == 0 || spans[p][i].start_s < t0 ? spans[p][i].start_s : t0;
            t1 = i == 0 || spans[p][i].end_s > t1 ? spans[p][i].end_s : t1;
        }
        const double px_per_s = t1 > t0 ? TIMELINE_PLOT_PX / (t1 - t0) : 0;
        for (int i = 0; i < counts[p]; i++) {
            const RptSpan *s = &spans[p][i];
            char tag[sizeof s->tag];
            clean(tag, sizeof tag, s->tag);
            for (char *c = tag; *c; c++)
                if (*c == '"' || *c == ' ')
                    *c = '_';
            /* the whole tag, else its micro-batch alone (before the dot), else none */
            const double px = (s->end_s - s->start_s) * px_per_s;
            if (px < (double)(strlen(tag) + 1) * TIMELINE_CHAR_PX) {
                char *dot = strchr(tag, '.');
                if (dot)
                    *dot = 0;
                if (px < (double)(strlen(tag) + 1) * TIMELINE_CHAR_PX)
                    tag[0] = 0;
            }
            bput(&data, "%d %d %.9g %.9g \"%s\"\n", s->track, s->kind, s->start_s, s->end_s, tag);
        }
        if (counts[p] == 0)
            bput(&data, "0 2 0 0 \"\"\n"); /* an empty panel still needs a block */
        bput(&data, "\n\n");
    }
    /* a row of at least 14 pixels per track in every panel: 32 stages stay legible */
    int height = 120 + panels * (90 + 14 * tracks);
    height = height < 560 ? 560 : height;
    bput(&body, "set multiplot layout %d,1 title '%s'\n", panels, t);
    bput(&body, "set ylabel 'rank / stage'\nset xlabel 'seconds from the start of the step'\nset yrange [%d.6:-0.6]\n",
         tracks - 1);
    bput(&body, "set ytics 1\nset grid xtics\nset style fill solid 0.9 border rgb 'white'\nset key off\n");
    bput(&body, "set linetype 1 lc rgb '#4C72B0'\nset linetype 2 lc rgb '#DD8452'\nset linetype 3 lc rgb '#9A9A9A'\n");
    for (int p = 0; p < panels; p++) {
        char pt[256];
        clean(pt, sizeof pt, titles[p]);
        bput(&body, "set title '%s'\n", pt);
        bput(&body, "plot datafile index %d using (($3+$4)/2):1:(($4-$3)/2):(0.38):($2+1) with boxxyerror lc variable, "
                    "'' index %d using (($3+$4)/2):1:5 with labels font ',8' tc rgb 'white'\n",
             p, p);
    }
    bput(&body, "unset multiplot\n");
    /* replot does not repeat a multiplot: draw it again for the SVG */
    Buf svg_body = {0};
    bput(&svg_body, "%s", body.s ? body.s : "");
    bput(&body, "set terminal svg size 960,%d fixed font 'sans,10' noenhanced\n", height);
    bput(&body, "set output '%s/%s.svg'\n%s", o->dir, name, svg_body.s ? svg_body.s : "");
    free(svg_body.s);
    int rc = draw_ex(o, name, &data, &body, 1, height, err);
    free(data.s);
    free(body.s);
    return rc;
}

void rpt_pareto(const double *x, const double *y, int n, int *front)
{
    for (int i = 0; i < n; i++) {
        front[i] = 1;
        for (int k = 0; k < n && front[i]; k++)
            if (k != i && x[k] <= x[i] && y[k] <= y[i] && (x[k] < x[i] || y[k] < y[i]))
                front[i] = 0;
    }
}

int rpt_scatter_pareto(const RptOutput *o, const char *name, const char *title, const char *xlabel,
                       const char *ylabel, const double *x, const double *y, const int *front,
                       int n, PxError *err)
{
    Buf data = {0}, body = {0};
    char t[256], xl[128], yl[128];
    clean(t, sizeof t, title);
    clean(xl, sizeof xl, xlabel);
    clean(yl, sizeof yl, ylabel);
    for (int i = 0; i < n; i++)
        bput(&data, "%.10g %.10g\n", x[i], y[i]);
    bput(&data, "\n\n");
    /* the front, sorted by x */
    int *idx = malloc((size_t)(n > 0 ? n : 1) * sizeof *idx), m = 0;
    if (!idx)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    for (int i = 0; i < n; i++)
        if (front[i])
            idx[m++] = i;
    for (int i = 1; i < m; i++)
        for (int k = i; k > 0 && x[idx[k]] < x[idx[k - 1]]; k--) {
            int tmp = idx[k];
            idx[k] = idx[k - 1];
            idx[k - 1] = tmp;
        }
    for (int i = 0; i < m; i++)
        bput(&data, "%.10g %.10g\n", x[idx[i]], y[idx[i]]);
    if (m == 0)
        bput(&data, "0 0\n");
    free(idx);
    /* step times spanning more than a decade (a landscape from 60 s to 4,500 s) on a log axis,
     * where the fast layouts that matter are not flattened against the bottom */
    double lo = 0, hi = 0;
    for (int i = 0; i < n; i++)
        if (y[i] > 0) {
            lo = lo == 0 || y[i] < lo ? y[i] : lo;
            hi = y[i] > hi ? y[i] : hi;
        }
    const int logy = lo > 0 && hi / lo > 10;
    bput(&body, "set title '%s'\nset xlabel '%s'\nset ylabel '%s%s'\nset grid\nset key top right\n", t, xl, yl,
         logy ? ", log scale" : "");
    if (logy)
        bput(&body, "set logscale y 10\nset mytics 10\nset grid mytics\n");
    bput(&body, "plot datafile index 0 using 1:2 with points pt 7 ps 0.5 lc rgb '#8FA9CF' title 'feasible layouts', "
                "'' index 1 using 1:2 with linespoints lt 4 pt 7 ps 1.2 title 'Pareto front'\n");
    int rc = draw(o, name, &data, &body, err);
    free(data.s);
    free(body.s);
    return rc;
}

int rpt_compare_bars(const RptOutput *o, const char *name, const char *title, const char *ylabel,
                     const char *const *labels, const double *predicted, const double *measured,
                     int n, PxError *err)
{
    Buf data = {0}, body = {0};
    char t[256], yl[128];
    clean(t, sizeof t, title);
    clean(yl, sizeof yl, ylabel);
    size_t longest = 0;
    for (int i = 0; i < n; i++) {
        /* the label is one double-quoted field of the data file, spaces and all */
        char lab[96];
        clean(lab, sizeof lab, labels[i]);
        for (char *p = lab; *p; p++)
            if (*p == '"')
                *p = '`';
        if (strlen(lab) > longest)
            longest = strlen(lab);
        double e = predicted[i] != 0 ? (measured[i] - predicted[i]) / predicted[i] : 0;
        bput(&data, "\"%s\" %.10g %.10g %+.1f%%\n", lab, predicted[i], measured[i], 100 * e);
    }
    /* the key above the plot, where no bar's error label can lie under it */
    bput(&body, "set title '%s'\nset ylabel '%s'\nset grid ytics\nset key above\n", t, yl);
    bput(&body, "set style data histograms\nset style histogram clustered gap 1\n");
    bput(&body, "set style fill solid 0.85 border -1\nset yrange [0:*]\nset offsets 0,0,graph 0.1,0\n");
    /* Labels lie flat while each fits under its own pair of bars (about 820 of the 960 pixels
     * shared by n, some 7 pixels a character); else they stand upright, ending at their bar, and
     * the plot's bottom edge rises with the longest so that none is cut off at the edge of the
     * image. The edge is set as a fraction of the image, not in lines of text: the PNG's text is
     * larger against its 560 pixels than the SVG's, and a margin of lines sized for one cuts
     * the labels of the other. 7 pixels a character of the 9-point labels in the PNG, 30 for
     * the tics and the gap under the labels; the SVG's labels are shorter. */
    if ((double)longest * 7.0 > 0.9 * 820.0 / (n > 0 ? n : 1)) {
        double bottom = (7.0 * (double)longest + 30.0) / 560.0;
        bput(&body, "set xtics rotate by 90 right font ',9'\nset bmargin at screen %.3f\n",
             bottom < 0.6 ? bottom : 0.6);
    }
    bput(&body, "plot datafile using 2:xtic(1) lt 1 title 'predicted', '' using 3 lt 2 title 'measured', "
                "'' using 0:($2 > $3 ? $2 : $3):4 with labels offset 0,1 font ',%d' notitle\n",
         n > 10 ? 8 : 10);
    int rc = draw(o, name, &data, &body, err);
    free(data.s);
    free(body.s);
    return rc;
}
