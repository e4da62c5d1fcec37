/* test_json.c — the strict JSON reader (io/json.c): values of every kind,
 * escapes and surrogate pairs decoded to UTF-8 (bytes written by hand), the
 * last of repeated keys, and refusals naming the byte where the text goes
 * wrong; nothing stays allocated. */
#include <string.h>
#include "check.h"
#include "io/json.h"

static void refused(fr_ctx *ctx, const char *text, const char *needle) {
    fr_json v;
    fr_status st = fr_json_parse(ctx, "t.json", text, strlen(text), &v);
    CHECK(st == FR_ERR_FORMAT && strstr(fr_last_error(ctx), needle),
          "'%s': status %d, '%s' (wanted '%s')", text, st, fr_last_error(ctx), needle);
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    const char *t =
        " {\"r\": 8, \"lora_alpha\": -1.5e1, \"t\": [\"a\\\"b\", \"\\u00e9\\ud83d\\ude00\"],"
        " \"x\": {\"y\": null}, \"b\": true, \"r\": 16} ";
    fr_json v;
    fr_status st = fr_json_parse(ctx, "t.json", t, strlen(t), &v);
    CHECK(st == FR_OK, "parse: %s", fr_last_error(ctx));
    if (!st) {
        const fr_json *r = fr_json_get(&v, "r"), *a = fr_json_get(&v, "lora_alpha");
        const fr_json *l = fr_json_get(&v, "t"), *x = fr_json_get(&v, "x");
        CHECK(v.kind == FR_JSON_OBJECT && v.n == 6, "an object of 6 members");
        CHECK(r && r->kind == FR_JSON_NUMBER && r->number == 16, "the last 'r' (16)");
        CHECK(a && a->number == -15.0, "-1.5e1 is -15");
        CHECK(l && l->kind == FR_JSON_ARRAY && l->n == 2 && !strcmp(l->items[0].str, "a\"b") &&
                  !strcmp(l->items[1].str, "\xc3\xa9\xf0\x9f\x98\x80"),
              "strings decoded: e-acute C3 A9, U+1F600 F0 9F 98 80");
        CHECK(x && x->kind == FR_JSON_OBJECT && fr_json_get(x, "y") &&
                  fr_json_get(x, "y")->kind == FR_JSON_NULL,
              "nested null");
        CHECK(fr_json_get(&v, "b")->boolean == 1 && !fr_json_get(&v, "zz"), "true; no 'zz'");
        fr_json_free(ctx, &v);
    }
    refused(ctx, "{\"a\": 1,}", "byte 8: expected a member name");
    refused(ctx, "{\"a\" 1}", "byte 5: expected ':'");
    refused(ctx, "[1 2]", "byte 3: expected ',' or ']'");
    refused(ctx, "{\"a\": 01}", "byte 7: expected ',' or '}'");
    refused(ctx, "[1.]", "fraction without digits");
    refused(ctx, "[1e400]", "out of range");
    refused(ctx, "\"abc", "without its closing quote");
    refused(ctx, "\"a\\x\"", "bad escape");
    refused(ctx, "\"\\ud83d\"", "high surrogate without its low one");
    refused(ctx, "\"\\u0000\"", "NUL character");
    refused(ctx, "\"a\tb\"", "control character");
    refused(ctx, "{} x", "byte 3: text after the value");
    refused(ctx, "tru", "expected a value");
    refused(ctx, "", "byte 0: expected a value, found the end");
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    fr_json d;
    st = fr_json_parse(ctx, "t.json", deep, 130, &d);
    CHECK(st == FR_ERR_FORMAT && strstr(fr_last_error(ctx), "deeper than 64"), "depth: %s",
          fr_last_error(ctx));
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    CHECK(s.allocated_total == 0, "%zu bytes left allocated", s.allocated_total);
    fr_ctx_free(ctx);
    return check_done();
}
