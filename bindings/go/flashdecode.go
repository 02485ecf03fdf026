// SPDX-License-Identifier: Apache-2.0

// Package flashdecode is the Go binding of libflashdecode: flash-decoding
// attention for LLM inference behind a stable C ABI.
//
// The newest query tokens of each sequence (one for plain decode, up to 64
// for speculative steps) attend to a KV cache that is split along the
// sequence, computed per split in parallel and merged; with grouped-query
// attention, ragged lengths, paged caches, any strided layout, the
// log-sum-exp, a reusable workspace, and since 0.3 the attention variants:
// causal or full masks, sliding windows, logit softcaps, ALiBi and
// attention sinks (see DecodeArgs).
//
// The package links the library through cgo and pkg-config
// (PKG_CONFIG_PATH must find flashdecode.pc; at run time the dynamic loader
// must find libflashdecode.so.0). Host tensors are Go slices ([]float32,
// []uint16 holding f16 or bf16 bits, []int32) for the CPU backend; CUDA
// tensors are device pointers (uintptr) for the CUDA backend. Failures are
// *Error values carrying the library's message; errors.Is matches them
// against the Err* statuses.
//
// The package builds against the header of the library it links (0.2 or
// later) and needs a library at least as new at run time. Built against a
// 0.2 header it has no 0.3 features: Options.CheckContents,
// DecodeArgs.SplitTokens, the attention variants of DecodeArgs,
// DecodeArgs.QLens,
// Handle.CheckContents and Handle.MergeStates then fail with
// ErrUnsupported, naming the version they need, and PlanInfo.Schedule is
// always ScheduleFixed.
//
// Partial results of a cache decoded in parts, each with its LSE (a shared
// prefix and each sequence's suffix in cascade attention, or the shards of
// context-parallel decode on several GPUs), merge into the attention over
// the whole cache with Handle.MergeStates.
package flashdecode

/*
#cgo pkg-config: flashdecode
#include <stdint.h>
#include <flashdecode.h>

enum { FDGO_DECODE = 0, FDGO_WORKSPACE_SIZE = 1, FDGO_DESCRIBE_PLAN = 2 };

// What 0.3 added, where the header has it: the package builds against a 0.2
// header too, without these features (HeaderHas03).
enum { FDGO_CHECK_CONTENTS = 1 }; // FD_CHECK_CONTENTS (pinned)
#if FD_VERSION_MINOR >= 3
enum { FDGO_HAS_0_3 = 1, FDGO_MAX_Q_LEN = FD_MAX_Q_LEN };
static void fdgo_set_checks(fd_options *options, uint32_t checks) { options->checks = checks; }
static void fdgo_set_split_tokens(fd_decode_args *args, int64_t tokens) { args->split_tokens = tokens; }
static void fdgo_set_variants(fd_decode_args *args, int mask, float logit_softcap, int64_t window_left,
                              fd_tensor alibi_slopes, fd_tensor sinks) {
  args->mask = (fd_attention_mask)mask;
  args->logit_softcap = logit_softcap;
  args->window_left = window_left;
  args->alibi_slopes = alibi_slopes;
  args->sinks = sinks;
}
static void fdgo_set_variant_data(fd_decode_args *args, void *alibi_slopes, void *sinks) {
  args->alibi_slopes.data = alibi_slopes;
  args->sinks.data = sinks;
}
static void fdgo_set_scales(fd_decode_args *args, fd_tensor k_scale, fd_tensor v_scale) {
  args->k_scale = k_scale;
  args->v_scale = v_scale;
}
static void fdgo_set_scale_data(fd_decode_args *args, void *k_scale, void *v_scale) {
  args->k_scale.data = k_scale;
  args->v_scale.data = v_scale;
}
static void fdgo_set_q_lens(fd_decode_args *args, fd_tensor q_lens) { args->q_lens = q_lens; }
static void fdgo_set_q_lens_data(fd_decode_args *args, void *q_lens) { args->q_lens.data = q_lens; }
static int fdgo_plan_schedule(const fd_plan_info *info) { return (int)info->schedule; }
static fd_status fdgo_check_contents(fd_handle *handle, uintptr_t stream) {
  return fd_check_contents(handle, (fd_cuda_stream)stream);
}
#else
enum { FDGO_HAS_0_3 = 0, FDGO_MAX_Q_LEN = 1 };
static void fdgo_set_checks(fd_options *options, uint32_t checks) { (void)options; (void)checks; }
static void fdgo_set_split_tokens(fd_decode_args *args, int64_t tokens) { (void)args; (void)tokens; }
static void fdgo_set_variants(fd_decode_args *args, int mask, float logit_softcap, int64_t window_left,
                              fd_tensor alibi_slopes, fd_tensor sinks) {
  (void)args; (void)mask; (void)logit_softcap; (void)window_left; (void)alibi_slopes; (void)sinks;
}
static void fdgo_set_variant_data(fd_decode_args *args, void *alibi_slopes, void *sinks) {
  (void)args; (void)alibi_slopes; (void)sinks;
}
static void fdgo_set_scales(fd_decode_args *args, fd_tensor k_scale, fd_tensor v_scale) {
  (void)args; (void)k_scale; (void)v_scale;
}
static void fdgo_set_scale_data(fd_decode_args *args, void *k_scale, void *v_scale) {
  (void)args; (void)k_scale; (void)v_scale;
}
static void fdgo_set_q_lens(fd_decode_args *args, fd_tensor q_lens) { (void)args; (void)q_lens; }
static void fdgo_set_q_lens_data(fd_decode_args *args, void *q_lens) { (void)args; (void)q_lens; }
static int fdgo_plan_schedule(const fd_plan_info *info) { (void)info; return 0; } // FD_SCHEDULE_FIXED
static fd_status fdgo_check_contents(fd_handle *handle, uintptr_t stream) {
  (void)handle;
  (void)stream;
  return FD_ERROR_UNSUPPORTED;
}
#endif

// cgo forbids storing Go pointers in memory passed to C, so the data
// pointers travel as arguments and are put into the struct here, on the C
// stack. mode asks for the workspace size (into bytes) or the plan (into
// info) instead of decoding.
static fd_status fdgo_decode(fd_handle *handle, fd_decode_args args, void *q, void *k, void *v, void *out,
                             void *lse, void *seq_lens, void *block_table, void *alibi_slopes, void *sinks,
                             void *k_scale, void *v_scale, void *q_lens, uintptr_t stream, int mode,
                             size_t *bytes, fd_plan_info *info) {
  args.q.data = q;
  args.k.data = k;
  args.v.data = v;
  args.out.data = out;
  args.lse.data = lse;
  args.seq_lens.data = seq_lens;
  args.block_table.data = block_table;
  fdgo_set_variant_data(&args, alibi_slopes, sinks);
  fdgo_set_scale_data(&args, k_scale, v_scale);
  fdgo_set_q_lens_data(&args, q_lens);
  if (mode == FDGO_WORKSPACE_SIZE) return fd_workspace_size(handle, &args, bytes);
  if (mode == FDGO_DESCRIBE_PLAN) return fd_describe_plan(handle, &args, info);
  return fd_decode(handle, &args, (fd_cuda_stream)stream);
}

// Device addresses arrive as integers; converting them in C keeps them out
// of Go's pointer rules (they never point into Go memory).
static void *fdgo_address(uintptr_t address) { return (void *)address; }
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// The header this package was compiled against.
const (
	HeaderVersionMajor = C.FD_VERSION_MAJOR
	HeaderVersionMinor = C.FD_VERSION_MINOR
	// HeaderHas03 says whether that header has 0.3's features (content
	// checks, SplitTokens, MergeStates, several query tokens, the
	// attention variants, 8-bit caches with their scales and AppendKV);
	// without them they fail with ErrUnsupported.
	HeaderHas03 = C.FDGO_HAS_0_3 == 1
	// MaxQLen is the most query tokens per sequence (dimension 1 of Q) a
	// decode takes: FD_MAX_Q_LEN (64) since 0.3, 1 with a 0.2 header.
	MaxQLen = C.FDGO_MAX_Q_LEN
	// MaxDims is the most dimensions a tensor has.
	MaxDims = C.FD_MAX_DIMS
	// WorkspaceAlignment is the alignment in bytes SetWorkspace requires.
	WorkspaceAlignment = 256
)

// Version is the loaded library's version string, e.g. "0.3.0".
func Version() string { return C.GoString(C.fd_version_string()) }

// VersionNumber is the loaded library's version as major*10000 + minor*100 + patch.
func VersionNumber() int { return int(C.fd_version_number()) }

var (
	versionOnce  sync.Once
	versionError error
)

// checkVersion makes sure, once, that the loaded library has the header's
// major version and at least its minor version (the declarations used here).
// (A library older than the header usually fails to load at all: the
// dynamic loader finds no version node of that minor, e.g. FLASHDECODE_0.3.)
func checkVersion() error {
	versionOnce.Do(func() {
		loaded := VersionNumber()
		if loaded/10000 != HeaderVersionMajor || loaded/100%100 < HeaderVersionMinor {
			versionError = refuse(ErrUnsupported, fmt.Sprintf(
				"libflashdecode %s is loaded; this package was compiled against flashdecode.h %d.%d and needs %d.x with x >= %d",
				Version(), HeaderVersionMajor, HeaderVersionMinor, HeaderVersionMajor, HeaderVersionMinor))
		}
	})
	return versionError
}

// require03 is nil when the header this package was compiled against has
// 0.3's features, else the ErrUnsupported error for feature.
func require03(feature string) error {
	if HeaderHas03 {
		return nil
	}
	return refuse(ErrUnsupported, fmt.Sprintf(
		"%s needs flashdecode 0.3 or later; this package was compiled against flashdecode.h %d.%d",
		feature, HeaderVersionMajor, HeaderVersionMinor))
}

// setSplitTokens sets fd_decode_args.split_tokens (a 0.3 header's field;
// the C helpers live in this file's preamble).
func setSplitTokens(raw *C.fd_decode_args, tokens int) {
	C.fdgo_set_split_tokens(raw, C.int64_t(tokens))
}

// setScales sets fd_decode_args.k_scale and v_scale (a 0.3 header's fields),
// without their data pointers.
func setScales(raw *C.fd_decode_args, kScale, vScale C.fd_tensor) {
	C.fdgo_set_scales(raw, kScale, vScale)
}

// setQLens sets fd_decode_args.q_lens (a 0.3 header's field), without its
// data pointer.
func setQLens(raw *C.fd_decode_args, qLens C.fd_tensor) {
	C.fdgo_set_q_lens(raw, qLens)
}

// setVariants sets the attention variants' fields of fd_decode_args (a 0.3
// header's), the tensors without their data pointers.
func setVariants(raw *C.fd_decode_args, mask AttentionMask, softcap float32, window int, slopes, sinks C.fd_tensor) {
	C.fdgo_set_variants(raw, C.int(mask), C.float(softcap), C.int64_t(window), slopes, sinks)
}

// Backend is where a handle runs (fd_backend).
type Backend int

// Backends.
const (
	// BackendAuto is CUDA when the library can use the device, else the CPU.
	BackendAuto Backend = C.FD_BACKEND_AUTO
	// BackendCPU is the multi-threaded CPU backend: host memory, synchronous.
	BackendCPU Backend = C.FD_BACKEND_CPU
	// BackendCUDA is the CUDA backend: device memory, asynchronous on a stream.
	BackendCUDA Backend = C.FD_BACKEND_CUDA
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendCPU:
		return "cpu"
	case BackendCUDA:
		return "cuda"
	}
	return fmt.Sprintf("Backend(%d)", int(b))
}

// Options configure New. The zero value picks BackendAuto on device 0 with
// a CPU worker per core, and no content checks.
type Options struct {
	Backend    Backend
	Device     int // CUDA device ordinal
	NumThreads int // CPU backend workers; 0 uses every core
	// CheckContents checks seq_lens and block_table on every decode
	// (FD_CHECK_CONTENTS, since 0.3). Without it each length is clamped to
	// [0, kv_capacity] and each used page index into the pool: a bad one
	// gives a meaningless result, not an error. With it a bad length fails
	// with ErrInvalidLength and a bad page index with ErrInvalidBlockTable,
	// naming the element: from Decode itself on the CPU backend; on CUDA,
	// where the check runs on the device, from the next Decode or from
	// Handle.CheckContents. FLASHDECODE_CHECKS=contents in the environment
	// turns the checks on for every handle.
	CheckContents bool
}

// Handle is a backend, its device, and a workspace reused across calls.
//
// Calls on one handle are serialised by a mutex (the C API forbids
// overlapping calls on a handle), so a Handle may be shared by goroutines;
// use one per goroutine to decode in parallel. Close it when done.
type Handle struct {
	mu        sync.Mutex
	raw       *C.fd_handle
	backend   Backend
	device    int
	workspace *HostWorkspace // the one SetHostWorkspace gave it, kept (and not freed) while used
}

// New creates a handle. It fails with ErrNoDevice when CUDA is asked for and
// the device (or the library's CUDA support) is missing.
func New(options Options) (*Handle, error) {
	if err := checkVersion(); err != nil {
		return nil, err
	}
	// The defaults of fd_options_init, filled here: a newer library's init
	// would write its own, larger struct into this one.
	var raw C.fd_options
	raw.struct_size = C.sizeof_fd_options
	raw.backend = C.fd_backend(options.Backend)
	raw.device = C.int32_t(options.Device)
	raw.num_threads = C.int32_t(options.NumThreads)
	if int(raw.device) != options.Device || int(raw.num_threads) != options.NumThreads {
		return nil, refuse(ErrInvalidArgument, "options: device and thread count must fit in 32 bits")
	}
	if options.CheckContents {
		if err := require03("Options.CheckContents"); err != nil {
			return nil, err
		}
		C.fdgo_set_checks(&raw, C.FDGO_CHECK_CONTENTS)
	}
	h := &Handle{device: options.Device}
	if err := call(func() C.fd_status { return C.fd_create(&h.raw, &raw) }); err != nil {
		return nil, err
	}
	var resolved C.fd_backend
	if err := call(func() C.fd_status { return C.fd_get_backend(h.raw, &resolved) }); err != nil {
		C.fd_destroy(h.raw)
		return nil, err
	}
	h.backend = Backend(resolved)
	// A safety net only: a forgotten handle frees its workspace when collected.
	runtime.SetFinalizer(h, (*Handle).Close)
	return h, nil
}

// Backend is the backend the handle runs on (BackendAuto resolved).
func (h *Handle) Backend() Backend { return h.backend }

// Close destroys the handle and frees its library-owned workspace, or lets
// go of its HostWorkspace. For CUDA, work enqueued with it must have
// finished. Closing twice is a no-op.
func (h *Handle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.raw == nil {
		return nil
	}
	raw := h.raw
	h.raw = nil
	runtime.SetFinalizer(h, nil)
	err := call(func() C.fd_status { return C.fd_destroy(raw) })
	h.workspace.release()
	h.workspace = nil
	return err
}

// Decode computes decode attention for the newest query tokens of every
// sequence (see DecodeArgs): on the CPU backend synchronously, on CUDA
// enqueued on the legacy default stream. On error nothing is written.
func (h *Handle) Decode(args *DecodeArgs) error {
	return h.DecodeOnStream(args, 0)
}

// DecodeOnStream is Decode enqueued on a CUDA stream (a cudaStream_t; 0 is
// the legacy default stream). The CPU backend ignores the stream.
func (h *Handle) DecodeOnStream(args *DecodeArgs, stream uintptr) error {
	_, err := h.run(args, stream, C.FDGO_DECODE, nil)
	return err
}

// CheckContents reports a bad seq_lens or block_table entry that a checked
// decode found (fd_check_contents, since 0.3), after waiting for the legacy
// default stream; see CheckContentsOnStream.
func (h *Handle) CheckContents() error {
	return h.CheckContentsOnStream(0)
}

// CheckContentsOnStream reports a bad seq_lens or block_table entry that a
// checked decode found, after waiting for stream (the cudaStream_t the
// decodes ran on; 0 is the legacy default stream).
//
// For handles made with Options.CheckContents. On CUDA the checks run on
// the device, asynchronously: this synchronises the stream and returns what
// the first bad decode since the last report found (ErrInvalidLength or
// ErrInvalidBlockTable), then clears the report. On the CPU backend Decode
// fails at once, so there is never anything left to report. It fails with
// ErrInvalidArgument for a handle without checks (or a stream being
// captured into a CUDA graph).
func (h *Handle) CheckContentsOnStream(stream uintptr) error {
	if err := require03("Handle.CheckContents"); err != nil {
		return err
	}
	return h.locked(func(raw *C.fd_handle) C.fd_status { return C.fdgo_check_contents(raw, C.uintptr_t(stream)) })
}

// WorkspaceSize is the bytes of workspace Decode needs for args on this
// handle; it depends only on shapes, the split count and the window.
func (h *Handle) WorkspaceSize(args *DecodeArgs) (int, error) {
	return h.run(args, 0, C.FDGO_WORKSPACE_SIZE, nil)
}

// Merge is how a decode combines its splits' partial results (fd_merge).
type Merge int

// Merges.
const (
	// MergeNone: one split; the split kernel writes the output (CUDA).
	MergeNone Merge = C.FD_MERGE_NONE
	// MergeSeparate: a pass after all splits (the CUDA merge kernel, or the CPU merge pass).
	MergeSeparate Merge = C.FD_MERGE_SEPARATE
	// MergeFused: the last CUDA thread block of each (sequence, KV head) merges its splits.
	MergeFused Merge = C.FD_MERGE_FUSED
	// MergeCluster: each (sequence, KV head)'s splits run as one thread-block cluster (sm_90+).
	MergeCluster Merge = C.FD_MERGE_CLUSTER
)

func (m Merge) String() string {
	switch m {
	case MergeNone:
		return "none"
	case MergeSeparate:
		return "separate"
	case MergeFused:
		return "fused"
	case MergeCluster:
		return "cluster"
	}
	return fmt.Sprintf("Merge(%d)", int(m))
}

// Schedule is how a decode lays its splits out over the batch (fd_schedule, since 0.3).
type Schedule int

// Schedules (fd_schedule's pinned values: a 0.2 header has none).
const (
	// ScheduleFixed: NumSplits splits of SplitTokens keys for every (sequence, KV head), in index order.
	ScheduleFixed Schedule = 0
	// ScheduleLongestFirst: CUDA; the fixed splits, longest sequence first (one more launch orders them).
	ScheduleLongestFirst Schedule = 1
	// ScheduleFitted: CUDA; splits whose length the device fits to the lengths at run time.
	ScheduleFitted Schedule = 2
	// ScheduleBalanced: CUDA; every thread block takes an equal share of the batch's keys (0 splits).
	ScheduleBalanced Schedule = 3
)

func (s Schedule) String() string {
	switch s {
	case ScheduleFixed:
		return "fixed"
	case ScheduleLongestFirst:
		return "longest-first"
	case ScheduleFitted:
		return "fitted"
	case ScheduleBalanced:
		return "balanced"
	}
	return fmt.Sprintf("Schedule(%d)", int(s))
}

// PlanInfo is what Decode would run for a problem (fd_plan_info).
type PlanInfo struct {
	Backend        Backend
	NumSplits      int    // splits of the KV sequence (requested, or the planner's choice); 0: the device cuts each sequence from its length (CUDA, per-sequence lengths)
	SplitTokens    int    // KV tokens per split; with 0 splits, the tile the device cuts at
	WorkspaceBytes int    // as WorkspaceSize reports
	Kernel         string // the split kernel, e.g. "tensor-core-wide-128" or "cpu"; for logs
	Merge          Merge
	Launches       int      // CUDA kernels per Decode (1 to 3, one more when checking contents); 0 on the CPU
	Blocks         int      // CUDA thread blocks of the split kernel; CPU tasks of the split pass
	Schedule       Schedule // how the splits are laid out over the batch (ScheduleFixed from a 0.2 library, or in a build against a 0.2 header)
}

// DescribePlan says what Decode would run for args on this handle, without
// running it; it validates args as Decode does.
func (h *Handle) DescribePlan(args *DecodeArgs) (PlanInfo, error) {
	var info C.fd_plan_info
	C.fd_plan_info_init(&info, C.sizeof_fd_plan_info)
	if _, err := h.run(args, 0, C.FDGO_DESCRIBE_PLAN, &info); err != nil {
		return PlanInfo{}, err
	}
	return PlanInfo{
		Backend:        Backend(info.backend),
		NumSplits:      int(info.num_splits),
		SplitTokens:    int(info.split_tokens),
		WorkspaceBytes: int(info.workspace_bytes),
		Kernel:         C.GoString(info.kernel),
		Merge:          Merge(info.merge),
		Launches:       int(info.launches),
		Blocks:         int(info.blocks),
		Schedule:       Schedule(C.fdgo_plan_schedule(&info)),
	}, nil
}

// ReserveWorkspace makes the library-owned workspace at least bytes, so
// that decodes that fit do not allocate (CUDA graph capture, real-time loops).
func (h *Handle) ReserveWorkspace(bytes int) error {
	if bytes < 0 {
		return refuse(ErrInvalidArgument, fmt.Sprintf("workspace: %d bytes", bytes))
	}
	return h.locked(func(raw *C.fd_handle) C.fd_status { return C.fd_reserve_workspace(raw, C.size_t(bytes)) })
}

// SetWorkspace hands the handle caller-owned workspace memory: device memory
// for the CUDA backend, or host memory Go does not manage (C, mmap) for the
// CPU backend, aligned to WorkspaceAlignment and valid until replaced or the
// handle is closed (SetHostWorkspace does this for you on the CPU). A zero
// address goes back to library-owned memory. Either lets go of a
// HostWorkspace the handle had.
func (h *Handle) SetWorkspace(address uintptr, bytes int) error {
	if bytes < 0 {
		return refuse(ErrInvalidArgument, fmt.Sprintf("workspace: %d bytes", bytes))
	}
	var previous *HostWorkspace
	err := h.locked(func(raw *C.fd_handle) C.fd_status {
		status := C.fd_set_workspace(raw, C.fdgo_address(C.uintptr_t(address)), C.size_t(bytes))
		if status == C.FD_SUCCESS {
			previous, h.workspace = h.workspace, nil
		}
		return status
	})
	previous.release()
	return err
}

func (h *Handle) locked(f func(*C.fd_handle) C.fd_status) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.raw == nil {
		return refuse(ErrInvalidHandle, "the handle is closed")
	}
	return call(func() C.fd_status { return f(h.raw) })
}

// run decodes, or with another mode (FDGO_*) sizes the workspace or
// describes the plan into info.
func (h *Handle) run(args *DecodeArgs, stream uintptr, mode C.int, info *C.fd_plan_info) (int, error) {
	raw, err := args.describe(h.backend == BackendCUDA, h.device)
	if err != nil {
		return 0, err
	}
	var bytes C.size_t
	err = h.locked(func(handle *C.fd_handle) C.fd_status {
		return C.fdgo_decode(handle, raw, args.Q.data(), args.K.data(), args.V.data(), args.Out.data(), args.LSE.data(),
			args.SeqLens.data(), args.BlockTable.data(), args.AlibiSlopes.data(), args.Sinks.data(), args.KScale.data(),
			args.VScale.data(), args.QLens.data(), C.uintptr_t(stream), mode, &bytes, info)
	})
	runtime.KeepAlive(args)
	return int(bytes), err
}

// emptyHost stands for the data of an empty slice, which has no first
// element: the library refuses a NULL pointer even where it reads nothing
// (a batch of 0 is a no-op for it), and wants it aligned to the element
// size: a uint64 suits every dtype.
var emptyHost [1]uint64

// data is the pointer handed to C: a Go pointer for host memory (pinned by
// cgo for the call), a device address converted on the C side, NULL for an
// absent tensor.
func (t Tensor) data() unsafe.Pointer {
	switch {
	case t.onDevice:
		return C.fdgo_address(C.uintptr_t(t.device))
	case t.host != nil:
		return t.host
	case t.present():
		return unsafe.Pointer(&emptyHost[0])
	}
	return nil
}

// call runs one C call and turns a failure into an *Error with this
// thread's message; the thread is locked because the message is thread-local.
func call(f func() C.fd_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	status := f()
	if status == C.FD_SUCCESS {
		return nil
	}
	length := C.fd_last_error_message(nil, 0)
	message := make([]byte, int(length)+1)
	C.fd_last_error_message((*C.char)(unsafe.Pointer(&message[0])), C.size_t(len(message)))
	return &Error{Status: Status(status), Message: string(message[:length])}
}
