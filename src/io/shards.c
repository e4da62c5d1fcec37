/* shards.c — weights as Hugging Face stores them: one model.safetensors, or
 * shards (model-00001-of-00002.safetensors, ...) with an index,
 * model.safetensors.index.json, whose "weight_map" names the shard of each
 * tensor. The shards are opened with fr_st_read (headers only) and their
 * entries gathered into one fr_st_file whose fr_st_load reads from the
 * right shard: a loader sees one file either way. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"

#define INDEX_MAX_BYTES (64u << 20) /* an index is a name -> file map: a few hundred KiB */
#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

static char *join(fr_ctx *ctx, const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = fr_alloc(ctx, a + b + 2, FR_MEM_OTHER);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (k && p[k - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static char *dup_str(fr_ctx *ctx, const char *s) { return join(ctx, "", s); }

/* The directory part of path ("." when it has none), as a new string. */
static char *dir_of(fr_ctx *ctx, const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return dup_str(ctx, ".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = fr_alloc(ctx, n + 1, FR_MEM_OTHER);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

static int is_dir(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

static int exists(const char *p) {
    struct stat s;
    return stat(p, &s) == 0;
}

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

/* A shard name of the index: a plain file name beside it (no directories,
 * nothing hidden): what save_pretrained writes. */
static int plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static fr_status read_index(fr_ctx *ctx, const char *index, fr_st_file *out, fr_mem_cat cat) {
    char *text = NULL, *dir = NULL;
    size_t len = 0;
    fr_json root;
    memset(&root, 0, sizeof root);
    memset(out, 0, sizeof *out);
    fr_status st = fr_read_small(ctx, index, "weights index", INDEX_MAX_BYTES, &text, &len);
    if (st) return st;
    st = fr_json_parse(ctx, index, text, len, &root);
    fr_free(ctx, text);
    if (st) return st;
    const fr_json *map = root.kind == FR_JSON_OBJECT ? fr_json_get(&root, "weight_map") : NULL;
    const char **files = NULL;
    int n_files = 0;
    if (!map || map->kind != FR_JSON_OBJECT || map->n == 0) {
        st = fr_fail(ctx, FR_ERR_FORMAT,
                     "%s: not a safetensors index: it needs a non-empty object \"weight_map\" "
                     "{tensor name: shard file}",
                     index);
        goto done;
    }
    if (!(files = fr_calloc(ctx, map->n * sizeof *files, FR_MEM_OTHER))) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < map->n; i++) {
        const fr_json *v = &map->items[i];
        if (v->kind != FR_JSON_STRING || !plain_name(v->str)) {
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: byte %zu: weight_map[\"%.80s\"] must be the name of a shard file "
                         "beside the index",
                         index, v->pos, map->keys[i]);
            goto done;
        }
        int k = 0;
        while (k < n_files && strcmp(files[k], v->str)) k++;
        if (k == n_files) files[n_files++] = v->str;
    }
    if (!(dir = dir_of(ctx, index)) ||
        !(out->parts = fr_calloc(ctx, (size_t)n_files * sizeof *out->parts, cat))) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    int total = 0;
    for (int k = 0; k < n_files; k++) {
        char *p = join(ctx, dir, files[k]);
        if (!p) {
            st = FR_ERR_NOMEM;
            goto done;
        }
        if (!exists(p)) {
            st = fr_fail(ctx, FR_ERR_IO, "%s: names shard '%s', which is missing (%s)", index,
                         files[k], p);
            fr_free(ctx, p);
            goto done;
        }
        st = fr_st_read(ctx, p, &out->parts[k], cat);
        fr_free(ctx, p);
        if (st) goto done;
        out->n_parts = k + 1;
        total += out->parts[k].n;
    }
    if (!(out->entries = fr_calloc(ctx, (size_t)(total + 1) * sizeof *out->entries, cat))) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    /* every tensor of every shard, where the index says it is, once */
    for (int k = 0; k < n_files && !st; k++) {
        const fr_st_file *s = &out->parts[k];
        for (int i = 0; i < s->n && !st; i++) {
            const fr_json *where = fr_json_get(map, s->entries[i].name);
            if (!where)
                st = fr_fail(ctx, FR_ERR_FORMAT,
                             "%s: shard '%s' holds tensor '%s', which the index does not name",
                             index, files[k], s->entries[i].name);
            else if (strcmp(where->str, files[k]))
                st = fr_fail(ctx, FR_ERR_FORMAT,
                             "%s: tensor '%s' is in shard '%s', the index says '%s'", index,
                             s->entries[i].name, files[k], where->str);
            else if (fr_st_find(out, s->entries[i].name))
                st = fr_fail(ctx, FR_ERR_FORMAT, "%s: tensor '%s' is in two shards", index,
                             s->entries[i].name);
            else {
                out->entries[out->n] = s->entries[i];
                out->entries[out->n++].part = k;
            }
        }
    }
    for (size_t i = 0; i < map->n && !st; i++)
        if (!fr_st_find(out, map->keys[i]))
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: names tensor '%s' in shard '%s', which does not hold it", index,
                         map->keys[i], map->items[i].str);
    /* the first shard's metadata ("format": "pt") stands for the set */
    if (!st && out->n_parts) {
        memcpy(out->meta, out->parts[0].meta, sizeof out->meta);
        out->n_meta = out->parts[0].n_meta;
    }
done:
    fr_free(ctx, files);
    fr_free(ctx, dir);
    fr_json_free(ctx, &root);
    if (st) fr_st_close(ctx, out);
    return st;
}

fr_status fr_st_open(fr_ctx *ctx, const char *path, fr_st_file *out, fr_mem_cat cat,
                     char **resolved) {
    char *p = NULL;
    fr_status st;
    memset(out, 0, sizeof *out);
    if (resolved) *resolved = NULL;
    if (!path || !path[0]) return fr_fail(ctx, FR_ERR_ARG, "weights: no path given");
    if (is_dir(path)) {
        char *single = join(ctx, path, SINGLE_NAME), *index = join(ctx, path, INDEX_NAME);
        if (!single || !index) {
            fr_free(ctx, single);
            fr_free(ctx, index);
            return FR_ERR_NOMEM;
        }
        if (exists(single)) {
            p = single;
            fr_free(ctx, index);
        } else if (exists(index)) {
            p = index;
            fr_free(ctx, single);
        } else {
            fr_free(ctx, single);
            fr_free(ctx, index);
            return fr_fail(
                ctx, FR_ERR_IO,
                "%s: is a directory, not a regular file, and holds no weights (neither %s nor %s)",
                path, SINGLE_NAME, INDEX_NAME);
        }
    } else if (!(p = dup_str(ctx, path))) {
        return FR_ERR_NOMEM;
    }
    st = ends_with(p, ".index.json") ? read_index(ctx, p, out, cat) : fr_st_read(ctx, p, out, cat);
    if (!st && resolved) *resolved = p;
    else fr_free(ctx, p);
    return st;
}
