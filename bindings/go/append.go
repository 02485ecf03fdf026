// SPDX-License-Identifier: Apache-2.0

package flashdecode

/*
#include <stdint.h>
#include <flashdecode.h>

#if FD_VERSION_MINOR >= 3
// fd_append_args is a 0.3 struct: built here from its tensors and their data pointers.
static fd_status fdgo_append_kv(fd_handle *handle, fd_tensor k_new, fd_tensor v_new, fd_tensor k, fd_tensor v,
                                fd_tensor k_scale, fd_tensor v_scale, fd_tensor seq_lens, fd_tensor block_table,
                                void *k_new_data, void *v_new_data, void *k_data, void *v_data, void *k_scale_data,
                                void *v_scale_data, void *seq_lens_data, void *block_table_data, uintptr_t stream) {
  fd_append_args args;
  fd_append_args_init(&args, sizeof args);
  args.k_new = k_new;
  args.k_new.data = k_new_data;
  args.v_new = v_new;
  args.v_new.data = v_new_data;
  args.k = k;
  args.k.data = k_data;
  args.v = v;
  args.v.data = v_data;
  args.k_scale = k_scale;
  args.k_scale.data = k_scale_data;
  args.v_scale = v_scale;
  args.v_scale.data = v_scale_data;
  args.seq_lens = seq_lens;
  args.seq_lens.data = seq_lens_data;
  args.block_table = block_table;
  args.block_table.data = block_table_data;
  return fd_append_kv(handle, &args, (fd_cuda_stream)stream);
}
#else
static fd_status fdgo_append_kv(fd_handle *handle, fd_tensor k_new, fd_tensor v_new, fd_tensor k, fd_tensor v,
                                fd_tensor k_scale, fd_tensor v_scale, fd_tensor seq_lens, fd_tensor block_table,
                                void *k_new_data, void *v_new_data, void *k_data, void *v_data, void *k_scale_data,
                                void *v_scale_data, void *seq_lens_data, void *block_table_data, uintptr_t stream) {
  (void)handle; (void)k_new; (void)v_new; (void)k; (void)v; (void)k_scale; (void)v_scale; (void)seq_lens;
  (void)block_table; (void)k_new_data; (void)v_new_data; (void)k_data; (void)v_data; (void)k_scale_data;
  (void)v_scale_data; (void)seq_lens_data; (void)block_table_data; (void)stream;
  return FD_ERROR_UNSUPPORTED;
}
#endif
*/
import "C"

import "runtime"

// AppendArgs is what AppendKV reads and writes (fd_append_args, since 0.3):
// this step's new keys and values, and the cache they are written into,
// converted to its dtype.
//
//   - KNew, VNew: [batch, new_len, kv_heads, head_dim], Float32Type,
//     Float16Type or BFloat16Type (the two may differ).
//   - K, V: the cache, as DecodeArgs takes it (dense, or a page pool with
//     BlockTable), of any cache dtype; written.
//   - KScale, VScale (optional): the scales of an 8-bit cache, as in
//     DecodeArgs. With per-token scales, write this step's first: each
//     written position's scale is read.
//   - SeqLens (optional): [batch] Int32Type, each sequence's length with
//     the new tokens (the SeqLens of the same step's Decode).
//   - BlockTable (optional): [batch, max_pages] Int32Type.
//
// New token i of sequence b, of length L, goes to position L - new_len + i;
// a negative position, or a page outside the pool, is not written. Each
// element is converted from x = new/scale in float32: to Float32Type,
// Float16Type or BFloat16Type rounding to nearest even; to E4M3Type or
// E5M2Type rounding to nearest even and saturating to ±448 or ±57344 (NaN
// stays NaN); to Int8Type rounding to nearest even and clamping to
// [-127, 127] (NaN gives 0).
type AppendArgs struct {
	KNew, VNew          Tensor
	K, V                Tensor
	KScale, VScale      Tensor // optional
	SeqLens, BlockTable Tensor // optional
}

// AppendKV writes new keys and values into a cache (fd_append_kv, since
// 0.3; see AppendArgs): on the CPU backend synchronously, on CUDA enqueued
// on the legacy default stream. On error nothing is written.
func (h *Handle) AppendKV(args *AppendArgs) error {
	return h.AppendKVOnStream(args, 0)
}

// AppendKVOnStream is AppendKV enqueued on a CUDA stream (a cudaStream_t;
// 0 is the legacy default stream). The CPU backend ignores the stream.
func (h *Handle) AppendKVOnStream(args *AppendArgs, stream uintptr) error {
	if err := require03("Handle.AppendKV"); err != nil {
		return err
	}
	onDevice := h.backend == BackendCUDA
	roles := []struct {
		name   string
		tensor Tensor
	}{
		{"k_new", args.KNew}, {"v_new", args.VNew}, {"k", args.K}, {"v", args.V}, {"k_scale", args.KScale},
		{"v_scale", args.VScale}, {"seq_lens", args.SeqLens}, {"block_table", args.BlockTable},
	}
	var raw [8]C.fd_tensor
	for i, role := range roles {
		if !role.tensor.present() {
			continue
		}
		if role.tensor.isDevice() != onDevice {
			return refuse(ErrInvalidArgument, placementMismatch(role.name, onDevice, h.device))
		}
		described, err := role.tensor.describe(role.name)
		if err != nil {
			return err
		}
		raw[i] = described
	}
	err := h.locked(func(handle *C.fd_handle) C.fd_status {
		return C.fdgo_append_kv(handle, raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
			args.KNew.data(), args.VNew.data(), args.K.data(), args.V.data(), args.KScale.data(), args.VScale.data(),
			args.SeqLens.data(), args.BlockTable.data(), C.uintptr_t(stream))
	})
	runtime.KeepAlive(args)
	return err
}
