// SPDX-License-Identifier: Apache-2.0

package flashdecode_test

import (
	"fmt"
	"math"
	"testing"

	flashdecode "github.com/flashdecode/flashdecode/bindings/go"
)

// The attention variants of 0.3 on the CPU backend: several query tokens per
// sequence, causal or not, ragged query lengths, sliding windows, logit
// softcaps, ALiBi and attention sinks, alone and together, with GQA, ragged lengths, paged caches
// and every dtype, against a float64 reference written here from the
// header's definition ("Attention variants" in flashdecode.h).

// variants are the options as the reference takes them (zero: not set).
type variants struct {
	full    bool // MaskNone
	window  int
	softcap float32
	slopes  []float32
	sinks   []float32
	scale   float64 // 0: 1/sqrt(head_dim)
	qLens   []int32 // QLens (nil: not set)
}

// apply sets the variants on args.
func (o variants) apply(args *flashdecode.DecodeArgs) {
	if o.full {
		args.Mask = flashdecode.MaskNone
	}
	args.WindowLeft, args.LogitSoftcap, args.SoftmaxScale = o.window, o.softcap, o.scale
	if o.slopes != nil {
		args.AlibiSlopes = flashdecode.Float32(o.slopes, int64(len(o.slopes)))
	}
	if o.sinks != nil {
		args.Sinks = flashdecode.Float32(o.sinks, int64(len(o.sinks)))
	}
	if o.qLens != nil {
		args.QLens = flashdecode.Int32(o.qLens, int64(len(o.qLens)))
	}
}

// tokens is sequence b's query token count: its QLens entry clamped to [0, qLen], else qLen.
func (o variants) tokens(b, qLen int) int {
	if o.qLens == nil {
		return qLen
	}
	n := int(o.qLens[b])
	if n < 0 {
		return 0
	}
	if n > qLen {
		return qLen
	}
	return n
}

// sizes of a problem: q [batch, qLen, heads, dim], k and v [batch, kvLen, kvHeads, dim] (NHD).
type sizes struct{ batch, qLen, heads, kvHeads, kvLen, dim int }

func (s sizes) qShape() []int64 {
	return []int64{int64(s.batch), int64(s.qLen), int64(s.heads), int64(s.dim)}
}
func (s sizes) kvShape() []int64 {
	return []int64{int64(s.batch), int64(s.kvLen), int64(s.kvHeads), int64(s.dim)}
}
func (s sizes) lseShape() []int64 { return []int64{int64(s.batch), int64(s.qLen), int64(s.heads)} }
func (s sizes) qCount() int       { return s.batch * s.qLen * s.heads * s.dim }
func (s sizes) kvCount() int      { return s.batch * s.kvLen * s.kvHeads * s.dim }

// reference computes the attention of every query token in float64, from the
// definition: token t of a sequence of length L with n query tokens (its
// QLens entry, else qLen) sits at pos = L - n + t, and the tokens t >= n are
// padding, never read (zeros, LSE -inf or the sink); key j is seen if j < L, j <= pos unless full, pos - j < W with a window;
// its score is scale*q.k, capped, plus slope*(j - pos); exp(sink) joins the
// denominator. It returns out [b][t][h][d] and lse [b][t][h].
func (s sizes) reference(q, k, v []float64, lens []int, o variants) ([]float64, []float64) {
	scale := o.scale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(s.dim))
	}
	group := s.heads / s.kvHeads
	out := make([]float64, s.qCount())
	lse := make([]float64, s.batch*s.qLen*s.heads)
	for b := 0; b < s.batch; b++ {
		tokens := o.tokens(b, s.qLen)
		for t := 0; t < s.qLen; t++ {
			pos := lens[b] - tokens + t
			keys := lens[b]
			if t >= tokens {
				keys = 0 // padding sees no key
			}
			for h := 0; h < s.heads; h++ {
				g, row := h/group, (b*s.qLen+t)*s.heads+h
				type key struct {
					j     int
					score float64
				}
				var seen []key
				for j := 0; j < keys; j++ {
					if (!o.full && j > pos) || (o.window > 0 && pos-j >= o.window) {
						continue
					}
					score := 0.0
					for d := 0; d < s.dim; d++ {
						score += q[row*s.dim+d] * k[((b*s.kvLen+j)*s.kvHeads+g)*s.dim+d]
					}
					score *= scale
					if o.softcap > 0 {
						c := float64(o.softcap)
						score = c * math.Tanh(score/c)
					}
					if o.slopes != nil {
						score += float64(o.slopes[h]) * float64(j-pos)
					}
					seen = append(seen, key{j, score})
				}
				peak := math.Inf(-1)
				for _, kj := range seen {
					peak = math.Max(peak, kj.score)
				}
				if o.sinks != nil {
					peak = math.Max(peak, float64(o.sinks[h]))
				}
				lse[row] = math.Inf(-1)
				if math.IsInf(peak, -1) {
					continue // no key and no sink: zeros, -inf
				}
				total := 0.0
				if o.sinks != nil {
					total = math.Exp(float64(o.sinks[h]) - peak)
				}
				for _, kj := range seen {
					total += math.Exp(kj.score - peak)
				}
				for _, kj := range seen {
					w := math.Exp(kj.score-peak) / total
					for d := 0; d < s.dim; d++ {
						out[row*s.dim+d] += w * v[((b*s.kvLen+kj.j)*s.kvHeads+g)*s.dim+d]
					}
				}
				lse[row] = peak + math.Log(total)
			}
		}
	}
	return out, lse
}

// closeTo fails unless got matches want within tolerance (relative, plus as
// much absolute); infinities must match exactly.
func closeTo(t *testing.T, what string, got, want []float64, tolerance float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.IsInf(want[i], 0) {
			if got[i] != want[i] {
				t.Fatalf("%s: element %d is %g, want %g", what, i, got[i], want[i])
			}
		} else if math.IsNaN(got[i]) || math.Abs(got[i]-want[i]) > tolerance*(1+math.Abs(want[i])) {
			t.Fatalf("%s: element %d is %g, want %g", what, i, got[i], want[i])
		}
	}
}

func ints(lens []int32) []int {
	out := make([]int, len(lens))
	for i, l := range lens {
		out[i] = int(l)
	}
	return out
}

// checkF32 decodes the float32 problem with o (in splits splits when not 0) and
// checks out and lse against the reference; it returns out.
func checkF32(t *testing.T, handle *flashdecode.Handle, s sizes, seed uint64, lens []int32, o variants, splits int) []float32 {
	t.Helper()
	q, k, v := values(s.qCount(), seed), values(s.kvCount(), seed+1), values(s.kvCount(), seed+2)
	// The padding tokens of ragged query lengths are never read: NaN there would show.
	row := s.heads * s.dim
	for b := 0; b < s.batch; b++ {
		for i := (b*s.qLen + o.tokens(b, s.qLen)) * row; i < (b+1)*s.qLen*row; i++ {
			q[i] = float32(math.NaN())
		}
	}
	out, lse := make([]float32, len(q)), make([]float32, s.batch*s.qLen*s.heads)
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, s.qShape()...), K: flashdecode.Float32(k, s.kvShape()...),
		V: flashdecode.Float32(v, s.kvShape()...), Out: flashdecode.Float32(out, s.qShape()...),
		LSE: flashdecode.Float32(lse, s.lseShape()...), SeqLens: flashdecode.Int32(lens, int64(s.batch)), NumSplits: splits,
	}
	o.apply(&args)
	if err := handle.Decode(&args); err != nil {
		t.Fatal(err)
	}
	want, wantLSE := s.reference(widen(q), widen(k), widen(v), ints(lens), o)
	closeTo(t, "out", widen(out), want, 3e-5)
	closeTo(t, "lse", widen(lse), wantLSE, 1e-4)
	return out
}

func TestQueryTokensCausalAndNot(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	for _, qLen := range []int{1, 2, 4, 16} {
		for _, full := range []bool{false, true} {
			t.Run(fmt.Sprintf("q_len %d full %v", qLen, full), func(t *testing.T) {
				s := sizes{batch: 4, qLen: qLen, heads: 8, kvHeads: 2, kvLen: 70, dim: 32}
				// Among the lengths: one shorter than q_len (its first tokens see no key when causal), one empty.
				lens := []int32{70, 0, 17, int32(qLen - 1)}
				out := checkF32(t, handle, s, uint64(10+qLen), lens, variants{full: full}, 0)
				split := checkF32(t, handle, s, uint64(10+qLen), lens, variants{full: full}, 5)
				closeTo(t, "splits", widen(split), widen(out), 1e-5)
			})
		}
	}
}

func TestWindowsLargerEqualShorterAndOne(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	s := sizes{batch: 3, qLen: 4, heads: 8, kvHeads: 2, kvLen: 60, dim: 32}
	for _, window := range []int{65, 60, 7, 1} {
		for _, full := range []bool{false, true} {
			o := variants{full: full, window: window}
			checkF32(t, handle, s, 20, []int32{60, 5, 0}, o, 0)
			checkF32(t, handle, s, 20, []int32{60, 5, 0}, o, 3)
		}
	}
}

func TestSoftcapAlibiAndSinks(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	s := sizes{batch: 3, qLen: 4, heads: 8, kvHeads: 4, kvLen: 90, dim: 64}
	slopes, sinks := make([]float32, 8), make([]float32, 8)
	for h := range slopes {
		slopes[h] = float32(math.Pow(2, -float64(h+1)))
		sinks[h] = float32(h)*0.5 - 2
	}
	for _, o := range []variants{
		{softcap: 2, scale: 1}, // scores well above the cap
		{slopes: slopes},
		{sinks: sinks},
		{full: true, window: 20, softcap: 3, slopes: slopes, sinks: sinks, scale: 0.5},
	} {
		checkF32(t, handle, s, 30, []int32{90, 2, 0}, o, 0)
	}

	// With sinks, a sequence of no tokens is zeros with LSE = sink.
	one := sizes{batch: 1, qLen: 4, heads: 8, kvHeads: 4, kvLen: 90, dim: 64}
	q, k := values(one.qCount(), 31), values(one.kvCount(), 32)
	out, lse := make([]float32, len(q)), make([]float32, 4*8)
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, one.qShape()...), K: flashdecode.Float32(k, one.kvShape()...),
		V: flashdecode.Float32(k, one.kvShape()...), Out: flashdecode.Float32(out, one.qShape()...),
		LSE: flashdecode.Float32(lse, one.lseShape()...), SeqLens: flashdecode.Int32([]int32{0}, 1),
		Sinks: flashdecode.Float32(sinks, 8),
	}
	if err := handle.Decode(&args); err != nil {
		t.Fatal(err)
	}
	for i, x := range out {
		if x != 0 {
			t.Fatalf("out[%d] = %g of an empty sequence", i, x)
		}
	}
	for i, x := range lse {
		if math.Abs(float64(x-sinks[i%8])) > 1e-6 {
			t.Fatalf("lse[%d] = %g, the sink is %g", i, x, sinks[i%8])
		}
	}
}

// Ragged query lengths: each sequence its own number of query tokens (none,
// all, some; more than it has keys; entries outside [0, q_len] clamped),
// causal and not, split and not, alone and with the other variants; the
// padding tokens of Q are NaN and never read, and get zeros and LSE -inf (the
// sink with sinks).
func TestRaggedQueryLengths(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	s := sizes{batch: 6, qLen: 6, heads: 8, kvHeads: 2, kvLen: 50, dim: 32}
	lens := []int32{50, 40, 3, 0, 25, 50}
	slopes, sinks := make([]float32, 8), make([]float32, 8)
	for h := range slopes {
		slopes[h], sinks[h] = 0.03*float32(h+1), float32(h)*0.25-1
	}
	for _, qLens := range [][]int32{
		{6, 0, 4, 2, 1, 3},  // full, none, more tokens than keys, an empty sequence, one, some
		{6, 6, 6, 6, 6, 6},  // every sequence all of q_len: as without QLens
		{9, -3, 0, 6, 2, 5}, // clamped to [0, 6]
	} {
		t.Run(fmt.Sprint(qLens), func(t *testing.T) {
			for _, full := range []bool{false, true} {
				o := variants{full: full, qLens: qLens}
				checkF32(t, handle, s, 70, lens, o, 0)
				checkF32(t, handle, s, 70, lens, o, 4)
			}
			together := variants{window: 9, softcap: 4, slopes: slopes, sinks: sinks, qLens: qLens}
			out := checkF32(t, handle, s, 71, lens, together, 3)
			// Padding with sinks: zeros (checkF32 checked its LSE against the sinks).
			row := s.heads * s.dim
			for b := 0; b < s.batch; b++ {
				for i := (b*s.qLen + together.tokens(b, s.qLen)) * row; i < (b+1)*s.qLen*row; i++ {
					if out[i] != 0 {
						t.Fatalf("sequence %d: padding out[%d] = %g", b, i, out[i])
					}
				}
			}
		})
	}
}

// A QLens of the wrong dtype or shape is refused naming q_lens; with content
// checks an entry outside [0, q_len] is ErrInvalidLength; in device memory
// the package refuses it on a CPU handle. Nothing is written.
func TestQLensOfTheWrongKindAreRefused(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	checked, err := flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCPU, NumThreads: 2, CheckContents: true})
	if err != nil {
		t.Fatal(err)
	}
	defer checked.Close()
	q, k := values(2*4*8*64, 80), values(2*100*2*64, 81)
	out := make([]float32, len(q))
	for i := range out {
		out[i] = 7
	}
	for _, c := range []struct {
		name    string
		checked bool
		qLens   flashdecode.Tensor
		status  flashdecode.Status
		needle  string
	}{
		{"f32", false, flashdecode.Float32([]float32{1, 2}, 2), flashdecode.ErrInvalidDType, "q_lens: dtype must be i32, got f32"},
		{"[3]", false, flashdecode.Int32([]int32{1, 2, 3}, 3), flashdecode.ErrInvalidShape, "q_lens: batch must be 2 (from q), got 3"},
		{"[2, 1]", false, flashdecode.Int32([]int32{1, 2}, 2, 1), flashdecode.ErrInvalidShape, "q_lens: ndim must be 1, got 2"},
		{"5 > q_len", true, flashdecode.Int32([]int32{1, 5}, 2), flashdecode.ErrInvalidLength, "q_lens[1] must be in [0, 4]"},
		{"-1", true, flashdecode.Int32([]int32{-1, 2}, 2), flashdecode.ErrInvalidLength, "q_lens[0] must be in [0, 4]"},
		{"device", false, flashdecode.Device(0xdead0000, flashdecode.Int32Type, 2), flashdecode.ErrInvalidArgument,
			"q_lens: is device memory, but the handle runs on the CPU backend"},
	} {
		args := flashdecode.DecodeArgs{
			Q: flashdecode.Float32(q, 2, 4, 8, 64), K: flashdecode.Float32(k, 2, 100, 2, 64),
			V: flashdecode.Float32(k, 2, 100, 2, 64), Out: flashdecode.Float32(out, 2, 4, 8, 64), QLens: c.qLens,
		}
		on := handle
		if c.checked {
			on = checked
		}
		expectError(t, on.Decode(&args), c.status, c.needle)
		for i, x := range out {
			if x != 7 {
				t.Fatalf("%s: out[%d] was written", c.name, i)
			}
		}
	}
	// Entries within [0, q_len] pass the checks.
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, 2, 4, 8, 64), K: flashdecode.Float32(k, 2, 100, 2, 64),
		V: flashdecode.Float32(k, 2, 100, 2, 64), Out: flashdecode.Float32(out, 2, 4, 8, 64),
		QLens: flashdecode.Int32([]int32{4, 2}, 2),
	}
	if err := checked.Decode(&args); err != nil {
		t.Fatal(err)
	}
}

// Every variant at once on a paged cache (HND pages) with ragged lengths and
// GQA, in every dtype, against the reference over the dense cache the pages hold.
func TestPagedRaggedGQAInEveryDType(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	const batch, qLen, heads, kvHeads, dim, page, pagesPerSequence = 3, 4, 8, 2, 32, 16, 4
	capacity, numPages := page*pagesPerSequence, batch*pagesPerSequence
	s := sizes{batch: batch, qLen: qLen, heads: heads, kvHeads: kvHeads, kvLen: capacity, dim: dim}
	lens := []int32{64, 1, 37}
	o := variants{window: 20, softcap: 6, slopes: make([]float32, heads), sinks: make([]float32, heads), scale: 0.3}
	for h := 0; h < heads; h++ {
		o.slopes[h], o.sinks[h] = 0.05*float32(h+1), 0.25*float32(h)-1
	}
	q, k, v := values(s.qCount(), 40), values(s.kvCount(), 41), values(s.kvCount(), 42)
	// Page p of sequence b is pool page (b*4 + p)*5 % 12 (a permutation), stored HND: [page, kv_head, slot, dim].
	table := make([]int32, numPages)
	for i := range table {
		table[i] = int32(i * 5 % numPages)
	}
	toPool := func(dense []float32) []float32 {
		pool := make([]float32, len(dense))
		for b := 0; b < batch; b++ {
			for p := 0; p < pagesPerSequence; p++ {
				target := int(table[b*pagesPerSequence+p])
				for slot := 0; slot < page; slot++ {
					for g := 0; g < kvHeads; g++ {
						from := ((b*capacity+p*page+slot)*kvHeads + g) * dim
						to := ((target*kvHeads+g)*page + slot) * dim
						copy(pool[to:to+dim], dense[from:from+dim])
					}
				}
			}
		}
		return pool
	}
	poolK, poolV := toPool(k), toPool(v)
	poolShape := []int64{int64(numPages), page, kvHeads, dim}
	hnd := []int64{kvHeads * page * dim, dim, page * dim, 1}
	type codec struct {
		dtype      flashdecode.DType
		toBits     func(float32) uint16
		fromBits   func(uint16) float64
		tolerance  float64
		makeTensor func([]uint16, ...int64) flashdecode.Tensor
	}
	for _, c := range []codec{
		{flashdecode.Float32Type, nil, nil, 3e-5, nil},
		{flashdecode.Float16Type, toFloat16, fromFloat16, 3e-3, flashdecode.Float16},
		{flashdecode.BFloat16Type, toBFloat16, fromBFloat16, 2e-2, flashdecode.BFloat16},
	} {
		// What the library reads, in float64, for the reference.
		read := func(x []float32) []float64 {
			if c.toBits == nil {
				return widen(x)
			}
			out := make([]float64, len(x))
			for i, y := range x {
				out[i] = c.fromBits(c.toBits(y))
			}
			return out
		}
		bits := func(x []float32) []uint16 {
			out := make([]uint16, len(x))
			for i, y := range x {
				out[i] = c.toBits(y)
			}
			return out
		}
		want, wantLSE := s.reference(read(q), read(k), read(v), ints(lens), o)
		for _, splits := range []int{0, 3} {
			out32, out16, lse := make([]float32, len(q)), make([]uint16, len(q)), make([]float32, batch*qLen*heads)
			args := flashdecode.DecodeArgs{
				LSE: flashdecode.Float32(lse, s.lseShape()...), SeqLens: flashdecode.Int32(lens, batch),
				BlockTable: flashdecode.Int32(table, batch, pagesPerSequence), NumSplits: splits,
			}
			if c.toBits == nil {
				args.Q, args.Out = flashdecode.Float32(q, s.qShape()...), flashdecode.Float32(out32, s.qShape()...)
				args.K, args.V = flashdecode.Float32(poolK, poolShape...), flashdecode.Float32(poolV, poolShape...)
			} else {
				args.Q, args.Out = c.makeTensor(bits(q), s.qShape()...), c.makeTensor(out16, s.qShape()...)
				args.K, args.V = c.makeTensor(bits(poolK), poolShape...), c.makeTensor(bits(poolV), poolShape...)
			}
			args.K, args.V = args.K.WithStrides(hnd...), args.V.WithStrides(hnd...)
			o.apply(&args)
			if err := handle.Decode(&args); err != nil {
				t.Fatal(err)
			}
			got := widen(out32)
			if c.toBits != nil {
				got = make([]float64, len(out16))
				for i, x := range out16 {
					got[i] = c.fromBits(x)
				}
			}
			closeTo(t, fmt.Sprintf("dtype %d out", c.dtype), got, want, c.tolerance)
			closeTo(t, fmt.Sprintf("dtype %d lse", c.dtype), widen(lse), wantLSE, 1e-4)
		}
	}
}

// A windowed plan cuts the window's keys, not the cache's.
func TestWindowPlansItsKeysOnly(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	q, k := values(2*2*4*32, 60), values(2*400*2*32, 61)
	out := make([]float32, len(q))
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, 2, 2, 4, 32), K: flashdecode.Float32(k, 2, 400, 2, 32),
		V: flashdecode.Float32(k, 2, 400, 2, 32), Out: flashdecode.Float32(out, 2, 2, 4, 32), NumSplits: 4,
	}
	whole, err := handle.DescribePlan(&args)
	if err != nil {
		t.Fatal(err)
	}
	args.WindowLeft = 32
	windowed, err := handle.DescribePlan(&args)
	if err != nil {
		t.Fatal(err)
	}
	bytes, err := handle.WorkspaceSize(&args)
	if err != nil {
		t.Fatal(err)
	}
	if windowed.NumSplits != 4 || windowed.SplitTokens >= whole.SplitTokens || windowed.WorkspaceBytes != bytes {
		t.Fatalf("windowed plan %+v, whole %+v, workspace %d", windowed, whole, bytes)
	}
	if flashdecode.MaxQLen != 64 {
		t.Fatalf("MaxQLen %d", flashdecode.MaxQLen)
	}
}
