// SPDX-License-Identifier: Apache-2.0
/* What the libFuzzer harnesses share (fuzz_support.h). */
#include "fuzz_support.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t input_seed(const uint8_t *data, size_t size) {
  uint64_t seed = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < size; ++i) seed = (seed ^ data[i]) * 1099511628211ull;
  return seed;
}

/* ---- the fuzzer's bytes ---------------------------------------------------- */
unsigned take(input *in, unsigned n) {
  if (n <= 1) return 0;
  unsigned value = 0;
  for (unsigned span = 1; span < n && in->size > 0; span <<= 8) {
    value = (value << 8) | *in->data++;
    --in->size;
  }
  return value % n;
}

/* ---- failures --------------------------------------------------------------- */
char problem_text[4096];

void fuzz_fail(const char *format, ...) {
  char message[1024];
  va_list ap;
  va_start(ap, format);
  vsnprintf(message, sizeof message, format, ap);
  va_end(ap);
  char last[1024];
  fd_last_error_message(last, sizeof last);
  fprintf(stderr, "\n%s: FAILED: %s\n  this thread's last error message: %s\n%s\n", fuzz_name, message, last,
          problem_text);
  abort();
}

void describe_text(char **cursor, size_t *left, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  int n = vsnprintf(*cursor, *left, format, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= *left) n = (int)*left - 1;
  *cursor += n;
  *left -= (size_t)n;
}

void describe_tensor(char **cursor, size_t *left, const char *name, const fd_tensor *t) {
  int dtype;
  memcpy(&dtype, &t->dtype, sizeof dtype);
  char dims[2][128] = {"", ""};
  const int shown = t->ndim >= 1 && t->ndim <= FD_MAX_DIMS ? t->ndim : FD_MAX_DIMS;
  for (int d = 0; d < shown; ++d) {
    const size_t used[2] = {strlen(dims[0]), strlen(dims[1])};
    snprintf(dims[0] + used[0], sizeof dims[0] - used[0], "%s%lld", d ? "," : "", (long long)t->shape[d]);
    snprintf(dims[1] + used[1], sizeof dims[1] - used[1], "%s%lld", d ? "," : "", (long long)t->strides[d]);
  }
  describe_text(cursor, left, "  %-11s data=%p dtype=%d ndim=%d shape={%s} strides={%s}\n", name, t->data, dtype,
                (int)t->ndim, dims[0], dims[1]);
}

void require_message(const char *call) {
  char message[8];
  if (fd_last_error_message(message, sizeof message) == 0) fuzz_fail("%s failed without a message", call);
}

void set_raw_dtype(fd_tensor *t, int raw) { memcpy(&t->dtype, &raw, sizeof raw); }

/* ---- buffers of exactly the bytes a tensor reaches ---------------------------- */
void buffer_alloc(buffer *b, int64_t elements, size_t element, unsigned char fill) {
  b->elements = elements;
  b->element = element;
  b->size = (size_t)elements * element;
  b->bytes = malloc(b->size);
  if (b->bytes == NULL && b->size != 0) fuzz_fail("out of memory (%zu bytes)", b->size);
  if (b->size) memset(b->bytes, fill, b->size);
}

unsigned char *buffer_copy(const buffer *b) {
  unsigned char *copy = malloc(b->size ? b->size : 1);
  if (copy == NULL) fuzz_fail("out of memory");
  if (b->size) memcpy(copy, b->bytes, b->size);
  return copy;
}

int all_bytes(const unsigned char *bytes, size_t size, unsigned char value) {
  for (size_t i = 0; i < size; ++i)
    if (bytes[i] != value) return 0;
  return 1;
}

unsigned char *element_mask(const buffer *b, const fd_tensor *t, int ndim) {
  unsigned char *mask = calloc(b->elements ? (size_t)b->elements : 1, 1);
  if (mask == NULL) fuzz_fail("out of memory");
  if (b->elements == 0) return mask;
  const int64_t n3 = ndim == 4 ? t->shape[3] : 1;
  for (int64_t i0 = 0; i0 < t->shape[0]; ++i0)
    for (int64_t i1 = 0; i1 < t->shape[1]; ++i1)
      for (int64_t i2 = 0; i2 < t->shape[2]; ++i2)
        for (int64_t i3 = 0; i3 < n3; ++i3) mask[at(t, i0, i1, i2, i3)] = 1;
  return mask;
}

int64_t lay_out(input *in, int ndim, const int64_t *shape, int64_t *strides, int contiguous_last, int may_broadcast) {
  const unsigned style = take(in, 4); /* 0 natural order, 1 shuffled, 2 + padding, 3 + broadcast */
  int order[FD_MAX_DIMS];
  const int outer = contiguous_last ? ndim - 1 : ndim;
  for (int i = 0; i < outer; ++i) order[i] = outer - 1 - i; /* innermost first */
  if (style >= 1) {
    for (int i = outer - 1; i > 0; --i) {
      const int j = (int)take(in, (unsigned)i + 1);
      const int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
  }
  int64_t running = 1;
  if (contiguous_last) {
    strides[ndim - 1] = 1;
    running = (shape[ndim - 1] > 0 ? shape[ndim - 1] : 1) + (style >= 2 ? take(in, 4) : 0);
  }
  for (int i = 0; i < outer; ++i) {
    const int d = order[i];
    strides[d] = running;
    running = running * (shape[d] > 0 ? shape[d] : 1) + (style >= 2 ? take(in, 3) : 0);
  }
  if (style == 3 && may_broadcast && outer > 0) strides[order[take(in, (unsigned)outer)]] = 0;
  if (style >= 1) {
    static const int64_t odd[] = {0, 1, 7, 4096, INT64_MAX};
    for (int d = 0; d < ndim; ++d)
      if (shape[d] == 1 && take(in, 3) == 0) strides[d] = odd[take(in, 5)];
  }
  int64_t furthest = 0;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return 0;
    furthest += (shape[d] - 1) * strides[d];
  }
  return furthest + 1;
}
