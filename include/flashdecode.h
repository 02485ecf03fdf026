// SPDX-License-Identifier: Apache-2.0
/**
 * @file flashdecode.h
 * @brief flashdecode: flash-decoding attention behind a stable C ABI.
 *
 * The newest query tokens of each sequence (one, or up to #FD_MAX_Q_LEN for
 * a speculative step) attend to a long key/value cache. The
 * cache is split along the sequence; each split computes a partial softmax
 * (running max m, running sum l, unnormalised accumulator acc) in parallel,
 * and the splits are merged into the output.
 *
 * This header is the whole public API: if it is not declared here, it is not
 * API. It is C99 and C++ compatible and includes only `<stddef.h>` and
 * `<stdint.h>`; CUDA types are declared opaquely so that no CUDA header is
 * needed to use it.
 *
 * Reading order: version, status codes and errors, tensors, handle creation,
 * the decode call, workspace control, plan descriptions, merging partial
 * results.
 *
 * @par Thread safety
 * - fd_version_number(), fd_version_string(), fd_status_string(),
 *   fd_options_init(), fd_decode_args_init(), fd_plan_info_init(),
 *   fd_merge_args_init(), fd_append_args_init() and fd_last_error_message()
 *   may be called from any thread at any time.
 * - Distinct handles are independent: any calls on different handles may run
 *   concurrently from different threads.
 * - On one handle, calls are serialised by the library: any of them may be
 *   made from several threads at once and they run one at a time.
 *   fd_destroy() waits for a call in progress on the handle; calls that start
 *   after it return #FD_ERROR_INVALID_HANDLE. This orders host calls only: on
 *   CUDA, decodes on one handle share its workspace and must still be ordered
 *   on the device (see fd_decode()). Use one handle per thread or stream for
 *   calls that should run in parallel.
 * - CUDA graph capture in the default cudaStreamCaptureModeGlobal forbids
 *   device allocation, freeing and synchronisation in every thread while
 *   it lasts. The calls on a CUDA handle that do those (fd_create(),
 *   fd_destroy(), fd_reserve_workspace(), fd_set_workspace(), and an
 *   fd_decode() that grows its workspace) fail or invalidate the capture if
 *   another thread is capturing: reserve workspace before capturing, or
 *   capture in cudaStreamCaptureModeThreadLocal.
 * - The detailed error message is thread-local: it describes the last failed
 *   call made by the calling thread.
 *
 * @par Exceptions and crashes
 * No C++ exception ever crosses this ABI. Every argument is checked before any
 * work starts; on error nothing is written to the output and a specific status
 * is returned together with a message naming the offending argument.
 *
 * @par Versioned structs
 * #fd_options, #fd_decode_args, #fd_plan_info, #fd_merge_args and
 * #fd_append_args start with
 * `struct_size`, the sizeof the caller compiled, so that callers built
 * against older and newer headers share one ABI. Later minor versions
 * append fields only past the sizeof of every earlier version (never into
 * its trailing padding), and zero is the default of every field they add.
 * The inputs (#fd_options, #fd_decode_args, #fd_merge_args,
 * #fd_append_args) are read as
 * Linux's
 * copy_struct_from_user() reads a user's struct:
 * - a smaller struct_size (an older caller): the fields it lacks take their
 *   defaults;
 * - a larger struct_size (a newer caller): the bytes past this library's
 *   sizeof belong to fields it does not know. If they are all zero, nothing
 *   is asked of those fields and the call proceeds; if any is not, the call
 *   asks for something this library cannot do and fails with
 *   #FD_ERROR_UNSUPPORTED, whose message names the struct and the offset of
 *   the first non-zero byte, rather than silently ignoring it;
 * - a struct_size too small for the fields every version has, or above
 *   4096 (an uninitialised struct), fails with #FD_ERROR_INVALID_ARGUMENT.
 *
 * Initialising with the `_init` function zeroes every byte of the caller's
 * struct_size, so a newer caller is refused only for a field it set. The
 * output #fd_plan_info is only written, never refused: a newer caller's
 * extra bytes are left as they are.
 */
#ifndef FLASHDECODE_H_INCLUDED
#define FLASHDECODE_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** @brief Marks a function exported from libflashdecode (every other symbol is hidden). */
#if defined(_WIN32)
#define FD_API
#elif defined(__GNUC__) && (__GNUC__ >= 4)
#define FD_API __attribute__((visibility("default")))
#else
#define FD_API
#endif

/* ------------------------------------------------------------------------ */
/** @defgroup version Version
 * The macros describe the header you compiled against; the functions describe
 * the library you loaded. A binding or a dlopen() user compares the two: the
 * ABI is stable within one major version.
 * @{ */

/** @brief Major version: changes when the ABI breaks; it is the SONAME suffix. */
#define FD_VERSION_MAJOR 0
/** @brief Minor version: changes when API is added in an ABI-compatible way. */
#define FD_VERSION_MINOR 3
/** @brief Patch version: changes for fixes only. */
#define FD_VERSION_PATCH 0
/** @brief The version as one number: major * 10000 + minor * 100 + patch. */
#define FD_VERSION_NUMBER (FD_VERSION_MAJOR * 10000 + FD_VERSION_MINOR * 100 + FD_VERSION_PATCH)

/** @brief Helper of #FD_VERSION_STRING: the token @p x as a string literal. Not for use elsewhere. */
#define FD_VERSION_STR_(x) #x
/** @brief Helper of #FD_VERSION_STRING: the expansion of the macro @p x as a string literal. */
#define FD_VERSION_XSTR_(x) FD_VERSION_STR_(x)
/**
 * @brief The version as a string literal, "MAJOR.MINOR.PATCH" (e.g. "0.3.0").
 *
 * Made from the three numbers above, so it cannot disagree with them; the
 * library's fd_version_string() returns it as the library was built.
 */
#define FD_VERSION_STRING \
  FD_VERSION_XSTR_(FD_VERSION_MAJOR) "." FD_VERSION_XSTR_(FD_VERSION_MINOR) "." FD_VERSION_XSTR_(FD_VERSION_PATCH)

/**
 * @brief Version of the loaded library, encoded like #FD_VERSION_NUMBER.
 * @return major * 10000 + minor * 100 + patch of the library at run time.
 */
FD_API unsigned fd_version_number(void);

/**
 * @brief Version of the loaded library as text, e.g. "0.3.0": the
 *        #FD_VERSION_STRING of the header it was built with.
 * @return A static NUL-terminated string; never NULL, never freed.
 */
FD_API const char *fd_version_string(void);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup errors Status codes and error messages
 * Every fallible call returns an ::fd_status; the calling thread's last
 * detailed message names the argument at fault.
 * @{ */

/**
 * @brief Result of every fallible call. Values are pinned and never renumbered.
 *
 * On any status other than #FD_SUCCESS, fd_last_error_message() returns a
 * detailed message for the calling thread, naming the argument at fault.
 */
typedef enum fd_status {
  FD_SUCCESS = 0,                    /**< The call succeeded. */
  FD_ERROR_NULL_POINTER = 1,         /**< A required pointer (handle, argument struct or tensor data) was NULL. */
  FD_ERROR_INVALID_ARGUMENT = 2,     /**< A scalar or pointer argument is invalid (e.g. a non-finite softmax
                                          scale, a struct_size too small or above 4096, tensor data not aligned to
                                          its elements, an output overlapping an input). */
  FD_ERROR_INVALID_DTYPE = 3,        /**< A dtype is unknown, or not allowed for that tensor, or q/k/v dtypes
                                          differ. */
  FD_ERROR_INVALID_HEAD_DIM = 4,     /**< head_dim is out of range for the API or for the handle's backend. */
  FD_ERROR_INVALID_HEAD_COUNT = 5,   /**< A head count is out of range, or query heads are not a multiple of KV
                                          heads. */
  FD_ERROR_INVALID_SHAPE = 6,        /**< A tensor's rank or extents are invalid, or disagree with another
                                          tensor's (batch, heads, head_dim). */
  FD_ERROR_INVALID_STRIDE = 7,       /**< A stride is negative, head_dim is not contiguous (stride of head_dim
                                          must be 1), strides place an element beyond 64-bit offsets or the
                                          address space, or an output's strides are not nested, so that its
                                          elements could share memory (see "What may share memory"). */
  FD_ERROR_INVALID_LENGTH = 8,       /**< A length or extent is out of range; with #FD_CHECK_CONTENTS, a
                                          seq_lens entry outside [0, kv_capacity] or a q_lens entry outside
                                          [0, q_len]. */
  FD_ERROR_INVALID_BLOCK_TABLE = 9,  /**< With #FD_CHECK_CONTENTS: a block table entry that a sequence uses points
                                          outside the page pool. */
  FD_ERROR_INVALID_SPLITS = 10,      /**< num_splits or split_tokens is negative, both are set, or the split count
                                          is larger than #FD_MAX_SPLITS. */
  FD_ERROR_WORKSPACE_TOO_SMALL = 11, /**< The caller-provided workspace is smaller than fd_workspace_size()
                                          requires, or a library-owned one would have to grow during CUDA graph
                                          capture. */
  FD_ERROR_INVALID_HANDLE = 12,      /**< The handle is not live: destroyed, or never created by fd_create()
                                          (detected by address; see fd_destroy()). */
  FD_ERROR_UNSUPPORTED = 13,         /**< Valid input the handle's backend does not support (yet); or a newer
                                          caller's #fd_options, #fd_decode_args, #fd_merge_args or
                                          #fd_append_args with a non-zero byte past this library's struct: a
                                          field this version does not know (see "Versioned structs" above). */
  FD_ERROR_NO_DEVICE = 14,           /**< No usable CUDA device with that ordinal, or the library was built
                                          without CUDA. */
  FD_ERROR_OUT_OF_MEMORY = 15,       /**< Host or device memory could not be allocated, or a workspace size is
                                          beyond what any allocator can satisfy (above PTRDIFF_MAX). */
  FD_ERROR_CUDA = 16,                /**< The CUDA runtime reported an error; the message carries its text. */
  FD_ERROR_INTERNAL = 17             /**< A bug in flashdecode; please report it with the message. */
} fd_status;

/**
 * @brief A short static description of a status, e.g. "invalid shape".
 * @param status Any value; unknown values give "unknown status".
 * @return A static NUL-terminated string; never NULL, never freed.
 */
FD_API const char *fd_status_string(fd_status status);

/**
 * @brief Copies the calling thread's last detailed error message.
 *
 * The message is set by every failing call: the status's description, then
 * the argument at fault and what is wrong with it, e.g. "invalid stride: k:
 * stride of head_dim must be 1, got 3". Successful calls do not clear it. It
 * is empty if this thread has seen no error.
 *
 * @param buffer Where to copy the message (NUL-terminated, truncated to fit);
 *        may be NULL when @p buffer_size is 0, to query the length.
 * @param buffer_size Size of @p buffer in bytes.
 * @return The full length of the message in bytes, without the terminating
 *         NUL (as snprintf does); the message was truncated if this is
 *         >= @p buffer_size.
 */
FD_API size_t fd_last_error_message(char *buffer, size_t buffer_size);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup tensors Tensors
 * Strided views of host or device memory: every input and output of a decode.
 * @{ */

/** @brief Element type of a tensor. Values are pinned. */
typedef enum fd_dtype {
  FD_DTYPE_F32 = 0,  /**< IEEE binary32. */
  FD_DTYPE_F16 = 1,  /**< IEEE binary16 (half). */
  FD_DTYPE_BF16 = 2, /**< bfloat16: the upper 16 bits of a binary32. */
  FD_DTYPE_I32 = 3,  /**< int32, for sequence lengths and block tables. */
  FD_DTYPE_E4M3 = 4, /**< Since 0.3: OCP fp8 E4M3 (`__nv_fp8_e4m3`, `float8_e4m3fn`), for K/V caches: 1 sign,
                          4 exponent (bias 7) and 3 mantissa bits; no infinity, S.1111.111 is NaN, 448 is
                          the largest finite value. */
  FD_DTYPE_E5M2 = 5, /**< Since 0.3: OCP fp8 E5M2 (`__nv_fp8_e5m2`, `float8_e5m2`), for K/V caches: 1 sign,
                          5 exponent (bias 15) and 2 mantissa bits, IEEE-style infinities and NaNs; 57344 is
                          the largest finite value. */
  FD_DTYPE_I8 = 6    /**< Since 0.3: int8 (two's complement), for K/V caches: the value is the integer. */
} fd_dtype;

/** @brief Largest number of dimensions of an #fd_tensor. */
#define FD_MAX_DIMS 4

/**
 * @brief A strided view of memory: pointer, dtype, shape and element strides.
 *
 * The meaning of each dimension is fixed by the tensor's role (see
 * #fd_decode_args); the memory layout is given only by the strides, so BHND
 * (`[batch, heads, seq, dim]`) and BNHD (`[batch, seq, heads, dim]`) caches, or
 * a slice of a larger cache, are all the same call with different strides.
 * The last dimension (head_dim) must be contiguous (stride 1). Strides are in
 * elements, not bytes, and must not be negative; a non-empty tensor's bytes,
 * from `data` to the end of its furthest element, must span at most
 * PTRDIFF_MAX and end inside the address space (#FD_ERROR_INVALID_STRIDE
 * otherwise, e.g. for a stride of INT64_MAX: no memory block is larger).
 * Data must be aligned to its element size (1 byte for the 8-bit types, 2
 * for f16 and bf16, 4 for f32 and i32; #FD_ERROR_INVALID_ARGUMENT
 * otherwise).
 *
 * What may share memory:
 * - Inputs (`q`, `k`, `v`, `seq_lens`, `block_table`) may overlap each
 *   other and may repeat elements: a stride of 0 broadcasts (one query
 *   row for every sequence, one cache for every sequence, one length).
 * - No two elements of an output (`out`, `lse`) may share memory
 *   (#FD_ERROR_INVALID_STRIDE). What is checked is that an output's strides
 *   nest: with its dimensions of extent > 1 in increasing stride order,
 *   each stride passes the furthest element of the dimensions inside it.
 *   Every layout made from a contiguous tensor by slicing, transposing or
 *   padding passes; a stride of 0 on an extent above 1 is refused, and so
 *   are interleaved strides, even where their elements happen to be
 *   distinct (e.g. shape [3, 2] with strides [2, 3]). No element of `out` may be an element
 *   of `lse` (#FD_ERROR_INVALID_ARGUMENT). `lse` may live in the padding
 *   between `out`'s rows.
 * - `out` may be `q` itself (the same data, dtype and strides): the
 *   decode then runs in place. Otherwise an output's bytes (from its first
 *   to the end of its furthest element) must not overlap an input's
 *   (#FD_ERROR_INVALID_ARGUMENT): with `out` in place, `lse` in `out`'s
 *   padding is in `q`'s bytes too, and refused.
 *
 * Memory is host memory for the CPU backend and device memory (of the
 * handle's device) for the CUDA backend.
 */
typedef struct fd_tensor {
  void *data;                   /**< First element; NULL marks an optional tensor as absent. */
  fd_dtype dtype;               /**< Element type. */
  int32_t ndim;                 /**< Number of dimensions used in @p shape and @p strides. */
  int64_t shape[FD_MAX_DIMS];   /**< Extent of each dimension. */
  int64_t strides[FD_MAX_DIMS]; /**< Distance in elements between neighbours along each dimension. */
} fd_tensor;

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup handles Handles
 * A handle holds a backend (CPU or CUDA), its device and its workspace;
 * create one with fd_create() and reuse it across calls.
 * @{ */

/** @brief An opaque decode handle: a backend, its device and its workspace. */
typedef struct fd_handle fd_handle;

/**
 * @brief A CUDA stream (`cudaStream_t`), declared without CUDA headers.
 *
 * NULL is the legacy default stream.
 */
typedef struct CUstream_st *fd_cuda_stream;

/** @brief Which backend a handle runs on. Values are pinned. */
typedef enum fd_backend {
  FD_BACKEND_AUTO = 0, /**< CUDA on fd_options::device if the library has a CUDA backend and the device is
                            usable, else the CPU. */
  FD_BACKEND_CPU = 1,  /**< The multi-threaded CPU backend; always available. */
  FD_BACKEND_CUDA = 2  /**< The CUDA backend on fd_options::device. */
} fd_backend;

/** @brief Largest accepted fd_options::num_threads. */
#define FD_MAX_THREADS 1024

/**
 * @brief Checks a handle makes on what its decodes read, for
 *        fd_options::checks (a bitwise OR). Values are pinned. Since 0.3.
 *
 * The environment variable `FLASHDECODE_CHECKS` adds checks to every handle
 * fd_create() makes, whatever its options say, so that a deployed program
 * can be checked without rebuilding it: `FLASHDECODE_CHECKS=contents`. An
 * unknown word in it (anything but `contents` and `none`, comma-separated)
 * makes fd_create() fail with #FD_ERROR_INVALID_ARGUMENT.
 */
typedef enum fd_check {
  FD_CHECK_NONE = 0,    /**< The default: nothing beyond argument validation. */
  FD_CHECK_CONTENTS = 1 /**< Every fd_decode() checks seq_lens and the block-table entries its sequences use
                             (see "Lengths and block tables" at #fd_decode_args): the CPU backend before any
                             work, the CUDA backend on the device, reporting through the next fd_decode() or
                             fd_check_contents(). Costs one small extra kernel per decode on CUDA. */
} fd_check;

/**
 * @brief Options for fd_create(). Initialise with
 *        `fd_options_init(&options, sizeof options)`.
 *
 * The struct starts with its own size so fields can be appended in later
 * minor versions without breaking callers compiled against older or newer
 * headers: a newer caller's fields that this library does not know must be
 * zero (see "Versioned structs" in the file description).
 */
typedef struct fd_options {
  size_t struct_size;  /**< sizeof(fd_options) as the caller compiled it; set by fd_options_init(). Bytes past
                            this library's sizeof must be zero (#FD_ERROR_UNSUPPORTED otherwise). */
  fd_backend backend;  /**< Backend to use; default #FD_BACKEND_AUTO. */
  int32_t device;      /**< CUDA device ordinal for the CUDA backend; default 0. */
  int32_t num_threads; /**< Worker threads for the CPU backend, at most #FD_MAX_THREADS; 0 (default) uses
                            every online core (up to that). */
  uint32_t reserved_0; /**< The trailing padding of 0.2's struct, named so that no later field lands in it
                            (older libraries would not see it): never read. */
  uint32_t checks;     /**< Since 0.3: #fd_check flags ORed together; default #FD_CHECK_NONE. */
  uint32_t reserved_1; /**< Padding: never read. */
} fd_options;

/**
 * @brief Fills the caller's options struct with defaults and sets its struct_size.
 *
 * Safe across versions: writes exactly @p struct_size bytes, so a caller
 * compiled against an older (smaller) header is never overrun, and bytes this
 * library does not know (a newer header's fields) are zeroed — zero is the
 * default of every field added later.
 *
 * @param options The struct to fill, or NULL to only query the size.
 * @param struct_size sizeof(*options) as the caller compiled it; nothing is
 *        written if it is smaller than sizeof(size_t).
 * @return sizeof(fd_options) of this library, for bindings that check the ABI.
 */
FD_API size_t fd_options_init(fd_options *options, size_t struct_size);

/**
 * @brief Creates a decode handle.
 *
 * Allocates no workspace yet: that happens on the first fd_decode() or on
 * fd_reserve_workspace(). For the CUDA backend this initialises the device's
 * primary context.
 *
 * @param[out] handle Receives the new handle; set to NULL on failure.
 * @param options Options, or NULL for the defaults of fd_options_init().
 * @return #FD_SUCCESS; #FD_ERROR_NULL_POINTER if @p handle is NULL;
 *         #FD_ERROR_INVALID_ARGUMENT for a bad struct_size, backend, thread
 *         count (negative or above #FD_MAX_THREADS), unknown bits in
 *         fd_options::checks, a `FLASHDECODE_CHECKS` value other than a
 *         comma-separated list of `contents` and `none`, or a negative
 *         device with #FD_BACKEND_CUDA (#FD_BACKEND_AUTO takes the CPU
 *         then);
 *         #FD_ERROR_UNSUPPORTED for a non-zero byte past this library's
 *         #fd_options (a newer caller's field; see "Versioned structs");
 *         #FD_ERROR_NO_DEVICE if the CUDA backend was requested but the
 *         device is missing, unavailable (exclusive mode, a driver too old),
 *         cannot run this build's kernels, or the library has no CUDA
 *         backend (#FD_BACKEND_AUTO then takes the CPU instead);
 *         #FD_ERROR_OUT_OF_MEMORY, also when the system refuses a worker
 *         thread; #FD_ERROR_CUDA for other CUDA runtime failures.
 */
FD_API fd_status fd_create(fd_handle **handle, const fd_options *options);

/**
 * @brief Destroys a handle and frees its library-owned workspace.
 *
 * Waits for a call on the handle in progress on another thread, but for no
 * device work: the caller must ensure no decode enqueued with this handle is
 * still running on the device (for example by synchronising the stream it
 * used). Caller-provided workspace is not freed.
 *
 * A handle is recognised by its address: calls on a destroyed handle return
 * #FD_ERROR_INVALID_HANDLE instead of touching freed memory, until a later
 * fd_create() happens to return the same address, which then names the new
 * handle. Do not keep pointers to destroyed handles.
 *
 * @param handle The handle; NULL is accepted and does nothing.
 * @return #FD_SUCCESS; #FD_ERROR_INVALID_HANDLE if it is not live.
 */
FD_API fd_status fd_destroy(fd_handle *handle);

/**
 * @brief Reports the backend a handle runs on (resolves #FD_BACKEND_AUTO).
 * @param handle A live handle.
 * @param[out] backend Receives #FD_BACKEND_CPU or #FD_BACKEND_CUDA.
 * @return #FD_SUCCESS, #FD_ERROR_NULL_POINTER or #FD_ERROR_INVALID_HANDLE.
 */
FD_API fd_status fd_get_backend(const fd_handle *handle, fd_backend *backend);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup decode Decode
 * The call itself: what it reads and writes (::fd_decode_args) and fd_decode().
 * @{ */

/** @brief Largest accepted head_dim. */
#define FD_MAX_HEAD_DIM 256
/** @brief Largest accepted number of query heads (and of KV heads). */
#define FD_MAX_HEADS 4096
/** @brief Largest accepted batch (sequences per call). */
#define FD_MAX_BATCH INT32_MAX
/** @brief Largest accepted KV capacity per sequence (tokens). */
#define FD_MAX_KV_LEN INT32_MAX
/** @brief Largest accepted split count in fd_decode_args::num_splits. */
#define FD_MAX_SPLITS 1024
/** @brief Since 0.3: largest accepted q_len (query tokens per sequence). */
#define FD_MAX_Q_LEN 64

/**
 * @brief Since 0.3: which keys the query tokens of a sequence see
 *        (fd_decode_args::mask). Values are pinned and never renumbered.
 *
 * Query token i of a sequence of length L sits at position
 * `L - q_len + i`: the new tokens are the last q_len of the cache. With one
 * query token both masks are the same.
 */
typedef enum fd_attention_mask {
  FD_MASK_CAUSAL = 0, /**< Token i sees keys `0 .. L - q_len + i` (the default): causal among the new tokens. */
  FD_MASK_NONE = 1    /**< Every query token sees all L keys (e.g. a verify step that scores drafts alike). */
} fd_attention_mask;

/**
 * @brief Everything one decode call reads and writes. Initialise with
 *        `fd_decode_args_init(&args, sizeof args)`, then fill in the tensors.
 *
 * Shapes, by role (dimension order is fixed; layout comes from strides):
 * - `q`:   `[batch, q_len, q_heads, head_dim]`; q_len is 1 for plain
 *          decode and up to #FD_MAX_Q_LEN for speculative or multi-token
 *          steps (0.2 accepted 1 only). The q_len query tokens of a sequence
 *          are its newest tokens: see "Attention variants" below.
 * - `k`, `v` (dense cache, @p block_table absent):
 *          `[batch, kv_capacity, kv_heads, head_dim]`. A BHND cache
 *          `[batch, heads, seq, dim]` is the same tensor with strides
 *          `{H*N*D, D, N*D, 1}`.
 * - `k`, `v` (paged cache, @p block_table present):
 *          `[num_pages, page_size, kv_heads, head_dim]`: the page pool. NHD
 *          pages (`[page, slot, head, dim]`) and HND pages
 *          (`[page, head, slot, dim]`) differ only in strides.
 * - `out`: `[batch, q_len, q_heads, head_dim]`, dtype of q or #FD_DTYPE_F32.
 * - `lse`: optional, `[batch, q_len, q_heads]`, #FD_DTYPE_F32: the natural
 *          logarithm of the softmax denominator, log(sum_j exp(scale * q.k_j)).
 *          Natural log (not base 2), so partial results from different
 *          libraries merge correctly. -inf for an empty sequence.
 * - `seq_lens`: optional, `[batch]`, #FD_DTYPE_I32: tokens of each sequence
 *          (0 allowed: its output is zeros and its LSE -inf). Absent: every
 *          sequence uses the whole kv_capacity. Only the first seq_lens[b]
 *          tokens are ever read, so padding may hold anything, NaN included.
 * - `block_table`: optional, `[batch, max_pages]`, #FD_DTYPE_I32: page
 *          indices into the pool; a sequence's capacity is max_pages * page_size.
 *
 * q is F32, F16 or BF16; k and v share q's dtype, or one 8-bit cache dtype
 * (see "Quantized caches" below). Query head h attends to KV
 * head h / (q_heads / kv_heads) (grouped-query attention; MQA when kv_heads
 * is 1). Scores, the softmax state and the accumulation are float32 whatever
 * the storage type; with 16-bit inputs and a 16-bit output the CUDA backend
 * rounds the softmax weights to the input type before multiplying by V (as
 * FlashAttention does), scaled so that weights down to 2^-29 of the largest
 * keep full fp16 precision, which stays well within that output's precision.
 * An F32 output keeps the weights in float32.
 *
 * Non-finite values. A score is scale * q.k computed in float32, in base 2
 * (q pre-multiplied by scale * log2(e); an ALiBi bias and a sink logit are
 * multiplied by log2(e) likewise), so a score, bias or sink of magnitude
 * above FLT_MAX / log2(e), about 2.36e38, overflows. Both backends then
 * follow these rules:
 * - A score of -inf masks its key: it gets weight 0 (a large negative
 *   score whose float32 product or sum overflows is such a score). A row
 *   whose keys are all masked is zeros with LSE -inf, as an empty sequence.
 * - A score that is NaN or +inf (a NaN in q or k, an infinite q or k
 *   element whose product does not cancel, or an overflow to +inf), and a
 *   sink logit that overflows to +inf in a row that sees a key, make that
 *   row's output and LSE NaN.
 * - A NaN or infinity in v reaches every row that gives its token a
 *   non-zero weight. Under a masked key it may or may not (0 * NaN is NaN
 *   where a kernel multiplies, and a kernel may skip masked blocks), so the
 *   result can depend on the plan: masking does not hide non-finite v.
 * Tokens past a sequence's length are never read and cannot affect it.
 *
 * Lengths and block tables. Their contents are not validated by default
 * (a CUDA backend would have to synchronise to read them), and both backends
 * treat them alike:
 * - each seq_lens entry is clamped to [0, kv_capacity], each q_lens entry
 *   to [0, q_len];
 * - the block-table entries a sequence's tokens use (the first
 *   ceil(len / page_size) of its row) must be in [0, num_pages); the rest
 *   are never read and may hold anything. A used entry outside the pool is
 *   clamped into it: no memory outside k and v is read, and that
 *   sequence's output is meaningless.
 * With #FD_CHECK_CONTENTS in fd_options::checks (or `FLASHDECODE_CHECKS=
 * contents` in the environment) a bad length or used entry is an error,
 * #FD_ERROR_INVALID_LENGTH or #FD_ERROR_INVALID_BLOCK_TABLE naming the
 * first bad element. The CPU backend reports it from the fd_decode() that
 * reads it, before writing anything. The CUDA backend checks on the device
 * (a small kernel ahead of the decode, which still runs, clamped) and
 * records the first bad element it finds; the next fd_decode() on the
 * handle reports it (and then does nothing), or fd_check_contents() does
 * after waiting for the stream. Run under compute-sanitizer, a checked or
 * unchecked decode with bad contents reads nothing out of bounds.
 *
 * Batch invariance. By default the split count comes from the whole
 * batch's shape, so a sequence's result can differ in the last bits with
 * the batch it runs in. With split_tokens > 0 the cache is cut at fixed
 * multiples of split_tokens (rounded up to a multiple of the backend's KV
 * tile; fd_plan_info::split_tokens reports the length used), the kernel and
 * the order of the merge depend only on the fields listed next, and a
 * sequence's out and lse are bitwise identical whether it runs alone or in
 * any batch: whatever the other sequences, the batch size, kv_capacity,
 * whether seq_lens is given, or the CPU backend's thread count. It holds
 * between calls with the same backend, device model and library version,
 * dtypes, head_dim, group size, softmax_scale, cache kind (dense, or paged
 * with one page size) and 16-byte alignment of the cache's rows. The split
 * count, ceil(span / split length), must be at most #FD_MAX_SPLITS
 * (#FD_ERROR_INVALID_SPLITS), the span being kv_capacity, or with a window
 * the keys a query token can see, min(window_left + q_len - 1,
 * kv_capacity). The CUDA backend then merges several splits in a second
 * kernel; docs/performance.md measures what the mode costs.
 *
 * Attention variants (since 0.3; the zero defaults are plain causal
 * attention, bit for bit the result of 0.2). For query token i of a
 * sequence of length L, at position `pos_q = L - q_len + i`, and key j
 * (`pos_k = j`), the score is computed as
 * 1. `s = softmax_scale * q.k_j`;
 * 2. with logit_softcap c > 0: `s = c * tanh(s / c)`;
 * 3. with alibi_slopes: `s += slope[h] * (pos_k - pos_q)`;
 * 4. key j is seen if `j < L` and, with #FD_MASK_CAUSAL, `pos_k <= pos_q`,
 *    and, with window_left W > 0, `pos_q - pos_k < W`;
 * 5. with sinks, the softmax denominator gets `exp(sink[h])` more: out =
 *    sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink[h])), and the LSE is
 *    `log(sum_j exp(s_j) + exp(sink[h]))`.
 * A query token that sees no key (an empty sequence, or q_len > L under
 * the causal mask, whose first q_len - L tokens have a negative position)
 * gets zeros and LSE -inf, or LSE sink[h] with sinks. With a window, only
 * the keys inside the window are read (on a paged cache, only their pages),
 * so the time follows the window, not the length. Every variant works with
 * every cache layout, dtype, GQA ratio, split and merge mode, with batch
 * invariance and under CUDA graph capture (slopes and sinks are read on the
 * device at run time, so a graph replays with their current values).
 *
 * Ragged query lengths (since 0.3). With `q_lens` (`[batch]`, #FD_DTYPE_I32)
 * sequence b has its own number of query tokens, `q_lens[b]` of q's q_len
 * (speculative steps with a different number of drafts per sequence): its
 * tokens are `q[b, 0 .. q_lens[b])`, token i at position
 * `L - q_lens[b] + i`, and everything above holds with q_lens[b] for q_len.
 * The tokens past q_lens[b] are padding: they are never read from q (they
 * may hold anything, NaN included) and get zeros and LSE -inf (LSE sink[h]
 * with sinks), as a query token that sees no key. Entries are clamped to
 * [0, q_len] and checked like the lengths (#FD_CHECK_CONTENTS:
 * #FD_ERROR_INVALID_LENGTH); they are read on the device at run time, so a
 * captured graph replays with their current values. The plan (kernel,
 * splits, workspace) follows q_len, the largest count.
 *
 * Quantized caches (since 0.3). k and v may both be #FD_DTYPE_E4M3,
 * #FD_DTYPE_E5M2 or #FD_DTYPE_I8 (the same one) with q and out as
 * always. Each cache element stands for `stored value * scale`, with its
 * scale from the optional f32 tensors `k_scale` and `v_scale`, whose shape
 * follows the cache without head_dim: `[batch, kv_capacity, kv_heads]`
 * for a dense cache, `[num_pages, page_size, kv_heads]` for a paged one.
 * A stride of 0 broadcasts, so one mechanism covers a per-tensor scale
 * (every stride 0, as vLLM and FlashInfer use), per KV head (strides
 * `{0, 0, 1}`) and per token and head (a full tensor, as int8 caches use).
 * An absent scale is 1. Scales are read on the device at run time, like
 * the lengths, so a captured graph replays with their current values, and
 * only the scales of tokens a query sees are read. Scales may be zero or
 * any finite value; the non-finite rules above apply to the dequantized
 * values (an fp8 NaN, or an E5M2 infinity, is such a value). Both backends
 * decode the formats exactly (subnormals included) and compute in float32;
 * the CUDA backend's tensor-core kernels round the dequantized values to
 * q's 16-bit type before the tensor cores multiply them, so for an F16 q
 * they must lie within its range (they are, for a cache quantized from
 * F16 keys and values). Scales on a 16- or 32-bit cache are
 * #FD_ERROR_INVALID_DTYPE. fd_append_kv() writes new tokens into such a
 * cache.
 */
typedef struct fd_decode_args {
  size_t struct_size;     /**< sizeof(fd_decode_args) as the caller compiled it; set by fd_decode_args_init().
                               Bytes past this library's sizeof must be zero (#FD_ERROR_UNSUPPORTED otherwise). */
  fd_tensor q;            /**< Queries, `[batch, q_len, q_heads, head_dim]`. */
  fd_tensor k;            /**< Key cache (dense or page pool, see above). */
  fd_tensor v;            /**< Value cache, same shape as @p k. */
  fd_tensor out;          /**< Output, `[batch, q_len, q_heads, head_dim]`. */
  fd_tensor lse;          /**< Optional log-sum-exp output (data NULL: not written). */
  fd_tensor seq_lens;     /**< Optional per-sequence KV lengths (data NULL: full capacity). */
  fd_tensor block_table;  /**< Optional paged-cache block table (data NULL: dense cache). */
  double softmax_scale;   /**< Multiplies q.k before the softmax; 0 (default) means 1/sqrt(head_dim). Must
                               be finite, non-zero once rounded to float (|scale| of at least about 1e-45:
                               0 means the default) and finite times log2(e) as a float (|scale| below
                               about 2.3e38); #FD_ERROR_INVALID_ARGUMENT otherwise. Scores it makes
                               overflow follow the non-finite rules above. */
  int32_t num_splits;     /**< Splits of the KV sequence; 0 (default) chooses automatically; at most #FD_MAX_SPLITS. */
  int32_t reserved_0;     /**< The trailing padding of 0.2's struct, named so that no later field lands in it
                               (older libraries would not see it): never read. */
  int64_t split_tokens;   /**< Since 0.3: a fixed split length in KV tokens, for batch-invariant results (see
                               "Batch invariance" above); 0 (default) leaves the splits to num_splits or the
                               planner. Must be in [0, #FD_MAX_KV_LEN] and not set together with
                               num_splits. */
  fd_attention_mask mask; /**< Since 0.3: #FD_MASK_CAUSAL (default) or #FD_MASK_NONE, for q_len > 1 (see
                              "Attention variants" above); another value is #FD_ERROR_INVALID_ARGUMENT. */
  float logit_softcap;    /**< Since 0.3: c > 0 caps scores to `c * tanh(s / c)`; 0 (default) leaves them.
                               Negative or non-finite: #FD_ERROR_INVALID_ARGUMENT. */
  int64_t window_left;    /**< Since 0.3: a sliding window of W > 0 keys: a key is seen if `pos_q - pos_k < W`
                               (W = 1: a query token sees only its own position); 0 (default): no window.
                               Negative: #FD_ERROR_INVALID_ARGUMENT. */
  fd_tensor alibi_slopes; /**< Since 0.3: optional ALiBi slopes, `[q_heads]`, #FD_DTYPE_F32, in the memory of
                               the other inputs: adds `slope[h] * (pos_k - pos_q)` to scores. */
  fd_tensor sinks;        /**< Since 0.3: optional attention-sink logits, `[q_heads]`, #FD_DTYPE_F32, in the
                               memory of the other inputs: `exp(sink[h])` joins each softmax denominator
                               (nothing joins the numerator; the LSE includes it). */
  fd_tensor k_scale;      /**< Since 0.3: optional dequantization scales of an 8-bit @p k, #FD_DTYPE_F32,
                               `[batch, kv_capacity, kv_heads]` (dense) or `[num_pages, page_size, kv_heads]`
                               (paged), strides of 0 broadcast (see "Quantized caches" above). */
  fd_tensor v_scale;      /**< Since 0.3: optional dequantization scales of an 8-bit @p v, as @p k_scale. */
  fd_tensor q_lens;       /**< Since 0.3: optional per-sequence query token counts, `[batch]`, #FD_DTYPE_I32, in
                               the memory of the other inputs (data NULL: every sequence has q_len). See
                               "Ragged query lengths" above. */
} fd_decode_args;

/**
 * @brief Fills the caller's args struct with defaults (all tensors absent,
 *        automatic scale and splits) and sets its struct_size.
 *
 * Writes exactly @p struct_size bytes, like fd_options_init().
 *
 * @param args The struct to fill, or NULL to only query the size.
 * @param struct_size sizeof(*args) as the caller compiled it; nothing is
 *        written if it is smaller than sizeof(size_t).
 * @return sizeof(fd_decode_args) of this library.
 */
FD_API size_t fd_decode_args_init(fd_decode_args *args, size_t struct_size);

/**
 * @brief Computes decode attention for the newest query tokens of every
 *        sequence.
 *
 * For every batch b, query token t and query head h, with no variant set
 * and q_len 1:
 * `out[b,0,h,:] = softmax(scale * q[b,0,h,:] . K[b,0:len_b,g,:]^T) V[b,0:len_b,g,:]`
 * with g the KV head of h's group; several query tokens, masks, windows,
 * softcaps, ALiBi and sinks as in "Attention variants" (#fd_decode_args).
 * The KV sequence is split into
 * fd_decode_args::num_splits parts whose partial softmax states are merged in
 * a fixed order: the same inputs and the same plan give bitwise-identical
 * results.
 *
 * CUDA backend: asynchronous on @p stream; does not allocate, copy to or from
 * the host, or synchronise once the workspace is large enough (see
 * fd_reserve_workspace()), so it may be captured in a CUDA graph. Called
 * during capture with too small a library-owned workspace, it returns
 * #FD_ERROR_WORKSPACE_TOO_SMALL rather than allocate, and the capture stays
 * valid. A captured graph holds the workspace's address: it stays valid
 * until the handle's workspace changes (an fd_decode() or
 * fd_reserve_workspace() that grows it, fd_set_workspace(), fd_destroy()).
 * The handle keeps the plan of its last call and reuses it while the shapes
 * stay the same. Decodes on one handle share its workspace (partial
 * results, and counters that each launch leaves at zero), so they must run
 * one after another on the device: enqueue them on one stream, or on
 * streams ordered by events, graph replays included. Decodes that may run
 * at the same time need one handle each. The call runs on the handle's
 * device whatever device the calling thread has current, and leaves the
 * thread's current context as it found it.
 * CPU backend: synchronous, on the handle's worker threads; @p stream is
 * ignored.
 *
 * Everything is validated before any work; on error the outputs are untouched.
 *
 * @param handle A live handle (calls on it from other threads wait their turn).
 * @param args The problem; see #fd_decode_args.
 * @param stream CUDA stream to enqueue on (NULL: the legacy default stream of the handle's device).
 * @return #FD_SUCCESS or the status of the first problem found; see
 *         fd_last_error_message() for details.
 */
FD_API fd_status fd_decode(fd_handle *handle, const fd_decode_args *args, fd_cuda_stream stream);

/**
 * @brief Waits for the decodes enqueued on @p stream, then reports a bad
 *        length or block-table entry that a checked decode found. Since 0.3.
 *
 * For handles created with #FD_CHECK_CONTENTS (see "Lengths and block
 * tables" at #fd_decode_args). On the CUDA backend the checks run on the
 * device: this synchronises @p stream, and if a decode on this handle has
 * found a seq_lens entry outside [0, kv_capacity], a q_lens entry outside
 * [0, q_len] or a used block-table entry outside the page pool since the
 * last report, returns the status
 * fd_decode() would have (#FD_ERROR_INVALID_LENGTH or
 * #FD_ERROR_INVALID_BLOCK_TABLE) with a message naming the first bad
 * element, and clears the report. On the CPU backend fd_decode() itself
 * reports bad contents, so there is never anything left to report here.
 *
 * @param handle A live handle.
 * @param stream The stream the checked decodes were enqueued on (NULL: the
 *        legacy default stream of the handle's device); ignored on the CPU.
 * @return #FD_SUCCESS if nothing bad was found; #FD_ERROR_INVALID_LENGTH or
 *         #FD_ERROR_INVALID_BLOCK_TABLE; #FD_ERROR_NULL_POINTER;
 *         #FD_ERROR_INVALID_HANDLE; #FD_ERROR_INVALID_ARGUMENT if the handle
 *         checks nothing (created without #FD_CHECK_CONTENTS), or if
 *         @p stream is being captured into a CUDA graph (waiting would
 *         invalidate the capture); #FD_ERROR_CUDA if waiting fails.
 */
FD_API fd_status fd_check_contents(fd_handle *handle, fd_cuda_stream stream);

/**
 * @brief Since 0.3: what fd_append_kv() reads and writes. Initialise with
 *        `fd_append_args_init(&args, sizeof args)`, then fill in the tensors.
 *
 * - `k_new`, `v_new`: `[batch, new_len, kv_heads, head_dim]`, both F32,
 *   F16 or BF16 (the same one): this step's keys and values, new_len >= 0.
 * - `k`, `v`: the cache, exactly as fd_decode() takes it (dense
 *   `[batch, kv_capacity, kv_heads, head_dim]`, or a page pool with
 *   @p block_table), of any cache dtype (F32, F16, BF16, E4M3, E5M2, I8;
 *   k and v alike). Written.
 * - `k_scale`, `v_scale`: optional, as in #fd_decode_args (8-bit caches only).
 * - `seq_lens`: optional `[batch]` I32: each sequence's length *with* the
 *   new tokens (the seq_lens of the fd_decode() of the same step), clamped
 *   to [0, kv_capacity]; absent: kv_capacity.
 * - `block_table`: optional `[batch, max_pages]` I32, as in fd_decode().
 *
 * New token i of sequence b, of length L, goes to position `L - new_len + i`;
 * tokens whose position is negative (L < new_len) are not written. On a
 * paged cache the position's page is `block_table[b][pos / page_size]`; a
 * page outside [0, num_pages) is not written (nothing outside the pool is
 * ever touched), and where two sequences' tables name the same page, each
 * writes only the slots its own positions select. Nothing else of the cache
 * changes.
 *
 * Each element is converted to the cache dtype from `x = new / scale`,
 * computed in float32 (x = new without a scale): F32, F16 and BF16 round to
 * nearest even (IEEE overflow to infinity); E4M3 and E5M2 round to nearest
 * even and saturate to their largest finite value (+-448, +-57344), and
 * store any NaN as 0x7F (as CUDA's conversions do); I8 rounds to nearest
 * even, clamps to [-127, 127] and stores 0 for NaN; a NaN into F16 or BF16
 * stays a NaN (which NaN may differ between backends). A scale of 0 makes
 * x infinite (saturated) or, for 0 / 0, NaN. With per-token scales, write
 * this step's scales first: fd_append_kv() reads the scale of each
 * position it writes. Where positions of two sequences select the same
 * element (their tables share a page slot), which value lands there is
 * unspecified.
 */
typedef struct fd_append_args {
  size_t struct_size;    /**< sizeof(fd_append_args) as the caller compiled it; set by fd_append_args_init(). */
  fd_tensor k_new;       /**< New keys, `[batch, new_len, kv_heads, head_dim]`. */
  fd_tensor v_new;       /**< New values, same shape as @p k_new. */
  fd_tensor k;           /**< Key cache (dense or page pool), written. */
  fd_tensor v;           /**< Value cache, same shape and dtype as @p k, written. */
  fd_tensor k_scale;     /**< Optional scales of an 8-bit @p k (see "Quantized caches" at #fd_decode_args). */
  fd_tensor v_scale;     /**< Optional scales of an 8-bit @p v. */
  fd_tensor seq_lens;    /**< Optional lengths including the new tokens (data NULL: full capacity). */
  fd_tensor block_table; /**< Optional paged-cache block table (data NULL: dense cache). */
} fd_append_args;

/**
 * @brief Since 0.3: fills the caller's append-args struct with defaults (all
 *        tensors absent) and sets its struct_size.
 *
 * Writes exactly @p struct_size bytes, like fd_options_init().
 *
 * @param args The struct to fill, or NULL to only query the size.
 * @param struct_size sizeof(*args) as the caller compiled it; nothing is
 *        written if it is smaller than sizeof(size_t).
 * @return sizeof(fd_append_args) of this library.
 */
FD_API size_t fd_append_args_init(fd_append_args *args, size_t struct_size);

/**
 * @brief Since 0.3: writes this step's new keys and values into the cache,
 *        converting (quantizing) them to its dtype (see #fd_append_args).
 *
 * Asynchronous on the CUDA backend like fd_decode(): it never allocates nor
 * synchronises, reads lengths, block tables and scales on the device at run
 * time, and may be captured into a CUDA graph. An engine appends, then
 * decodes with the same seq_lens. The tensors' memory rules are those of
 * fd_decode() with the cache as the output: no two elements of k (or of v)
 * may share memory, and the bytes of k and v must not overlap an input's.
 * k and v may share one allocation (pages that interleave K and V) but
 * must not share an element: that is not checked, and the result would
 * be either one's values.
 *
 * @param handle A live handle.
 * @param args The tensors; see #fd_append_args.
 * @param stream CUDA stream to enqueue on (NULL: the legacy default stream of the handle's device).
 * @return #FD_SUCCESS or the status of the first problem found (nothing is
 *         written then); see fd_last_error_message().
 */
FD_API fd_status fd_append_kv(fd_handle *handle, const fd_append_args *args, fd_cuda_stream stream);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup workspace Workspace
 * The per-split partial results (m, l, acc) live in a workspace. By default
 * the handle owns it, grows it on demand and reuses it across calls. To keep
 * fd_decode() free of allocation (CUDA graph capture, real-time loops),
 * reserve capacity ahead with fd_reserve_workspace(), or hand the handle
 * memory of your own with fd_set_workspace().
 * @{ */

/**
 * @brief Bytes of workspace fd_decode() needs for a problem on this handle.
 *
 * Depends only on dtypes, shapes, which of seq_lens and block_table are
 * given, num_splits, split_tokens and window_left (and on the CPU backend
 * the handle's thread count: each thread's scratch is in the workspace),
 * never on tensor contents.
 *
 * @param handle A live handle.
 * @param args The problem, validated as fd_decode() validates it.
 * @param[out] bytes Receives the size in bytes (0 if none is needed).
 * @return #FD_SUCCESS or the validation status of @p args.
 */
FD_API fd_status fd_workspace_size(const fd_handle *handle, const fd_decode_args *args, size_t *bytes);

/**
 * @brief Makes sure the handle owns at least @p bytes of workspace.
 *
 * Allocates (on the handle's device for CUDA) if the library-owned workspace
 * is smaller, and then (CUDA) zeroes the state kept at its start and waits
 * for that; never shrinks it. Has no effect on a caller-provided workspace
 * other than checking its size.
 *
 * A size no allocator can satisfy (above PTRDIFF_MAX rounded down to a
 * multiple of 256, e.g. SIZE_MAX or a wrapped subtraction; the message
 * states the limit) is refused with #FD_ERROR_OUT_OF_MEMORY before any
 * allocator sees it, as is a size the allocator refuses. On any error the
 * handle keeps the workspace it had, and later calls use it as before.
 *
 * @param handle A live handle.
 * @param bytes Capacity to reserve, e.g. from fd_workspace_size().
 * @return #FD_SUCCESS; #FD_ERROR_NULL_POINTER; #FD_ERROR_INVALID_HANDLE;
 *         #FD_ERROR_OUT_OF_MEMORY if @p bytes cannot be allocated (or is
 *         above that limit); #FD_ERROR_WORKSPACE_TOO_SMALL if a
 *         caller-provided workspace is smaller than @p bytes;
 *         #FD_ERROR_CUDA if zeroing the state fails.
 */
FD_API fd_status fd_reserve_workspace(fd_handle *handle, size_t bytes);

/**
 * @brief Hands the handle caller-owned workspace memory, or goes back to
 *        library-owned workspace.
 *
 * The memory must be host memory for the CPU backend and device memory of
 * the handle's device for the CUDA backend, aligned to 256 bytes, and stay
 * valid until it is replaced or the handle destroyed. A library-owned
 * workspace is freed. The CUDA backend keeps state between calls at the
 * start of its workspace (counters of the merge fused into the split
 * kernel, 64 KiB): this call zeroes that part and waits until it is done, so
 * the memory must not be in use by other work, and the caller must not
 * write to it while it belongs to the handle.
 *
 * No memory block can be larger than PTRDIFF_MAX bytes or run past the end
 * of the address space: such a @p bytes is refused with
 * #FD_ERROR_INVALID_ARGUMENT (nothing is allocated here, so it is not
 * #FD_ERROR_OUT_OF_MEMORY). On any error the handle keeps the workspace it
 * had.
 *
 * @param handle A live handle.
 * @param workspace The memory, or NULL to return to library-owned workspace.
 * @param bytes Its size in bytes (ignored when @p workspace is NULL).
 * @return #FD_SUCCESS; #FD_ERROR_NULL_POINTER; #FD_ERROR_INVALID_HANDLE;
 *         #FD_ERROR_INVALID_ARGUMENT if misaligned or if @p bytes is
 *         impossible (see above); #FD_ERROR_CUDA if zeroing the state
 *         fails (e.g. host memory given to a CUDA handle).
 */
FD_API fd_status fd_set_workspace(fd_handle *handle, void *workspace, size_t bytes);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup plans Plans
 * What fd_decode() would run for a problem: the split count the planner
 * chose, the kernel, how the splits are merged and how many launches that
 * takes. For logs, tuning and tests; fd_decode() needs none of it. Since 0.2.
 * @{ */

/** @brief How a decode combines the partial results of its splits. Values are pinned. */
typedef enum fd_merge {
  FD_MERGE_NONE = 0,     /**< One split (CUDA): the split kernel writes the output itself. */
  FD_MERGE_SEPARATE = 1, /**< A pass after every split is done: the CUDA merge kernel (a second launch), or
                              the CPU backend's merge pass. */
  FD_MERGE_FUSED = 2,    /**< CUDA: the last thread block of each (sequence, KV head) to finish merges its
                              splits inside the split kernel, counting finished blocks at the start of the
                              workspace. */
  FD_MERGE_CLUSTER = 3   /**< CUDA, compute capability 9.0+: the splits of each (sequence, KV head) run as
                              one thread-block cluster and merge through distributed shared memory. */
} fd_merge;

/**
 * @brief How the split kernel's work is laid out over a batch
 *        (fd_plan_info::schedule). Since 0.3. Values are pinned.
 */
typedef enum fd_schedule {
  FD_SCHEDULE_FIXED = 0,         /**< num_splits splits of split_tokens keys for every (sequence, KV head), in
                                      index order: the CPU backend, and CUDA where none of the others applies. */
  FD_SCHEDULE_LONGEST_FIRST = 1, /**< CUDA: the fixed splits, handed out longest sequence first by a one-block
                                      kernel ahead of the split kernel (lengths on the device; a grid of more
                                      than one wave of blocks, at most two splits a sequence, and splits long
                                      enough for the waves). One of fd_plan_info::launches. */
  FD_SCHEDULE_FITTED = 2,        /**< CUDA: num_splits (2 or more) splits whose length the device fits to the
                                      lengths at run time (lengths on the device in a paged cache, automatic
                                      splits, fewer (sequence, KV head) pairs than the device runs blocks at
                                      once); two or more sequences run on one wave of `blocks`. */
  FD_SCHEDULE_BALANCED = 3       /**< CUDA: each of `blocks` blocks takes an equal share of the batch's keys, cut
                                      at multiples of split_tokens; num_splits is 0 (lengths on the device in
                                      a paged cache, automatic splits). */
} fd_schedule;

/**
 * @brief A description of the work fd_decode() would do for one problem.
 *        Initialise with `fd_plan_info_init(&info, sizeof info)`; filled by
 *        fd_describe_plan().
 *
 * Starts with its own size, like #fd_options: a later minor version may
 * append fields, and fd_describe_plan() writes only the caller's
 * struct_size bytes. An output, so a newer caller's larger struct is never
 * refused: the bytes past this library's sizeof are left as they are.
 */
typedef struct fd_plan_info {
  size_t struct_size;     /**< sizeof(fd_plan_info) as the caller compiled it; set by fd_plan_info_init(). */
  fd_backend backend;     /**< #FD_BACKEND_CPU or #FD_BACKEND_CUDA: the handle's backend. */
  int32_t num_splits;     /**< Splits of the KV sequence: fd_decode_args::num_splits, or the planner's
                               choice when that is 0. Since 0.3, 0 on CUDA when the device cuts each
                               sequence from its length (a paged cache with per-sequence lengths,
                               automatic splits and no split_tokens, on the balanced schedule: each of
                               `blocks` thread blocks takes an equal share of the batch's keys, and a
                               sequence is split where the shares end). */
  int64_t split_tokens;   /**< KV tokens of each split (the last may be shorter or empty); when num_splits
                               is 0, the tile whose multiples the device cuts at. On CUDA, for a paged
                               cache with per-sequence lengths, automatic splits and fewer (sequence, KV
                               head) pairs than the device runs thread blocks at once, the length planned
                               over the capacity (in no more splits than one wave of thread blocks
                               shared out over a sequence's KV heads), which the device replaces at run
                               time: it fits the splits to the lengths (at least 128 tokens each, enough
                               that num_splits cover the longest sequence, long enough that the batch's
                               keys make at most one wave of thread blocks) and skips those past the
                               longest, so a block table much wider than the lengths still spreads each
                               sequence over its splits. */
  size_t workspace_bytes; /**< Workspace the decode needs, as fd_workspace_size() reports. */
  /**
   * The split kernel, as a static NUL-terminated string (never NULL, never
   * freed): `"cpu"`, or on CUDA `"cuda-core-<bucket>"`,
   * `"tensor-core-<bucket>"`, `"tensor-core-wide-<bucket>"`,
   * `"tensor-core-compact-<bucket>"` (paged batches of many sequences),
   * `"tensor-core-rows-<bucket>"` / `"tensor-core-rows64-<bucket>"` (17-32
   * / over 32 query rows a KV head: q_len x group;
   * `"tensor-core-rows64-wide-<bucket>"` on sm_90, also for 17-32 rows in
   * long splits) or
   * `"cuda-core-8bit-<bucket>"` / `"tensor-core-8bit-<bucket>"` /
   * `"tensor-core-8bit-keys-<bucket>"` (8-bit caches; the last with up to
   * 8 query rows a KV head) with the head_dim bucket (64, 128 or 256)
   * whose code runs. For logs: the names may change between versions.
   */
  const char *kernel;
  fd_merge merge;       /**< How the splits' partial results are combined. */
  int32_t launches;     /**< Kernels fd_decode() enqueues: 1 to 3 on CUDA (the split kernel; the merge
                             kernel with #FD_MERGE_SEPARATE; the ordering kernel of
                             #FD_SCHEDULE_LONGEST_FIRST; one more on a handle with #FD_CHECK_CONTENTS),
                             0 on the CPU (and for an empty batch). */
  int64_t blocks;       /**< CUDA: thread blocks of the split kernel's work (batches beyond 65535 are
                             covered by fewer, looping blocks; splits fitted to the lengths of two or
                             more sequences run on one wave of blocks); CPU: tasks of the split pass. */
  fd_schedule schedule; /**< Since 0.3: how the splits are laid out over the batch (#fd_schedule);
                             #FD_SCHEDULE_FIXED on the CPU and for an empty batch. */
  int32_t reserved_0;   /**< Since 0.3: padding, written as 0, named so that no later field lands in it. */
} fd_plan_info;

/**
 * @brief Fills the caller's plan-info struct with zeros and sets its struct_size.
 *
 * Writes exactly @p struct_size bytes, like fd_options_init(); `kernel`
 * points to an empty string rather than being NULL.
 *
 * @param info The struct to fill, or NULL to only query the size.
 * @param struct_size sizeof(*info) as the caller compiled it; nothing is
 *        written if it is smaller than sizeof(size_t).
 * @return sizeof(fd_plan_info) of this library.
 */
FD_API size_t fd_plan_info_init(fd_plan_info *info, size_t struct_size);

/**
 * @brief Describes what fd_decode() would run for @p args on this handle,
 *        without running it.
 *
 * Validates @p args as fd_workspace_size() does (everything fd_decode()
 * checks but the contents of seq_lens, q_lens and block_table, which the CPU
 * backend reads only in fd_decode()) and plans the problem the same way:
 * the same plan, kernel and merge, pointer alignment and strides included.
 * It allocates nothing, enqueues nothing and does not change the handle.
 * The description holds for fd_decode() calls on this handle with the same
 * shapes, strides, split count and pointer alignment. An empty batch runs
 * nothing: #FD_MERGE_NONE, no launches, no blocks.
 *
 * @param handle A live handle.
 * @param args The problem, validated as fd_decode() validates it.
 * @param[in,out] info Initialised with fd_plan_info_init(); receives the
 *        description (only its struct_size bytes are written).
 * @return #FD_SUCCESS; #FD_ERROR_NULL_POINTER if @p info is NULL;
 *         #FD_ERROR_INVALID_ARGUMENT if its struct_size is too small; or
 *         the validation status of @p args. On error @p info is untouched.
 */
FD_API fd_status fd_describe_plan(const fd_handle *handle, const fd_decode_args *args, fd_plan_info *info);

/** @} */

/* ------------------------------------------------------------------------ */
/** @defgroup merge Merging partial results
 * Attention over a cache split into parts computed apart (a shared prefix
 * and each sequence's own suffix, or shards of one cache on several GPUs)
 * is the merge of the parts' outputs by their log-sum-exps. Since 0.3.
 * @{ */

/** @brief Largest accepted fd_merge_args::num_states. */
#define FD_MAX_MERGE_STATES 64

/**
 * @brief The partial results fd_merge_states() combines, and where it
 *        writes. Initialise with `fd_merge_args_init(&args, sizeof args)`.
 *
 * State s is `states_out[s]` `[batch, q_len, heads, head_dim]` (#FD_DTYPE_F32,
 * #FD_DTYPE_F16 or #FD_DTYPE_BF16; the states may differ in dtype) with its
 * natural-log LSE `states_lse[s]` `[batch, q_len, heads]` (#FD_DTYPE_F32):
 * attention of the same queries over one part of the keys, normalised over
 * that part, as fd_decode() writes `out` and `lse`. For every row,
 * with m = max_s lse_s and w_s = exp(lse_s - m):
 * `out = sum_s w_s out_s / sum_s w_s`, `lse = m + log(sum_s w_s)`.
 * A state with LSE -inf is empty (a part with no keys): it weighs nothing and
 * its output never enters the result, NaN included (the CUDA backend may
 * still load it with the other states' rows: it must be a valid tensor, its
 * contents may be anything); a row whose states are all empty is zeros
 * with LSE -inf. A NaN LSE, or +inf, makes the row NaN. Sums run in state
 * order: the same inputs on the same backend give bitwise the same result
 * (the backends may differ in the last bits).
 *
 * `out` may be one of the `states_out` (the same data, dtype and strides),
 * and `lse` one of the `states_lse`: the merge then runs in place.
 * Otherwise the outputs must not overlap any input, as for fd_decode(). Tensors follow #fd_tensor's rules (strides
 * in elements, head_dim contiguous).
 */
typedef struct fd_merge_args {
  size_t struct_size;          /**< sizeof(fd_merge_args) as the caller compiled it; set by fd_merge_args_init(). */
  int32_t num_states;          /**< States to merge, 1 to #FD_MAX_MERGE_STATES. */
  int32_t reserved_0;          /**< Padding: never read. */
  const fd_tensor *states_out; /**< num_states outputs, `[batch, q_len, heads, head_dim]`. */
  const fd_tensor *states_lse; /**< num_states LSEs, `[batch, q_len, heads]`, #FD_DTYPE_F32. */
  fd_tensor out;               /**< The merged output, `[batch, q_len, heads, head_dim]`, F32, F16 or BF16.
                                    batch, q_len and heads may be 0 (nothing to merge, #FD_SUCCESS); q_len
                                    goes up to the cache-length bound, not #FD_MAX_Q_LEN. */
  fd_tensor lse;               /**< Optional merged LSE, `[batch, q_len, heads]`, F32 (data NULL: not written). */
} fd_merge_args;

/**
 * @brief Fills the caller's merge-args struct with defaults (no states, all
 *        tensors absent) and sets its struct_size.
 *
 * Writes exactly @p struct_size bytes, like fd_options_init().
 *
 * @param args The struct to fill, or NULL to only query the size.
 * @param struct_size sizeof(*args) as the caller compiled it; nothing is
 *        written if it is smaller than sizeof(size_t).
 * @return sizeof(fd_merge_args) of this library.
 */
FD_API size_t fd_merge_args_init(fd_merge_args *args, size_t struct_size);

/**
 * @brief Merges partial attention results by their log-sum-exps (see
 *        #fd_merge_args).
 *
 * The building block of cascade attention (a prefix shared by many
 * sequences decoded once, each sequence's suffix apart, then merged) and of
 * context-parallel decode: each GPU decodes its shard of the cache with
 * `lse`, the (out, lse) pairs are gathered (an NCCL all-gather, say), and
 * this merges them.
 *
 * CUDA backend: one kernel on @p stream; no allocation, no copy, no
 * synchronisation, so it may be captured in a CUDA graph (the tensors'
 * addresses are captured with it; their contents may change between
 * replays). Uses no workspace. CPU backend: synchronous; @p stream is
 * ignored.
 *
 * Everything is validated before any work; on error the outputs are
 * untouched.
 *
 * @param handle A live handle; its backend decides where the tensors live.
 * @param args The states and outputs.
 * @param stream CUDA stream to enqueue on (NULL: the legacy default stream
 *        of the handle's device).
 * @return #FD_SUCCESS or the status of the first problem found: as for
 *         fd_decode(); #FD_ERROR_INVALID_ARGUMENT for a num_states out of
 *         range; #FD_ERROR_NULL_POINTER for NULL state arrays.
 */
FD_API fd_status fd_merge_states(fd_handle *handle, const fd_merge_args *args, fd_cuda_stream stream);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHDECODE_H_INCLUDED */
