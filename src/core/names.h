/* names.h — the words frugal prints for sizes and precisions: bytes in
 * human units and strings in JSON here, the precision names (fr_precision_name and
 * fr_precision_parse, defined in names.c) public in frugal.h. */
#ifndef FR_NAMES_H
#define FR_NAMES_H

#include <stddef.h>
#include <stdio.h>
#include "frugal.h"

/* Bytes in human units into buf (len bytes, always terminated) and return
 * buf: "512 B" below 1 KiB, else one decimal in KiB, MiB or GiB
 * ("1.5 KiB", "3.0 MiB", "2048.0 GiB"); a value that would print as 1024.0
 * of a unit moves up to the next ("1.0 MiB"). */
const char *fr_human_bytes(size_t b, char *buf, int len);
/* s as a JSON string to f: quoted, quotes and backslashes escaped, control
 * characters as \u00XX. */
void fr_json_str(FILE *f, const char *s);

#endif
