// SPDX-License-Identifier: Apache-2.0
/* What the libFuzzer harnesses share (tests/fuzz/README.md): the fuzzer's
 * bytes read in order, failure reports, buffers of exactly the bytes a
 * tensor reaches, and random tensor layouts. */
#ifndef FD_FUZZ_SUPPORT_H
#define FD_FUZZ_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "flashdecode.h"

/* ---- the fuzzer's bytes ---------------------------------------------------- */
typedef struct input {
  const uint8_t *data;
  size_t size;
} input;

/* A value in [0, n) (n <= 65536) from the next one or two bytes; 0 once the
 * bytes run out, so a short input is a small, plain problem. */
unsigned take(input *in, unsigned n);

/* A generator seed from every byte of the input: values come from it,
 * structure from the bytes in order. */
uint64_t input_seed(const uint8_t *data, size_t size);

/* ---- failures --------------------------------------------------------------- */
extern const char *fuzz_name;   /* the harness, as failure reports name it */
extern char problem_text[4096]; /* what this input decodes to, for failure reports */

/* Prints the message, the thread's last library error and problem_text,
 * and aborts: libFuzzer saves the input. */
__attribute__((noreturn, format(printf, 1, 2))) void fuzz_fail(const char *format, ...);

/* Appends printf-style text to the text at *cursor (*left bytes left,
 * truncated when full). */
__attribute__((format(printf, 3, 4))) void describe_text(char **cursor, size_t *left, const char *format, ...);

/* Appends a line describing t to the text at *cursor (*left bytes left). */
void describe_tensor(char **cursor, size_t *left, const char *name, const fd_tensor *t);

/* Fails unless the last call on this thread left an error message. */
void require_message(const char *call);

/* Sets a dtype the enum may not name (an unknown one). */
void set_raw_dtype(fd_tensor *t, int raw);

/* ---- buffers of exactly the bytes a tensor reaches ---------------------------- */
typedef struct buffer {
  unsigned char *bytes; /* malloc'd, exactly `size` bytes (0 allowed: any access is reported) */
  size_t size;
  size_t element;
  int64_t elements;
} buffer;

void buffer_alloc(buffer *b, int64_t elements, size_t element, unsigned char fill);
unsigned char *buffer_copy(const buffer *b);
int all_bytes(const unsigned char *bytes, size_t size, unsigned char value);

/* A malloc'd flag per element of b: 1 where an index of t (ndim 3 or 4,
 * laid out over b) lands. */
unsigned char *element_mask(const buffer *b, const fd_tensor *t, int ndim);

/* Chooses strides for a tensor of extents `shape`: the dimensions in a random
 * order (head_dim innermost with stride 1 when `contiguous_last`), padding
 * between them, a dimension broadcast (stride 0) when `may_broadcast`, and
 * arbitrary strides, huge ones included, on extent-1 dimensions (never
 * multiplied by a non-zero index). Returns the elements a buffer needs: one
 * past the furthest element, 0 for an empty tensor. */
int64_t lay_out(input *in, int ndim, const int64_t *shape, int64_t *strides, int contiguous_last, int may_broadcast);

/* Element offset of index (i0, i1, i2, i3) in t (unused indices 0). */
static inline int64_t at(const fd_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2] + i3 * t->strides[3];
}

#endif /* FD_FUZZ_SUPPORT_H */
