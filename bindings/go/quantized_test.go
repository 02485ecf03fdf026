// SPDX-License-Identifier: Apache-2.0

package flashdecode_test

// 8-bit K/V caches (since 0.3): E4M3, E5M2 and int8 caches with
// per-tensor, per-KV-head and per-token scales against the float64
// reference over the dequantized values (stored value * scale), and
// AppendKV's rounding against the header's rules. The numerics need the
// CPU backend's 8-bit decode and fd_append_kv: they are skipped while the
// library's backend still refuses them as it did before it had them.

import (
	"math"
	"testing"

	"github.com/flashdecode/flashdecode/bindings/go"
)

var cacheTypes = []flashdecode.DType{flashdecode.E4M3Type, flashdecode.E5M2Type, flashdecode.Int8Type}

type scaleMode int

const (
	scaleNone scaleMode = iota
	scaleTensor
	scaleHead
	scaleToken
)

// dequantize is the value of an 8-bit cache element.
func dequantize(b uint8, dtype flashdecode.DType) float64 {
	if dtype == flashdecode.Int8Type {
		return float64(int8(b))
	}
	exponentBits, mantissaBits := 4, 3
	if dtype == flashdecode.E5M2Type {
		exponentBits, mantissaBits = 5, 2
	}
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	bias, top := (1<<(exponentBits-1))-1, (1<<exponentBits)-1
	exponent := int(b>>mantissaBits) & top
	mantissa := int(b) & ((1 << mantissaBits) - 1)
	fraction := float64(mantissa) / float64(int(1)<<mantissaBits)
	switch {
	case dtype == flashdecode.E5M2Type && exponent == top && mantissa == 0:
		return sign * math.Inf(1)
	case dtype == flashdecode.E5M2Type && exponent == top, dtype == flashdecode.E4M3Type && exponent == top && mantissa == 7:
		return math.NaN()
	case exponent == 0:
		return sign * fraction * math.Pow(2, float64(1-bias))
	}
	return sign * (1 + fraction) * math.Pow(2, float64(exponent-bias))
}

// quantize is the append rounding of x (= new/scale in float32).
func quantize(x float32, dtype flashdecode.DType) uint8 {
	if dtype == flashdecode.Int8Type {
		if x != x {
			return 0
		}
		return uint8(int8(math.Max(-127, math.Min(127, math.RoundToEven(float64(x))))))
	}
	if x != x {
		return 0x7f
	}
	largest := uint8(0x7e)
	if dtype == flashdecode.E5M2Type {
		largest = 0x7b
	}
	magnitude := math.Min(math.Abs(float64(x)), dequantize(largest, dtype))
	best := uint8(0)
	for code := uint8(1); code <= largest; code++ {
		distance, bestDistance := math.Abs(dequantize(code, dtype)-magnitude), math.Abs(dequantize(best, dtype)-magnitude)
		if distance < bestDistance || (distance == bestDistance && code%2 == 0) {
			best = code
		}
	}
	if math.Signbit(float64(x)) {
		best |= 0x80
	}
	return best
}

func scaleData(mode scaleMode, batch, length, heads int, seed uint64) []float32 {
	count := map[scaleMode]int{scaleNone: 0, scaleTensor: 1, scaleHead: heads, scaleToken: batch * length * heads}[mode]
	out := values(count, seed)
	for i := range out {
		out[i] = 0.02 + 0.01*out[i]
	}
	return out
}

func scaleAt(mode scaleMode, scales []float32, length, heads, b, t, h int) float32 {
	switch mode {
	case scaleTensor:
		return scales[0]
	case scaleHead:
		return scales[h]
	case scaleToken:
		return scales[(b*length+t)*heads+h]
	}
	return 1
}

func scaleTensorOf(mode scaleMode, scales []float32, cacheShape []int64) flashdecode.Tensor {
	switch mode {
	case scaleTensor:
		return flashdecode.ScalePerTensor(scales, cacheShape...)
	case scaleHead:
		return flashdecode.ScalePerHead(scales, cacheShape...)
	case scaleToken:
		return flashdecode.ScalePerToken(scales, cacheShape...)
	}
	return flashdecode.Tensor{}
}

func TestQuantizedDecodeMatchesTheDequantizedReference(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	p := problem{batch: 2, heads: 4, kvHeads: 2, kvLen: 40, dim: 32}
	lens := []int32{40, 17}
	qValues := values(p.batch*p.heads*p.dim, 1)
	for _, cache := range cacheTypes {
		for _, query := range []flashdecode.DType{flashdecode.Float32Type, flashdecode.Float16Type, flashdecode.BFloat16Type} {
			for mode := scaleNone; mode <= scaleToken; mode++ {
				seed := uint64(cache)*100 + uint64(query)*10 + uint64(mode)
				kScales := scaleData(mode, p.batch, p.kvLen, p.kvHeads, seed+2)
				vScales := scaleData(mode, p.batch, p.kvLen, p.kvHeads, seed+3)
				store := func(scales []float32, seed uint64) ([]uint8, []float64) {
					raw := values(p.batch*p.kvLen*p.kvHeads*p.dim, seed)
					bytes, wide := make([]uint8, len(raw)), make([]float64, len(raw))
					for i, x := range raw {
						b, tok, h := i/(p.kvLen*p.kvHeads*p.dim), i/(p.kvHeads*p.dim)%p.kvLen, i/p.dim%p.kvHeads
						scale := scaleAt(mode, scales, p.kvLen, p.kvHeads, b, tok, h)
						if cache == flashdecode.Int8Type && mode == scaleNone {
							x *= 10 // small integers: large scores would need a looser tolerance
						}
						bytes[i] = quantize(x/scale, cache)
						wide[i] = dequantize(bytes[i], cache) * float64(scale)
					}
					return bytes, wide
				}
				kBytes, k64 := store(kScales, seed+4)
				vBytes, v64 := store(vScales, seed+5)
				q64, tolerance := widen(qValues), 2e-5
				var qTensor, outTensor flashdecode.Tensor
				outF32, outBits := make([]float32, len(qValues)), make([]uint16, len(qValues))
				bits := make([]uint16, len(qValues))
				switch query {
				case flashdecode.Float32Type:
					qTensor, outTensor = flashdecode.Float32(qValues, p.qShape()...), flashdecode.Float32(outF32, p.qShape()...)
				case flashdecode.Float16Type:
					for i, x := range qValues {
						bits[i] = toFloat16(x)
						q64[i] = fromFloat16(bits[i])
					}
					qTensor, outTensor, tolerance = flashdecode.Float16(bits, p.qShape()...), flashdecode.Float16(outBits, p.qShape()...), 2e-3
				default:
					for i, x := range qValues {
						bits[i] = toBFloat16(x)
						q64[i] = fromBFloat16(bits[i])
					}
					qTensor, outTensor, tolerance = flashdecode.BFloat16(bits, p.qShape()...), flashdecode.BFloat16(outBits, p.qShape()...), 1.6e-2
				}
				args := flashdecode.DecodeArgs{
					Q: qTensor, K: flashdecode.Bytes(kBytes, cache, p.kvShape()...), V: flashdecode.Bytes(vBytes, cache, p.kvShape()...),
					Out: outTensor, SeqLens: flashdecode.Int32(lens, int64(p.batch)),
					KScale: scaleTensorOf(mode, kScales, p.kvShape()), VScale: scaleTensorOf(mode, vScales, p.kvShape()),
				}
				if err := handle.Decode(&args); err != nil {
					t.Fatalf("cache %d q %d scales %d: %v", cache, query, mode, err)
				}
				want, _ := p.reference(q64, k64, v64, []int{40, 17}, 1/math.Sqrt(float64(p.dim)))
				got := widen(outF32)
				if query != flashdecode.Float32Type {
					for i, b := range outBits {
						if query == flashdecode.Float16Type {
							got[i] = fromFloat16(b)
						} else {
							got[i] = fromBFloat16(b)
						}
					}
				}
				assertClose(t, got, want, tolerance)
			}
		}
	}
}

func TestAppendRoundsAsTheHeaderSays(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	batch, capacity, heads, dim, newLen := 3, 6, 2, 16, 2
	lens := []int32{6, 3, 1} // the last sequence: one new token falls before position 0
	shape := []int64{int64(batch), int64(capacity), int64(heads), int64(dim)}
	for _, cache := range cacheTypes {
		for mode := scaleNone; mode <= scaleToken; mode++ {
			scales := scaleData(mode, batch, capacity, heads, 11)
			newKV := values(batch*newLen*heads*dim, 12)
			for i := range newKV {
				newKV[i] *= 8
			}
			newKV[0], newKV[1], newKV[2], newKV[3] = float32(math.NaN()), 1e30, -1e30, float32(math.Inf(1))
			const sentinel = 0x11
			k, v := make([]uint8, batch*capacity*heads*dim), make([]uint8, batch*capacity*heads*dim)
			for i := range k {
				k[i], v[i] = sentinel, sentinel
			}
			newShape := []int64{int64(batch), int64(newLen), int64(heads), int64(dim)}
			err := handle.AppendKV(&flashdecode.AppendArgs{
				KNew: flashdecode.Float32(newKV, newShape...), VNew: flashdecode.Float32(newKV, newShape...),
				K: flashdecode.Bytes(k, cache, shape...), V: flashdecode.Bytes(v, cache, shape...),
				KScale: scaleTensorOf(mode, scales, shape), VScale: scaleTensorOf(mode, scales, shape),
				SeqLens: flashdecode.Int32(lens, int64(batch)),
			})
			if err != nil {
				t.Fatalf("cache %d scales %d: %v", cache, mode, err)
			}
			for b := 0; b < batch; b++ {
				for tok := 0; tok < capacity; tok++ {
					i := tok - (int(lens[b]) - newLen)
					for h := 0; h < heads; h++ {
						for d := 0; d < dim; d++ {
							index := ((b*capacity+tok)*heads+h)*dim + d
							want := uint8(sentinel)
							if i >= 0 && i < newLen && tok < int(lens[b]) {
								x := newKV[((b*newLen+i)*heads+h)*dim+d]
								want = quantize(x/scaleAt(mode, scales, capacity, heads, b, tok, h), cache)
							}
							for _, got := range []uint8{k[index], v[index]} {
								g, w := dequantize(got, cache), dequantize(want, cache)
								if g != w && !(math.IsNaN(g) && math.IsNaN(w)) {
									t.Fatalf("cache %d scales %d: [%d %d %d %d] = %#x, want %#x", cache, mode, b, tok, h, d, got, want)
								}
							}
						}
					}
				}
			}
		}
	}
}

func TestQuantizedArgumentsPassValidation(t *testing.T) {
	// The strides this package builds are the header's: the size query validates them as Decode does.
	needs03(t)
	handle := cpuHandle(t)
	q, out, cache := make([]float32, 2*4*32), make([]float32, 2*4*32), make([]int8, 2*10*2*32)
	shape := []int64{2, 10, 2, 32}
	base := flashdecode.DecodeArgs{Q: flashdecode.Float32(q, 2, 1, 4, 32), K: flashdecode.Int8(cache, shape...),
		V: flashdecode.Int8(cache, shape...), Out: flashdecode.Float32(out, 2, 1, 4, 32)}
	plain, err := handle.WorkspaceSize(&base)
	if err != nil {
		t.Fatal(err)
	}
	for _, scale := range []flashdecode.Tensor{
		flashdecode.ScalePerTensor([]float32{0.5}, shape...), flashdecode.ScalePerHead([]float32{0.5, 2}, shape...),
		flashdecode.ScalePerToken(make([]float32, 2*10*2), shape...),
	} {
		args := base
		args.KScale, args.VScale = scale, scale
		if size, err := handle.WorkspaceSize(&args); err != nil || size != plain {
			t.Fatalf("scale %v %v: %d, %v", scale.Shape(), scale.Strides(), size, err)
		}
	}
	bytes := make([]uint8, len(cache))
	args := base
	args.K, args.V = flashdecode.Bytes(bytes, flashdecode.E5M2Type, shape...), flashdecode.Bytes(bytes, flashdecode.E5M2Type, shape...)
	if size, err := handle.WorkspaceSize(&args); err != nil || size != plain {
		t.Fatalf("e5m2 bytes: %d, %v", size, err)
	}

	// What the library refuses, by name.
	wide := make([]float32, len(cache))
	args = base
	args.K, args.V = flashdecode.Float32(wide, shape...), flashdecode.Float32(wide, shape...)
	args.KScale = flashdecode.ScalePerTensor([]float32{0.5}, shape...)
	_, err = handle.WorkspaceSize(&args)
	expectError(t, err, flashdecode.ErrInvalidDType, "k_scale")
	args = base
	args.VScale = flashdecode.ScalePerHead([]float32{1, 1, 1}, 2, 10, 3, 32)
	_, err = handle.WorkspaceSize(&args)
	expectError(t, err, flashdecode.ErrInvalidShape, "v_scale")
	args = base
	args.KScale = flashdecode.ScalePerHead([]float32{1}, shape...) // one value for two heads: outside the slice
	_, err = handle.WorkspaceSize(&args)
	expectError(t, err, flashdecode.ErrInvalidShape, "k_scale")
	// A slice longer than its form takes (one value per query head, say) is refused, not read in part.
	args.KScale = flashdecode.ScalePerHead([]float32{1, 2, 3}, shape...)
	_, err = handle.WorkspaceSize(&args)
	expectError(t, err, flashdecode.ErrInvalidShape, "k_scale: ScalePerHead takes a slice of exactly 2")
	args.KScale = flashdecode.ScalePerTensor([]float32{1, 2}, shape...)
	_, err = handle.WorkspaceSize(&args)
	expectError(t, err, flashdecode.ErrInvalidShape, "k_scale: ScalePerTensor takes a slice of exactly 1")
	args.KScale = flashdecode.ScalePerToken(make([]float32, 2*10*2+1), shape...)
	_, err = handle.WorkspaceSize(&args)
	expectError(t, err, flashdecode.ErrInvalidShape, "k_scale: ScalePerToken takes a slice of exactly 40")

	newKV, k16 := make([]float32, 2*2*32), make([]uint16, len(cache))
	err = handle.AppendKV(&flashdecode.AppendArgs{
		KNew: flashdecode.Float32(newKV, 2, 1, 2, 32), VNew: flashdecode.Float32(newKV, 2, 1, 2, 32),
		K: flashdecode.Float16(k16, shape...), V: flashdecode.Float16(k16, shape...),
		VScale: flashdecode.ScalePerTensor([]float32{2}, shape...),
	})
	expectError(t, err, flashdecode.ErrInvalidDType, "v_scale")
	k8 := make([]int8, len(cache))
	for i := range k8 {
		k8[i] = 5
	}
	err = handle.AppendKV(&flashdecode.AppendArgs{
		KNew: flashdecode.Float32(newKV, 2, 1, 2, 32), VNew: flashdecode.Float32(newKV[:32*2], 2, 1, 1, 32),
		K: flashdecode.Int8(k8, shape...), V: flashdecode.Int8(make([]int8, len(cache)), shape...),
	})
	expectError(t, err, flashdecode.ErrInvalidShape, "v_new")
	for _, x := range k8 {
		if x != 5 {
			t.Fatal("a refused append wrote the cache")
		}
	}
}

func TestBytesTakesOnly8BitDTypes(t *testing.T) {
	// Bytes over a slice of bytes described as a wider dtype would let the
	// library read and write past the slice: refused before any call.
	handle := cpuHandle(t)
	q, k, out := make([]float32, 1*1*2*16), make([]float32, 1*8*2*16), make([]uint8, 4*32)
	for i := range out {
		out[i] = 0xab
	}
	args := flashdecode.DecodeArgs{Q: flashdecode.Float32(q, 1, 1, 2, 16), K: flashdecode.Float32(k, 1, 8, 2, 16),
		V: flashdecode.Float32(k, 1, 8, 2, 16), Out: flashdecode.Bytes(out[:32], flashdecode.Float32Type, 1, 1, 2, 16)}
	expectError(t, handle.Decode(&args), flashdecode.ErrInvalidDType, "Bytes takes")
	for i, b := range out {
		if b != 0xab {
			t.Fatalf("out[%d] written: %#x", i, b)
		}
	}
	args.Out = flashdecode.Float32(make([]float32, 32), 1, 1, 2, 16)
	args.K = flashdecode.Bytes(make([]uint8, 8*2*16), flashdecode.Float16Type, 1, 8, 2, 16)
	expectError(t, handle.Decode(&args), flashdecode.ErrInvalidDType, "k: dtype 1 over a slice of 1-byte elements")
}

// A paged 8-bit cache: pages of 8 tokens in a shuffled pool, per-token and
// per-head scales laid out like the pool, every byte past a sequence's
// length (and every page no table uses) a NaN code, or for int8 the
// largest code under a huge per-token scale, which must not reach out.
func TestQuantizedPagedDecode(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	p := problem{batch: 3, heads: 8, kvHeads: 2, kvLen: 29, dim: 16}
	const pageSize = 8
	maxPages := (p.kvLen + pageSize - 1) / pageSize
	numPages := p.batch*maxPages + 2 // two pages no table uses
	lens := []int32{29, 9, 1}
	table := make([]int32, p.batch*maxPages)
	for i := range table { // page i*5 mod numPages: every sequence's pages scattered over the pool
		table[i] = int32(i * 5 % numPages)
	}
	qValues := values(p.batch*p.heads*p.dim, 11)
	q64 := widen(qValues)
	poolShape := []int64{int64(numPages), pageSize, int64(p.kvHeads), int64(p.dim)}
	for _, cache := range cacheTypes {
		for _, mode := range []scaleMode{scaleHead, scaleToken} {
			seed := uint64(cache)*10 + uint64(mode)
			// store fills a pool: sequence b's token tok lives at slot tok%pageSize of page table[b][tok/pageSize].
			store := func(seed uint64) ([]uint8, []float32, []float64) {
				raw := values(p.batch*p.kvLen*p.kvHeads*p.dim, seed)
				bytes := make([]uint8, numPages*pageSize*p.kvHeads*p.dim)
				for i := range bytes {
					bytes[i] = 0x7f // NaN in both fp8 formats; int8's largest value
				}
				scales := scaleData(mode, 1, numPages*pageSize, p.kvHeads, seed+1)
				if mode == scaleToken && cache == flashdecode.Int8Type {
					for i := range scales {
						scales[i] = 1e30
					}
				}
				wide := make([]float64, p.batch*p.kvLen*p.kvHeads*p.dim) // the dense cache the pages hold
				for b := 0; b < p.batch; b++ {
					for tok := 0; tok < int(lens[b]); tok++ {
						page, slot := int(table[b*maxPages+tok/pageSize]), tok%pageSize
						for h := 0; h < p.kvHeads; h++ {
							position := (page*pageSize+slot)*p.kvHeads + h
							if mode == scaleToken {
								scales[position] = 0.02 + 0.01*raw[((b*p.kvLen+tok)*p.kvHeads+h)*p.dim]
							}
							scale := scaleAt(mode, scales, numPages*pageSize, p.kvHeads, 0, page*pageSize+slot, h)
							for d := 0; d < p.dim; d++ {
								x := raw[((b*p.kvLen+tok)*p.kvHeads+h)*p.dim+d]
								if cache == flashdecode.Int8Type {
									x *= 0.5 // keeps int8's scores small: the codes are x/scale rounded
								}
								code := quantize(x/scale, cache)
								bytes[position*p.dim+d] = code
								wide[((b*p.kvLen+tok)*p.kvHeads+h)*p.dim+d] = dequantize(code, cache) * float64(scale)
							}
						}
					}
				}
				return bytes, scales, wide
			}
			kBytes, kScales, k64 := store(seed + 20)
			vBytes, vScales, v64 := store(seed + 30)
			out := make([]float32, len(qValues))
			for i := range out {
				out[i] = float32(math.NaN())
			}
			args := flashdecode.DecodeArgs{
				Q: flashdecode.Float32(qValues, p.qShape()...), Out: flashdecode.Float32(out, p.qShape()...),
				K: flashdecode.Bytes(kBytes, cache, poolShape...), V: flashdecode.Bytes(vBytes, cache, poolShape...),
				SeqLens:    flashdecode.Int32(lens, int64(p.batch)),
				BlockTable: flashdecode.Int32(table, int64(p.batch), int64(maxPages)),
				KScale:     scaleTensorOf(mode, kScales, poolShape), VScale: scaleTensorOf(mode, vScales, poolShape),
			}
			if err := handle.Decode(&args); err != nil {
				t.Fatalf("cache %d scales %d: %v", cache, mode, err)
			}
			want, _ := p.reference(q64, k64, v64, []int{29, 9, 1}, 1/math.Sqrt(float64(p.dim)))
			assertClose(t, widen(out), want, 2e-5)
		}
	}
}
