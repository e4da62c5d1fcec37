/* cmd_tokenize.c — `frugal tokenize`: text files through a tokenizer into
 * llm.c token shards (data/tokens.h's format: 256 int32 header words, magic
 * 20240520, version 1, the count; then uint16 tokens), which `frugal train
 * --data DIR` reads again without the tokenizer.
 *
 * Each file is one document and starts with the tokenizer's BOS when it has
 * one (GPT-2: <|endoftext|>, as llm.c's data scripts put it; --no-bos: none).
 * A byte-level BPE with GPT-2's pre-tokenizer reads a file in chunks of
 * about 1 MiB, each cut after a newline that an ASCII letter, digit or mark
 * follows: that pre-tokenizer never joins across such a cut, so the tokens
 * are those of the whole file (fr_tokenizer_cuttable). SentencePiece (its
 * dummy-prefix space would make a cut visible), a BPE adding a prefix space
 * or with its own Split pattern read each file whole. A shard is written beside its final name and renamed once
 * complete: a stopped run leaves no half shard under a shard's name. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core/names.h"
#include "data/tokens.h"
#include "tok/tokenizer.h"

int cmd_tokenize(int argc, char **argv);

static const char *usage_tokenize =
    "usage: frugal tokenize --tokenizer FILE|DIR --data TEXT --out DIR [options]\n"
    "\n"
    "Encode text with a model's tokenizer into llm.c token shards (uint16) for\n"
    "`frugal train --data DIR`.\n"
    "\n"
    "options:\n"
    "  --tokenizer T       tokenizer.model (SentencePiece), tokenizer.json (byte-level BPE),\n"
    "                      vocab.json (merges.txt beside it), or a directory holding one\n"
    "  --data TEXT         a text file, or a directory of them (walked in byte order of\n"
    "                      names; skipped: names starting with '.', *.dat, symlinks)\n"
    "  --out DIR           the shards' directory (made if missing): DIR/tokens_000000.bin, ...\n"
    "  --shard-tokens N    tokens a shard holds at most (default 100000000, llm.c's)\n"
    "  --no-bos            no BOS token before each file (default: each file is a document\n"
    "                      that starts with BOS when the tokenizer has one)\n"
    "  --json              a JSON summary on stdout\n"
    "  --quiet             no progress lines on stderr\n"
    "  -h, --help          this text\n"
    "\n"
    "example:\n"
    "  frugal tokenize --tokenizer models/smollm --data /usr/share/games/fortunes --out fort\n";

#define CHUNK (1u << 20)

typedef struct job {
    fr_ctx *ctx;
    fr_tokenizer *tok;
    const char *out_dir;
    int64_t shard_tokens, shard_n, total_tokens, total_bytes;
    int shard_index, files, bos, quiet;
    FILE *shard;
    char tmp[4200], final[4200];
    char **names; /* shards written */
    int64_t *counts;
} job;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("frugal tokenize: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static int write_header(FILE *f, int64_t n) {
    int32_t h[256] = {FR_SHARD_MAGIC, FR_SHARD_VERSION, (int32_t)n};
    return fseek(f, 0, SEEK_SET) || fwrite(h, sizeof h, 1, f) != 1;
}

static int shard_close(job *j) {
    if (!j->shard) return 0;
    int bad = write_header(j->shard, j->shard_n) || fflush(j->shard) || fsync(fileno(j->shard));
    bad |= fclose(j->shard) != 0;
    j->shard = NULL;
    if (bad) return fail("%s: %s", j->tmp, strerror(errno));
    if (rename(j->tmp, j->final)) return fail("%s: rename: %s", j->final, strerror(errno));
    char **nn = realloc(j->names, (size_t)(j->shard_index + 1) * sizeof *nn);
    if (nn) j->names = nn;
    int64_t *nc = realloc(j->counts, (size_t)(j->shard_index + 1) * sizeof *nc);
    if (nc) j->counts = nc;
    if (!nn || !nc || !(j->names[j->shard_index] = strdup(j->final))) return fail("out of memory");
    j->counts[j->shard_index++] = j->shard_n;
    return 0;
}

static int shard_open(job *j) {
    snprintf(j->final, sizeof j->final, "%s/tokens_%06d.bin", j->out_dir, j->shard_index);
    snprintf(j->tmp, sizeof j->tmp, "%s/.tokens_%06d.bin.partial", j->out_dir, j->shard_index);
    if (!(j->shard = fopen(j->tmp, "wb"))) return fail("%s: %s", j->tmp, strerror(errno));
    j->shard_n = 0;
    return write_header(j->shard, 0) ? fail("%s: %s", j->tmp, strerror(errno)) : 0;
}

static int put_tokens(job *j, const int32_t *ids, size_t n) {
    uint16_t buf[4096];
    size_t i = 0;
    while (i < n) {
        if (!j->shard && shard_open(j)) return 1;
        size_t k = 0;
        while (i < n && k < 4096 && j->shard_n + (int64_t)k < j->shard_tokens)
            buf[k++] = (uint16_t)ids[i++];
        if (fwrite(buf, 2, k, j->shard) != k) return fail("%s: %s", j->tmp, strerror(errno));
        j->shard_n += (int64_t)k, j->total_tokens += (int64_t)k;
        if (j->shard_n == j->shard_tokens && shard_close(j)) return 1;
    }
    return 0;
}

static int encode_put(job *j, const char *text, size_t len, int bos) {
    int32_t *ids;
    size_t n;
    if (fr_tokenizer_encode(j->tok, text, len, bos, &ids, &n))
        return fail("%s", fr_last_error(j->ctx));
    int r = put_tokens(j, ids, n);
    free(ids);
    return r;
}

static int do_file(job *j, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail("--data %s: %s", path, strerror(errno));
    int whole = !fr_tokenizer_cuttable(j->tok);
    size_t cap = 0, len = 0;
    char *buf = NULL;
    int first = 1, r = 0;
    int64_t before = j->total_tokens, bytes = 0;
    for (;;) {
        if (cap - len < CHUNK) {
            char *nb = realloc(buf, cap + 2 * CHUNK);
            if (!nb) {
                r = fail("out of memory reading %s", path);
                break;
            }
            buf = nb, cap += 2 * CHUNK;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        if (ferror(f)) {
            r = fail("--data %s: read error", path);
            break;
        }
        len += got, bytes += (int64_t)got;
        int eof = got == 0 || feof(f);
        if (!eof && (whole || len < 2 * CHUNK)) continue;
        size_t end = eof ? len : fr_tokenizer_next_cut(buf, len, CHUNK + 1);
        if (end == len && !eof) continue; /* no cut yet: read on */
        if ((r = encode_put(j, buf, end, first && j->bos))) break;
        first = 0;
        if (!j->quiet && isatty(2))
            fprintf(stderr, "\rtokenize: %s: %.1f MB, %" PRId64 " tokens", path,
                    (double)(bytes - (int64_t)(len - end)) / 1e6, j->total_tokens - before);
        memmove(buf, buf + end, len - end);
        len -= end;
        if (eof) {
            if (len && (r = encode_put(j, buf, len, 0))) break;
            break;
        }
    }
    free(buf);
    fclose(f);
    if (r) return r;
    j->files++, j->total_bytes += bytes;
    if (!j->quiet)
        fprintf(stderr, "%stokenize: %s: %" PRId64 " bytes -> %" PRId64 " tokens\n",
                isatty(2) ? "\r\033[K" : "", path, bytes, j->total_tokens - before);
    return 0;
}

static int byte_order(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int walk(job *j, const char *path, int top) {
    struct stat s;
    if (lstat(path, &s)) return fail("--data %s: %s", path, strerror(errno));
    if (S_ISLNK(s.st_mode) && top && stat(path, &s))
        return fail("--data %s: %s", path, strerror(errno));
    if (S_ISREG(s.st_mode)) return do_file(j, path);
    if (!S_ISDIR(s.st_mode)) return top ? fail("--data %s: not a file or a directory", path) : 0;
    struct dirent **list;
    int n = scandir(path, &list, NULL, byte_order);
    if (n < 0) return fail("--data %s: %s", path, strerror(errno));
    int r = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = list[i]->d_name;
        size_t k = strlen(nm);
        if (!r && nm[0] != '.' && !(k >= 4 && !strcmp(nm + k - 4, ".dat"))) {
            char p[4200];
            snprintf(p, sizeof p, "%s/%s", path, nm);
            struct stat e;
            if (!lstat(p, &e) && (S_ISREG(e.st_mode) || S_ISDIR(e.st_mode))) r = walk(j, p, 0);
        }
        free(list[i]);
    }
    free(list);
    return r;
}

int cmd_tokenize(int argc, char **argv) {
    const char *tpath = NULL, *data = NULL, *out = NULL;
    int json = 0, bos = 1, quiet = 0;
    int64_t shard_tokens = 100000000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return fputs(usage_tokenize, stdout), 0;
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-bos")) bos = 0;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--tokenizer") || !strcmp(a, "--data") || !strcmp(a, "--out") ||
                 !strcmp(a, "--shard-tokens")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "frugal tokenize: %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--tokenizer")) tpath = v;
            else if (!strcmp(a, "--data")) data = v;
            else if (!strcmp(a, "--out")) out = v;
            else {
                char *end;
                errno = 0;
                long long x = strtoll(v, &end, 10);
                if (errno || *end || end == v || x < 1) {
                    fprintf(stderr,
                            "frugal tokenize: --shard-tokens '%s': not a positive integer\n", v);
                    return 2;
                }
                shard_tokens = x;
            }
        } else {
            fprintf(stderr,
                    "frugal tokenize: unknown option '%s' (options: --tokenizer, --data, --out, "
                    "--shard-tokens, --no-bos, --json, --quiet, --help)\n",
                    a);
            return 2;
        }
    }
    if (!tpath || !data || !out) {
        fprintf(stderr, "frugal tokenize: needs --tokenizer, --data and --out (see --help)\n");
        return 2;
    }
    if (shard_tokens > INT32_MAX)
        return fail("--shard-tokens %" PRId64 ": over %d", shard_tokens, INT32_MAX);
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fail("out of memory");
    job j = {.ctx = ctx, .out_dir = out, .shard_tokens = shard_tokens, .bos = bos, .quiet = quiet};
    int r = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!(j.tok = fr_tokenizer_load(ctx, tpath))) r = fail("--tokenizer %s", fr_last_error(ctx));
    else if (fr_tokenizer_vocab(j.tok) > 65536)
        r = fail("--tokenizer %s: %d ids do not fit llm.c's uint16 shards (at most 65536)",
                 fr_tokenizer_path(j.tok), fr_tokenizer_vocab(j.tok));
    if (!r && mkdir(out, 0777) && errno != EEXIST) r = fail("--out %s: %s", out, strerror(errno));
    if (!r) {
        char p[4200];
        snprintf(p, sizeof p, "%s/tokens_000000.bin", out);
        if (!access(p, F_OK))
            r = fail("--out %s: holds tokens_000000.bin already (an earlier run?): remove its "
                     "shards or choose another directory",
                     out);
    }
    if (!r) r = walk(&j, data, 1);
    if (!r && j.shard && j.shard_n) r = shard_close(&j);
    if (j.shard) { /* a failure, or an empty last shard: nothing under a shard's name */
        fclose(j.shard);
        unlink(j.tmp);
    }
    if (!r && !j.total_tokens) r = fail("--data %s: no text (no token written)", data);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!r && !quiet)
        fprintf(stderr,
                "tokenize: %d files, %" PRId64 " bytes -> %" PRId64
                " tokens in %d shards, %.2f s\n",
                j.files, j.total_bytes, j.total_tokens, j.shard_index, sec);
    if (!r && json) {
        printf("{\"tokenizer\": ");
        fr_json_str(stdout, fr_tokenizer_path(j.tok));
        printf(", \"kind\": \"%s\", \"vocab\": %d, \"bos\": %d, \"files\": %d, \"bytes\": %" PRId64
               ", \"tokens\": %" PRId64 ", \"seconds\": %.3f, \"mb_per_s\": %.3f, \"shards\": [",
               fr_tokenizer_kind(j.tok), fr_tokenizer_vocab(j.tok),
               bos ? fr_tokenizer_bos(j.tok) : -1, j.files, j.total_bytes, j.total_tokens, sec,
               sec > 0 ? (double)j.total_bytes / 1e6 / sec : 0.0);
        for (int i = 0; i < j.shard_index; i++) {
            printf("%s{\"path\": ", i ? ", " : "");
            fr_json_str(stdout, j.names[i]);
            printf(", \"tokens\": %" PRId64 "}", j.counts[i]);
        }
        printf("]}\n");
    }
    for (int i = 0; i < j.shard_index; i++) free(j.names[i]);
    free(j.names);
    free(j.counts);
    fr_tokenizer_free(j.tok);
    fr_ctx_free(ctx);
    return r;
}
