/* The built-in training text: English-like sentences from a small hand-written grammar, so that
 * the demo trains on something with structure (spelling, agreement, punctuation, recurring
 * phrases) without any file from outside. A fixed seed makes it the same text everywhere: the
 * plan's seed changes which windows are read, not the text. */
#include <string.h>

#include "exec/train/internal.h"

typedef struct {
    uint64_t state;
    char *buf;
    size_t len, cap;
} Gen;

static uint32_t pick(Gen *g, uint32_t n)
{
    g->state = px_mix64(g->state);
    return (uint32_t)((g->state >> 33) % n);
}

static void put(Gen *g, const char *s)
{
    size_t n = strlen(s);
    if (n > g->cap - g->len)
        n = g->cap - g->len;
    memcpy(g->buf + g->len, s, n);
    g->len += n;
}

#define COUNT(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
#define ONE_OF(g, a) ((a)[pick((g), COUNT(a))])

static const char *const names[] = {"Ada", "Brook", "Cyrus", "Dana", "Elio", "Farah", "Gus",
                                    "Hana", "Ivo", "June", "Kai", "Lena", "Milo", "Nora"};
static const char *const adjectives[] = {
    "small", "old", "quiet", "bright", "heavy", "green", "careful", "patient", "tired", "clever",
    "wooden", "distant", "curious", "gentle", "narrow", "warm", "cold", "silver"};
/* singular and plural forms side by side */
static const char *const nouns[][2] = {
    {"cat", "cats"}, {"river", "rivers"}, {"teacher", "teachers"}, {"garden", "gardens"},
    {"machine", "machines"}, {"child", "children"}, {"city", "cities"}, {"bird", "birds"},
    {"farmer", "farmers"}, {"letter", "letters"}, {"window", "windows"}, {"train", "trains"},
    {"baker", "bakers"}, {"mountain", "mountains"}, {"student", "students"}, {"lamp", "lamps"},
    {"boat", "boats"}, {"story", "stories"}, {"friend", "friends"}, {"clock", "clocks"}};
/* transitive verbs: third person singular, plural, past */
static const char *const verbs_t[][3] = {
    {"sees", "see", "saw"},         {"finds", "find", "found"},     {"builds", "build", "built"},
    {"carries", "carry", "carried"}, {"follows", "follow", "followed"},
    {"paints", "paint", "painted"}, {"watches", "watch", "watched"}, {"keeps", "keep", "kept"},
    {"opens", "open", "opened"},    {"reads", "read", "read"},      {"moves", "move", "moved"},
    {"helps", "help", "helped"}};
static const char *const verbs_i[][3] = {
    {"sleeps", "sleep", "slept"}, {"waits", "wait", "waited"}, {"sings", "sing", "sang"},
    {"runs", "run", "ran"},       {"laughs", "laugh", "laughed"}, {"rests", "rest", "rested"},
    {"works", "work", "worked"},  {"falls", "fall", "fell"}};
static const char *const adverbs[] = {"slowly", "quickly", "again", "quietly", "at night",
                                      "every morning", "without a sound", "for a while",
                                      "in the rain", "together"};
static const char *const preps[] = {"near", "behind", "under", "beside", "across", "inside",
                                    "above", "toward"};
static const char *const conjunctions[] = {"and", "but", "so", "because", "while"};
static const char *const openers[] = {"Yesterday", "Later", "In the evening", "Once",
                                      "After the storm", "That winter", "Every day"};

static void noun_phrase(Gen *g, int plural, int capital)
{
    if (!plural && pick(g, 4) == 0) {
        put(g, ONE_OF(g, names));
        return;
    }
    static const char *const det_s[] = {"the", "a", "this", "that", "my", "our"};
    static const char *const det_p[] = {"the", "some", "these", "those", "many", "two"};
    const char *det = plural ? ONE_OF(g, det_p) : ONE_OF(g, det_s);
    if (capital) {
        char c[2] = {(char)(det[0] - 'a' + 'A'), 0};
        put(g, c);
        put(g, det + 1);
    } else {
        put(g, det);
    }
    put(g, " ");
    if (pick(g, 2) == 0) {
        put(g, ONE_OF(g, adjectives));
        put(g, " ");
    }
    put(g, nouns[pick(g, COUNT(nouns))][plural]);
}

/* subject, verb (agreeing with the subject, or past tense), object or adverb, maybe a place */
static void clause(Gen *g, int capital, int past)
{
    int plural = pick(g, 3) == 0;
    noun_phrase(g, plural, capital);
    put(g, " ");
    int form = past ? 2 : plural;
    if (pick(g, 3) != 0) {
        put(g, verbs_t[pick(g, COUNT(verbs_t))][form]);
        put(g, " ");
        noun_phrase(g, pick(g, 3) == 0, 0);
    } else {
        put(g, verbs_i[pick(g, COUNT(verbs_i))][form]);
        if (pick(g, 2) == 0) {
            put(g, " ");
            put(g, ONE_OF(g, adverbs));
        }
    }
    if (pick(g, 3) == 0) {
        put(g, " ");
        put(g, ONE_OF(g, preps));
        put(g, " ");
        noun_phrase(g, pick(g, 4) == 0, 0);
    }
}

static void sentence(Gen *g)
{
    int past = pick(g, 3) == 0;
    switch (pick(g, 6)) {
    case 0: /* a time opener */
        put(g, ONE_OF(g, openers));
        put(g, ", ");
        clause(g, 0, 1);
        put(g, ".");
        break;
    case 1: /* two clauses */
        clause(g, 1, past);
        put(g, ", ");
        put(g, ONE_OF(g, conjunctions));
        put(g, " ");
        clause(g, 0, past);
        put(g, ".");
        break;
    case 2: { /* a question */
        int plural = pick(g, 3) == 0;
        put(g, past ? "Did " : plural ? "Do " : "Does ");
        noun_phrase(g, plural, 0);
        put(g, " ");
        put(g, verbs_t[pick(g, COUNT(verbs_t))][1]);
        put(g, " ");
        noun_phrase(g, 0, 0);
        put(g, "?");
        break;
    }
    default:
        clause(g, 1, past);
        put(g, ".");
        break;
    }
}

size_t exec_text_generate(char *buf, size_t cap)
{
    Gen g = {.state = 0x706172616c6c6178ull, .buf = buf, .cap = cap};
    while (g.len < cap) {
        int n = 3 + (int)pick(&g, 4);
        for (int i = 0; i < n && g.len < cap; i++) {
            if (i > 0)
                put(&g, " ");
            sentence(&g);
        }
        put(&g, "\n");
    }
    return g.len;
}
