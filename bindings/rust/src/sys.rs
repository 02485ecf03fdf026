// SPDX-License-Identifier: Apache-2.0
//! The C ABI of `include/flashdecode.h`, declared by hand.
//!
//! `#[repr(C)]` mirrors of its structs and the signatures of its functions,
//! under their C names. [`Library::functions`](crate::Library::functions)
//! hands out the resolved function pointers for anything the safe API does
//! not cover; calling them is `unsafe` and follows the header's rules.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

/// `FD_VERSION_MAJOR` of the header mirrored here: the ABI, and the SONAME suffix.
pub const VERSION_MAJOR: u32 = 0;
/// `FD_VERSION_MINOR` of the header mirrored here.
pub const VERSION_MINOR: u32 = 3;
/// `FD_MAX_DIMS`: the most dimensions an [`fd_tensor`] has.
pub const MAX_DIMS: usize = 4;
/// Alignment in bytes that `fd_set_workspace` requires of caller memory.
pub const WORKSPACE_ALIGNMENT: usize = 256;

/// `fd_status` (an `int`-sized enum).
pub type fd_status = c_int;
/// `fd_dtype` (an `int`-sized enum).
pub type fd_dtype = c_int;
/// `fd_backend` (an `int`-sized enum).
pub type fd_backend = c_int;
/// `fd_merge` (an `int`-sized enum).
pub type fd_merge = c_int;
/// `fd_schedule` (an `int`-sized enum, since 0.3).
pub type fd_schedule = c_int;
/// `fd_attention_mask` (an `int`-sized enum, since 0.3).
pub type fd_attention_mask = c_int;
/// `fd_cuda_stream`: a `cudaStream_t`; null is the legacy default stream.
pub type fd_cuda_stream = *mut c_void;

/// `fd_handle`: opaque.
#[repr(C)]
pub struct fd_handle {
    _opaque: [u8; 0],
}

/// `fd_tensor`: pointer, dtype, shape and element strides.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fd_tensor {
    /// First element; null marks an optional tensor as absent.
    pub data: *mut c_void,
    /// Element type.
    pub dtype: fd_dtype,
    /// Dimensions used in `shape` and `strides`.
    pub ndim: i32,
    /// Extent of each dimension.
    pub shape: [i64; MAX_DIMS],
    /// Distance in elements between neighbours along each dimension.
    pub strides: [i64; MAX_DIMS],
}

impl fd_tensor {
    /// An absent optional tensor.
    pub const ABSENT: fd_tensor = fd_tensor {
        data: std::ptr::null_mut(),
        dtype: 0,
        ndim: 0,
        shape: [0; MAX_DIMS],
        strides: [0; MAX_DIMS],
    };
}

/// `FD_CHECK_NONE`: no checks beyond argument validation (since 0.3).
pub const CHECK_NONE: u32 = 0;
/// `FD_CHECK_CONTENTS`: every decode checks seq_lens and the block-table
/// entries it uses (since 0.3).
pub const CHECK_CONTENTS: u32 = 1;

/// `fd_options`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fd_options {
    /// `sizeof(fd_options)` as the caller compiled it.
    pub struct_size: usize,
    /// Backend to use.
    pub backend: fd_backend,
    /// CUDA device ordinal.
    pub device: i32,
    /// CPU worker threads; 0 uses every core.
    pub num_threads: i32,
    /// The trailing padding of 0.2's struct: never read.
    pub reserved_0: u32,
    /// Since 0.3: `fd_check` flags ORed together ([`CHECK_CONTENTS`]).
    pub checks: u32,
    /// Padding: never read.
    pub reserved_1: u32,
}

impl Default for fd_options {
    /// What `fd_options_init` writes: every default is zero but `struct_size`,
    /// and the library reads only `struct_size` bytes and defaults the rest.
    fn default() -> Self {
        fd_options {
            struct_size: std::mem::size_of::<fd_options>(),
            backend: 0,
            device: 0,
            num_threads: 0,
            reserved_0: 0,
            checks: CHECK_NONE,
            reserved_1: 0,
        }
    }
}

/// `FD_MAX_Q_LEN`: the most query tokens per sequence (dimension 1 of q) a decode takes (since 0.3).
pub const MAX_Q_LEN: i64 = 64;
/// `FD_MASK_CAUSAL`: query token i of a sequence of length L sees keys up to position `L - q_len + i` (since 0.3).
pub const MASK_CAUSAL: fd_attention_mask = 0;
/// `FD_MASK_NONE`: every query token sees all L keys (since 0.3).
pub const MASK_NONE: fd_attention_mask = 1;

/// `fd_decode_args`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fd_decode_args {
    /// `sizeof(fd_decode_args)` as the caller compiled it.
    pub struct_size: usize,
    /// Queries `[batch, q_len, q_heads, head_dim]`.
    pub q: fd_tensor,
    /// Key cache (dense, or the page pool).
    pub k: fd_tensor,
    /// Value cache, shaped like `k`.
    pub v: fd_tensor,
    /// Output, shaped like `q`.
    pub out: fd_tensor,
    /// Optional log-sum-exp `[batch, q_len, q_heads]`, f32.
    pub lse: fd_tensor,
    /// Optional sequence lengths `[batch]`, i32.
    pub seq_lens: fd_tensor,
    /// Optional block table `[batch, max_pages]`, i32.
    pub block_table: fd_tensor,
    /// Softmax scale; 0 means `1/sqrt(head_dim)`.
    pub softmax_scale: f64,
    /// KV splits; 0 chooses automatically.
    pub num_splits: i32,
    /// The trailing padding of 0.2's struct: never read.
    pub reserved_0: i32,
    /// Since 0.3: a fixed split length in KV tokens, for batch-invariant
    /// results; 0 leaves the splits to `num_splits` or the planner.
    pub split_tokens: i64,
    /// Since 0.3: [`MASK_CAUSAL`] (the default) or [`MASK_NONE`].
    pub mask: fd_attention_mask,
    /// Since 0.3: c > 0 caps scores to `c * tanh(s / c)`; 0 leaves them.
    pub logit_softcap: f32,
    /// Since 0.3: a sliding window of W > 0 keys (`pos_q - pos_k < W`); 0 is none.
    pub window_left: i64,
    /// Since 0.3: optional ALiBi slopes `[q_heads]`, f32.
    pub alibi_slopes: fd_tensor,
    /// Since 0.3: optional attention-sink logits `[q_heads]`, f32.
    pub sinks: fd_tensor,
    /// Since 0.3: optional dequantization scales of an 8-bit `k`, f32, `[batch, kv_capacity, kv_heads]`
    /// (dense) or `[num_pages, page_size, kv_heads]` (paged); strides of 0 broadcast.
    pub k_scale: fd_tensor,
    /// Since 0.3: optional dequantization scales of an 8-bit `v`, as `k_scale`.
    pub v_scale: fd_tensor,
    /// Since 0.3: optional per-sequence query token counts `[batch]`, i32, in [0, q_len].
    pub q_lens: fd_tensor,
}

impl Default for fd_decode_args {
    /// What `fd_decode_args_init` writes (see [`fd_options::default`]).
    fn default() -> Self {
        fd_decode_args {
            struct_size: std::mem::size_of::<fd_decode_args>(),
            q: fd_tensor::ABSENT,
            k: fd_tensor::ABSENT,
            v: fd_tensor::ABSENT,
            out: fd_tensor::ABSENT,
            lse: fd_tensor::ABSENT,
            seq_lens: fd_tensor::ABSENT,
            block_table: fd_tensor::ABSENT,
            softmax_scale: 0.0,
            num_splits: 0,
            reserved_0: 0,
            split_tokens: 0,
            mask: MASK_CAUSAL,
            logit_softcap: 0.0,
            window_left: 0,
            alibi_slopes: fd_tensor::ABSENT,
            sinks: fd_tensor::ABSENT,
            k_scale: fd_tensor::ABSENT,
            v_scale: fd_tensor::ABSENT,
            q_lens: fd_tensor::ABSENT,
        }
    }
}

/// `fd_plan_info` (since 0.2): what `fd_decode` would run for a problem.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fd_plan_info {
    /// `sizeof(fd_plan_info)` as the caller compiled it.
    pub struct_size: usize,
    /// The handle's backend.
    pub backend: fd_backend,
    /// Splits of the KV sequence.
    pub num_splits: i32,
    /// KV tokens per split.
    pub split_tokens: i64,
    /// Workspace bytes the decode needs.
    pub workspace_bytes: usize,
    /// The split kernel's name: a static NUL-terminated string.
    pub kernel: *const c_char,
    /// How the splits are merged.
    pub merge: fd_merge,
    /// Kernels enqueued per decode.
    pub launches: i32,
    /// CUDA thread blocks of the split kernel; CPU tasks.
    pub blocks: i64,
    /// How the splits are laid out over the batch (since 0.3; a 0.2 library leaves the 0 of `Default`).
    pub schedule: fd_schedule,
    /// Padding (since 0.3).
    pub reserved_0: i32,
}

impl Default for fd_plan_info {
    /// What `fd_plan_info_init` writes: zeros but `struct_size`.
    fn default() -> Self {
        fd_plan_info {
            struct_size: std::mem::size_of::<fd_plan_info>(),
            backend: 0,
            num_splits: 0,
            split_tokens: 0,
            workspace_bytes: 0,
            kernel: std::ptr::null(),
            merge: 0,
            launches: 0,
            blocks: 0,
            schedule: 0,
            reserved_0: 0,
        }
    }
}

/// `FD_MAX_MERGE_STATES`: the most states one `fd_merge_states` call merges (since 0.3).
pub const MAX_MERGE_STATES: usize = 64;

/// `fd_merge_args` (since 0.3): the partial results `fd_merge_states` combines, and where it writes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fd_merge_args {
    /// `sizeof(fd_merge_args)` as the caller compiled it.
    pub struct_size: usize,
    /// States to merge, 1 to [`MAX_MERGE_STATES`].
    pub num_states: i32,
    /// Padding: never read.
    pub reserved_0: i32,
    /// `num_states` outputs, `[batch, q_len, heads, head_dim]`.
    pub states_out: *const fd_tensor,
    /// `num_states` log-sum-exps, `[batch, q_len, heads]`, f32.
    pub states_lse: *const fd_tensor,
    /// The merged output, `[batch, q_len, heads, head_dim]`.
    pub out: fd_tensor,
    /// Optional merged log-sum-exp `[batch, q_len, heads]`, f32.
    pub lse: fd_tensor,
}

impl Default for fd_merge_args {
    /// What `fd_merge_args_init` writes: no states, every tensor absent.
    fn default() -> Self {
        fd_merge_args {
            struct_size: std::mem::size_of::<fd_merge_args>(),
            num_states: 0,
            reserved_0: 0,
            states_out: std::ptr::null(),
            states_lse: std::ptr::null(),
            out: fd_tensor::ABSENT,
            lse: fd_tensor::ABSENT,
        }
    }
}

/// `fd_append_args` (since 0.3): what `fd_append_kv` reads and writes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fd_append_args {
    /// `sizeof(fd_append_args)` as the caller compiled it.
    pub struct_size: usize,
    /// New keys, `[batch, new_len, kv_heads, head_dim]`, f32, f16 or bf16.
    pub k_new: fd_tensor,
    /// New values, same shape as `k_new`.
    pub v_new: fd_tensor,
    /// Key cache (dense or page pool), written.
    pub k: fd_tensor,
    /// Value cache, same shape and dtype as `k`, written.
    pub v: fd_tensor,
    /// Optional scales of an 8-bit `k`, as in [`fd_decode_args::k_scale`].
    pub k_scale: fd_tensor,
    /// Optional scales of an 8-bit `v`.
    pub v_scale: fd_tensor,
    /// Optional `[batch]` i32 lengths including the new tokens.
    pub seq_lens: fd_tensor,
    /// Optional `[batch, max_pages]` i32 block table (absent: dense cache).
    pub block_table: fd_tensor,
}

impl Default for fd_append_args {
    /// What `fd_append_args_init` writes: every tensor absent.
    fn default() -> Self {
        fd_append_args {
            struct_size: std::mem::size_of::<fd_append_args>(),
            k_new: fd_tensor::ABSENT,
            v_new: fd_tensor::ABSENT,
            k: fd_tensor::ABSENT,
            v: fd_tensor::ABSENT,
            k_scale: fd_tensor::ABSENT,
            v_scale: fd_tensor::ABSENT,
            seq_lens: fd_tensor::ABSENT,
            block_table: fd_tensor::ABSENT,
        }
    }
}

/// Every exported function, resolved from a loaded library. A function of
/// a later minor version than 0.2 is an `Option`: `None` in an older library.
#[derive(Clone, Copy, Debug)]
pub struct Functions {
    /// `unsigned fd_version_number(void)`
    pub fd_version_number: unsafe extern "C" fn() -> c_uint,
    /// `const char *fd_version_string(void)`
    pub fd_version_string: unsafe extern "C" fn() -> *const c_char,
    /// `const char *fd_status_string(fd_status)`
    pub fd_status_string: unsafe extern "C" fn(fd_status) -> *const c_char,
    /// `size_t fd_last_error_message(char *, size_t)`
    pub fd_last_error_message: unsafe extern "C" fn(*mut c_char, usize) -> usize,
    /// `size_t fd_options_init(fd_options *, size_t)`
    pub fd_options_init: unsafe extern "C" fn(*mut fd_options, usize) -> usize,
    /// `size_t fd_decode_args_init(fd_decode_args *, size_t)`
    pub fd_decode_args_init: unsafe extern "C" fn(*mut fd_decode_args, usize) -> usize,
    /// `fd_status fd_create(fd_handle **, const fd_options *)`
    pub fd_create: unsafe extern "C" fn(*mut *mut fd_handle, *const fd_options) -> fd_status,
    /// `fd_status fd_destroy(fd_handle *)`
    pub fd_destroy: unsafe extern "C" fn(*mut fd_handle) -> fd_status,
    /// `fd_status fd_get_backend(const fd_handle *, fd_backend *)`
    pub fd_get_backend: unsafe extern "C" fn(*const fd_handle, *mut fd_backend) -> fd_status,
    /// `fd_status fd_decode(fd_handle *, const fd_decode_args *, fd_cuda_stream)`
    pub fd_decode: unsafe extern "C" fn(*mut fd_handle, *const fd_decode_args, fd_cuda_stream) -> fd_status,
    /// `fd_status fd_workspace_size(const fd_handle *, const fd_decode_args *, size_t *)`
    pub fd_workspace_size: unsafe extern "C" fn(*const fd_handle, *const fd_decode_args, *mut usize) -> fd_status,
    /// `fd_status fd_reserve_workspace(fd_handle *, size_t)`
    pub fd_reserve_workspace: unsafe extern "C" fn(*mut fd_handle, usize) -> fd_status,
    /// `fd_status fd_set_workspace(fd_handle *, void *, size_t)`
    pub fd_set_workspace: unsafe extern "C" fn(*mut fd_handle, *mut c_void, usize) -> fd_status,
    /// `size_t fd_plan_info_init(fd_plan_info *, size_t)`
    pub fd_plan_info_init: unsafe extern "C" fn(*mut fd_plan_info, usize) -> usize,
    /// `fd_status fd_describe_plan(const fd_handle *, const fd_decode_args *, fd_plan_info *)`
    pub fd_describe_plan: unsafe extern "C" fn(*const fd_handle, *const fd_decode_args, *mut fd_plan_info) -> fd_status,
    /// `fd_status fd_check_contents(fd_handle *, fd_cuda_stream)` (since 0.3).
    pub fd_check_contents: Option<unsafe extern "C" fn(*mut fd_handle, fd_cuda_stream) -> fd_status>,
    /// `size_t fd_merge_args_init(fd_merge_args *, size_t)` (since 0.3).
    pub fd_merge_args_init: Option<unsafe extern "C" fn(*mut fd_merge_args, usize) -> usize>,
    /// `fd_status fd_merge_states(fd_handle *, const fd_merge_args *, fd_cuda_stream)` (since 0.3).
    pub fd_merge_states:
        Option<unsafe extern "C" fn(*mut fd_handle, *const fd_merge_args, fd_cuda_stream) -> fd_status>,
    /// `size_t fd_append_args_init(fd_append_args *, size_t)` (since 0.3).
    pub fd_append_args_init: Option<unsafe extern "C" fn(*mut fd_append_args, usize) -> usize>,
    /// `fd_status fd_append_kv(fd_handle *, const fd_append_args *, fd_cuda_stream)` (since 0.3).
    pub fd_append_kv: Option<unsafe extern "C" fn(*mut fd_handle, *const fd_append_args, fd_cuda_stream) -> fd_status>,
}
