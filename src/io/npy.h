/* npy.h — the header of a NumPy .npy file: the magic \x93NUMPY, version
 * 1.0 (2-byte header length) or 2.0/3.0 (4-byte), then a Python dict
 * literal {'descr': ..., 'fortran_order': ..., 'shape': (...)} padded with
 * spaces to the first element. One parser for every reader of .npy
 * (data/dataset.c's images, labels and targets, data/tokens.c's token ids).
 * It owns the syntax and the element types it knows; which types, ranks and
 * sizes a reader takes, and whether the file's length matches, are the
 * reader's. Every fault is FR_ERR_FORMAT with "<name>: byte <position>:
 * <fault>" (or "<name>: <fault>" where no byte is to blame). */
#ifndef FR_NPY_H
#define FR_NPY_H

#include <stddef.h>
#include <stdint.h>
#include "core/ctx.h"

#define FR_NPY_DIMS_MAX 4            /* more is refused: no reader takes more */
#define FR_NPY_HEADER_MAX (1u << 20) /* the longest dict a reader need accept */

/* Element types, by the descriptor numpy writes. Big-endian descriptors are
 * refused by the parser; any other descriptor is FR_NPY_OTHER, for the
 * reader to refuse in its own terms. */
typedef enum fr_npy_type {
    FR_NPY_OTHER,
    FR_NPY_U1, /* '|u1' */
    FR_NPY_U2, /* '<u2' */
    FR_NPY_I4, /* '<i4' */
    FR_NPY_I8, /* '<i8' */
    FR_NPY_F4, /* '<f4' */
    FR_NPY_F8, /* '<f8' */
} fr_npy_type;

typedef struct fr_npy {
    fr_npy_type type;
    char descr[32];  /* as the file writes it, for messages */
    size_t descr_at; /* file byte of descr's opening quote, for messages */
    unsigned size;   /* bytes an element: 1, 2, 4 or 8; 0 for FR_NPY_OTHER */
    int fortran;     /* fortran_order True: accepted only with at most one
                          dimension, where both orders lay the elements out alike */
    int ndim;        /* 0 (a scalar) to FR_NPY_DIMS_MAX */
    int64_t shape[FR_NPY_DIMS_MAX];
    uint64_t off;   /* byte of element 0: the preamble plus the dict */
    uint64_t bytes; /* off + numel * size: the file's exact length (0 for FR_NPY_OTHER) */
} fr_npy;

/* Parses the header from the first `have` bytes of a file named `name` (in
 * messages). A dict longer than max_dict bytes is refused (readers of small
 * arrays pass less than FR_NPY_HEADER_MAX); so is a header running past
 * `have`. Returns FR_OK and fills *h, or FR_ERR_FORMAT with a message on
 * ctx (and *h undefined). */
fr_status fr_npy_parse(fr_ctx *ctx, const char *name, const unsigned char *b, size_t have,
                       uint32_t max_dict, fr_npy *h);

/* The bytes a whole header takes (preamble plus the dict's declared length,
 * the length capped at max_dict) as its first `have` bytes tell: what a
 * reader must read before calling fr_npy_parse. 12 while have < 12 (the
 * longest preamble); b's magic is not checked. */
uint64_t fr_npy_header_bytes(const unsigned char *b, size_t have, uint32_t max_dict);

#endif
