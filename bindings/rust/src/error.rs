// SPDX-License-Identifier: Apache-2.0
//! Status codes and the error type every fallible call returns.

use std::fmt;

/// Why a call failed: `fd_status` without its success value. Values are pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// A required pointer (an output, or a tensor's data) was null.
    NullPointer = 1,
    /// A scalar argument is invalid, or a tensor is in the wrong kind of memory.
    InvalidArgument = 2,
    /// A dtype is not allowed for that tensor, or q/k/v dtypes differ.
    InvalidDType = 3,
    /// head_dim is out of range.
    InvalidHeadDim = 4,
    /// A head count is out of range, or query heads are not a multiple of KV heads.
    InvalidHeadCount = 5,
    /// A tensor's rank or extents are invalid, disagree with another's, or exceed its slice.
    InvalidShape = 6,
    /// A stride is negative, or head_dim is not contiguous.
    InvalidStride = 7,
    /// A sequence length is negative or longer than its cache.
    InvalidLength = 8,
    /// A block table entry points outside the page pool.
    InvalidBlockTable = 9,
    /// `num_splits` is negative or too large.
    InvalidSplits = 10,
    /// The caller-provided workspace is smaller than the problem needs.
    WorkspaceTooSmall = 11,
    /// The handle is not live.
    InvalidHandle = 12,
    /// Valid input that the backend does not support (yet).
    Unsupported = 13,
    /// No usable CUDA device, or a library built without CUDA.
    NoDevice = 14,
    /// Host or device memory could not be allocated.
    OutOfMemory = 15,
    /// The CUDA runtime reported an error.
    Cuda = 16,
    /// A bug in flashdecode (also used for a status newer than this binding).
    Internal = 17,
}

impl Status {
    const ALL: [Status; 17] = [
        Status::NullPointer,
        Status::InvalidArgument,
        Status::InvalidDType,
        Status::InvalidHeadDim,
        Status::InvalidHeadCount,
        Status::InvalidShape,
        Status::InvalidStride,
        Status::InvalidLength,
        Status::InvalidBlockTable,
        Status::InvalidSplits,
        Status::WorkspaceTooSmall,
        Status::InvalidHandle,
        Status::Unsupported,
        Status::NoDevice,
        Status::OutOfMemory,
        Status::Cuda,
        Status::Internal,
    ];

    /// Every status, in code order.
    pub fn all() -> impl Iterator<Item = Status> {
        Status::ALL.iter().copied()
    }

    /// The status for a nonzero `fd_status` code; `None` for a code this binding does not know.
    pub fn from_code(code: i32) -> Option<Status> {
        Status::ALL.iter().copied().find(|status| status.code() == code)
    }

    /// The `fd_status` value.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The short text `fd_status_string` gives, e.g. `"invalid shape"`.
    pub fn summary(self) -> &'static str {
        match self {
            Status::NullPointer => "null pointer",
            Status::InvalidArgument => "invalid argument",
            Status::InvalidDType => "invalid dtype",
            Status::InvalidHeadDim => "invalid head_dim",
            Status::InvalidHeadCount => "invalid head count",
            Status::InvalidShape => "invalid shape",
            Status::InvalidStride => "invalid stride",
            Status::InvalidLength => "invalid length",
            Status::InvalidBlockTable => "invalid block table",
            Status::InvalidSplits => "invalid split count",
            Status::WorkspaceTooSmall => "workspace too small",
            Status::InvalidHandle => "invalid handle",
            Status::Unsupported => "unsupported",
            Status::NoDevice => "no device",
            Status::OutOfMemory => "out of memory",
            Status::Cuda => "CUDA error",
            Status::Internal => "internal error",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.summary())
    }
}

/// A failed call, or a library that could not be loaded.
///
/// [`status`](Error::status) says why a call failed and
/// [`message`](Error::message) names the argument at fault, e.g.
/// `"invalid stride: k: stride of head_dim must be 1, got 3"`: the library's
/// own message, or one worded the same way when the binding refused the
/// arguments before calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Option<Status>,
    message: String,
}

impl Error {
    /// The status; `None` when the library could not be loaded (or is incompatible).
    pub fn status(&self) -> Option<Status> {
        self.status
    }

    /// The detailed message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// An error for a call that returned `code`, with the library's message.
    pub(crate) fn from_call(code: i32, message: String) -> Error {
        match Status::from_code(code) {
            Some(status) => Error {
                status: Some(status),
                message,
            },
            None => Error {
                status: Some(Status::Internal),
                message: format!("unknown status {}: {}", code, message),
            },
        }
    }

    /// An error for arguments the binding refuses itself.
    pub(crate) fn refused(status: Status, detail: impl fmt::Display) -> Error {
        Error {
            status: Some(status),
            message: format!("{}: {}", status.summary(), detail),
        }
    }

    pub(crate) fn load(message: String) -> Error {
        Error { status: None, message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
