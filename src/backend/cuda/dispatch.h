// SPDX-License-Identifier: Apache-2.0
// The host's handle on the kernels: loading and sizing them on a device, and
// one launch call. dispatch.cu, behind it, is the one place where runtime
// choices (variant, dtype, head-dim bucket, merge) become template
// parameters; every switch there fails closed.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/params.h"
#include "backend/cuda/variants.h"
#include "flashdecode.h"

namespace fd {
namespace cuda {

// On the current device: loads every kernel (so that no lazy load lands in
// fd_decode or a graph capture), raises the shared-memory limit of every
// split kernel and reports their occupancy.
cudaError_t prepare_kernels(KernelOccupancy *occupancy);

// Checks that this binary has code the current device can run.
cudaError_t probe_kernel_image();

// Whether the merge kernels loaded for the current device wait on their
// grid dependency (griddepcontrol: compiled for sm_90 or later), so that they
// may be launched with programmatic stream serialization.
cudaError_t merge_supports_programmatic_launch(bool *supported);

// Enqueues the split kernel of `variant` for q of q_dtype and K/V of
// kv_dtype (q's, or an 8-bit cache for the 8-bit variants), after the
// kernel that writes split.sequence_order when it is set, and, when merge
// is not null, the merge kernel writing out_dtype; with programmatic set (see
// merge_supports_programmatic_launch), each may be scheduled while the kernel
// before it on the stream finishes (it waits for it before touching memory).
// Returns the first launch error; throws FD_ERROR_INTERNAL for a combination
// no kernel was built for.
// fd_merge_states: one kernel for the output dtype (fails closed on another);
// the vector kernel where states_aligned (every state's rows on 16 bytes)
// and the states allow it, with vector stores where out_aligned;
// programmatic as for launch_decode.
cudaError_t launch_merge_states(fd_dtype out_dtype, const MergeStatesParams &merge, bool states_aligned,
                                bool out_aligned, bool programmatic, cudaStream_t stream);

// fd_append_kv: one kernel for every dtype (they are runtime values);
// programmatic as for launch_decode.
cudaError_t launch_append_kv(const AppendParams &append, bool programmatic, cudaStream_t stream);

// FD_CHECK_CONTENTS: the check kernel, enqueued ahead of a decode.
cudaError_t launch_check_contents(const CheckParams &check, cudaStream_t stream);

cudaError_t launch_decode(SplitVariant variant, fd_dtype q_dtype, fd_dtype kv_dtype, fd_dtype out_dtype,
                          const SplitParams &split, const MergeParams *merge, bool programmatic, cudaStream_t stream);

}  // namespace cuda
}  // namespace fd
