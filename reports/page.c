/* The report pages: report.md for reading in a repository, report.html for a browser, both
 * embedding the charts (PNG linked from the Markdown, SVG inlined in the HTML, so that the HTML
 * page is one file that shows its charts wherever it is sent). The page is written once, in GitHub's
 * Markdown; report.html is that Markdown rendered by cmark-gfm with its table extension, so the
 * two pages cannot disagree and every table of report.md is a <table> in report.html. */
#include "reports/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmark-gfm-core-extensions.h>
#include <cmark-gfm.h>

const char *rpt_fmt_sig(char *buf, size_t cap, double v, int digits)
{
    if (digits < 1)
        digits = 1;
    if (digits > 17)
        digits = 17;
    if (!isfinite(v)) {
        snprintf(buf, cap, "n/a");
        return buf;
    }
    if (v == 0) {
        snprintf(buf, cap, "0");
        return buf;
    }
    /* the exponent after rounding to `digits`: 9.996 rounds to 10.0, not to 10.00 */
    char e[40];
    snprintf(e, sizeof e, "%.*e", digits - 1, v);
    const char *x = strchr(e, 'e');
    int exp10 = x ? atoi(x + 1) : 0;
    if (exp10 < -3 || exp10 >= 6)
        snprintf(buf, cap, "%s", e);
    else
        snprintf(buf, cap, "%.*f", digits - 1 - exp10 > 0 ? digits - 1 - exp10 : 0, v);
    return buf;
}

/* The <title>, the one piece of text that is not rendered from the Markdown. */
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

/* The whole page in Markdown, the charts embedded as `image` ("png" or "svg") and linked in
 * the `other` format, named `other_name`; NULL when out of memory. */
static char *page_markdown(const char *title, const RptSection *sections, int n, const char *image,
                           const char *other, const char *other_name)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    fprintf(f, "# %s\n\n", title);
    for (int i = 0; i < n; i++) {
        const RptSection *s = &sections[i];
        if (s->heading) /* none: text under the title (the header) */
            fprintf(f, "## %s\n\n", s->heading);
        if (s->chart)
            fprintf(f, "![%s](%s.%s)\n\n([%s](%s.%s), data in `%s.dat`, script `%s.gp`)\n\n",
                    s->heading, s->chart, image, other_name, s->chart, other, s->chart, s->chart);
        if (s->text)
            fprintf(f, "%s\n\n", s->text);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* Markdown to an HTML fragment through cmark-gfm (tables on; raw HTML, of which parallax writes
 * none, left out); NULL when the library fails. Free with free(). */
static char *render_html(const char *md)
{
    cmark_gfm_core_extensions_ensure_registered();
    cmark_syntax_extension *table = cmark_find_syntax_extension("table");
    cmark_parser *parser = cmark_parser_new(CMARK_OPT_DEFAULT);
    if (!table || !parser) {
        if (parser)
            cmark_parser_free(parser);
        return NULL;
    }
    char *out = NULL;
    if (cmark_parser_attach_syntax_extension(parser, table)) {
        cmark_parser_feed(parser, md, strlen(md));
        cmark_node *doc = cmark_parser_finish(parser);
        if (doc) {
            char *html = cmark_render_html(doc, CMARK_OPT_DEFAULT,
                                           cmark_parser_get_syntax_extensions(parser));
            /* the library's own allocator frees what it allocated */
            if (html) {
                out = strdup(html);
                cmark_get_default_mem_allocator()->free(html);
            }
            cmark_node_free(doc);
        }
    }
    cmark_parser_free(parser);
    return out;
}

/* Writes s with every id and reference to one (id='x', href='#x', url(#x)) prefixed by
 * `prefix`: gnuplot names its markers gpPt0... in every chart, and charts inlined in one page
 * would otherwise take each other's. */
static void put_prefixed_ids(FILE *f, const char *s, const char *prefix)
{
    static const char *const keys[] = {"id='", "id=\"", "href='#", "href=\"#", "url(#"};
    while (*s) {
        size_t skip = 0;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0] && !skip; k++)
            if (strncmp(s, keys[k], strlen(keys[k])) == 0)
                skip = strlen(keys[k]);
        if (skip) {
            fwrite(s, 1, skip, f);
            fprintf(f, "%s-", prefix);
            s += skip;
        } else {
            fputc(*s++, f);
        }
    }
}

/* The chart `name`'s SVG from dir, from its <svg> element on (the XML declaration left out),
 * its ids prefixed by the chart's name; 0 when it cannot be read. */
static int put_inline_svg(FILE *f, const char *dir, const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    PxError e = {0};
    char *svg = px_read_file(path, NULL, &e);
    const char *start = svg ? strstr(svg, "<svg") : NULL;
    if (!start) {
        free(svg);
        return 0;
    }
    char prefix[128];
    px_strlcpy(prefix, name, sizeof prefix);
    char *ext = strrchr(prefix, '.');
    if (ext)
        *ext = 0;
    for (char *p = prefix; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
            *p = '_';
    fprintf(f, "<span class=\"chart\" data-chart=\"%s\">", prefix);
    put_prefixed_ids(f, start, prefix);
    fputs("</span>", f);
    free(svg);
    return 1;
}

/* The rendered body with each chart's <img src="NAME.svg" ... /> replaced by the SVG itself,
 * so that report.html is one self-contained file: mailed alone, it still shows its charts. An
 * image whose file cannot be read stays a link (and the browser test finds it missing). */
static void put_body_inlined(FILE *f, const char *body, const char *dir)
{
    static const char img[] = "<img src=\"";
    const char *p = body;
    for (;;) {
        const char *at = strstr(p, img);
        if (!at) {
            fputs(p, f);
            return;
        }
        fwrite(p, 1, (size_t)(at - p), f);
        const char *src = at + strlen(img), *q = strchr(src, '"'), *end = strstr(src, "/>");
        char name[256] = "";
        if (q && end && (size_t)(q - src) < sizeof name && (size_t)(q - src) > 4 &&
            strncmp(q - 4, ".svg", 4) == 0) {
            memcpy(name, src, (size_t)(q - src));
            name[q - src] = 0;
        }
        if (name[0] && !strchr(name, '/') && put_inline_svg(f, dir, name)) {
            p = end + 2;
        } else {
            fwrite(at, 1, strlen(img), f);
            p = src;
        }
    }
}

int rpt_page_write(const RptOutput *o, const char *title, const RptSection *sections, int n,
                   PxError *err)
{
    char md_path[1200], html_path[1200];
    snprintf(md_path, sizeof md_path, "%s/report.md", o->dir);
    snprintf(html_path, sizeof html_path, "%s/report.html", o->dir);
    char *md = page_markdown(title, sections, n, "png", "svg", "SVG");
    char *md_svg = page_markdown(title, sections, n, "svg", "png", "PNG");
    char *body = md_svg ? render_html(md_svg) : NULL;
    free(md_svg);
    if (!md || !body) {
        free(md);
        free(body);
        return px_fail(err, PX_ERUNTIME, "%s: cannot render the report pages (%s)", o->dir,
                       md ? "cmark-gfm failed" : "out of memory");
    }
    PxAtomicFile page_md, page_html;
    int rc = PX_OK;
    if (px_atomic_open(&page_md, md_path, err)) {
        rc = px_fail(err, PX_ERUNTIME, "%s: cannot write the report pages", o->dir);
        goto out;
    }
    if (px_atomic_open(&page_html, html_path, err)) {
        px_atomic_abort(&page_md);
        rc = px_fail(err, PX_ERUNTIME, "%s: cannot write the report pages", o->dir);
        goto out;
    }
    fputs(md, page_md.f);
    FILE *fh = page_html.f;
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>", fh);
    html_escape(fh, title);
    fputs("</title>\n<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
          "img{max-width:100%}pre{background:#f5f5f5;padding:.6em;overflow-x:auto}"
          "h2{border-bottom:1px solid #ddd}table{border-collapse:collapse;margin:1em 0}"
          "th,td{border:1px solid #ccc;padding:.2em .6em}th{background:#f5f5f5}"
          "td{font-variant-numeric:tabular-nums}"
          ".chart svg{display:block;max-width:100%;height:auto}</style></head><body>\n", fh);
    put_body_inlined(fh, body, o->dir);
    fputs("</body></html>\n", fh);
    if (px_atomic_commit(&page_md, err) || px_atomic_commit(&page_html, err)) {
        px_atomic_abort(&page_html);
        rc = px_fail(err, PX_ERUNTIME, "%s: writing the report pages failed", o->dir);
    }
out:
    free(md);
    free(body);
    return rc;
}
