// SPDX-License-Identifier: Apache-2.0
//! Handles, their options and workspace, the decode call, and merging partial results.

use std::alloc::{self, Layout};
use std::os::raw::c_void;
use std::ptr::NonNull;

use crate::error::{Error, Result, Status};
use crate::library::Library;
use crate::sys;
use crate::tensor::{CudaStream, Memory, Tensor, TensorMut};

/// Which backend a handle runs on (`fd_backend`). Values are pinned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// CUDA when the library can use the device, else the CPU.
    #[default]
    Auto = 0,
    /// The multi-threaded CPU backend: host memory.
    Cpu = 1,
    /// The CUDA backend: device memory, asynchronous on a stream.
    Cuda = 2,
}

/// How a decode combines its splits' partial results (`fd_merge`: 0, 1, 2, 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Merge {
    /// `FD_MERGE_NONE`: one split; the CUDA split kernel writes the output itself.
    None,
    /// `FD_MERGE_SEPARATE`: a pass after every split (the CUDA merge kernel, or the CPU merge pass).
    Separate,
    /// `FD_MERGE_FUSED`: the last CUDA thread block of each (sequence, KV head) merges its splits.
    Fused,
    /// `FD_MERGE_CLUSTER`: each (sequence, KV head)'s splits run as one thread-block cluster (sm_90+).
    Cluster,
    /// A value a later library added, unknown to this crate.
    Other(i32),
}

/// How a decode lays its splits out over the batch (`fd_schedule`: 0, 1, 2, 3; since 0.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Schedule {
    /// `FD_SCHEDULE_FIXED`: `num_splits` splits of `split_tokens` keys for every (sequence, KV head), in index order.
    Fixed,
    /// `FD_SCHEDULE_LONGEST_FIRST`: CUDA; the fixed splits, longest sequence first (one more launch orders them).
    LongestFirst,
    /// `FD_SCHEDULE_FITTED`: CUDA; splits whose length the device fits to the lengths at run time.
    Fitted,
    /// `FD_SCHEDULE_BALANCED`: CUDA; every thread block takes an equal share of the batch's keys (0 splits).
    Balanced,
    /// A value a later library added, unknown to this crate.
    Other(i32),
}

/// What [`Handle::decode`] would run for a problem (`fd_plan_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanInfo {
    /// The handle's backend.
    pub backend: Backend,
    /// Splits of the KV sequence (requested, or the planner's choice); 0 on
    /// CUDA when the device cuts each sequence from its length (per-sequence
    /// lengths with automatic splits: the balanced schedule).
    pub num_splits: i32,
    /// KV tokens of each split; with 0 splits, the tile the device cuts at.
    pub split_tokens: i64,
    /// As [`Handle::workspace_size`] reports.
    pub workspace_bytes: usize,
    /// The split kernel, e.g. `"tensor-core-wide-128"` or `"cpu"`; for logs.
    pub kernel: String,
    /// How the splits are combined.
    pub merge: Merge,
    /// CUDA kernels per decode (1 to 3, one more when checking contents); 0 on the CPU.
    pub launches: i32,
    /// CUDA thread blocks of the split kernel; CPU tasks of the split pass.
    pub blocks: i64,
    /// How the splits are laid out over the batch ([`Schedule::Fixed`] from a 0.2 library).
    pub schedule: Schedule,
}

/// Options for [`Handle::new`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    backend: Backend,
    device: i32,
    num_threads: i32,
    check_contents: bool,
}

impl Options {
    /// The CPU backend, with a worker per core.
    pub fn cpu() -> Options {
        Options {
            backend: Backend::Cpu,
            ..Options::default()
        }
    }

    /// The CUDA backend on device `device`.
    pub fn cuda(device: i32) -> Options {
        Options {
            backend: Backend::Cuda,
            device,
            ..Options::default()
        }
    }

    /// Sets the backend.
    pub fn backend(mut self, backend: Backend) -> Options {
        self.backend = backend;
        self
    }

    /// Sets the CUDA device ordinal.
    pub fn device(mut self, device: i32) -> Options {
        self.device = device;
        self
    }

    /// Sets the CPU backend's worker threads; 0 uses every core.
    pub fn num_threads(mut self, num_threads: i32) -> Options {
        self.num_threads = num_threads;
        self
    }

    /// Checks the contents of `seq_lens` and `block_table` on every decode
    /// (`FD_CHECK_CONTENTS`, since 0.3; default off).
    ///
    /// Without checks, each length is clamped to `[0, kv_capacity]` and each
    /// used page index into the pool: a bad one gives a meaningless result,
    /// not an error. With them, a bad length fails with
    /// [`Status::InvalidLength`] and a bad page index with
    /// [`Status::InvalidBlockTable`], naming the element: from
    /// [`Handle::decode`] itself on the CPU backend; on CUDA, where the
    /// check runs on the device, from the next decode or from
    /// [`Handle::check_contents`]. `FLASHDECODE_CHECKS=contents` in the
    /// environment turns the checks on for every handle. A library older
    /// than 0.3 refuses the handle with [`Status::Unsupported`].
    pub fn check_contents(mut self, check: bool) -> Options {
        self.check_contents = check;
        self
    }
}

/// Which keys the query tokens of a sequence see (`fd_attention_mask`,
/// since 0.3; [`DecodeArgs::mask`]). Values are pinned. With one query
/// token both are the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttentionMask {
    /// `FD_MASK_CAUSAL`: query token i of a sequence of length L sees the
    /// keys up to its own position `L - q_len + i` (the default).
    #[default]
    Causal = 0,
    /// `FD_MASK_NONE`: every query token sees all L keys (e.g. a verify
    /// step that scores drafts alike).
    None = 1,
}

/// Everything one decode reads and writes.
///
/// Shapes, by role (the order is fixed; the layout comes from strides):
/// - `q`, `out`: `[batch, q_len, q_heads, head_dim]`; `out` of q's dtype or
///   f32. q_len is 1 for plain decode and up to [`sys::MAX_Q_LEN`] (64,
///   since 0.3) for speculative or multi-token steps: the q_len query
///   tokens of a sequence are its newest, token i of a sequence of length L
///   at position `L - q_len + i`.
/// - `k`, `v`: a dense cache `[batch, kv_len, kv_heads, head_dim]` (a BHND
///   cache `[batch, heads, kv_len, head_dim]` is the same with strides
///   `[H*N*D, D, N*D, 1]`), or with a block table the page pool
///   `[num_pages, page_size, kv_heads, head_dim]`.
/// - `lse`: `[batch, q_len, q_heads]`, f32, natural log; -inf for a query
///   token that sees no key (an empty sequence).
/// - `seq_lens`: `[batch]`, i32. `block_table`: `[batch, max_pages]`, i32.
/// - `q_lens`: `[batch]`, i32, in the memory of the other tensors.
/// - `alibi_slopes`, `sinks`: `[q_heads]`, f32, in the memory of the other
///   tensors.
///
/// q_heads must be a multiple of kv_heads (grouped-query attention).
///
/// # Attention variants
/// Since 0.3 (a 0.2 library refuses each with [`Status::Unsupported`]; the
/// defaults are plain causal attention). For query token i at position
/// `pos_q` and key j, the score `s = scale * q.k_j` is capped to
/// `c * tanh(s / c)` by [`logit_softcap`](Self::logit_softcap), gets
/// `slope[h] * (j - pos_q)` from [`alibi_slopes`](Self::alibi_slopes); key j
/// is seen if `j < L`, with [`AttentionMask::Causal`] `j <= pos_q`, and with
/// [`window_left`](Self::window_left) W `pos_q - j < W`;
/// [`sinks`](Self::sinks) add `exp(sink[h])` to the softmax denominator (and
/// the LSE). A query token that sees no key gets zeros and LSE -inf, or
/// `sink[h]` with sinks.
///
/// ```
/// use flashdecode::{AttentionMask, DecodeArgs, Library, Options, Tensor, TensorMut};
///
/// # fn main() -> Result<(), flashdecode::Error> {
/// // A verify step: 4 draft tokens of one sequence of 10, each seeing all 10 keys,
/// // over a sliding window of 8 keys, with a sink per head.
/// let (q, k, v) = (vec![0.5f32; 4 * 2 * 16], vec![0.25f32; 10 * 16], vec![1.0f32; 10 * 16]);
/// let sinks = [0.0f32, 1.0];
/// let mut out = vec![0f32; q.len()];
/// let library = Library::load()?;
/// let mut handle = library.create_handle(&Options::cpu())?;
/// let mut args = DecodeArgs::new(
///     Tensor::f32(&q, &[1, 4, 2, 16])?,
///     Tensor::f32(&k, &[1, 10, 1, 16])?,
///     Tensor::f32(&v, &[1, 10, 1, 16])?,
///     TensorMut::f32(&mut out, &[1, 4, 2, 16])?,
/// )
/// .mask(AttentionMask::None)
/// .window_left(8)
/// .sinks(Tensor::f32(&sinks, &[2])?);
/// handle.decode(&mut args)?;
/// drop(args);
/// // Equal scores: every value is 1; a sink of 0 weighs as one more key (of value 0).
/// assert!(out.iter().all(|&x| x <= 1.0 && x > 0.5));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct DecodeArgs<'a> {
    q: Tensor<'a>,
    k: Tensor<'a>,
    v: Tensor<'a>,
    out: TensorMut<'a>,
    lse: Option<TensorMut<'a>>,
    seq_lens: Option<Tensor<'a>>,
    block_table: Option<Tensor<'a>>,
    softmax_scale: Option<f64>,
    num_splits: i32,
    split_tokens: i64,
    mask: AttentionMask,
    window_left: Option<i64>,
    logit_softcap: Option<f32>,
    alibi_slopes: Option<Tensor<'a>>,
    sinks: Option<Tensor<'a>>,
    k_scale: Option<Tensor<'a>>,
    v_scale: Option<Tensor<'a>>,
    q_lens: Option<Tensor<'a>>,
    in_place: bool,
}

impl<'a> DecodeArgs<'a> {
    /// The required tensors; the scale defaults to `1/sqrt(head_dim)` and
    /// the split count is chosen by the library.
    pub fn new(q: Tensor<'a>, k: Tensor<'a>, v: Tensor<'a>, out: TensorMut<'a>) -> Self {
        DecodeArgs {
            q,
            k,
            v,
            out,
            lse: None,
            seq_lens: None,
            block_table: None,
            softmax_scale: None,
            num_splits: 0,
            split_tokens: 0,
            mask: AttentionMask::Causal,
            window_left: None,
            logit_softcap: None,
            alibi_slopes: None,
            sinks: None,
            k_scale: None,
            v_scale: None,
            q_lens: None,
            in_place: false,
        }
    }

    /// A decode in place (since 0.3): `q_out` is the query, `[batch, q_len,
    /// q_heads, head_dim]`, and receives the output (the C API's `out` that
    /// is `q` itself: the same memory, dtype and strides).
    pub fn in_place(q_out: TensorMut<'a>, k: Tensor<'a>, v: Tensor<'a>) -> Self {
        let q = q_out.reborrow_as_input();
        DecodeArgs {
            in_place: true,
            ..DecodeArgs::new(q, k, v, q_out)
        }
    }

    /// Since 0.3: the f32 dequantization scales of an 8-bit `k` (each element
    /// stands for `stored * scale`): [`Tensor::scale_per_tensor`],
    /// [`Tensor::scale_per_head`] or [`Tensor::scale_per_token`] (or any f32
    /// tensor of the cache's first three dimensions; strides of 0 broadcast).
    /// Unset: 1. Refused (`InvalidDType`) on a 16- or 32-bit cache.
    pub fn k_scale(mut self, scale: Tensor<'a>) -> Self {
        self.k_scale = Some(scale);
        self
    }

    /// Since 0.3: the scales of an 8-bit `v`, as [`DecodeArgs::k_scale`].
    pub fn v_scale(mut self, scale: Tensor<'a>) -> Self {
        self.v_scale = Some(scale);
        self
    }

    /// Also writes the log-sum-exp of the scores.
    pub fn lse(mut self, lse: TensorMut<'a>) -> Self {
        self.lse = Some(lse);
        self
    }

    /// Per-sequence lengths (a ragged batch); absent, every sequence fills its cache.
    pub fn seq_lens(mut self, seq_lens: Tensor<'a>) -> Self {
        self.seq_lens = Some(seq_lens);
        self
    }

    /// Per-sequence query token counts (ragged query lengths, since 0.3),
    /// `[batch]`, i32, in the memory of the other tensors; absent, every
    /// sequence has q's q_len tokens. Sequence b's tokens are
    /// `q[b, 0 .. q_lens[b])`, token i at position `L - q_lens[b] + i`. The
    /// tokens past `q_lens[b]` are padding: never read from q (they may hold
    /// NaN), they get zeros and LSE -inf (`sink[h]` with sinks), as a query
    /// token that sees no key. Entries are clamped to `[0, q_len]`; with
    /// [`Options::check_contents`] one outside is [`Status::InvalidLength`].
    pub fn q_lens(mut self, q_lens: Tensor<'a>) -> Self {
        self.q_lens = Some(q_lens);
        self
    }

    /// Page indices: k and v are then a paged cache.
    pub fn block_table(mut self, block_table: Tensor<'a>) -> Self {
        self.block_table = Some(block_table);
        self
    }

    /// Multiplies q·k before the softmax (default `1/sqrt(head_dim)`); must be finite and non-zero.
    pub fn softmax_scale(mut self, scale: f64) -> Self {
        self.softmax_scale = Some(scale);
        self
    }

    /// Splits of the KV sequence; 0 lets the library choose.
    pub fn num_splits(mut self, num_splits: i32) -> Self {
        self.num_splits = num_splits;
        self
    }

    /// A fixed split length in KV tokens, for batch-invariant results (since
    /// 0.3): a sequence's out and lse are then bitwise the same whether it
    /// runs alone or in any batch, on one backend, device model and library
    /// version (see `fd_decode_args::split_tokens` in the C header). The
    /// library rounds it up to its KV tile ([`Handle::describe_plan`]
    /// reports the length used). 0 (the default) leaves the splits to
    /// [`num_splits`](Self::num_splits) or the library; do not set both. A
    /// library older than 0.3 refuses a non-zero one with [`Status::Unsupported`].
    pub fn split_tokens(mut self, split_tokens: i64) -> Self {
        self.split_tokens = split_tokens;
        self
    }

    /// Which keys each query token sees, for q_len > 1 (since 0.3; see
    /// [Attention variants](Self#attention-variants)): [`AttentionMask::Causal`]
    /// (the default) or [`AttentionMask::None`].
    pub fn mask(mut self, mask: AttentionMask) -> Self {
        self.mask = mask;
        self
    }

    /// A sliding window of `window_left` keys (since 0.3): query token i
    /// sees key j only if `pos_i - j < window_left` (1: only its own
    /// position). Only the keys inside the window are read. Unset, there is
    /// no window; 0 is refused (the C API would read it as "none"), and a
    /// negative one is the library's [`Status::InvalidArgument`].
    pub fn window_left(mut self, window_left: i64) -> Self {
        self.window_left = Some(window_left);
        self
    }

    /// Caps every score s (after the scale) to `cap * tanh(s / cap)` (since
    /// 0.3; Gemma 2, Grok). Unset, nothing is capped; 0 is refused (the C
    /// API would read it as "none"), and a negative or non-finite one is the
    /// library's [`Status::InvalidArgument`].
    pub fn logit_softcap(mut self, cap: f32) -> Self {
        self.logit_softcap = Some(cap);
        self
    }

    /// ALiBi slopes, `[q_heads]`, f32, in the memory of the other tensors
    /// (since 0.3): `slope[h] * (j - pos_i)` is added to the score of key j.
    pub fn alibi_slopes(mut self, slopes: Tensor<'a>) -> Self {
        self.alibi_slopes = Some(slopes);
        self
    }

    /// Attention-sink logits, `[q_heads]`, f32, in the memory of the other
    /// tensors (since 0.3): `exp(sink[h])` joins every softmax denominator
    /// (not the numerator) and the LSE.
    pub fn sinks(mut self, sinks: Tensor<'a>) -> Self {
        self.sinks = Some(sinks);
        self
    }

    fn raw(&self, library: &Library) -> Result<sys::fd_decode_args> {
        if self.split_tokens != 0 {
            library.require(3, "split_tokens")?;
        }
        if self.in_place {
            library.require(3, "an in-place decode")?;
        }
        if self.mask != AttentionMask::Causal {
            library.require(3, "mask")?;
        }
        if self.window_left.is_some() {
            library.require(3, "window_left")?;
        }
        if self.logit_softcap.is_some() {
            library.require(3, "logit_softcap")?;
        }
        if self.alibi_slopes.is_some() {
            library.require(3, "alibi_slopes")?;
        }
        if self.sinks.is_some() {
            library.require(3, "sinks")?;
        }
        if self.q_lens.is_some() {
            library.require(3, "q_lens")?;
        }
        require_quantized(library, &self.k, &self.v, &self.k_scale, &self.v_scale)?;
        // The C API reads 0 as "automatic" or "none": refuse it rather than change its meaning.
        if self.softmax_scale == Some(0.0) {
            return Err(Error::refused(
                Status::InvalidArgument,
                "softmax_scale must not be 0; leave it unset for 1/sqrt(head_dim)",
            ));
        }
        if self.window_left == Some(0) {
            return Err(Error::refused(
                Status::InvalidArgument,
                "window_left must not be 0; leave it unset for no window",
            ));
        }
        if self.logit_softcap == Some(0.0) {
            return Err(Error::refused(
                Status::InvalidArgument,
                "logit_softcap must not be 0; leave it unset for no cap",
            ));
        }
        Ok(sys::fd_decode_args {
            q: self.q.raw(),
            k: self.k.raw(),
            v: self.v.raw(),
            out: self.out.raw(),
            lse: self.lse.as_ref().map_or(sys::fd_tensor::ABSENT, TensorMut::raw),
            seq_lens: self.seq_lens.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            block_table: self.block_table.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            softmax_scale: self.softmax_scale.unwrap_or(0.0),
            num_splits: self.num_splits,
            split_tokens: self.split_tokens,
            mask: self.mask as sys::fd_attention_mask,
            logit_softcap: self.logit_softcap.unwrap_or(0.0),
            window_left: self.window_left.unwrap_or(0),
            alibi_slopes: self.alibi_slopes.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            sinks: self.sinks.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            k_scale: self.k_scale.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            v_scale: self.v_scale.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            q_lens: self.q_lens.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            ..sys::fd_decode_args::default()
        })
    }

    fn memories(&self) -> Vec<(&'static str, Memory)> {
        let mut found = vec![
            ("q", self.q.memory()),
            ("k", self.k.memory()),
            ("v", self.v.memory()),
            ("out", self.out.memory()),
        ];
        found.extend(self.lse.as_ref().map(|t| ("lse", t.memory())));
        found.extend(self.seq_lens.as_ref().map(|t| ("seq_lens", t.memory())));
        found.extend(self.block_table.as_ref().map(|t| ("block_table", t.memory())));
        found.extend(self.alibi_slopes.as_ref().map(|t| ("alibi_slopes", t.memory())));
        found.extend(self.sinks.as_ref().map(|t| ("sinks", t.memory())));
        found.extend(self.k_scale.as_ref().map(|t| ("k_scale", t.memory())));
        found.extend(self.v_scale.as_ref().map(|t| ("v_scale", t.memory())));
        found.extend(self.q_lens.as_ref().map(|t| ("q_lens", t.memory())));
        found
    }
}

/// What an 8-bit cache (k's or v's) or its scales need of the library: 0.3.
fn require_quantized(
    library: &Library,
    k: &Tensor<'_>,
    v: &Tensor<'_>,
    k_scale: &Option<Tensor<'_>>,
    v_scale: &Option<Tensor<'_>>,
) -> Result<()> {
    if k.dtype().is_8_bit() || v.dtype().is_8_bit() {
        library.require(3, "an 8-bit cache")?;
    }
    if k_scale.is_some() {
        library.require(3, "k_scale")?;
    }
    if v_scale.is_some() {
        library.require(3, "v_scale")?;
    }
    Ok(())
}

/// What [`Handle::append_kv`] reads and writes (since 0.3): this step's new
/// keys and values, and the cache they go into, converted to its dtype.
///
/// `k_new`, `v_new`: `[batch, new_len, kv_heads, head_dim]`, f32, f16 or bf16.
/// `k`, `v`: the cache as [`DecodeArgs`] takes it (dense, or a page pool with
/// a block table), of any cache dtype. New token i of sequence b, of length
/// L (its `seq_lens` entry, the length *with* the new tokens), goes to
/// position `L - new_len + i`; a negative position, or a page outside the
/// pool, is not written. Each element is converted from `x = new / scale`
/// in f32: to f32/f16/bf16 by rounding to nearest even; to E4M3/E5M2 by
/// rounding to nearest even and saturating to ±448/±57344 (NaN stays NaN);
/// to i8 by rounding to nearest even and clamping to [-127, 127] (NaN: 0).
#[derive(Debug)]
pub struct AppendArgs<'a> {
    k_new: Tensor<'a>,
    v_new: Tensor<'a>,
    k: TensorMut<'a>,
    v: TensorMut<'a>,
    k_scale: Option<Tensor<'a>>,
    v_scale: Option<Tensor<'a>>,
    seq_lens: Option<Tensor<'a>>,
    block_table: Option<Tensor<'a>>,
}

impl<'a> AppendArgs<'a> {
    /// New keys and values, and the cache they are written into.
    pub fn new(k_new: Tensor<'a>, v_new: Tensor<'a>, k: TensorMut<'a>, v: TensorMut<'a>) -> Self {
        AppendArgs {
            k_new,
            v_new,
            k,
            v,
            k_scale: None,
            v_scale: None,
            seq_lens: None,
            block_table: None,
        }
    }

    /// The scales of an 8-bit `k`, as [`DecodeArgs::k_scale`]; with per-token
    /// scales, write this step's first: each written position's scale is read.
    pub fn k_scale(mut self, scale: Tensor<'a>) -> Self {
        self.k_scale = Some(scale);
        self
    }

    /// The scales of an 8-bit `v`.
    pub fn v_scale(mut self, scale: Tensor<'a>) -> Self {
        self.v_scale = Some(scale);
        self
    }

    /// `[batch]` i32: each sequence's length including the new tokens (unset: the capacity).
    pub fn seq_lens(mut self, seq_lens: Tensor<'a>) -> Self {
        self.seq_lens = Some(seq_lens);
        self
    }

    /// `[batch, max_pages]` i32 page indices: `k` and `v` are then a page pool.
    pub fn block_table(mut self, block_table: Tensor<'a>) -> Self {
        self.block_table = Some(block_table);
        self
    }

    /// The cache's keys, for reading them back (a decode after the append).
    pub fn k(&self) -> Tensor<'_> {
        self.k.as_tensor()
    }

    /// The cache's values.
    pub fn v(&self) -> Tensor<'_> {
        self.v.as_tensor()
    }

    fn raw(&self) -> sys::fd_append_args {
        sys::fd_append_args {
            k_new: self.k_new.raw(),
            v_new: self.v_new.raw(),
            k: self.k.raw(),
            v: self.v.raw(),
            k_scale: self.k_scale.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            v_scale: self.v_scale.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            seq_lens: self.seq_lens.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            block_table: self.block_table.as_ref().map_or(sys::fd_tensor::ABSENT, Tensor::raw),
            ..sys::fd_append_args::default()
        }
    }

    fn memories(&self) -> Vec<(&'static str, Memory)> {
        let mut found = vec![
            ("k_new", self.k_new.memory()),
            ("v_new", self.v_new.memory()),
            ("k", self.k.memory()),
            ("v", self.v.memory()),
        ];
        found.extend(self.k_scale.as_ref().map(|t| ("k_scale", t.memory())));
        found.extend(self.v_scale.as_ref().map(|t| ("v_scale", t.memory())));
        found.extend(self.seq_lens.as_ref().map(|t| ("seq_lens", t.memory())));
        found.extend(self.block_table.as_ref().map(|t| ("block_table", t.memory())));
        found
    }
}

/// Partial attention results to merge, and where [`Handle::merge_states`] writes.
///
/// State s is an output `[batch, q_len, heads, head_dim]` (f32, f16 or bf16;
/// the states may differ in dtype) with its log-sum-exp `[batch, q_len,
/// heads]` (f32, natural log): attention of the same queries over one part
/// of the keys, as [`Handle::decode`] writes `out` and `lse` for that part
/// (with q_len 1). The merged `out` has the states' shape, in f32, f16 or
/// bf16; the merged `lse` (optional) the LSEs' shape, in f32. The order of
/// the dimensions is fixed; the layout comes from strides.
///
/// For every row, with `m = max_s lse_s` and `w_s = exp(lse_s - m)`:
/// `out = sum_s w_s out_s / sum_s w_s` and `lse = m + ln(sum_s w_s)`, the
/// attention over all the parts' keys. A state whose LSE is -inf is empty (a
/// part with no keys) and is not read, NaN included; a row whose states are
/// all empty is zeros with LSE -inf; a NaN (or +inf) LSE makes its row NaN.
/// Sums run in state order: the same inputs give bitwise the same result.
///
/// The recipes: cascade attention (a prefix shared by the batch decoded
/// once, each sequence's suffix apart, then merged) and context-parallel
/// decode (each GPU decodes its shard of the cache with its LSE; gather the
/// `(out, lse)` pairs, e.g. with an NCCL all-gather, and merge them).
///
/// A merge into fresh memory is [`MergeArgs::new`] with [`state`](Self::state)s;
/// [`MergeArgs::in_place`] makes `out` (and its LSE) the first state itself,
/// overwritten by the merge, which the borrow checker could not allow
/// otherwise:
///
/// ```
/// use flashdecode::{Library, MergeArgs, Options, Tensor, TensorMut};
///
/// # fn main() -> Result<(), flashdecode::Error> {
/// // Two parts of one cache, each decoded with its LSE: [batch 1, q_len 1, heads 2, head_dim 4].
/// let mut prefix = vec![1.0f32; 8];
/// let mut prefix_lse = vec![0.0f32, f32::NEG_INFINITY]; // head 1 saw no prefix key
/// let suffix = vec![3.0f32; 8];
/// let suffix_lse = vec![0.0f32, 2.0];
///
/// let library = Library::load()?;
/// let mut handle = library.create_handle(&Options::cpu())?;
/// let mut args = MergeArgs::in_place(
///     TensorMut::f32(&mut prefix, &[1, 1, 2, 4])?,
///     TensorMut::f32(&mut prefix_lse, &[1, 1, 2])?,
/// )
/// .state(Tensor::f32(&suffix, &[1, 1, 2, 4])?, Tensor::f32(&suffix_lse, &[1, 1, 2])?);
/// handle.merge_states(&mut args)?;
/// assert_eq!(prefix, [2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]); // equal weights; the suffix alone
/// assert!((prefix_lse[0] - 2f32.ln()).abs() < 1e-6 && prefix_lse[1] == 2.0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct MergeArgs<'a> {
    out: TensorMut<'a>,
    lse: Option<TensorMut<'a>>,
    /// In place: state 0 is `out` with this LSE (also the merged LSE unless `lse` names another).
    in_place_lse: Option<TensorMut<'a>>,
    states: Vec<(Tensor<'a>, Tensor<'a>)>,
}

impl<'a> MergeArgs<'a> {
    /// A merge into `out`; add the states with [`state`](Self::state).
    pub fn new(out: TensorMut<'a>) -> Self {
        MergeArgs {
            out,
            lse: None,
            in_place_lse: None,
            states: Vec::new(),
        }
    }

    /// A merge in place: `out` with `lse` is the first state, and the merge
    /// overwrites both with its result (the merged LSE goes to another
    /// tensor if [`lse`](Self::lse) names one; `lse` is then only read).
    /// Add the other states with [`state`](Self::state).
    pub fn in_place(out: TensorMut<'a>, lse: TensorMut<'a>) -> Self {
        MergeArgs {
            out,
            lse: None,
            in_place_lse: Some(lse),
            states: Vec::new(),
        }
    }

    /// Adds a state: an output and its log-sum-exp. The library merges 1 to
    /// [`sys::MAX_MERGE_STATES`] states, in the order they were added.
    pub fn state(mut self, out: Tensor<'a>, lse: Tensor<'a>) -> Self {
        self.states.push((out, lse));
        self
    }

    /// Adds states, in order (see [`state`](Self::state)).
    pub fn states<I: IntoIterator<Item = (Tensor<'a>, Tensor<'a>)>>(mut self, states: I) -> Self {
        self.states.extend(states);
        self
    }

    /// Also writes the merged log-sum-exp.
    pub fn lse(mut self, lse: TensorMut<'a>) -> Self {
        self.lse = Some(lse);
        self
    }

    /// The states to merge, the in-place one included.
    pub fn num_states(&self) -> usize {
        self.states.len() + usize::from(self.in_place_lse.is_some())
    }

    /// The states' descriptors (outputs, LSEs) and the C arguments, which
    /// point into them: the vectors must outlive the call.
    fn raw(&self) -> Result<(Vec<sys::fd_tensor>, Vec<sys::fd_tensor>, sys::fd_merge_args)> {
        let count = self.num_states();
        let num_states = i32::try_from(count).map_err(|_| {
            Error::refused(
                Status::InvalidArgument,
                format!("num_states must be in [1, {}], got {}", sys::MAX_MERGE_STATES, count),
            )
        })?;
        let mut outs = Vec::with_capacity(count);
        let mut lses = Vec::with_capacity(count);
        if let Some(lse) = &self.in_place_lse {
            outs.push(self.out.raw());
            lses.push(lse.raw());
        }
        for (out, lse) in &self.states {
            outs.push(out.raw());
            lses.push(lse.raw());
        }
        let merged_lse = self.lse.as_ref().or(self.in_place_lse.as_ref());
        let raw = sys::fd_merge_args {
            num_states,
            states_out: outs.as_ptr(),
            states_lse: lses.as_ptr(),
            out: self.out.raw(),
            lse: merged_lse.map_or(sys::fd_tensor::ABSENT, TensorMut::raw),
            ..sys::fd_merge_args::default()
        };
        Ok((outs, lses, raw))
    }

    fn memories(&self) -> Vec<(String, Memory)> {
        let mut found = vec![("out".to_owned(), self.out.memory())];
        found.extend(self.lse.as_ref().map(|t| ("lse".to_owned(), t.memory())));
        let first = usize::from(self.in_place_lse.is_some());
        found.extend(
            self.in_place_lse
                .as_ref()
                .map(|t| ("states_lse[0]".to_owned(), t.memory())),
        );
        for (index, (out, lse)) in self.states.iter().enumerate() {
            found.push((format!("states_out[{}]", first + index), out.memory()));
            found.push((format!("states_lse[{}]", first + index), lse.memory()));
        }
        found
    }
}

/// Host memory aligned for [`Handle::set_host_workspace`].
#[derive(Debug)]
pub struct HostWorkspace {
    memory: NonNull<u8>,
    layout: Layout,
    bytes: usize,
}

// It owns its memory.
unsafe impl Send for HostWorkspace {}

impl HostWorkspace {
    /// Allocates `bytes` (uninitialised), aligned to 256 bytes.
    pub fn new(bytes: usize) -> Result<HostWorkspace> {
        let layout = Layout::from_size_align(bytes.max(1), sys::WORKSPACE_ALIGNMENT)
            .map_err(|_| Error::refused(Status::OutOfMemory, format!("workspace: {} bytes is too large", bytes)))?;
        // SAFETY: the layout has a non-zero size.
        let memory = NonNull::new(unsafe { alloc::alloc(layout) }).ok_or_else(|| {
            Error::refused(
                Status::OutOfMemory,
                format!("workspace: cannot allocate {} bytes", bytes),
            )
        })?;
        Ok(HostWorkspace { memory, layout, bytes })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for HostWorkspace {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.memory.as_ptr(), self.layout) };
    }
}

/// A decode handle: a backend, its device, and a workspace reused across calls.
///
/// Destroyed (and its library-owned workspace freed) on drop. For CUDA, work
/// enqueued with it must have finished before it is dropped.
///
/// # Threads
/// A handle is `Send` but not `Sync`: the C API lets a handle move between
/// threads but not be used by two at once (every call uses its workspace).
/// Methods that touch the workspace take `&mut self`, so the borrow checker
/// enforces that; for parallel decodes, use one handle per thread.
pub struct Handle {
    raw: NonNull<sys::fd_handle>,
    library: Library,
    backend: Backend,
    device: i32,
    host_workspace: Option<HostWorkspace>,
}

// SAFETY: see "Threads" above; fd_handle has no thread affinity.
unsafe impl Send for Handle {}

// Here rather than in `library`, so that dependencies go one way: `handle`
// uses `library`, never the reverse.
impl Library {
    /// Creates a handle; the same as [`Handle::new`].
    pub fn create_handle(&self, options: &Options) -> Result<Handle> {
        Handle::new(self, options)
    }
}

impl Handle {
    /// Creates a handle on `library`.
    ///
    /// Fails with [`Status::NoDevice`] when CUDA was asked for and the device
    /// (or the library's CUDA support) is missing, [`Status::InvalidArgument`]
    /// for a bad device or thread count.
    pub fn new(library: &Library, options: &Options) -> Result<Handle> {
        let functions = library.functions();
        if options.check_contents {
            library.require(3, "check_contents")?;
        }
        let raw_options = sys::fd_options {
            backend: options.backend as sys::fd_backend,
            device: options.device,
            num_threads: options.num_threads,
            checks: if options.check_contents {
                sys::CHECK_CONTENTS
            } else {
                sys::CHECK_NONE
            },
            ..sys::fd_options::default()
        };
        let mut raw: *mut sys::fd_handle = std::ptr::null_mut();
        // SAFETY: both pointers are valid for the call.
        library.check(unsafe { (functions.fd_create)(&mut raw, &raw_options) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::refused(Status::Internal, "fd_create returned no handle"))?;
        let mut handle = Handle {
            raw,
            library: library.clone(),
            backend: options.backend,
            device: options.device,
            host_workspace: None,
        };
        let mut resolved: sys::fd_backend = 0;
        // SAFETY: a live handle and a valid output pointer.
        library.check(unsafe { (functions.fd_get_backend)(handle.raw.as_ptr(), &mut resolved) })?;
        handle.backend = if resolved == Backend::Cuda as i32 {
            Backend::Cuda
        } else {
            Backend::Cpu
        };
        Ok(handle)
    }

    /// The backend it runs on (`Auto` resolved).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The library it was made from.
    pub fn library(&self) -> &Library {
        &self.library
    }

    /// Decode attention for the newest query tokens of every sequence (see
    /// [`DecodeArgs`]): on the CPU backend synchronously, on CUDA enqueued on
    /// the legacy default stream.
    ///
    /// On error nothing is written, and the error names the argument at fault.
    pub fn decode(&mut self, args: &mut DecodeArgs<'_>) -> Result<()> {
        self.decode_on(args, CudaStream::LEGACY_DEFAULT)
    }

    /// [`decode`](Self::decode), enqueued on `stream` (CUDA backend; the CPU ignores it).
    pub fn decode_on(&mut self, args: &mut DecodeArgs<'_>, stream: CudaStream) -> Result<()> {
        self.check_memory(args)?;
        let raw = args.raw(&self.library)?;
        // SAFETY: the tensors borrow memory that outlives the call (host) or
        // was promised valid by an unsafe constructor (device), and is of the
        // kind this backend reads.
        self.library
            .check(unsafe { (self.library.functions().fd_decode)(self.raw.as_ptr(), &raw, stream.as_raw()) })
    }

    /// Bytes of workspace [`decode`](Self::decode) needs for `args` on this
    /// handle; depends only on shapes, the split count and the window.
    pub fn workspace_size(&self, args: &DecodeArgs<'_>) -> Result<usize> {
        let raw = args.raw(&self.library)?;
        let mut bytes = 0usize;
        // SAFETY: shapes only are read; the pointers are not dereferenced.
        self.library
            .check(unsafe { (self.library.functions().fd_workspace_size)(self.raw.as_ptr(), &raw, &mut bytes) })?;
        Ok(bytes)
    }

    /// What [`decode`](Self::decode) would run for `args` on this handle,
    /// without running it; validates `args` as `decode` does.
    pub fn describe_plan(&self, args: &DecodeArgs<'_>) -> Result<PlanInfo> {
        let raw = args.raw(&self.library)?;
        let mut info = sys::fd_plan_info::default();
        // SAFETY: shapes only are read; the pointers are not dereferenced.
        self.library
            .check(unsafe { (self.library.functions().fd_describe_plan)(self.raw.as_ptr(), &raw, &mut info) })?;
        let kernel = if info.kernel.is_null() {
            String::new()
        } else {
            // SAFETY: a static NUL-terminated string of the library.
            unsafe { std::ffi::CStr::from_ptr(info.kernel) }
                .to_string_lossy()
                .into_owned()
        };
        let merge = match info.merge {
            0 => Merge::None,
            1 => Merge::Separate,
            2 => Merge::Fused,
            3 => Merge::Cluster,
            other => Merge::Other(other),
        };
        let schedule = match info.schedule {
            0 => Schedule::Fixed,
            1 => Schedule::LongestFirst,
            2 => Schedule::Fitted,
            3 => Schedule::Balanced,
            other => Schedule::Other(other),
        };
        Ok(PlanInfo {
            backend: if info.backend == Backend::Cuda as i32 {
                Backend::Cuda
            } else {
                Backend::Cpu
            },
            num_splits: info.num_splits,
            split_tokens: info.split_tokens,
            workspace_bytes: info.workspace_bytes,
            kernel,
            merge,
            launches: info.launches,
            blocks: info.blocks,
            schedule,
        })
    }

    /// Reports a bad `seq_lens` or `block_table` entry that a checked decode
    /// found (`fd_check_contents`, since 0.3), after waiting for the legacy
    /// default stream; see [`check_contents_on`](Self::check_contents_on).
    pub fn check_contents(&mut self) -> Result<()> {
        self.check_contents_on(CudaStream::LEGACY_DEFAULT)
    }

    /// Reports a bad `seq_lens` or `block_table` entry that a checked decode
    /// found, after waiting for `stream` (the one the decodes ran on).
    ///
    /// For handles created with [`Options::check_contents`]. On CUDA the
    /// checks run on the device, asynchronously: this synchronises `stream`
    /// and returns what the first bad decode since the last report found
    /// ([`Status::InvalidLength`] or [`Status::InvalidBlockTable`]), then
    /// clears the report. On the CPU backend [`decode`](Self::decode) fails
    /// at once, so there is never anything left to report. Fails with
    /// [`Status::InvalidArgument`] for a handle without checks (or a stream
    /// being captured into a CUDA graph), [`Status::Unsupported`] with a
    /// library older than 0.3.
    pub fn check_contents_on(&mut self, stream: CudaStream) -> Result<()> {
        self.library.require(3, "check_contents")?;
        let check = self.library.functions().fd_check_contents.ok_or_else(|| {
            Error::refused(
                Status::Unsupported,
                "check_contents: the library does not export fd_check_contents",
            )
        })?;
        // SAFETY: a live handle; the stream is the caller's (null: the legacy default).
        self.library.check(unsafe { check(self.raw.as_ptr(), stream.as_raw()) })
    }

    /// Merges partial attention results by their log-sum-exps
    /// (`fd_merge_states`, since 0.3; see [`MergeArgs`]): on the CPU backend
    /// synchronously, on CUDA enqueued on the legacy default stream.
    ///
    /// On error nothing is written, and the error names the argument at
    /// fault (a state whose shape differs from `out`'s:
    /// [`Status::InvalidShape`]; an LSE that is not f32:
    /// [`Status::InvalidDType`]). A library older than 0.3 refuses it with
    /// [`Status::Unsupported`].
    pub fn merge_states(&mut self, args: &mut MergeArgs<'_>) -> Result<()> {
        self.merge_states_on(args, CudaStream::LEGACY_DEFAULT)
    }

    /// [`merge_states`](Self::merge_states), enqueued on `stream` (CUDA
    /// backend: one kernel, no allocation, no synchronisation, so it may be
    /// captured in a CUDA graph; the CPU ignores the stream).
    pub fn merge_states_on(&mut self, args: &mut MergeArgs<'_>, stream: CudaStream) -> Result<()> {
        self.library.require(3, "merge_states")?;
        let merge = self.library.functions().fd_merge_states.ok_or_else(|| {
            Error::refused(
                Status::Unsupported,
                "merge_states: the library does not export fd_merge_states",
            )
        })?;
        for (name, memory) in args.memories() {
            self.check_placement(&name, memory)?;
        }
        let (_outs, _lses, raw) = args.raw()?;
        // SAFETY: the tensors borrow memory that outlives the call (host) or
        // was promised valid by an unsafe constructor (device), and is of the
        // kind this backend reads; `raw` points into `_outs` and `_lses`,
        // which live until the end of this function.
        self.library
            .check(unsafe { merge(self.raw.as_ptr(), &raw, stream.as_raw()) })
    }

    /// Writes new keys and values into a cache, converting them to its dtype
    /// (`fd_append_kv`, since 0.3; see [`AppendArgs`]). On the CPU backend
    /// it is synchronous; on CUDA it is enqueued on the legacy default stream.
    pub fn append_kv(&mut self, args: &mut AppendArgs<'_>) -> Result<()> {
        self.append_kv_on(args, CudaStream::LEGACY_DEFAULT)
    }

    /// [`Handle::append_kv`] on a CUDA stream (ignored by the CPU backend).
    pub fn append_kv_on(&mut self, args: &mut AppendArgs<'_>, stream: CudaStream) -> Result<()> {
        self.library.require(3, "append_kv")?;
        let append = self.library.functions().fd_append_kv.ok_or_else(|| {
            Error::refused(
                Status::Unsupported,
                "append_kv: the library does not export fd_append_kv",
            )
        })?;
        for (name, memory) in args.memories() {
            self.check_placement(name, memory)?;
        }
        let raw = args.raw();
        // SAFETY: the tensors borrow memory that outlives the call (host; the
        // cache mutably) or was promised valid by an unsafe constructor
        // (device), and is of the kind this backend reads.
        self.library
            .check(unsafe { append(self.raw.as_ptr(), &raw, stream.as_raw()) })
    }

    /// Makes the library-owned workspace at least `bytes`, so that decodes
    /// that fit do not allocate (for CUDA graph capture, real-time loops).
    pub fn reserve_workspace(&mut self, bytes: usize) -> Result<()> {
        // SAFETY: a live handle.
        self.library
            .check(unsafe { (self.library.functions().fd_reserve_workspace)(self.raw.as_ptr(), bytes) })
    }

    /// Hands the handle host memory of your own as its workspace (CPU
    /// backend); returns the one it replaces, if it was also yours.
    pub fn set_host_workspace(&mut self, workspace: HostWorkspace) -> Result<Option<HostWorkspace>> {
        if self.backend != Backend::Cpu {
            return Err(Error::refused(
                Status::InvalidArgument,
                "workspace: host memory, but the handle runs on the CUDA backend; use set_workspace_raw with device memory",
            ));
        }
        // SAFETY: the memory is kept alive in `self` until it is replaced or the handle dropped.
        unsafe { self.set_raw(workspace.memory.as_ptr() as *mut c_void, workspace.bytes)? };
        Ok(self.host_workspace.replace(workspace))
    }

    /// Hands the handle caller-owned workspace memory by pointer, e.g.
    /// device memory for the CUDA backend; returns a previous
    /// [`HostWorkspace`] if there was one.
    ///
    /// # Safety
    /// `workspace` must be memory of the handle's kind (host for the CPU
    /// backend, the device's for CUDA), at least `bytes` long, aligned to
    /// 256 bytes, and used by nothing else until it is replaced or the handle
    /// is dropped (and its last decode has finished).
    pub unsafe fn set_workspace_raw(
        &mut self,
        workspace: NonNull<c_void>,
        bytes: usize,
    ) -> Result<Option<HostWorkspace>> {
        // SAFETY: the caller's promise above.
        unsafe { self.set_raw(workspace.as_ptr(), bytes)? };
        Ok(self.host_workspace.take())
    }

    /// Goes back to a library-owned workspace; returns a previous [`HostWorkspace`].
    pub fn use_library_workspace(&mut self) -> Result<Option<HostWorkspace>> {
        // SAFETY: null hands the workspace back to the library.
        unsafe { self.set_raw(std::ptr::null_mut(), 0)? };
        Ok(self.host_workspace.take())
    }

    /// # Safety
    /// As for [`set_workspace_raw`](Self::set_workspace_raw); null goes back to library-owned memory.
    unsafe fn set_raw(&mut self, workspace: *mut c_void, bytes: usize) -> Result<()> {
        // SAFETY: a live handle; the memory is the caller's promise.
        let status = unsafe { (self.library.functions().fd_set_workspace)(self.raw.as_ptr(), workspace, bytes) };
        self.library.check(status)
    }

    /// Host tensors on a CUDA handle (or device tensors on a CPU one) would
    /// be dereferenced in the wrong address space: refuse them here.
    fn check_memory(&self, args: &DecodeArgs<'_>) -> Result<()> {
        for (name, memory) in args.memories() {
            self.check_placement(name, memory)?;
        }
        Ok(())
    }

    /// `Ok` if a tensor named `name` in `memory` is in this backend's kind of memory.
    fn check_placement(&self, name: &str, memory: Memory) -> Result<()> {
        let expected = if self.backend == Backend::Cuda {
            Memory::Device
        } else {
            Memory::Host
        };
        if memory != expected {
            let backend = if self.backend == Backend::Cuda {
                format!("CUDA device {}", self.device)
            } else {
                "the CPU backend".to_owned()
            };
            return Err(Error::refused(
                Status::InvalidArgument,
                format!("{}: is {}, but the handle runs on {}", name, memory, backend),
            ));
        }
        Ok(())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once. A failure cannot be
        // reported from drop, and can only mean a bug.
        let status = unsafe { (self.library.functions().fd_destroy)(self.raw.as_ptr()) };
        debug_assert_eq!(status, 0, "fd_destroy failed");
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("backend", &self.backend)
            .field("device", &self.device)
            .finish()
    }
}
