// SPDX-License-Identifier: Apache-2.0

package flashdecode

// #include <flashdecode.h>
import "C"

import "fmt"

// Status is why a call failed (fd_status without success). It is an error
// itself, so errors.Is(err, flashdecode.ErrInvalidShape) matches an *Error
// of that status.
type Status int

// Statuses, with the library's pinned values.
const (
	ErrNullPointer       Status = C.FD_ERROR_NULL_POINTER
	ErrInvalidArgument   Status = C.FD_ERROR_INVALID_ARGUMENT
	ErrInvalidDType      Status = C.FD_ERROR_INVALID_DTYPE
	ErrInvalidHeadDim    Status = C.FD_ERROR_INVALID_HEAD_DIM
	ErrInvalidHeadCount  Status = C.FD_ERROR_INVALID_HEAD_COUNT
	ErrInvalidShape      Status = C.FD_ERROR_INVALID_SHAPE
	ErrInvalidStride     Status = C.FD_ERROR_INVALID_STRIDE
	ErrInvalidLength     Status = C.FD_ERROR_INVALID_LENGTH
	ErrInvalidBlockTable Status = C.FD_ERROR_INVALID_BLOCK_TABLE
	ErrInvalidSplits     Status = C.FD_ERROR_INVALID_SPLITS
	ErrWorkspaceTooSmall Status = C.FD_ERROR_WORKSPACE_TOO_SMALL
	ErrInvalidHandle     Status = C.FD_ERROR_INVALID_HANDLE
	ErrUnsupported       Status = C.FD_ERROR_UNSUPPORTED
	ErrNoDevice          Status = C.FD_ERROR_NO_DEVICE
	ErrOutOfMemory       Status = C.FD_ERROR_OUT_OF_MEMORY
	ErrCUDA              Status = C.FD_ERROR_CUDA
	ErrInternal          Status = C.FD_ERROR_INTERNAL
)

// Error is the library's short description of the status, e.g. "invalid shape".
func (s Status) Error() string { return C.GoString(C.fd_status_string(C.fd_status(s))) }

// Error is a failed call: its status and a message naming the argument at
// fault, e.g. "invalid stride: k: stride of head_dim must be 1, got 3" (the
// library's own, or worded alike when the binding refused the arguments).
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return e.Message }

// Unwrap makes errors.Is(err, ErrInvalidShape) work.
func (e *Error) Unwrap() error { return e.Status }

// refuse is the error for arguments the binding rejects before calling.
func refuse(status Status, detail string) *Error {
	return &Error{Status: status, Message: fmt.Sprintf("%s: %s", status.Error(), detail)}
}
