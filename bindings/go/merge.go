// SPDX-License-Identifier: Apache-2.0

package flashdecode

/*
#include <stdint.h>
#include <string.h>
#include <flashdecode.h>

// fd_merge_states takes arrays of tensors, whose data pointers would be Go
// pointers stored in memory passed to C, which cgo forbids (before Go 1.21's
// runtime.Pinner, with no way around it). So every data pointer travels as
// an argument of its own, and the arrays are put together here, on the C
// stack: a state's output and LSE in p[2s] and p[2s + 1], up to 64 states.
enum { FDGO_MERGE_POINTERS = 128 };
#define FDGO_P8(g) void *p##g##0, void *p##g##1, void *p##g##2, void *p##g##3, \
                   void *p##g##4, void *p##g##5, void *p##g##6, void *p##g##7
#define FDGO_A8(g) p##g##0, p##g##1, p##g##2, p##g##3, p##g##4, p##g##5, p##g##6, p##g##7
#if FD_VERSION_MINOR >= 3
enum { FDGO_MAX_MERGE_STATES = FD_MAX_MERGE_STATES };
_Static_assert(2 * FD_MAX_MERGE_STATES <= FDGO_MERGE_POINTERS,
               "fdgo_merge_states takes the pointers of 64 states: give it more arguments");
#else
enum { FDGO_MAX_MERGE_STATES = 64 };
#endif

static fd_status fdgo_merge_states(fd_handle *handle, int num_states, const fd_tensor *states_out,
                                   const fd_tensor *states_lse, fd_tensor out, fd_tensor lse, void *out_data,
                                   void *lse_data, uintptr_t stream, FDGO_P8(0), FDGO_P8(1), FDGO_P8(2),
                                   FDGO_P8(3), FDGO_P8(4), FDGO_P8(5), FDGO_P8(6), FDGO_P8(7), FDGO_P8(8),
                                   FDGO_P8(9), FDGO_P8(a), FDGO_P8(b), FDGO_P8(c), FDGO_P8(d), FDGO_P8(e),
                                   FDGO_P8(f)) {
#if FD_VERSION_MINOR >= 3
  void *const p[FDGO_MERGE_POINTERS] = {FDGO_A8(0), FDGO_A8(1), FDGO_A8(2), FDGO_A8(3), FDGO_A8(4), FDGO_A8(5),
                                        FDGO_A8(6), FDGO_A8(7), FDGO_A8(8), FDGO_A8(9), FDGO_A8(a), FDGO_A8(b),
                                        FDGO_A8(c), FDGO_A8(d), FDGO_A8(e), FDGO_A8(f)};
  fd_tensor outs[FD_MAX_MERGE_STATES], lses[FD_MAX_MERGE_STATES];
  // The Go side passes at most FD_MAX_MERGE_STATES states; 0 is the library's to refuse.
  const int count = num_states < 0 ? 0 : num_states;
  if (count > 0) {
    memcpy(outs, states_out, (size_t)count * sizeof *outs);
    memcpy(lses, states_lse, (size_t)count * sizeof *lses);
  }
  for (int s = 0; s < count; ++s) {
    outs[s].data = p[2 * s];
    lses[s].data = p[2 * s + 1];
  }
  fd_merge_args args;
  fd_merge_args_init(&args, sizeof args);
  args.num_states = num_states;
  args.states_out = outs;
  args.states_lse = lses;
  args.out = out;
  args.out.data = out_data;
  args.lse = lse;
  args.lse.data = lse_data;
  return fd_merge_states(handle, &args, (fd_cuda_stream)stream);
#else
  (void)handle; (void)num_states; (void)states_out; (void)states_lse; (void)out; (void)lse;
  (void)out_data; (void)lse_data; (void)stream; // and the pointers: the Go side asks nothing of a 0.2 header
  return FD_ERROR_UNSUPPORTED;
#endif
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// MaxMergeStates is the most states one MergeStates call merges
// (FD_MAX_MERGE_STATES: 64 in 0.3); more fail with ErrInvalidArgument.
const MaxMergeStates = C.FDGO_MAX_MERGE_STATES

// MergeState is one partial result for MergeStates: Out [batch, q_len,
// heads, head_dim] (Float32Type, Float16Type or BFloat16Type) and its
// log-sum-exp LSE [batch, q_len, heads] (Float32Type, natural log), as
// Decode writes Out and LSE for one part of the keys (with q_len 1).
type MergeState struct {
	Out, LSE Tensor
}

// MergeArgs is everything one MergeStates call reads and writes: the
// States, 1 to MaxMergeStates, merged in order; Out, shaped like the states
// (Float32Type, Float16Type or BFloat16Type; the states may each have
// another); LSE (optional), shaped like the states' LSEs, Float32Type. The
// order of the dimensions is fixed; the layout comes from the strides.
//
// Out may be one of the states' Out itself (the same memory, dtype, shape
// and strides), and LSE one of their LSE: the merge then runs in place.
// Otherwise the outputs must not overlap any input.
type MergeArgs struct {
	States []MergeState
	Out    Tensor
	LSE    Tensor // optional
}

// MergeStates merges partial attention results by their log-sum-exps
// (fd_merge_states, since 0.3): on the CPU backend synchronously, on CUDA
// enqueued on the legacy default stream.
//
// For every row, with m = max_s LSE_s and w_s = exp(LSE_s - m):
// Out = sum_s w_s Out_s / sum_s w_s and LSE = m + log(sum_s w_s): the
// attention over all the parts' keys. A state whose LSE is -inf is empty (a
// part with no keys) and is not read, NaN included; a row whose states are
// all empty is zeros with LSE -inf; a NaN (or +inf) LSE makes its row NaN.
// Sums run in state order: the same inputs give bitwise the same result.
//
// The recipes: cascade attention (a prefix shared by the batch decoded
// once, each sequence's suffix apart, both with an LSE, then merged) and
// context-parallel decode (each GPU decodes its shard of the cache with its
// LSE; gather the (Out, LSE) pairs, e.g. with an NCCL all-gather, and merge
// them). On error nothing is written, and the error names the argument at
// fault (a state shaped unlike Out: ErrInvalidShape; an LSE that is not
// Float32Type: ErrInvalidDType). Built against a 0.2 header it fails with
// ErrUnsupported.
func (h *Handle) MergeStates(args *MergeArgs) error {
	return h.MergeStatesOnStream(args, 0)
}

// MergeStatesOnStream is MergeStates enqueued on a CUDA stream (a
// cudaStream_t; 0 is the legacy default stream): one kernel, no
// allocation, no synchronisation, so it may be captured in a CUDA graph.
// The CPU backend ignores the stream.
func (h *Handle) MergeStatesOnStream(args *MergeArgs, stream uintptr) error {
	if err := require03("Handle.MergeStates"); err != nil {
		return err
	}
	count := len(args.States)
	if count > MaxMergeStates {
		return refuse(ErrInvalidArgument, fmt.Sprintf("num_states must be in [1, %d], got %d", MaxMergeStates, count))
	}
	onDevice := h.backend == BackendCUDA
	describe := func(t Tensor, name string) (C.fd_tensor, error) {
		if t.present() && t.isDevice() != onDevice {
			return C.fd_tensor{}, refuse(ErrInvalidArgument, placementMismatch(name, onDevice, h.device))
		}
		return t.describe(name)
	}
	var outs, lses [MaxMergeStates]C.fd_tensor
	var pointers [C.FDGO_MERGE_POINTERS]unsafe.Pointer
	for s, state := range args.States {
		var err error
		if outs[s], err = describe(state.Out, fmt.Sprintf("states_out[%d]", s)); err != nil {
			return err
		}
		if lses[s], err = describe(state.LSE, fmt.Sprintf("states_lse[%d]", s)); err != nil {
			return err
		}
		pointers[2*s], pointers[2*s+1] = state.Out.data(), state.LSE.data()
	}
	out, err := describe(args.Out, "out")
	if err != nil {
		return err
	}
	lse, err := describe(args.LSE, "lse")
	if err != nil {
		return err
	}
	p := &pointers
	err = h.locked(func(handle *C.fd_handle) C.fd_status {
		return C.fdgo_merge_states(handle, C.int(count), &outs[0], &lses[0], out, lse, args.Out.data(), args.LSE.data(),
			C.uintptr_t(stream),
			p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15],
			p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27], p[28], p[29], p[30], p[31],
			p[32], p[33], p[34], p[35], p[36], p[37], p[38], p[39], p[40], p[41], p[42], p[43], p[44], p[45], p[46], p[47],
			p[48], p[49], p[50], p[51], p[52], p[53], p[54], p[55], p[56], p[57], p[58], p[59], p[60], p[61], p[62], p[63],
			p[64], p[65], p[66], p[67], p[68], p[69], p[70], p[71], p[72], p[73], p[74], p[75], p[76], p[77], p[78], p[79],
			p[80], p[81], p[82], p[83], p[84], p[85], p[86], p[87], p[88], p[89], p[90], p[91], p[92], p[93], p[94], p[95],
			p[96], p[97], p[98], p[99], p[100], p[101], p[102], p[103], p[104], p[105], p[106], p[107], p[108], p[109],
			p[110], p[111], p[112], p[113], p[114], p[115], p[116], p[117], p[118], p[119], p[120], p[121], p[122],
			p[123], p[124], p[125], p[126], p[127])
	})
	runtime.KeepAlive(args)
	return err
}
