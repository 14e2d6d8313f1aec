/* The report pages: report.md for reading in a repository, report.html for a browser, both
 * embedding the charts (PNG in Markdown, SVG in HTML). */
#include "reports/report.h"

#include <stdlib.h>
#include <string.h>

static void html_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A section's text: paragraphs, and blocks of lines starting with '|' or two spaces are kept
 * as preformatted tables. */
static void html_text(FILE *f, const char *text)
{
    const char *p = text;
    int in_pre = 0;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        int table = len > 0 && (p[0] == '|' || (len > 1 && p[0] == ' ' && p[1] == ' '));
        if (table && !in_pre) {
            fputs("<pre>", f);
            in_pre = 1;
        } else if (!table && in_pre) {
            fputs("</pre>\n", f);
            in_pre = 0;
        }
        char *line = malloc(len + 1);
        if (line) {
            memcpy(line, p, len);
            line[len] = '\0';
            if (in_pre) {
                html_escape(f, line);
                fputc('\n', f);
            } else if (len) {
                fputs("<p>", f);
                html_escape(f, line);
                fputs("</p>\n", f);
            }
            free(line);
        }
        p += len + (nl ? 1 : 0);
    }
    if (in_pre)
        fputs("</pre>\n", f);
}

int rpt_page_write(const RptOutput *o, const char *title, const RptSection *sections, int n,
                   PxError *err)
{
    char md[1200], html[1200];
    snprintf(md, sizeof md, "%s/report.md", o->dir);
    snprintf(html, sizeof html, "%s/report.html", o->dir);
    PxAtomicFile page_md, page_html;
    if (px_atomic_open(&page_md, md, err))
        return px_fail(err, PX_ERUNTIME, "%s: cannot write the report pages", o->dir);
    if (px_atomic_open(&page_html, html, err)) {
        px_atomic_abort(&page_md);
        return px_fail(err, PX_ERUNTIME, "%s: cannot write the report pages", o->dir);
    }
    FILE *fm = page_md.f, *fh = page_html.f;
    fprintf(fm, "# %s\n\n", title);
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>", fh);
    html_escape(fh, title);
    fputs("</title>\n<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
          "img{max-width:100%}pre{background:#f5f5f5;padding:.6em;overflow-x:auto}"
          "h2{border-bottom:1px solid #ddd}</style></head><body>\n<h1>", fh);
    html_escape(fh, title);
    fputs("</h1>\n", fh);
    for (int i = 0; i < n; i++) {
        const RptSection *s = &sections[i];
        fprintf(fm, "## %s\n\n", s->heading);
        fputs("<h2>", fh);
        html_escape(fh, s->heading);
        fputs("</h2>\n", fh);
        if (s->chart) {
            fprintf(fm, "![%s](%s.png)\n\n([SVG](%s.svg), data in `%s.dat`, script `%s.gp`)\n\n",
                    s->heading, s->chart, s->chart, s->chart, s->chart);
            fprintf(fh, "<p><img src=\"%s.svg\" alt=\"", s->chart);
            html_escape(fh, s->heading);
            fprintf(fh, "\"></p>\n<p><small><a href=\"%s.png\">PNG</a> &middot; data %s.dat &middot; "
                        "script %s.gp</small></p>\n", s->chart, s->chart, s->chart);
        }
        if (s->text) {
            fprintf(fm, "%s\n\n", s->text);
            html_text(fh, s->text);
        }
    }
    fputs("</body></html>\n", fh);
    if (px_atomic_commit(&page_md, err) || px_atomic_commit(&page_html, err)) {
        px_atomic_abort(&page_html);
        return px_fail(err, PX_ERUNTIME, "%s: writing the report pages failed", o->dir);
    }
    return PX_OK;
}
