// SPDX-License-Identifier: Apache-2.0

package flashdecode

/*
#include <stdlib.h>
#include <flashdecode.h>

// C memory, aligned to WorkspaceAlignment: Go's rules forbid the library
// keeping a pointer into Go memory after a call. At least one byte, so that
// an empty workspace is not NULL (which means library-owned workspace).
static void *fdgo_alloc_workspace(size_t bytes, size_t alignment) {
  void *memory = NULL;
  return posix_memalign(&memory, alignment, bytes ? bytes : 1) == 0 ? memory : NULL;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// HostWorkspace is host memory outside the Go heap, aligned to
// WorkspaceAlignment, for Handle.SetHostWorkspace (the CPU backend).
//
// A handle keeps the HostWorkspace it was given until it is replaced
// (SetHostWorkspace, SetWorkspace, UseLibraryWorkspace) or the handle is
// closed; it is one handle's at a time. Free may be called at any time: the
// memory goes at once, or when the handle using it lets it go.
// (Deferred rather than refused, so no decode reads freed memory and
// `defer ws.Free()` is right whichever order it runs in with `defer h.Close()`.)
type HostWorkspace struct {
	mu     sync.Mutex
	memory unsafe.Pointer // C memory; nil once freed
	bytes  int
	inUse  bool // a handle's workspace
	freed  bool // Free was called
}

// NewHostWorkspace allocates bytes of workspace (uninitialised), aligned to
// WorkspaceAlignment. It fails with ErrInvalidArgument for a negative size
// and ErrOutOfMemory when the memory cannot be allocated.
func NewHostWorkspace(bytes int) (*HostWorkspace, error) {
	if bytes < 0 {
		return nil, refuse(ErrInvalidArgument, fmt.Sprintf("workspace: bytes must be >= 0, got %d", bytes))
	}
	memory := C.fdgo_alloc_workspace(C.size_t(bytes), WorkspaceAlignment)
	if memory == nil {
		return nil, refuse(ErrOutOfMemory, fmt.Sprintf("workspace: cannot allocate %d bytes", bytes))
	}
	ws := &HostWorkspace{memory: memory, bytes: bytes}
	// A safety net only: a forgotten workspace is freed when collected (a
	// handle using it references it, so it is not collected before).
	runtime.SetFinalizer(ws, (*HostWorkspace).Free)
	return ws, nil
}

// Len is its size in bytes, as allocated.
func (ws *HostWorkspace) Len() int { return ws.bytes }

// Free releases the memory: at once, or, while a handle uses it, when the
// handle lets it go (it is then replaced or the handle closed). Freeing
// twice is a no-op; a freed workspace cannot be handed to a handle.
func (ws *HostWorkspace) Free() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.freed = true
	ws.freeUnused()
}

// release is called by the handle that used ws (or nil) once it no longer does.
func (ws *HostWorkspace) release() {
	if ws == nil {
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.inUse = false
	ws.freeUnused()
}

// freeUnused frees the memory if Free was called and no handle uses it; ws.mu is held.
func (ws *HostWorkspace) freeUnused() {
	if ws.freed && !ws.inUse && ws.memory != nil {
		C.free(ws.memory)
		ws.memory = nil
	}
}

// SetHostWorkspace hands the handle ws as its workspace (CPU backend only:
// a CUDA handle needs device memory, see SetWorkspace). The handle keeps ws
// until it is replaced or the handle closed, and lets go of any
// HostWorkspace it had. ws must be at least what WorkspaceSize reports for
// the decodes to come, else they fail with ErrWorkspaceTooSmall.
//
// It fails with ErrInvalidArgument on a CUDA handle, for a freed ws, or for
// one another handle uses: a handle's workspace is used by nothing else.
func (h *Handle) SetHostWorkspace(ws *HostWorkspace) error {
	if ws == nil {
		return refuse(ErrNullPointer, "workspace: nil *HostWorkspace; UseLibraryWorkspace goes back to library-owned memory")
	}
	if h.backend != BackendCPU {
		return refuse(ErrInvalidArgument, fmt.Sprintf(
			"workspace: a HostWorkspace is host memory, but the handle runs on the %v backend; use SetWorkspace with device memory",
			h.backend))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.raw == nil {
		return refuse(ErrInvalidHandle, "the handle is closed")
	}
	if err := ws.attach(h.raw, h.workspace == ws); err != nil {
		return err
	}
	if previous := h.workspace; previous != ws {
		h.workspace = ws
		previous.release()
	}
	return nil
}

// attach makes ws the workspace of raw (the live handle, whose mutex is
// held); mine says ws already is.
func (ws *HostWorkspace) attach(raw *C.fd_handle, mine bool) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.freed {
		return refuse(ErrInvalidArgument, "workspace: the HostWorkspace was freed")
	}
	if ws.inUse && !mine {
		return refuse(ErrInvalidArgument, "workspace: the HostWorkspace is another handle's workspace")
	}
	if err := call(func() C.fd_status { return C.fd_set_workspace(raw, ws.memory, C.size_t(ws.bytes)) }); err != nil {
		return err
	}
	ws.inUse = true
	return nil
}

// UseLibraryWorkspace goes back to library-owned workspace (as
// SetWorkspace(0, 0)), letting go of any HostWorkspace the handle had.
func (h *Handle) UseLibraryWorkspace() error {
	return h.SetWorkspace(0, 0)
}
