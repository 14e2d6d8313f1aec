/* A minimal test harness: every check stops the test at the first mismatch, printing the
 * expression, the expected and the actual value, and exits 1. */
#ifndef PX_TEST_H
#define PX_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int px_test_checks;

/* 1 in a build under AddressSanitizer (scripts/test.sh's sanitizer pass). There a test may run
 * fewer rounds of a loop whose later rounds run no line the first ones did not: the sanitizers
 * watch lines, and the `tests` stage checks every round's figures (docs/testing.md). */
#if defined(__SANITIZE_ADDRESS__)
#define PX_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PX_TEST_SANITIZED 1
#endif
#endif
#ifndef PX_TEST_SANITIZED
#define PX_TEST_SANITIZED 0
#endif

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        px_test_checks++;                                                                         \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);                    \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#define CHECK_EQ_U64(expected, actual)                                                            \
    do {                                                                                          \
        uint64_t e_ = (uint64_t)(expected), a_ = (uint64_t)(actual);                              \
        px_test_checks++;                                                                         \
        if (e_ != a_) {                                                                           \
            fprintf(stderr, "%s:%d: FAILED: %s\n  expected %" PRIu64 "\n  actual   %" PRIu64 "\n",  \
                    __FILE__, __LINE__, #actual, e_, a_);                                         \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#define CHECK_EQ_INT(expected, actual)                                                            \
    do {                                                                                          \
        long long e_ = (long long)(expected), a_ = (long long)(actual);                           \
        px_test_checks++;                                                                         \
        if (e_ != a_) {                                                                           \
            fprintf(stderr, "%s:%d: FAILED: %s\n  expected %lld\n  actual   %lld\n", __FILE__,     \
                    __LINE__, #actual, e_, a_);                                                   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* |actual - expected| <= rel * |expected| */
#define CHECK_REL(expected, actual, rel)                                                          \
    do {                                                                                          \
        double e_ = (double)(expected), a_ = (double)(actual);                                    \
        px_test_checks++;                                                                         \
        if (!(fabs(a_ - e_) <= (rel) * fabs(e_))) {                                               \
            fprintf(stderr, "%s:%d: FAILED: %s\n  expected %.9g (within %g relative)\n  actual   %.9g (%.3g off)\n", \
                    __FILE__, __LINE__, #actual, e_, (double)(rel), a_, fabs(a_ - e_) / fabs(e_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#define CHECK_STR(expected, actual)                                                               \
    do {                                                                                          \
        const char *e_ = (expected), *a_ = (actual);                                              \
        px_test_checks++;                                                                         \
        if (strcmp(e_, a_) != 0) {                                                                \
            fprintf(stderr, "%s:%d: FAILED: %s\n  expected \"%s\"\n  actual   \"%s\"\n", __FILE__, \
                    __LINE__, #actual, e_, a_);                                                   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* The call must succeed; on failure print its message. */
#define CHECK_OK(call, err)                                                                       \
    do {                                                                                          \
        px_test_checks++;                                                                         \
        int rc_ = (call);                                                                         \
        if (rc_ != 0) {                                                                           \
            fprintf(stderr, "%s:%d: FAILED: %s returned %d: %s\n", __FILE__, __LINE__, #call, rc_, \
                    (err).msg);                                                                   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* The call must fail with PX_EINPUT and a message containing `needle`. */
#define CHECK_INPUT_ERROR(call, err, needle)                                                      \
    do {                                                                                          \
        px_test_checks++;                                                                         \
        (err).msg[0] = '\0';                                                                      \
        int rc_ = (call);                                                                         \
        if (rc_ != 2 || !strstr((err).msg, (needle))) {                                           \
            fprintf(stderr, "%s:%d: FAILED: %s\n  expected status 2 with \"%s\"\n  got %d: \"%s\"\n", \
                    __FILE__, __LINE__, #call, (needle), rc_, (err).msg);                         \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#define TEST_DONE(name)                                                                           \
    do {                                                                                          \
        printf("%s: %d checks passed\n", (name), px_test_checks);                                 \
        return 0;                                                                                 \
    } while (0)

/* Every line of want is a whole line of text; no line of text contains a string of not_want. */
static inline void expect_lines(const char *what, const char *text, const char *const *want, const char *const *not_want)
{
    for (const char *const *w = want; w && *w; w++) {
        px_test_checks++;
        const size_t n = strlen(*w);
        const char *at = text;
        int found = 0;
        while (!found && (at = strstr(at, *w)) != NULL) {
            found = (at == text || at[-1] == '\n') && (at[n] == '\n' || at[n] == '\0');
            at++;
        }
        if (!found) {
            fprintf(stderr, "FAILED: %s lacks the line\n%s\n--- got:\n%s", what, *w, text);
            exit(1);
        }
    }
    for (const char *const *w = not_want; w && *w; w++) {
        px_test_checks++;
        if (strstr(text, *w)) {
            fprintf(stderr, "FAILED: %s has '%s':\n%s", what, *w, text);
            exit(1);
        }
    }
}

#endif
