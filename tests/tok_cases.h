/* tok_cases.h — the reference files of the tokenizer tests
 * (tests/data/tok/{bpe,spm}_cases.txt, made by tests/ref/tok_ref.py): a
 * sequence of cases, each
 *     case NAME\n  text N\n <N bytes>\n
 * then lists, each  KEY N\n  and either N ids separated by spaces or N raw
 * bytes, then \n. A reader of that file and of whole files for the tests. */
#ifndef FR_TOK_CASES_H
#define FR_TOK_CASES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_MAX_CASES 16
#define TOK_MAX_LISTS 2

typedef struct tok_list {
    char key[32];
    size_t n;
    int32_t *ids; /* or */
    char *bytes;
} tok_list;

typedef struct tok_case {
    char name[64];
    char *text;
    size_t len;
    tok_list lists[TOK_MAX_LISTS];
    int nlists;
} tok_case;

/* The whole file, NUL-terminated, or NULL. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) free(b), b = NULL;
    fclose(f);
    if (b) b[n] = 0, *len = (size_t)n;
    return b;
}

static void spit(const char *path, const char *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) fwrite(bytes, 1, n, f), fclose(f);
}

/* Reads path into cases[]; the number read, -1 on a malformed file. */
static int tok_cases_read(const char *path, tok_case *cases) {
    size_t len, at = 0;
    char *t = slurp(path, &len);
    int nc = 0, bad = 0;
    if (!t) return -1;
    while (at < len && !bad) {
        char line[128], key[32];
        const char *nl = memchr(t + at, '\n', len - at);
        size_t n = 0, ll = nl ? (size_t)(nl - t - at) : 0;
        if (!nl || ll >= sizeof line) break;
        memcpy(line, t + at, ll), line[ll] = 0;
        at += ll + 1;
        if (!strncmp(line, "case ", 5)) {
            if (nc == TOK_MAX_CASES) break;
            memset(&cases[nc], 0, sizeof cases[nc]);
            snprintf(cases[nc++].name, 64, "%.63s", line + 5);
            continue;
        }
        if (sscanf(line, "%31s %zu", key, &n) != 2 || !nc) break;
        tok_case *c = &cases[nc - 1];
        if (!strcmp(key, "text") || !strcmp(key, "decoded")) {
            char *b = malloc(n + 1);
            if (!b || at + n > len) break;
            memcpy(b, t + at, n), b[n] = 0;
            at += n + 1;
            if (!strcmp(key, "text")) {
                c->text = b, c->len = n;
                continue;
            }
            if (c->nlists == TOK_MAX_LISTS) break;
            tok_list *l = &c->lists[c->nlists++];
            snprintf(l->key, sizeof l->key, "%s", key), l->bytes = b, l->n = n;
            continue;
        }
        if (c->nlists == TOK_MAX_LISTS) break;
        tok_list *l = &c->lists[c->nlists++];
        snprintf(l->key, sizeof l->key, "%s", key);
        l->n = n;
        l->ids = malloc((n ? n : 1) * sizeof *l->ids);
        for (size_t i = 0; i < n; i++) {
            char *end;
            l->ids[i] = (int32_t)strtol(t + at, &end, 10);
            if (end == t + at) bad = 1;
            at = (size_t)(end - t) + 1;
        }
        if (!n) at++;
    }
    int ok = at >= len && !bad;
    free(t);
    return ok ? nc : -1;
}

static const tok_list *tok_case_list(const tok_case *c, const char *key) {
    for (int i = 0; i < c->nlists; i++)
        if (!strcmp(c->lists[i].key, key)) return &c->lists[i];
    return NULL;
}

static void tok_cases_free(tok_case *cases, int n) {
    for (int i = 0; i < n; i++) {
        free(cases[i].text);
        for (int k = 0; k < cases[i].nlists; k++)
            free(cases[i].lists[k].ids), free(cases[i].lists[k].bytes);
    }
}

#endif
