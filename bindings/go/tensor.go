// SPDX-License-Identifier: Apache-2.0

package flashdecode

// #include <flashdecode.h>
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// DType is a tensor's element type (fd_dtype).
type DType int

// Element types.
const (
	Float32Type  DType = C.FD_DTYPE_F32
	Float16Type  DType = C.FD_DTYPE_F16  // IEEE half, as uint16 bits
	BFloat16Type DType = C.FD_DTYPE_BF16 // bfloat16, as uint16 bits
	Int32Type    DType = C.FD_DTYPE_I32
	// Since 0.3, for K/V caches (pinned values, so that the package builds
	// against a 0.2 header too): OCP fp8 E4M3 (float8_e4m3fn) and E5M2 as
	// uint8 bits, and int8.
	E4M3Type DType = 4
	E5M2Type DType = 5
	Int8Type DType = 6
)

// Is8Bit says whether d is one of the 8-bit cache dtypes (since 0.3).
func (d DType) Is8Bit() bool { return d == E4M3Type || d == E5M2Type || d == Int8Type }

// elementBytes is the size of one element of d; 0 for a dtype this package
// does not know.
func (d DType) elementBytes() int {
	switch d {
	case Float32Type, Int32Type:
		return 4
	case Float16Type, BFloat16Type:
		return 2
	case E4M3Type, E5M2Type, Int8Type:
		return 1
	}
	return 0
}

// Tensor describes memory a call reads or writes: a Go slice (host memory,
// for the CPU backend) or a device pointer (for the CUDA backend), with a
// shape and strides in elements. The dimension order is fixed by the
// tensor's role (see DecodeArgs); the layout is given by the strides,
// row-major unless WithStrides says otherwise. The zero Tensor is absent.
type Tensor struct {
	dtype    DType
	shape    []int64
	strides  []int64
	host     unsafe.Pointer // first element of the slice (nil when it is empty); keeps it alive
	hostLen  int            // elements of the slice
	hostSize int            // bytes of one element of the slice (the dtype's, except through Bytes)
	device   uintptr
	onDevice bool // made by Device, whatever the address (0 is the library's to refuse)
	// Set by the ScalePer* constructors: the values the slice must hold
	// exactly (a longer one would be read in part without a word), and the
	// constructor's name for the message. WithStrides clears it.
	scaleValues int64
	scaleForm   string
}

// Int8 is an int8 K/V cache over a []int8 (since 0.3).
func Int8(data []int8, shape ...int64) Tensor {
	return hostTensor(Int8Type, data, shape)
}

// Bytes is an 8-bit K/V cache over its bytes (since 0.3): dtype is
// E4M3Type, E5M2Type or Int8Type; another dtype makes a tensor the
// calls refuse (ErrInvalidDType) before the library sees it.
func Bytes(data []uint8, dtype DType, shape ...int64) Tensor {
	return hostTensor(dtype, data, shape)
}

// ScalePerTensor is one dequantization scale for a whole 8-bit cache
// (since 0.3): data[0] seen as the cache's first three dimensions
// (cacheShape is K's shape) with strides of 0. Nothing is copied. For a
// device scale: Device(address, Float32Type, cacheShape[:3]...).WithStrides(0, 0, 0).
func ScalePerTensor(data []float32, cacheShape ...int64) Tensor {
	return Float32(data, firstThree(cacheShape)...).WithStrides(0, 0, 0).scaleOf(1, "ScalePerTensor")
}

// ScalePerHead is one scale per KV head (since 0.3): data ([kv_heads],
// exactly) seen as the cache's first three dimensions with strides {0, 0, 1}.
func ScalePerHead(data []float32, cacheShape ...int64) Tensor {
	heads := int64(-1)
	if len(cacheShape) >= 3 {
		heads = cacheShape[2]
	}
	return Float32(data, firstThree(cacheShape)...).WithStrides(0, 0, 1).scaleOf(heads, "ScalePerHead")
}

// ScalePerToken is one scale per token and KV head (since 0.3): data is
// the cache's first three dimensions, row-major ([batch, kv_len, kv_heads],
// or the pool's [num_pages, page_size, kv_heads]), exactly.
func ScalePerToken(data []float32, cacheShape ...int64) Tensor {
	t := Float32(data, firstThree(cacheShape)...)
	count := int64(1)
	for _, extent := range t.shape {
		if extent < 0 || (extent > 0 && count > math.MaxInt64/extent) {
			return t // a shape the calls refuse, naming the scale
		}
		count *= extent
	}
	return t.scaleOf(count, "ScalePerToken")
}

func (t Tensor) scaleOf(values int64, form string) Tensor {
	t.scaleValues, t.scaleForm = values, form
	return t
}

func firstThree(shape []int64) []int64 {
	if len(shape) < 3 {
		return shape // the shape of a rank the calls refuse, naming the scale
	}
	return append([]int64(nil), shape[:3]...)
}

// Float32 is a tensor over a []float32.
func Float32(data []float32, shape ...int64) Tensor {
	return hostTensor(Float32Type, data, shape)
}

// Float16 is a tensor of IEEE half-precision values given as their bits.
func Float16(bits []uint16, shape ...int64) Tensor {
	return hostTensor(Float16Type, bits, shape)
}

// BFloat16 is a tensor of bfloat16 values given as their bits.
func BFloat16(bits []uint16, shape ...int64) Tensor {
	return hostTensor(BFloat16Type, bits, shape)
}

// Int32 is a tensor over a []int32 (sequence lengths, block tables).
func Int32(data []int32, shape ...int64) Tensor {
	return hostTensor(Int32Type, data, shape)
}

// Device is a tensor in CUDA device memory at address, which must stay valid
// until the decode using it has finished on its stream.
func Device(address uintptr, dtype DType, shape ...int64) Tensor {
	return Tensor{dtype: dtype, shape: shape, strides: rowMajor(shape), device: address, onDevice: true}
}

// WithStrides returns the tensor with other strides, in elements (the last
// must be 1). For host tensors the call checks that they stay inside the slice.
func (t Tensor) WithStrides(strides ...int64) Tensor {
	t.strides = strides
	t.scaleForm = ""
	return t
}

// Shape is the tensor's extents.
func (t Tensor) Shape() []int64 { return t.shape }

// Strides is the tensor's strides, in elements.
func (t Tensor) Strides() []int64 { return t.strides }

// DType is the element type.
func (t Tensor) DType() DType { return t.dtype }

func first[T any](data []T) *T {
	if len(data) == 0 {
		return nil
	}
	return &data[0]
}

func hostTensor[T any](dtype DType, data []T, shape []int64) Tensor {
	var element T
	return Tensor{dtype: dtype, shape: shape, strides: rowMajor(shape), host: unsafe.Pointer(first(data)),
		hostLen: len(data), hostSize: int(unsafe.Sizeof(element))}
}

func rowMajor(shape []int64) []int64 {
	strides := make([]int64, len(shape))
	step := int64(1)
	for axis := len(shape) - 1; axis >= 0; axis-- {
		strides[axis] = step
		if shape[axis] > 1 {
			step *= shape[axis]
		}
	}
	return strides
}

func (t Tensor) present() bool { return t.shape != nil }

func (t Tensor) isDevice() bool { return t.onDevice }

// describe fills the C descriptor (without the data pointer) after the checks
// that make passing the memory to C safe: rank, signs, and for host memory
// that every element addressed lies inside the slice.
func (t Tensor) describe(name string) (C.fd_tensor, error) {
	var raw C.fd_tensor
	if !t.present() {
		return raw, nil
	}
	ndim := len(t.shape)
	if ndim == 0 || ndim > MaxDims {
		return raw, refuse(ErrInvalidShape, fmt.Sprintf("%s: %d dimensions, expected 1 to %d", name, ndim, MaxDims))
	}
	if len(t.strides) != ndim {
		return raw, refuse(ErrInvalidStride, fmt.Sprintf("%s: %d strides for %d dimensions", name, len(t.strides), ndim))
	}
	last, empty := int64(0), false
	for axis, extent := range t.shape {
		stride := t.strides[axis]
		if extent < 0 {
			return raw, refuse(ErrInvalidShape, fmt.Sprintf("%s: shape %v has a negative extent", name, t.shape))
		}
		if stride < 0 {
			return raw, refuse(ErrInvalidStride, fmt.Sprintf("%s: strides %v have a negative stride", name, t.strides))
		}
		empty = empty || extent == 0
		if extent > 1 {
			// Each term stays below 2^62; their sum is checked too.
			if stride > (1<<62)/extent || last > math.MaxInt64-(extent-1)*stride {
				return raw, refuse(ErrInvalidStride, fmt.Sprintf("%s: shape %v with strides %v overflows", name, t.shape, t.strides))
			}
			last += (extent - 1) * stride
		}
		raw.shape[axis] = C.int64_t(extent)
		raw.strides[axis] = C.int64_t(stride)
	}
	if t.scaleForm != "" && t.scaleValues >= 0 && int64(t.hostLen) != t.scaleValues { // -1: a shape the calls refuse by its rank
		return raw, refuse(ErrInvalidShape, fmt.Sprintf("%s: %s takes a slice of exactly %d for the cache's shape, got %d",
			name, t.scaleForm, t.scaleValues, t.hostLen))
	}
	if !t.onDevice {
		// The library reads and writes the dtype's elements: they must be
		// the slice's, or the bounds below would count the wrong bytes.
		if t.dtype.elementBytes() != t.hostSize {
			return raw, refuse(ErrInvalidDType, fmt.Sprintf("%s: dtype %d over a slice of %d-byte elements (Bytes takes E4M3Type, E5M2Type or Int8Type)",
				name, int(t.dtype), t.hostSize))
		}
		if !empty && last >= int64(t.hostLen) {
			return raw, refuse(ErrInvalidShape, fmt.Sprintf("%s: shape %v with strides %v reaches element %d, but the slice has %d",
				name, t.shape, t.strides, last, t.hostLen))
		}
	}
	raw.dtype = C.fd_dtype(t.dtype)
	raw.ndim = C.int32_t(ndim)
	return raw, nil
}

// AttentionMask is which keys the query tokens of a sequence see
// (fd_attention_mask, since 0.3). With one query token both are the same.
type AttentionMask int

// Attention masks (pinned values).
const (
	// MaskCausal (the zero value): query token i of a sequence of length L
	// sees the keys up to its own position L - q_len + i.
	MaskCausal AttentionMask = 0
	// MaskNone: every query token sees all L keys (e.g. a verify step that
	// scores drafts alike).
	MaskNone AttentionMask = 1
)

// DecodeArgs is everything one decode reads and writes.
//
// Shapes, by role (the order is fixed; the layout comes from strides):
//   - Q, Out: [batch, q_len, q_heads, head_dim]; Out of Q's dtype or
//     Float32Type. q_len is 1 for plain decode and up to MaxQLen (64, since
//     0.3) for speculative or multi-token steps: the q_len query tokens of a
//     sequence are its newest, token i of a sequence of length L at
//     position L - q_len + i.
//   - K, V: a dense cache [batch, kv_len, kv_heads, head_dim] (a BHND cache
//     [batch, heads, kv_len, head_dim] is the same with strides
//     {H*N*D, D, N*D, 1}), or with BlockTable the page pool
//     [num_pages, page_size, kv_heads, head_dim].
//   - LSE (optional): [batch, q_len, q_heads], Float32Type, natural log;
//     -inf for a query token that sees no key (an empty sequence).
//   - SeqLens (optional): [batch], Int32Type. BlockTable (optional):
//     [batch, max_pages], Int32Type.
//   - AlibiSlopes, Sinks (optional): [q_heads], Float32Type, in the memory
//     of the other tensors.
//   - QLens (optional): [batch], Int32Type, in the memory of the other
//     tensors.
//
// Q heads must be a multiple of KV heads (grouped-query attention).
//
// The attention variants (since 0.3; their zero values are plain causal
// attention): for query token i at position pos and key j, the score
// s = scale*q.k_j is capped to c*tanh(s/c) by LogitSoftcap c, gets
// slope[h]*(j - pos) from AlibiSlopes; key j is seen if j < L, with
// MaskCausal j <= pos, and with WindowLeft W pos - j < W; Sinks add
// exp(sink[h]) to the softmax denominator (and the LSE). A query token that
// sees no key gets zeros and LSE -inf, or sink[h] with Sinks.
type DecodeArgs struct {
	Q, K, V, Out        Tensor
	LSE                 Tensor  // optional
	SeqLens, BlockTable Tensor  // optional
	SoftmaxScale        float64 // 0 means 1/sqrt(head_dim)
	NumSplits           int     // 0 lets the library choose
	// SplitTokens is a fixed split length in KV tokens, for batch-invariant
	// results (since 0.3): a sequence's Out and LSE are then bitwise the
	// same whether it runs alone or in any batch, on one backend, device
	// model and library version (see fd_decode_args.split_tokens in the C
	// header). The library rounds it up to its KV tile (DescribePlan reports
	// the length used). 0 leaves the splits to NumSplits or the library; do
	// not set both.
	SplitTokens int
	// Mask is which keys each query token sees (since 0.3): MaskCausal (the
	// zero value) or MaskNone.
	Mask AttentionMask
	// WindowLeft > 0 is a sliding window of that many keys (since 0.3): query
	// token i sees key j only if pos_i - j < WindowLeft (1: only its own
	// position); only the keys inside it are read. 0 is no window; negative
	// fails with ErrInvalidArgument.
	WindowLeft int
	// LogitSoftcap c > 0 caps every score s (after the scale) to
	// c*tanh(s/c) (since 0.3; Gemma 2, Grok). 0 caps nothing; negative or
	// non-finite fails with ErrInvalidArgument.
	LogitSoftcap float32
	// AlibiSlopes (optional, since 0.3) adds slope[h]*(j - pos_i) to the
	// score of key j.
	AlibiSlopes Tensor
	// Sinks (optional, since 0.3) are attention-sink logits: exp(sink[h])
	// joins every softmax denominator (not the numerator) and the LSE.
	Sinks Tensor
	// KScale and VScale (optional, since 0.3) are the Float32Type
	// dequantization scales of an 8-bit K and V (E4M3Type, E5M2Type or
	// Int8Type): each element stands for stored*scale. Shaped as the cache
	// without head_dim ([batch, kv_len, kv_heads], or [num_pages,
	// page_size, kv_heads]); strides of 0 broadcast: ScalePerTensor,
	// ScalePerHead, ScalePerToken. Absent: 1. On a 16- or 32-bit cache they
	// fail with ErrInvalidDType.
	KScale, VScale Tensor
	// QLens (optional, since 0.3) are ragged query lengths: [batch],
	// Int32Type, each sequence's own number of query tokens out of Q's
	// q_len (absent: every sequence has q_len). Sequence b's tokens are
	// Q[b, 0 .. QLens[b]), token i at position L - QLens[b] + i. The tokens
	// past QLens[b] are padding: never read from Q (they may hold NaN), they
	// get zeros and LSE -inf (sink[h] with Sinks), as a query token that
	// sees no key. Entries are clamped to [0, q_len]; with
	// Options.CheckContents one outside fails with ErrInvalidLength.
	QLens Tensor
}

func (a *DecodeArgs) describe(onDevice bool, device int) (C.fd_decode_args, error) {
	// The defaults of fd_decode_args_init, filled here (see New).
	var raw C.fd_decode_args
	raw.struct_size = C.sizeof_fd_decode_args
	raw.softmax_scale = C.double(a.SoftmaxScale)
	raw.num_splits = C.int32_t(a.NumSplits)
	if int(raw.num_splits) != a.NumSplits {
		return raw, refuse(ErrInvalidSplits, fmt.Sprintf("num_splits %d does not fit in 32 bits", a.NumSplits))
	}
	if a.SplitTokens != 0 {
		if err := require03("DecodeArgs.SplitTokens"); err != nil {
			return raw, err
		}
		setSplitTokens(&raw, a.SplitTokens)
	}
	for _, variant := range []struct {
		name string
		set  bool
	}{
		{"DecodeArgs.Mask", a.Mask != MaskCausal}, {"DecodeArgs.WindowLeft", a.WindowLeft != 0},
		{"DecodeArgs.LogitSoftcap", a.LogitSoftcap != 0}, {"DecodeArgs.AlibiSlopes", a.AlibiSlopes.present()},
		{"DecodeArgs.Sinks", a.Sinks.present()}, {"DecodeArgs.KScale", a.KScale.present()},
		{"DecodeArgs.VScale", a.VScale.present()}, {"an 8-bit cache", a.K.dtype.Is8Bit() || a.V.dtype.Is8Bit()},
		{"DecodeArgs.QLens", a.QLens.present()},
	} {
		if variant.set {
			if err := require03(variant.name); err != nil {
				return raw, err
			}
		}
	}
	if int(C.int(a.Mask)) != int(a.Mask) {
		return raw, refuse(ErrInvalidArgument, fmt.Sprintf("mask %d does not fit in a C int", a.Mask))
	}
	// The 0.3 fields are described here, and set below where the header has them.
	var slopes, sinks, kScale, vScale, qLens C.fd_tensor
	roles := []struct {
		name   string
		tensor Tensor
		into   *C.fd_tensor
	}{
		{"q", a.Q, &raw.q}, {"k", a.K, &raw.k}, {"v", a.V, &raw.v}, {"out", a.Out, &raw.out},
		{"lse", a.LSE, &raw.lse}, {"seq_lens", a.SeqLens, &raw.seq_lens}, {"block_table", a.BlockTable, &raw.block_table},
		{"alibi_slopes", a.AlibiSlopes, &slopes}, {"sinks", a.Sinks, &sinks},
		{"k_scale", a.KScale, &kScale}, {"v_scale", a.VScale, &vScale}, {"q_lens", a.QLens, &qLens},
	}
	for _, role := range roles {
		if !role.tensor.present() {
			continue
		}
		if role.tensor.isDevice() != onDevice {
			return raw, refuse(ErrInvalidArgument, placementMismatch(role.name, onDevice, device))
		}
		described, err := role.tensor.describe(role.name)
		if err != nil {
			return raw, err
		}
		*role.into = described
	}
	if HeaderHas03 {
		setVariants(&raw, a.Mask, a.LogitSoftcap, a.WindowLeft, slopes, sinks)
		setScales(&raw, kScale, vScale)
		setQLens(&raw, qLens)
	}
	return raw, nil
}

// A host slice on a CUDA handle (or a device pointer on a CPU one) would be
// dereferenced in the wrong address space: refuse it before calling.
func placementMismatch(name string, onDevice bool, device int) string {
	if onDevice {
		return fmt.Sprintf("%s: is host memory, but the handle runs on CUDA device %d", name, device)
	}
	return fmt.Sprintf("%s: is device memory, but the handle runs on the CPU backend", name)
}
