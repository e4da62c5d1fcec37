// spm.cc — SentencePiece through libsentencepiece (see spm.h). The only C++
// in frugal: it owns the processor object and turns its statuses and
// exceptions into messages.
#include <sentencepiece_processor.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>
#include "tok/spm.h"

struct fr_spm {
    sentencepiece::SentencePieceProcessor sp;
};

static void say(char *err, size_t errlen, const std::string &what) {
    std::snprintf(err, errlen, "%s", what.c_str());
}

extern "C" fr_spm *fr_spm_load(const void *bytes, size_t len, char *err, size_t errlen) {
    try {
        fr_spm *s = new fr_spm;
        auto st =
            s->sp.LoadFromSerializedProto(absl::string_view(static_cast<const char *>(bytes), len));
        if (!st.ok()) {
            say(err, errlen, st.ToString());
            delete s;
            return nullptr;
        }
        return s;
    } catch (const std::bad_alloc &) {
        say(err, errlen, "out of memory");
    } catch (const std::exception &e) {
        say(err, errlen, e.what());
    }
    return nullptr;
}

extern "C" void fr_spm_free(fr_spm *s) { delete s; }
extern "C" int fr_spm_vocab(const fr_spm *s) { return s->sp.GetPieceSize(); }
extern "C" int fr_spm_bos(const fr_spm *s) { return s->sp.bos_id(); }
extern "C" int fr_spm_eos(const fr_spm *s) { return s->sp.eos_id(); }

extern "C" int fr_spm_encode(fr_spm *s, const char *text, size_t len, int32_t **ids, size_t *n,
                             size_t *cap, char *err, size_t errlen) {
    try {
        std::vector<int> out;
        auto st = s->sp.Encode(absl::string_view(text, len), &out);
        if (!st.ok()) return say(err, errlen, st.ToString()), -1;
        if (*n + out.size() > *cap) {
            size_t c = *cap ? *cap : 256;
            while (c < *n + out.size()) c *= 2;
            void *p = std::realloc(*ids, c * sizeof **ids);
            if (!p) return say(err, errlen, "out of memory for token ids"), -1;
            *ids = static_cast<int32_t *>(p), *cap = c;
        }
        for (size_t i = 0; i < out.size(); i++) (*ids)[*n + i] = out[i];
        *n += out.size();
        return 0;
    } catch (const std::bad_alloc &) {
        say(err, errlen, "out of memory");
    } catch (const std::exception &e) {
        say(err, errlen, e.what());
    }
    return -1;
}

extern "C" int fr_spm_decode(fr_spm *s, const int32_t *ids, size_t n, char **text, size_t *len,
                             char *err, size_t errlen) {
    try {
        std::vector<int> in(ids, ids + n);
        std::string out;
        auto st = s->sp.Decode(in, &out);
        if (!st.ok()) return say(err, errlen, st.ToString()), -1;
        char *p = static_cast<char *>(std::malloc(out.size() + 1));
        if (!p) return say(err, errlen, "out of memory for decoded text"), -1;
        std::memcpy(p, out.data(), out.size());
        p[out.size()] = 0;
        *text = p, *len = out.size();
        return 0;
    } catch (const std::bad_alloc &) {
        say(err, errlen, "out of memory");
    } catch (const std::exception &e) {
        say(err, errlen, e.what());
    }
    return -1;
}
