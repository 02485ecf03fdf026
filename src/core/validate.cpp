// SPDX-License-Identifier: Apache-2.0
// Argument validation for fd_decode and fd_workspace_size. Every check names
// the argument at fault; nothing here touches tensor contents except
// validate_host_contents, which backends with host memory call.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "core/problem.h"
#include "core/sized_struct.h"

namespace fd {
namespace {

// Checks rank, dtype family, the data's alignment to its elements, extents,
// strides and that the furthest element is addressable with a 64-bit
// element offset. dim_names label each dimension in messages.
StridedView check_tensor(const fd_tensor &t, const char *name, int ndim, const char *const *dim_names,
                         bool contiguous_last_dim) {
  if (t.data == nullptr) fail(FD_ERROR_NULL_POINTER, "%s: data is NULL", name);
  if (!is_known_dtype(t.dtype)) fail(FD_ERROR_INVALID_DTYPE, "%s: unknown dtype %d", name, raw_enum_value(t.dtype));
  // Kernels load whole elements (the CUDA backend's plain-load path too):
  // a misaligned one is undefined behaviour on the host and a fault on the
  // device.
  if (reinterpret_cast<uintptr_t>(t.data) % dtype_bytes(t.dtype) != 0) {
    fail(FD_ERROR_INVALID_ARGUMENT, "%s: data %p is not aligned to its %zu-byte %s elements", name, t.data,
         dtype_bytes(t.dtype), dtype_name(t.dtype));
  }
  if (t.ndim != ndim) fail(FD_ERROR_INVALID_SHAPE, "%s: ndim must be %d, got %d", name, ndim, static_cast<int>(t.ndim));
  StridedView view;
  view.data = t.data;
  int64_t max_offset = 0;
  for (int d = 0; d < ndim; ++d) {
    if (t.shape[d] < 0) {
      fail(FD_ERROR_INVALID_SHAPE, "%s: shape[%d] (%s) must not be negative, got %lld", name, d, dim_names[d],
           static_cast<long long>(t.shape[d]));
    }
    if (t.strides[d] < 0) {
      fail(FD_ERROR_INVALID_STRIDE, "%s: stride of %s must not be negative, got %lld", name, dim_names[d],
           static_cast<long long>(t.strides[d]));
    }
    view.shape[d] = t.shape[d];
    view.strides[d] = t.strides[d];
    if (t.shape[d] > 1) {
      int64_t span = 0;
      if (__builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &span) ||
          __builtin_add_overflow(max_offset, span, &max_offset)) {
        fail(FD_ERROR_INVALID_STRIDE, "%s: stride of %s (%lld) over %lld elements overflows 64-bit element offsets",
             name, dim_names[d], static_cast<long long>(t.strides[d]), static_cast<long long>(t.shape[d]));
      }
    }
  }
  // Backends address elements as data + offset * element size: the furthest
  // byte must lie within one object (at most PTRDIFF_MAX bytes) that ends
  // inside the address space, or those addresses wrap, onto other elements
  // or anywhere. byte_range relies on this too. Empty tensors are never read.
  bool empty = false;
  for (int d = 0; d < ndim; ++d) empty = empty || t.shape[d] == 0;
  uintptr_t span = 0;
  uintptr_t end = 0;
  if (!empty && (__builtin_mul_overflow(static_cast<uintptr_t>(max_offset) + 1, dtype_bytes(t.dtype), &span) ||
                 span > static_cast<uintptr_t>(PTRDIFF_MAX) ||
                 __builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data), span, &end))) {
    fail(FD_ERROR_INVALID_STRIDE,
         "%s: extent runs beyond any memory block or the address space: its furthest element is %lld elements of %zu "
         "bytes past data %p",
         name, static_cast<long long>(max_offset), dtype_bytes(t.dtype), t.data);
  }
  if (contiguous_last_dim && t.shape[ndim - 1] > 1 && t.strides[ndim - 1] != 1) {
    fail(FD_ERROR_INVALID_STRIDE, "%s: stride of %s must be 1, got %lld", name, dim_names[ndim - 1],
         static_cast<long long>(t.strides[ndim - 1]));
  }
  return view;
}

// Outputs are written by many threads at once: no two of their elements may
// share memory (a stride of 0, or dimensions interleaved onto each other),
// or the results race. Sufficient test: with the dimensions of extent > 1
// in increasing stride order, each stride passes the furthest element of
// the dimensions inside it. Empty tensors are never written.
void require_no_overlap(const StridedView &view, int ndim, const char *name) {
  int order[FD_MAX_DIMS];
  int used = 0;
  for (int d = 0; d < ndim; ++d) {
    if (view.shape[d] == 0) return;
    if (view.shape[d] > 1) order[used++] = d;
  }
  for (int i = 1; i < used; ++i) {  // insertion sort by stride: at most 4 dimensions
    for (int j = i; j > 0 && view.strides[order[j]] < view.strides[order[j - 1]]; --j)
      std::swap(order[j], order[j - 1]);
  }
  int64_t furthest = 0;  // element offset of the furthest element of the dimensions so far
  for (int i = 0; i < used; ++i) {
    const int d = order[i];
    if (view.strides[d] <= furthest) {
      fail(FD_ERROR_INVALID_STRIDE,
           "%s: its strides do not nest (stride %lld of dimension %d reaches no further than the dimensions "
           "inside it), so its elements could share memory; outputs must not overlap",
           name, static_cast<long long>(view.strides[d]), d);
    }
    furthest += (view.shape[d] - 1) * view.strides[d];  // bounded by check_tensor
  }
}

// The bytes from a tensor's first element to the end of its furthest one
// ([begin, end); begin == end when it is empty).
struct ByteRange {
  uintptr_t begin = 0, end = 0;
};

ByteRange byte_range(const StridedView &view, int ndim, size_t element) {
  ByteRange range;
  range.begin = range.end = reinterpret_cast<uintptr_t>(view.data);
  int64_t furthest = 0;
  for (int d = 0; d < ndim; ++d) {
    if (view.shape[d] == 0) return range;
    furthest += (view.shape[d] - 1) * view.strides[d];  // bounded by check_tensor
  }
  range.end = range.begin + (static_cast<uintptr_t>(furthest) + 1) * element;  // cannot wrap: check_tensor
  return range;
}

bool ranges_overlap(const ByteRange &a, const ByteRange &b) {
  return a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end;
}

// Whether two views are the same elements of the same type (out == q: an
// in-place decode, allowed).
bool same_view(const StridedView &a, const StridedView &b, int ndim) {
  if (a.data != b.data) return false;
  for (int d = 0; d < ndim; ++d) {
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  }
  return true;
}

// An output's bytes must not overlap an input's: the kernels read inputs
// while other threads write outputs. Checked by address range (an input
// interleaved into an output's padding is refused too: rare, and exact
// tests for strided inputs cost more than they save).
// in_place: the call lets this output be that very input (its note says so).
void require_apart(const ByteRange &output, const char *output_name, const ByteRange &input, const char *input_name,
                   bool in_place = false) {
  if (ranges_overlap(output, input)) {
    fail(FD_ERROR_INVALID_ARGUMENT,
         "%s: its bytes %p-%p overlap those of input %s (%p-%p); outputs must not share "
         "memory with inputs%s",
         output_name, reinterpret_cast<void *>(output.begin), reinterpret_cast<void *>(output.end), input_name,
         reinterpret_cast<void *>(input.begin), reinterpret_cast<void *>(input.end),
         in_place ? " (unless the output is that very input: the same data, dtype and strides)" : "");
  }
}

// Whether an element of lse shares a byte with an element of out, given
// that their address ranges overlap (lse in out's padding, say). out's
// strides are nested (require_no_overlap: each passes the furthest element
// of the dimensions inside it), so the row with the highest start at or
// before an address is found greedily, outermost dimension first; an lse
// element touches out exactly when the row before its last byte reaches
// its first. No allocation: this runs inside fd_decode.
bool lse_touches_out(const StridedView &out, size_t out_element, const StridedView &lse) {
  int order[3] = {0, 1, 2};  // out's row dimensions, largest stride first
  std::sort(order, order + 3, [&](int a, int b) { return out.strides[a] > out.strides[b]; });
  const uintptr_t out_begin = reinterpret_cast<uintptr_t>(out.data);
  const uintptr_t row_bytes = static_cast<uintptr_t>(out.shape[3]) * out_element;
  for (int64_t b = 0; b < lse.shape[0]; ++b) {
    for (int64_t t = 0; t < lse.shape[1]; ++t) {
      for (int64_t h = 0; h < lse.shape[2]; ++h) {
        const uintptr_t begin =
            reinterpret_cast<uintptr_t>(lse.data) +
            static_cast<uintptr_t>(b * lse.strides[0] + t * lse.strides[1] + h * lse.strides[2]) * sizeof(float);
        const uintptr_t last = begin + sizeof(float) - 1;
        if (last < out_begin) continue;
        uintptr_t offset = last - out_begin;  // bytes; the row start is found by whole strides
        uintptr_t row_start = out_begin;
        for (int d : order) {
          if (out.shape[d] <= 1) continue;
          const uintptr_t stride = static_cast<uintptr_t>(out.strides[d]) * out_element;
          const uintptr_t index = std::min<uintptr_t>(offset / stride, static_cast<uintptr_t>(out.shape[d] - 1));
          offset -= index * stride;
          row_start += index * stride;
        }
        if (row_start + row_bytes > begin) return true;
      }
    }
  }
  return false;
}

// lse and out are written by different threads: no byte may be both.
// Disjoint address ranges settle it at once; lse in out's padding is looked
// at element by element.
void require_lse_apart_from_out(const StridedView &out, fd_dtype out_dtype, const StridedView &lse) {
  const ByteRange out_bytes = byte_range(out, 4, dtype_bytes(out_dtype));
  const ByteRange lse_bytes = byte_range(lse, 3, sizeof(float));
  if (ranges_overlap(out_bytes, lse_bytes) && lse_touches_out(out, dtype_bytes(out_dtype), lse)) {
    fail(FD_ERROR_INVALID_ARGUMENT,
         "lse: an element shares memory with an element of out (bytes %p-%p and %p-%p); outputs must not overlap",
         reinterpret_cast<void *>(lse_bytes.begin), reinterpret_cast<void *>(lse_bytes.end),
         reinterpret_cast<void *>(out_bytes.begin), reinterpret_cast<void *>(out_bytes.end));
  }
}

// A call's outputs (out, and lse when present), against which each input
// is checked with require_input_apart.
struct Outputs {
  const StridedView &out;
  fd_dtype out_dtype;
  const StridedView *lse;  // null: absent
  ByteRange out_bytes, lse_bytes;

  Outputs(const StridedView &o, fd_dtype dtype, const StridedView *l)
      : out(o),
        out_dtype(dtype),
        lse(l),
        out_bytes(byte_range(o, 4, dtype_bytes(dtype))),
        lse_bytes(l != nullptr ? byte_range(*l, 3, sizeof(float)) : ByteRange{}) {}
};

// An input is read while other threads write the outputs: its bytes must
// not overlap theirs, unless an output is that very input and the call
// allows it there (out_may_be_it: the same data, dtype and strides as out;
// lse_may_be_it: as lse): an in-place call.
void require_input_apart(const Outputs &o, const StridedView &input, int ndim, fd_dtype dtype, const char *name,
                         bool out_may_be_it, bool lse_may_be_it) {
  const ByteRange in_bytes = byte_range(input, ndim, dtype_bytes(dtype));
  const bool out_is_it = out_may_be_it && dtype == o.out_dtype && same_view(o.out, input, 4);
  const bool lse_is_it = lse_may_be_it && o.lse != nullptr && same_view(*o.lse, input, 3);
  if (!out_is_it) require_apart(o.out_bytes, "out", in_bytes, name, out_may_be_it);
  if (!lse_is_it) require_apart(o.lse_bytes, "lse", in_bytes, name, lse_may_be_it);
}

void require_float_dtype(const fd_tensor &t, const char *name) {
  if (!is_float_dtype(t.dtype)) {
    fail(FD_ERROR_INVALID_DTYPE, "%s: dtype must be f32, f16 or bf16, got %s", name, dtype_name(t.dtype));
  }
}

void require_dtype(const fd_tensor &t, const char *name, fd_dtype dtype) {
  if (t.dtype != dtype) {
    fail(FD_ERROR_INVALID_DTYPE, "%s: dtype must be %s, got %s", name, dtype_name(dtype), dtype_name(t.dtype));
  }
}

void require_extent(const StridedView &view, int dim, int64_t expected, const char *name, const char *dim_name,
                    const char *source) {
  if (view.shape[dim] != expected) {
    fail(FD_ERROR_INVALID_SHAPE, "%s: %s must be %lld (from %s), got %lld", name, dim_name,
         static_cast<long long>(expected), source, static_cast<long long>(view.shape[dim]));
  }
}

// out and lse against every input (out may be q itself).
void require_outputs_apart_from_inputs(const Problem &p) {
  const Outputs outputs(p.out, p.out_dtype, p.has_lse ? &p.lse : nullptr);
  require_input_apart(outputs, p.q, 4, p.q_dtype, "q", true, false);
  require_input_apart(outputs, p.k, 4, p.kv_dtype, "k", false, false);
  require_input_apart(outputs, p.v, 4, p.kv_dtype, "v", false, false);
  if (p.has_seq_lens) require_input_apart(outputs, p.seq_lens, 1, FD_DTYPE_I32, "seq_lens", false, false);
  if (p.has_q_lens) require_input_apart(outputs, p.q_lens, 1, FD_DTYPE_I32, "q_lens", false, false);
  if (p.paged) require_input_apart(outputs, p.block_table, 2, FD_DTYPE_I32, "block_table", false, false);
  if (p.has_alibi) require_input_apart(outputs, p.alibi_slopes, 1, FD_DTYPE_F32, "alibi_slopes", false, false);
  if (p.has_sinks) require_input_apart(outputs, p.sinks, 1, FD_DTYPE_F32, "sinks", false, false);
  if (p.has_k_scale) require_input_apart(outputs, p.k_scale, 3, FD_DTYPE_F32, "k_scale", false, false);
  if (p.has_v_scale) require_input_apart(outputs, p.v_scale, 3, FD_DTYPE_F32, "v_scale", false, false);
}

const char *const kQueryDims[] = {"batch", "q_len", "q_heads", "head_dim"};
const char *const kDenseCacheDims[] = {"batch", "kv_capacity", "kv_heads", "head_dim"};
const char *const kPagedCacheDims[] = {"num_pages", "page_size", "kv_heads", "head_dim"};
const char *const kLseDims[] = {"batch", "q_len", "q_heads"};
const char *const kSeqLensDims[] = {"batch"};
const char *const kBlockTableDims[] = {"batch", "max_pages"};
const char *const kPerHeadDims[] = {"q_heads"};
const char *const kNewTokenDims[] = {"batch", "new_len", "kv_heads", "head_dim"};

// An optional per-query-head f32 vector (alibi_slopes, sinks).
bool check_per_head(const fd_tensor &t, const char *name, int64_t q_heads, StridedView *view) {
  if (t.data == nullptr) return false;
  *view = check_tensor(t, name, 1, kPerHeadDims, false);
  require_dtype(t, name, FD_DTYPE_F32);
  require_extent(*view, 0, q_heads, name, "q_heads", "q");
  return true;
}

// An optional per-sequence i32 vector (seq_lens, q_lens): [batch], where
// batch comes from the tensor batch_from names.
bool check_per_sequence(const fd_tensor &t, const char *name, int64_t batch, const char *batch_from,
                        StridedView *view) {
  if (t.data == nullptr) return false;
  *view = check_tensor(t, name, 1, kSeqLensDims, false);
  require_dtype(t, name, FD_DTYPE_I32);
  require_extent(*view, 0, batch, name, "batch", batch_from);
  return true;
}

// The cache's capacity from a dense k or a page pool and its block table,
// and the optional lengths: the same for fd_decode and fd_append_kv
// (Problem, AppendProblem). p.k, p.batch and p.paged are set; batch_from
// names the tensor p.batch comes from.
template <class P>
void check_cache_extent(const fd_tensor &args_block_table, const fd_tensor &args_seq_lens, const char *batch_from,
                        P &p) {
  if (p.paged) {
    p.block_table = check_tensor(args_block_table, "block_table", 2, kBlockTableDims, false);
    require_dtype(args_block_table, "block_table", FD_DTYPE_I32);
    require_extent(p.block_table, 0, p.batch, "block_table", "batch", batch_from);
    p.num_pages = p.k.shape[0];
    p.page_size = p.k.shape[1];
    p.max_pages = p.block_table.shape[1];
    if (p.page_size < 1) {
      fail(FD_ERROR_INVALID_LENGTH, "k: page_size must be at least 1, got %lld", static_cast<long long>(p.page_size));
    }
    if (p.max_pages > FD_MAX_KV_LEN / p.page_size) {
      fail(FD_ERROR_INVALID_LENGTH, "block_table: max_pages (%lld) * page_size (%lld) exceeds %d tokens",
           static_cast<long long>(p.max_pages), static_cast<long long>(p.page_size), FD_MAX_KV_LEN);
    }
    p.kv_capacity = p.max_pages * p.page_size;
    // Entries a sequence uses are clamped into the pool (flashdecode.h,
    // "Lengths and block tables"): there must be a page to clamp to.
    if (p.num_pages == 0 && p.max_pages > 0) {
      fail(FD_ERROR_INVALID_SHAPE, "k: the page pool is empty (num_pages 0) but block_table has %lld columns",
           static_cast<long long>(p.max_pages));
    }
  } else {
    p.kv_capacity = p.k.shape[1];
    if (p.kv_capacity > FD_MAX_KV_LEN) {
      fail(FD_ERROR_INVALID_LENGTH, "k: kv_capacity must be at most %d, got %lld", FD_MAX_KV_LEN,
           static_cast<long long>(p.kv_capacity));
    }
  }

  p.has_seq_lens = check_per_sequence(args_seq_lens, "seq_lens", p.batch, batch_from, &p.seq_lens);
}

const char *const kDenseScaleDims[] = {"batch", "kv_capacity", "kv_heads"};
const char *const kPagedScaleDims[] = {"num_pages", "page_size", "kv_heads"};

// An optional scale tensor of an 8-bit cache: f32, the cache's first three
// dimensions (any strides: 0 broadcasts).
template <class P>
bool check_scale(const fd_tensor &t, const char *name, const P &p, StridedView *view) {
  if (t.data == nullptr) return false;
  const char *const *dims = p.paged ? kPagedScaleDims : kDenseScaleDims;
  *view = check_tensor(t, name, 3, dims, false);
  require_dtype(t, name, FD_DTYPE_F32);
  if (!p.kv_quantized) {
    fail(FD_ERROR_INVALID_DTYPE, "%s: scales apply to 8-bit caches only, and k and v are %s", name,
         dtype_name(p.kv_dtype));
  }
  for (int d = 0; d < 3; ++d) require_extent(*view, d, p.k.shape[d], name, dims[d], "k");
  return true;
}

template <class P>
void check_scales(const fd_tensor &k_scale, const fd_tensor &v_scale, P &p) {
  p.has_k_scale = check_scale(k_scale, "k_scale", p, &p.k_scale);
  p.has_v_scale = check_scale(v_scale, "v_scale", p, &p.v_scale);
}

// k and v of one cache dtype: q's (fd_decode), or any float type (append),
// or one 8-bit type.
template <class P>
void check_cache_dtypes(const fd_tensor &k, const fd_tensor &v, P &p) {
  if (!is_quantized_dtype(k.dtype)) require_float_dtype(k, "k");
  require_dtype(v, "v", k.dtype);
  p.kv_dtype = k.dtype;
  p.kv_quantized = is_quantized_dtype(k.dtype);
}

// Reads the caller's args struct (fd_decode_args, fd_merge_args), honouring
// its struct_size: fields an older caller does not know keep the defaults
// `init` writes, and a newer caller's fields must be zero
// (core/sized_struct.h). `required`: the fields every version has.
template <class Args>
Args read_args(const Args *args, size_t required, size_t (*init)(Args *, size_t), const char *type) {
  if (args == nullptr) fail(FD_ERROR_NULL_POINTER, "args is NULL");
  Args defaults;
  init(&defaults, sizeof defaults);
  return read_sized_struct(*args, defaults, required, "args", type);
}

}  // namespace

Problem validate_decode_args(const fd_decode_args *caller_args) {
  const fd_decode_args args = read_args(caller_args, offsetof(fd_decode_args, num_splits) + sizeof(int32_t),
                                        fd_decode_args_init, "fd_decode_args");
  const bool paged = args.block_table.data != nullptr;
  const char *const *cache_dims = paged ? kPagedCacheDims : kDenseCacheDims;

  Problem p;
  p.q = check_tensor(args.q, "q", 4, kQueryDims, true);
  p.k = check_tensor(args.k, "k", 4, cache_dims, true);
  p.v = check_tensor(args.v, "v", 4, cache_dims, true);
  p.out = check_tensor(args.out, "out", 4, kQueryDims, true);

  require_float_dtype(args.q, "q");
  p.q_dtype = args.q.dtype;
  if (!is_quantized_dtype(args.k.dtype) && args.k.dtype != p.q_dtype) {
    fail(FD_ERROR_INVALID_DTYPE, "k: dtype must be %s (that of q) or an 8-bit cache dtype (e4m3, e5m2, i8), got %s",
         dtype_name(p.q_dtype), dtype_name(args.k.dtype));
  }
  check_cache_dtypes(args.k, args.v, p);
  if (args.out.dtype != p.q_dtype && args.out.dtype != FD_DTYPE_F32) {
    fail(FD_ERROR_INVALID_DTYPE, "out: dtype must be %s (that of q)%s, got %s", dtype_name(p.q_dtype),
         p.q_dtype == FD_DTYPE_F32 ? "" : " or f32", dtype_name(args.out.dtype));
  }
  p.out_dtype = args.out.dtype;

  p.head_dim = p.q.shape[3];
  if (p.head_dim < 1 || p.head_dim > FD_MAX_HEAD_DIM) {
    fail(FD_ERROR_INVALID_HEAD_DIM, "q: head_dim must be in [1, %d], got %lld", FD_MAX_HEAD_DIM,
         static_cast<long long>(p.head_dim));
  }
  require_extent(p.k, 3, p.head_dim, "k", "head_dim", "q");
  require_extent(p.v, 3, p.head_dim, "v", "head_dim", "q");

  p.batch = p.q.shape[0];
  // Bounded so that sequence x head products (rows, planner units) cannot
  // overflow, whatever strides make the tensors' extents addressable.
  if (p.batch > FD_MAX_BATCH) {
    fail(FD_ERROR_INVALID_SHAPE, "q: batch must be at most %d, got %lld", FD_MAX_BATCH,
         static_cast<long long>(p.batch));
  }
  p.q_len = p.q.shape[1];
  p.q_heads = p.q.shape[2];
  p.kv_heads = p.k.shape[2];
  if (p.q_heads < 1 || p.q_heads > FD_MAX_HEADS) {
    fail(FD_ERROR_INVALID_HEAD_COUNT, "q: q_heads must be in [1, %d], got %lld", FD_MAX_HEADS,
         static_cast<long long>(p.q_heads));
  }
  if (p.kv_heads < 1 || p.kv_heads > FD_MAX_HEADS) {
    fail(FD_ERROR_INVALID_HEAD_COUNT, "k: kv_heads must be in [1, %d], got %lld", FD_MAX_HEADS,
         static_cast<long long>(p.kv_heads));
  }
  if (p.q_heads % p.kv_heads != 0) {
    fail(FD_ERROR_INVALID_HEAD_COUNT, "q: q_heads (%lld) must be a multiple of kv_heads (%lld)",
         static_cast<long long>(p.q_heads), static_cast<long long>(p.kv_heads));
  }
  p.group_size = p.q_heads / p.kv_heads;
  if (p.q_len < 1 || p.q_len > FD_MAX_Q_LEN) {
    fail(FD_ERROR_INVALID_SHAPE, "q: q_len must be in [1, %d], got %lld", FD_MAX_Q_LEN,
         static_cast<long long>(p.q_len));
  }
  // k against q first, so that a wrong k is not reported as a wrong v.
  if (!paged) require_extent(p.k, 0, p.batch, "k", "batch", "q");
  for (int d = 0; d < 4; ++d) require_extent(p.v, d, p.k.shape[d], "v", cache_dims[d], "k");
  for (int d = 0; d < 4; ++d) require_extent(p.out, d, p.q.shape[d], "out", kQueryDims[d], "q");
  require_no_overlap(p.out, 4, "out");
  p.paged = paged;

  check_cache_extent(args.block_table, args.seq_lens, "q", p);
  check_scales(args.k_scale, args.v_scale, p);
  if (args.lse.data != nullptr) {
    p.lse = check_tensor(args.lse, "lse", 3, kLseDims, false);
    require_dtype(args.lse, "lse", FD_DTYPE_F32);
    for (int d = 0; d < 3; ++d) require_extent(p.lse, d, p.q.shape[d], "lse", kLseDims[d], "q");
    require_no_overlap(p.lse, 3, "lse");
    require_lse_apart_from_out(p.out, p.out_dtype, p.lse);
    p.has_lse = true;
  }
  p.has_q_lens = check_per_sequence(args.q_lens, "q_lens", p.batch, "q", &p.q_lens);
  p.has_alibi = check_per_head(args.alibi_slopes, "alibi_slopes", p.q_heads, &p.alibi_slopes);
  p.has_sinks = check_per_head(args.sinks, "sinks", p.q_heads, &p.sinks);
  require_outputs_apart_from_inputs(p);

  if (!std::isfinite(args.softmax_scale)) {
    fail(FD_ERROR_INVALID_ARGUMENT, "softmax_scale must be finite, got %g", args.softmax_scale);
  }
  const double scale =
      args.softmax_scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(p.head_dim)) : args.softmax_scale;
  p.softmax_scale = static_cast<float>(scale);
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale == 0.0f) {
    fail(FD_ERROR_INVALID_ARGUMENT, "softmax_scale %g is not representable as a non-zero float", args.softmax_scale);
  }
  // The backends fold log2(e) into the scale in float.
  if (!std::isfinite(p.softmax_scale * 1.4426950408889634f)) {
    fail(FD_ERROR_INVALID_ARGUMENT, "softmax_scale %g is too large: scale * log2(e) must be a finite float",
         args.softmax_scale);
  }

  if (args.num_splits < 0 || args.num_splits > FD_MAX_SPLITS) {
    fail(FD_ERROR_INVALID_SPLITS, "num_splits must be in [0, %d] (0 = automatic), got %d", FD_MAX_SPLITS,
         static_cast<int>(args.num_splits));
  }
  p.requested_splits = args.num_splits;
  if (args.split_tokens < 0 || args.split_tokens > FD_MAX_KV_LEN) {
    fail(FD_ERROR_INVALID_SPLITS, "split_tokens must be in [0, %d] (0 = not fixed), got %lld", FD_MAX_KV_LEN,
         static_cast<long long>(args.split_tokens));
  }
  if (args.split_tokens > 0 && args.num_splits > 0) {
    fail(FD_ERROR_INVALID_SPLITS,
         "split_tokens (%lld) and num_splits (%d) are both set: a fixed split length decides the split count",
         static_cast<long long>(args.split_tokens), static_cast<int>(args.num_splits));
  }
  p.requested_split_tokens = args.split_tokens;

  const int mask = raw_enum_value(args.mask);
  if (mask != FD_MASK_CAUSAL && mask != FD_MASK_NONE) {
    fail(FD_ERROR_INVALID_ARGUMENT, "mask must be FD_MASK_CAUSAL (0) or FD_MASK_NONE (1), got %d", mask);
  }
  p.causal = mask == FD_MASK_CAUSAL;
  if (!std::isfinite(args.logit_softcap) || args.logit_softcap < 0.0f) {
    fail(FD_ERROR_INVALID_ARGUMENT, "logit_softcap must be finite and positive (0: none), got %g",
         static_cast<double>(args.logit_softcap));
  }
  p.softcap = args.logit_softcap;
  if (args.window_left < 0) {
    fail(FD_ERROR_INVALID_ARGUMENT, "window_left must be positive (0: no window), got %lld",
         static_cast<long long>(args.window_left));
  }
  // Positions are below 2^31: a larger window is no window at all, and the
  // clamp keeps every position difference in 32 bits.
  p.window = args.window_left < FD_MAX_KV_LEN ? args.window_left : 0;
  return p;
}

AppendProblem validate_append_args(const fd_append_args *caller_args) {
  const fd_append_args args = read_args(caller_args, offsetof(fd_append_args, block_table) + sizeof(fd_tensor),
                                        fd_append_args_init, "fd_append_args");
  AppendProblem p;
  p.paged = args.block_table.data != nullptr;
  const char *const *cache_dims = p.paged ? kPagedCacheDims : kDenseCacheDims;
  p.k_new = check_tensor(args.k_new, "k_new", 4, kNewTokenDims, true);
  p.v_new = check_tensor(args.v_new, "v_new", 4, kNewTokenDims, true);
  p.k = check_tensor(args.k, "k", 4, cache_dims, true);
  p.v = check_tensor(args.v, "v", 4, cache_dims, true);
  require_float_dtype(args.k_new, "k_new");
  require_dtype(args.v_new, "v_new", args.k_new.dtype);
  p.new_dtype = args.k_new.dtype;
  check_cache_dtypes(args.k, args.v, p);

  p.batch = p.k_new.shape[0];
  p.new_len = p.k_new.shape[1];
  p.kv_heads = p.k.shape[2];
  p.head_dim = p.k.shape[3];
  if (p.batch > FD_MAX_BATCH) {
    fail(FD_ERROR_INVALID_SHAPE, "k_new: batch must be at most %d, got %lld", FD_MAX_BATCH,
         static_cast<long long>(p.batch));
  }
  if (p.new_len > FD_MAX_KV_LEN) {
    fail(FD_ERROR_INVALID_SHAPE, "k_new: new_len must be at most %d, got %lld", FD_MAX_KV_LEN,
         static_cast<long long>(p.new_len));
  }
  if (p.head_dim < 1 || p.head_dim > FD_MAX_HEAD_DIM) {
    fail(FD_ERROR_INVALID_HEAD_DIM, "k: head_dim must be in [1, %d], got %lld", FD_MAX_HEAD_DIM,
         static_cast<long long>(p.head_dim));
  }
  if (p.kv_heads < 1 || p.kv_heads > FD_MAX_HEADS) {
    fail(FD_ERROR_INVALID_HEAD_COUNT, "k: kv_heads must be in [1, %d], got %lld", FD_MAX_HEADS,
         static_cast<long long>(p.kv_heads));
  }
  if (!p.paged) require_extent(p.k, 0, p.batch, "k", "batch", "k_new");
  for (int d = 0; d < 4; ++d) require_extent(p.v, d, p.k.shape[d], "v", cache_dims[d], "k");
  require_extent(p.k_new, 2, p.kv_heads, "k_new", "kv_heads", "k");
  require_extent(p.k_new, 3, p.head_dim, "k_new", "head_dim", "k");
  for (int d = 0; d < 4; ++d) require_extent(p.v_new, d, p.k_new.shape[d], "v_new", kNewTokenDims[d], "k_new");
  require_no_overlap(p.k, 4, "k");
  require_no_overlap(p.v, 4, "v");

  check_cache_extent(args.block_table, args.seq_lens, "k_new", p);
  check_scales(args.k_scale, args.v_scale, p);
  // Only the last kv_capacity new tokens can land in the cache; the
  // elements written must be countable in 64 bits (broadcast inputs and
  // shared pages could otherwise describe more).
  int64_t elements = 0;
  const int64_t landing = std::min(p.new_len, p.kv_capacity);
  if (__builtin_mul_overflow(p.batch, landing, &elements) ||
      __builtin_mul_overflow(elements, p.kv_heads * p.head_dim, &elements)) {
    fail(FD_ERROR_INVALID_SHAPE,
         "k_new: batch (%lld) x new tokens that fit the cache (%lld) x kv_heads x head_dim "
         "overflows 64 bits",
         static_cast<long long>(p.batch), static_cast<long long>(landing));
  }

  // The cache is the output: its bytes stay apart from every input's. k and
  // v may interleave in one allocation (flashdecode.h, fd_append_kv).
  const struct {
    const StridedView *view;
    int ndim;
    fd_dtype dtype;
    const char *name;
    bool present;
  } inputs[] = {{&p.k_new, 4, p.new_dtype, "k_new", true},
                {&p.v_new, 4, p.new_dtype, "v_new", true},
                {&p.k_scale, 3, FD_DTYPE_F32, "k_scale", p.has_k_scale},
                {&p.v_scale, 3, FD_DTYPE_F32, "v_scale", p.has_v_scale},
                {&p.seq_lens, 1, FD_DTYPE_I32, "seq_lens", p.has_seq_lens},
                {&p.block_table, 2, FD_DTYPE_I32, "block_table", p.paged}};
  const struct {
    const StridedView *view;
    const char *name;
  } caches[] = {{&p.k, "k"}, {&p.v, "v"}};
  for (const auto &cache : caches) {
    const ByteRange cache_bytes = byte_range(*cache.view, 4, dtype_bytes(p.kv_dtype));
    for (const auto &input : inputs) {
      if (!input.present) continue;
      require_apart(cache_bytes, cache.name, byte_range(*input.view, input.ndim, dtype_bytes(input.dtype)), input.name);
    }
  }
  return p;
}

void fail_bad_length(int64_t sequence, int64_t length, int64_t kv_capacity, const char *found_by) {
  fail(FD_ERROR_INVALID_LENGTH, "seq_lens[%lld] must be in [0, %lld] (the KV capacity), got %lld%s",
       static_cast<long long>(sequence), static_cast<long long>(kv_capacity), static_cast<long long>(length), found_by);
}

void fail_bad_page(int64_t sequence, int64_t column, int64_t page, int64_t num_pages, const char *found_by) {
  fail(FD_ERROR_INVALID_BLOCK_TABLE, "block_table[%lld][%lld] must be in [0, %lld) (the page pool), got %lld%s",
       static_cast<long long>(sequence), static_cast<long long>(column), static_cast<long long>(num_pages),
       static_cast<long long>(page), found_by);
}

void fail_bad_query_length(int64_t sequence, int64_t q_len_b, int64_t q_len, const char *found_by) {
  fail(FD_ERROR_INVALID_LENGTH, "q_lens[%lld] must be in [0, %lld] (q's q_len), got %lld%s",
       static_cast<long long>(sequence), static_cast<long long>(q_len), static_cast<long long>(q_len_b), found_by);
}

// In the CUDA check's order (check_contents.cuh): by sequence, its q_lens
// entry, its length, then its pages.
void validate_host_contents(const Problem &p) {
  const auto *lens = static_cast<const int32_t *>(p.seq_lens.data);
  const auto *q_lens = static_cast<const int32_t *>(p.q_lens.data);
  const auto *table = static_cast<const int32_t *>(p.block_table.data);
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.has_q_lens) {
      const int64_t q_len_b = q_lens[b * p.q_lens.strides[0]];
      if (q_len_b < 0 || q_len_b > p.q_len) fail_bad_query_length(b, q_len_b, p.q_len, "");
    }
    int64_t len = p.kv_capacity;
    if (p.has_seq_lens) {
      len = lens[b * p.seq_lens.strides[0]];
      if (len < 0 || len > p.kv_capacity) fail_bad_length(b, len, p.kv_capacity, "");
    }
    if (!p.paged) continue;
    const int64_t pages_used = (len + p.page_size - 1) / p.page_size;
    for (int64_t j = 0; j < pages_used; ++j) {
      const int64_t page = table[b * p.block_table.strides[0] + j * p.block_table.strides[1]];
      if (page < 0 || page >= p.num_pages) fail_bad_page(b, j, page, p.num_pages, "");
    }
  }
}

namespace {

const char *const kMergeOutDims[] = {"batch", "q_len", "heads", "head_dim"};
const char *const kMergeLseDims[] = {"batch", "q_len", "heads"};

}  // namespace

MergeProblem validate_merge_args(const fd_merge_args *caller_args) {
  const fd_merge_args args =
      read_args(caller_args, offsetof(fd_merge_args, lse) + sizeof(fd_tensor), fd_merge_args_init, "fd_merge_args");
  if (args.num_states < 1 || args.num_states > FD_MAX_MERGE_STATES) {
    fail(FD_ERROR_INVALID_ARGUMENT, "num_states must be in [1, %d], got %d", FD_MAX_MERGE_STATES,
         static_cast<int>(args.num_states));
  }
  if (args.states_out == nullptr) fail(FD_ERROR_NULL_POINTER, "states_out is NULL");
  if (args.states_lse == nullptr) fail(FD_ERROR_NULL_POINTER, "states_lse is NULL");

  MergeProblem p;
  p.num_states = args.num_states;
  p.out = check_tensor(args.out, "out", 4, kMergeOutDims, true);
  require_float_dtype(args.out, "out");
  p.out_dtype = args.out.dtype;
  p.batch = p.out.shape[0];
  p.q_len = p.out.shape[1];
  p.heads = p.out.shape[2];
  p.head_dim = p.out.shape[3];
  if (p.head_dim < 1 || p.head_dim > FD_MAX_HEAD_DIM) {
    fail(FD_ERROR_INVALID_HEAD_DIM, "out: head_dim must be in [1, %d], got %lld", FD_MAX_HEAD_DIM,
         static_cast<long long>(p.head_dim));
  }
  if (p.heads > FD_MAX_HEADS) {
    fail(FD_ERROR_INVALID_HEAD_COUNT, "out: heads must be at most %d, got %lld", FD_MAX_HEADS,
         static_cast<long long>(p.heads));
  }
  if (p.batch > FD_MAX_BATCH) {
    fail(FD_ERROR_INVALID_SHAPE, "out: batch must be at most %d, got %lld", FD_MAX_BATCH,
         static_cast<long long>(p.batch));
  }
  if (p.q_len > FD_MAX_KV_LEN) {
    fail(FD_ERROR_INVALID_SHAPE, "out: q_len must be at most %d, got %lld", FD_MAX_KV_LEN,
         static_cast<long long>(p.q_len));
  }
  require_no_overlap(p.out, 4, "out");
  if (args.lse.data != nullptr) {
    p.lse = check_tensor(args.lse, "lse", 3, kMergeLseDims, false);
    require_dtype(args.lse, "lse", FD_DTYPE_F32);
    for (int d = 0; d < 3; ++d) require_extent(p.lse, d, p.out.shape[d], "lse", kMergeLseDims[d], "out");
    require_no_overlap(p.lse, 3, "lse");
    require_lse_apart_from_out(p.out, p.out_dtype, p.lse);
    p.has_lse = true;
  }

  const Outputs outputs(p.out, p.out_dtype, p.has_lse ? &p.lse : nullptr);
  for (int s = 0; s < p.num_states; ++s) {
    char out_name[32], lse_name[32];
    snprintf(out_name, sizeof out_name, "states_out[%d]", s);
    snprintf(lse_name, sizeof lse_name, "states_lse[%d]", s);
    p.states_out[s] = check_tensor(args.states_out[s], out_name, 4, kMergeOutDims, true);
    require_float_dtype(args.states_out[s], out_name);
    p.states_dtype[s] = args.states_out[s].dtype;
    for (int d = 0; d < 4; ++d) require_extent(p.states_out[s], d, p.out.shape[d], out_name, kMergeOutDims[d], "out");
    p.states_lse[s] = check_tensor(args.states_lse[s], lse_name, 3, kMergeLseDims, false);
    require_dtype(args.states_lse[s], lse_name, FD_DTYPE_F32);
    for (int d = 0; d < 3; ++d) require_extent(p.states_lse[s], d, p.out.shape[d], lse_name, kMergeLseDims[d], "out");
    // out may be a state's output, and lse its LSE: an in-place merge.
    require_input_apart(outputs, p.states_out[s], 4, p.states_dtype[s], out_name, true, false);
    require_input_apart(outputs, p.states_lse[s], 3, FD_DTYPE_F32, lse_name, false, true);
  }
  return p;
}

}  // namespace fd
