// SPDX-License-Identifier: Apache-2.0
//! Tensor views: host slices (checked, safe) or device pointers (unsafe to make).

use std::marker::PhantomData;
use std::os::raw::c_void;

use crate::error::{Error, Result, Status};
use crate::sys;

/// Element type of a tensor (`fd_dtype`). Values are pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE binary32.
    F32 = 0,
    /// IEEE binary16, stored as `u16` bits.
    F16 = 1,
    /// bfloat16 (the upper half of a binary32), stored as `u16` bits.
    Bf16 = 2,
    /// `i32`, for sequence lengths and block tables.
    I32 = 3,
    /// Since 0.3: OCP fp8 E4M3 (`float8_e4m3fn`), for K/V caches, stored as `u8` bits.
    E4m3 = 4,
    /// Since 0.3: OCP fp8 E5M2 (`float8_e5m2`), for K/V caches, stored as `u8` bits.
    E5m2 = 5,
    /// Since 0.3: `i8`, for K/V caches.
    I8 = 6,
}

impl DType {
    /// Whether this is one of the 8-bit cache dtypes of 0.3 ([`E4m3`](DType::E4m3),
    /// [`E5m2`](DType::E5m2), [`I8`](DType::I8)).
    pub fn is_8_bit(self) -> bool {
        matches!(self, DType::E4m3 | DType::E5m2 | DType::I8)
    }
}

/// Where a tensor's memory is: the CPU backend reads host memory, the CUDA
/// backend device memory, and a handle refuses the other kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory, borrowed from a slice.
    Host,
    /// CUDA device memory, from a raw pointer.
    Device,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Memory::Host => "host memory",
            Memory::Device => "device memory",
        })
    }
}

/// What [`Tensor`] and [`TensorMut`] share: the C descriptor and, for host
/// memory, the slice length every shape and stride is checked against.
#[derive(Clone, Copy, Debug)]
struct View {
    raw: sys::fd_tensor,
    host_len: Option<usize>,
}

impl View {
    fn new(data: *mut c_void, dtype: DType, shape: &[i64], host_len: Option<usize>) -> Result<View> {
        let ndim = shape.len();
        if ndim == 0 || ndim > sys::MAX_DIMS {
            return Err(Error::refused(
                Status::InvalidShape,
                format!("tensor: {} dimensions, expected 1 to {}", ndim, sys::MAX_DIMS),
            ));
        }
        let mut raw = sys::fd_tensor {
            data,
            dtype: dtype as i32,
            ndim: ndim as i32,
            ..sys::fd_tensor::ABSENT
        };
        raw.shape[..ndim].copy_from_slice(shape);
        let mut step = 1i64;
        for axis in (0..ndim).rev() {
            raw.strides[axis] = step;
            step = step.saturating_mul(shape[axis].max(1));
        }
        let view = View { raw, host_len };
        view.check()?;
        Ok(view)
    }

    fn with_strides(mut self, strides: &[i64]) -> Result<View> {
        let ndim = self.raw.ndim as usize;
        if strides.len() != ndim {
            return Err(Error::refused(
                Status::InvalidStride,
                format!("tensor: {} strides for {} dimensions", strides.len(), ndim),
            ));
        }
        self.raw.strides[..ndim].copy_from_slice(strides);
        self.check()?;
        Ok(self)
    }

    fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.ndim as usize]
    }

    fn strides(&self) -> &[i64] {
        &self.raw.strides[..self.raw.ndim as usize]
    }

    fn memory(&self) -> Memory {
        if self.host_len.is_some() {
            Memory::Host
        } else {
            Memory::Device
        }
    }

    /// Extents and strides must not be negative, and for host memory every
    /// element they address must lie inside the slice: that is what makes
    /// handing the pointer to C safe.
    fn check(&self) -> Result<()> {
        let (shape, strides) = (self.shape(), self.strides());
        if let Some(extent) = shape.iter().find(|&&extent| extent < 0) {
            return Err(Error::refused(
                Status::InvalidShape,
                format!("tensor: shape {:?} has a negative extent {}", shape, extent),
            ));
        }
        if let Some(stride) = strides.iter().find(|&&stride| stride < 0) {
            return Err(Error::refused(
                Status::InvalidStride,
                format!("tensor: strides {:?} have a negative stride {}", strides, stride),
            ));
        }
        let len = match self.host_len {
            Some(len) => len as i128,
            None => return Ok(()),
        };
        if shape.contains(&0) {
            return Ok(()); // no element is addressed
        }
        let last = shape
            .iter()
            .zip(strides)
            .map(|(&extent, &stride)| (extent as i128 - 1) * stride as i128)
            .fold(0i128, i128::saturating_add);
        if last >= len {
            return Err(Error::refused(
                Status::InvalidShape,
                format!(
                    "tensor: shape {:?} with strides {:?} reaches element {}, but the slice has {}",
                    shape, strides, last, len
                ),
            ));
        }
        Ok(())
    }
}

/// A read-only tensor: a host slice borrowed for `'a`, or device memory.
///
/// The dimension order is fixed by the tensor's role (see
/// [`DecodeArgs`](crate::DecodeArgs)); the layout is given by strides, in
/// elements, row-major by default.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    view: View,
    _borrow: PhantomData<&'a [u8]>,
}

/// A tensor the call writes: a mutable host slice borrowed for `'a`, or device memory.
#[derive(Debug)]
pub struct TensorMut<'a> {
    view: View,
    _borrow: PhantomData<&'a mut [u8]>,
}

macro_rules! tensor_common {
    () => {
        /// Replaces the row-major strides (in elements; the last one must be 1).
        ///
        /// Fails if a stride is negative or, for host memory, if an element
        /// would lie outside the slice.
        pub fn with_strides(self, strides: &[i64]) -> Result<Self> {
            Ok(Self {
                view: self.view.with_strides(strides)?,
                _borrow: PhantomData,
            })
        }

        /// The element type.
        pub fn dtype(&self) -> DType {
            match self.view.raw.dtype {
                0 => DType::F32,
                1 => DType::F16,
                2 => DType::Bf16,
                4 => DType::E4m3,
                5 => DType::E5m2,
                6 => DType::I8,
                _ => DType::I32,
            }
        }

        /// The extents.
        pub fn shape(&self) -> &[i64] {
            self.view.shape()
        }

        /// The strides, in elements.
        pub fn strides(&self) -> &[i64] {
            self.view.strides()
        }

        /// Host or device memory.
        pub fn memory(&self) -> Memory {
            self.view.memory()
        }

        pub(crate) fn raw(&self) -> sys::fd_tensor {
            self.view.raw
        }
    };
}

impl<'a> Tensor<'a> {
    fn host<T>(data: &'a [T], dtype: DType, shape: &[i64]) -> Result<Self> {
        let view = View::new(data.as_ptr() as *mut c_void, dtype, shape, Some(data.len()))?;
        Ok(Tensor {
            view,
            _borrow: PhantomData,
        })
    }

    /// `f32` elements, row-major `shape`.
    pub fn f32(data: &'a [f32], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::F32, shape)
    }

    /// IEEE half-precision elements given as their `u16` bits.
    pub fn f16(data: &'a [u16], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::F16, shape)
    }

    /// bfloat16 elements given as their `u16` bits.
    pub fn bf16(data: &'a [u16], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::Bf16, shape)
    }

    /// An 8-bit cache given as its bytes (since 0.3): `dtype` is [`DType::E4m3`],
    /// [`DType::E5m2`] or [`DType::I8`] (the bytes of `i8`s); any other dtype is refused.
    pub fn bytes(data: &'a [u8], dtype: DType, shape: &[i64]) -> Result<Self> {
        check_8_bit(dtype)?;
        Self::host(data, dtype, shape)
    }

    /// An `i8` cache (since 0.3): the value of each element is the integer (times its scale).
    pub fn i8(data: &'a [i8], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::I8, shape)
    }

    /// One dequantization scale for a whole 8-bit cache (since 0.3): `[scale]`
    /// seen as the cache's first three dimensions with strides of 0. `cache_shape`
    /// is the cache's shape (`k.shape()`); nothing is copied.
    /// `data` must hold exactly one value.
    pub fn scale_per_tensor(data: &'a [f32], cache_shape: &[i64]) -> Result<Self> {
        check_scale_count(data, 1, "scale_per_tensor", "one value")?;
        Self::host(data, DType::F32, &[1])?.broadcast_scale(cache_shape, Scales::Tensor)
    }

    /// One scale per KV head (since 0.3): `[kv_heads]` seen as the cache's
    /// first three dimensions with strides `{0, 0, 1}`; `data` must hold
    /// exactly kv_heads (`cache_shape[2]`) values.
    pub fn scale_per_head(data: &'a [f32], cache_shape: &[i64]) -> Result<Self> {
        let heads = cache_shape.get(2).copied().unwrap_or(0);
        check_scale_count(data, heads, "scale_per_head", "kv_heads values")?;
        Self::host(data, DType::F32, &[heads])?.broadcast_scale(cache_shape, Scales::Head)
    }

    /// One scale per token and KV head (since 0.3): a contiguous
    /// `[batch, kv_capacity, kv_heads]` (dense) or `[num_pages, page_size, kv_heads]` (paged)
    /// array, the cache's shape without head_dim, of exactly that many values.
    pub fn scale_per_token(data: &'a [f32], cache_shape: &[i64]) -> Result<Self> {
        let dims = &cache_shape[..cache_shape.len().min(3)];
        let count = dims
            .iter()
            .try_fold(1i64, |n, &d| n.checked_mul(d.max(0)))
            .unwrap_or(i64::MAX);
        check_scale_count(data, count, "scale_per_token", "a value for each token and KV head")?;
        Self::host(data, DType::F32, dims)
    }

    /// `self` (a 1-element or a `[kv_heads]` f32 tensor, host or device) broadcast
    /// over the cache's first three dimensions by strides of 0, as a scale.
    fn broadcast_scale(self, cache_shape: &[i64], scales: Scales) -> Result<Self> {
        if cache_shape.len() < 3 {
            return Err(Error::refused(
                Status::InvalidShape,
                format!("scale: the cache's shape {:?} has fewer than 3 dimensions", cache_shape),
            ));
        }
        let mut view = self.view;
        view.raw.ndim = 3;
        view.raw.shape[..3].copy_from_slice(&cache_shape[..3]);
        let head_stride = match scales {
            Scales::Tensor => 0,
            Scales::Head => self.view.raw.strides[0],
        };
        view.raw.strides[..3].copy_from_slice(&[0, 0, head_stride]);
        if scales == Scales::Head {
            view.raw.shape[2] = self.view.raw.shape[0]; // the library checks it against the cache's kv_heads
        }
        view.check()?;
        Ok(Tensor {
            view,
            _borrow: PhantomData,
        })
    }

    /// Device scales (since 0.3): `data` is one f32 for the whole cache
    /// ([`Tensor::scale_per_tensor`]'s form) or `[kv_heads]` f32s
    /// ([`Tensor::scale_per_head`]'s, with `per_head`), seen as the cache's
    /// first three dimensions by strides of 0. For per-token scales use
    /// [`Tensor::device`] with the cache's first three dimensions.
    ///
    /// # Safety
    ///
    /// As [`Tensor::device`].
    pub unsafe fn device_scale(data: *const c_void, cache_shape: &[i64], per_head: bool) -> Result<Self> {
        if per_head {
            let heads = cache_shape.get(2).copied().unwrap_or(0);
            // SAFETY: the caller's promise.
            unsafe { Self::device(data, DType::F32, &[heads]) }?.broadcast_scale(cache_shape, Scales::Head)
        } else {
            // SAFETY: the caller's promise.
            unsafe { Self::device(data, DType::F32, &[1]) }?.broadcast_scale(cache_shape, Scales::Tensor)
        }
    }

    /// `i32` elements (sequence lengths, block tables).
    pub fn i32(data: &'a [i32], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::I32, shape)
    }

    /// A tensor in CUDA device memory, row-major until [`with_strides`](Self::with_strides).
    ///
    /// # Safety
    /// `data` must point to device memory of the handle's device holding
    /// every element the shape and strides address, and stay valid, and not
    /// be written by anyone else, until the decode reading it has finished
    /// on its stream.
    pub unsafe fn device(data: *const c_void, dtype: DType, shape: &[i64]) -> Result<Self> {
        let view = View::new(data as *mut c_void, dtype, shape, None)?;
        Ok(Tensor {
            view,
            _borrow: PhantomData,
        })
    }

    tensor_common!();
}

impl<'a> TensorMut<'a> {
    /// The same memory as an input: the query of an in-place decode, which
    /// the library reads before it writes there (no Rust reference to the
    /// memory is made: both are raw descriptors).
    pub(crate) fn reborrow_as_input(&self) -> Tensor<'a> {
        Tensor {
            view: self.view,
            _borrow: PhantomData,
        }
    }

    fn host<T>(data: &'a mut [T], dtype: DType, shape: &[i64]) -> Result<Self> {
        let view = View::new(data.as_mut_ptr() as *mut c_void, dtype, shape, Some(data.len()))?;
        Ok(TensorMut {
            view,
            _borrow: PhantomData,
        })
    }

    /// `f32` elements, row-major `shape`.
    pub fn f32(data: &'a mut [f32], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::F32, shape)
    }

    /// IEEE half-precision elements given as their `u16` bits.
    pub fn f16(data: &'a mut [u16], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::F16, shape)
    }

    /// An 8-bit cache given as its bytes, written by
    /// [`Handle::append_kv`](crate::Handle::append_kv) (since 0.3): `dtype` is
    /// [`DType::E4m3`], [`DType::E5m2`] or [`DType::I8`].
    pub fn bytes(data: &'a mut [u8], dtype: DType, shape: &[i64]) -> Result<Self> {
        check_8_bit(dtype)?;
        Self::host(data, dtype, shape)
    }

    /// An `i8` cache, written by [`Handle::append_kv`](crate::Handle::append_kv) (since 0.3).
    pub fn i8(data: &'a mut [i8], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::I8, shape)
    }

    /// The same memory, read-only: for the decode after an append.
    pub fn as_tensor(&self) -> Tensor<'_> {
        Tensor {
            view: self.view,
            _borrow: PhantomData,
        }
    }

    /// bfloat16 elements given as their `u16` bits.
    pub fn bf16(data: &'a mut [u16], shape: &[i64]) -> Result<Self> {
        Self::host(data, DType::Bf16, shape)
    }

    /// A tensor in CUDA device memory that the call writes.
    ///
    /// # Safety
    /// As for [`Tensor::device`], and nothing else may read or write the
    /// memory until the decode writing it has finished on its stream.
    pub unsafe fn device(data: *mut c_void, dtype: DType, shape: &[i64]) -> Result<Self> {
        let view = View::new(data, dtype, shape, None)?;
        Ok(TensorMut {
            view,
            _borrow: PhantomData,
        })
    }

    tensor_common!();
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scales {
    Tensor,
    Head,
}

/// A scale constructor's slice holds exactly the values its form takes: a
/// longer one would be read in part without a word (a per-query-head array
/// for a per-KV-head scale, say).
fn check_scale_count(data: &[f32], want: i64, form: &str, what: &str) -> Result<()> {
    if i64::try_from(data.len()).ok() != Some(want) {
        return Err(Error::refused(
            Status::InvalidShape,
            format!(
                "{}: the cache takes {} ({}), the slice has {}",
                form,
                what,
                want,
                data.len()
            ),
        ));
    }
    Ok(())
}

fn check_8_bit(dtype: DType) -> Result<()> {
    if dtype.is_8_bit() {
        return Ok(());
    }
    Err(Error::refused(
        Status::InvalidDType,
        format!(
            "tensor: bytes hold an 8-bit cache dtype (E4m3, E5m2, I8), not {:?}",
            dtype
        ),
    ))
}

/// A CUDA stream (`cudaStream_t`) for [`Handle::decode_on`](crate::Handle::decode_on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaStream(sys::fd_cuda_stream);

// A stream handle may be used from any thread.
unsafe impl Send for CudaStream {}
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// The legacy default stream (`NULL`).
    pub const LEGACY_DEFAULT: CudaStream = CudaStream(std::ptr::null_mut());

    /// Wraps a `cudaStream_t` from the CUDA runtime or another library.
    ///
    /// # Safety
    /// `stream` must be a valid stream of the handle's device (or one of
    /// CUDA's special stream values) for as long as it is used.
    pub unsafe fn from_raw(stream: *mut c_void) -> CudaStream {
        CudaStream(stream)
    }

    /// The `cudaStream_t`.
    pub fn as_raw(self) -> *mut c_void {
        self.0
    }
}

impl Default for CudaStream {
    fn default() -> Self {
        CudaStream::LEGACY_DEFAULT
    }
}
