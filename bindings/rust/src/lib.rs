// SPDX-License-Identifier: Apache-2.0
//! Flash-decoding attention for LLM inference: a safe binding of
//! libflashdecode's C ABI.
//!
//! The newest query tokens of each sequence (one for plain decode, up to 64
//! for speculative steps) attend to a KV cache that is split along the
//! sequence, computed per split in parallel and merged; with grouped-query
//! attention, ragged lengths, paged caches, any strided layout, the
//! log-sum-exp, a reusable workspace, and the attention variants of 0.3
//! (causal or full masks, sliding windows, logit softcaps, ALiBi and
//! attention sinks: see [`DecodeArgs`]).
//!
//! The library is loaded at run time with `dlopen` ([`Library::load`]:
//! `$FLASHDECODE_LIBRARY`, else the SONAME `libflashdecode.so.0`), so nothing
//! is needed at build time and no crate beyond `std` is used. Its version
//! is checked when it is loaded: major 0, minor 2 or later. A 0.2 library
//! works without what 0.3 added (content checks, [`DecodeArgs::split_tokens`],
//! [`Handle::merge_states`], the attention variants), which then fails with
//! [`Status::Unsupported`].
//!
//! Partial results of a cache decoded in parts, each with its log-sum-exp
//! (a shared prefix and each sequence's suffix in cascade attention, or
//! the shards of context-parallel decode on several GPUs), merge into the
//! attention over the whole cache with [`Handle::merge_states`] (see
//! [`MergeArgs`]).
//!
//! ```
//! use flashdecode::{DecodeArgs, Library, Options, Tensor, TensorMut};
//!
//! # fn main() -> Result<(), flashdecode::Error> {
//! let (batch, heads, kv_heads, kv_len, dim) = (2, 8, 2, 100, 64);
//! let q = vec![0.1f32; (batch * heads * dim) as usize];
//! let k = vec![0.2f32; (batch * kv_len * kv_heads * dim) as usize];
//! let v = vec![1.0f32; k.len()];
//! let lens = [100, 7];
//! let mut out = vec![0f32; q.len()];
//!
//! let library = Library::load()?;
//! let mut handle = library.create_handle(&Options::cpu())?;
//! // A BHND cache [batch, kv_heads, kv_len, dim] would be the same call
//! // with .with_strides(&[kv_heads * kv_len * dim, dim, kv_len * dim, 1]).
//! let mut args = DecodeArgs::new(
//!     Tensor::f32(&q, &[batch, 1, heads, dim])?,
//!     Tensor::f32(&k, &[batch, kv_len, kv_heads, dim])?,
//!     Tensor::f32(&v, &[batch, kv_len, kv_heads, dim])?,
//!     TensorMut::f32(&mut out, &[batch, 1, heads, dim])?,
//! )
//! .seq_lens(Tensor::i32(&lens, &[batch])?);
//! handle.decode(&mut args)?;
//! assert!(out.iter().all(|&x| (x - 1.0).abs() < 1e-6));
//! # Ok(())
//! # }
//! ```
//!
//! # Memory
//! Host tensors borrow slices ([`Tensor::f32`], [`TensorMut::bf16`], ...):
//! their shapes and strides are checked against the slice, so a decode on
//! the CPU backend cannot read or write outside it. CUDA tensors wrap raw
//! device pointers through `unsafe` constructors ([`Tensor::device`]), and
//! a handle refuses tensors in the other kind of memory. f16 and bf16
//! elements are their `u16` bits.
//!
//! # Errors
//! Every call returns [`Result`]; an [`Error`] carries a [`Status`] and the
//! library's message naming the argument at fault. Nothing is written on
//! error.
//!
//! # Threads
//! [`Library`] is `Send + Sync`. [`Handle`] is `Send` but not `Sync`: a
//! handle may move between threads but must not be used by two at once.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(rust_2018_idioms)]

mod error;
mod handle;
mod library;
pub mod sys;
mod tensor;

pub use error::{Error, Result, Status};
pub use handle::{
    AppendArgs, AttentionMask, Backend, DecodeArgs, Handle, HostWorkspace, Merge, MergeArgs, Options, PlanInfo,
    Schedule,
};
pub use library::Library;
pub use tensor::{CudaStream, DType, Memory, Tensor, TensorMut};
