// SPDX-License-Identifier: Apache-2.0

package flashdecode_test

import (
	"math"
	"testing"

	flashdecode "github.com/flashdecode/flashdecode/bindings/go"
)

// decodeParts decodes p's NHD cache cut along kv_len at cuts, each part a
// strided view of the whole cache, its lengths the tokens each sequence has
// in it (none, for some): one (out, lse) state per part.
func decodeParts(t *testing.T, handle *flashdecode.Handle, p problem, q, k, v []float32, lens []int32, cuts []int) ([][]float32, [][]float32) {
	t.Helper()
	var outs, lses [][]float32
	row := p.kvHeads * p.dim
	for i := 0; i+1 < len(cuts); i++ {
		start, stop := cuts[i], cuts[i+1]
		shape := []int64{int64(p.batch), int64(stop - start), int64(p.kvHeads), int64(p.dim)}
		strides := []int64{int64(p.kvLen * row), int64(row), int64(p.dim), 1}
		partLens := make([]int32, len(lens))
		for b, length := range lens {
			partLens[b] = int32(math.Max(0, math.Min(float64(int(length)-start), float64(stop-start))))
		}
		out, lse := make([]float32, len(q)), make([]float32, p.batch*p.heads)
		args := flashdecode.DecodeArgs{
			Q:       flashdecode.Float32(q, p.qShape()...),
			K:       flashdecode.Float32(k[start*row:], shape...).WithStrides(strides...),
			V:       flashdecode.Float32(v[start*row:], shape...).WithStrides(strides...),
			Out:     flashdecode.Float32(out, p.qShape()...),
			LSE:     flashdecode.Float32(lse, int64(p.batch), 1, int64(p.heads)),
			SeqLens: flashdecode.Int32(partLens, int64(p.batch)),
		}
		if err := handle.Decode(&args); err != nil {
			t.Fatalf("part [%d, %d): %v", start, stop, err)
		}
		outs, lses = append(outs, out), append(lses, lse)
	}
	return outs, lses
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %g, want the bits of %g", what, i, got[i], want[i])
		}
	}
}

// TestMergeStatesOfPartsIsTheWhole: a cache decoded in parts (some empty for
// some sequences) and merged is the decode of the whole; in place too; f16
// states of another dtype than the bf16 output.
func TestMergeStatesOfPartsIsTheWhole(t *testing.T) {
	needs03(t)
	p := problem{batch: 5, heads: 8, kvHeads: 2, kvLen: 300, dim: 64}
	q, k, v := values(5*8*64, 31), values(5*300*2*64, 32), values(5*300*2*64, 33)
	lens := []int32{300, 0, 1, 150, 299}
	lseShape := []int64{5, 1, 8}
	handle := cpuHandle(t)
	whole, wholeLSE := make([]float32, len(q)), make([]float32, 5*8)
	if err := handle.Decode(&flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, p.qShape()...), K: flashdecode.Float32(k, p.kvShape()...),
		V: flashdecode.Float32(v, p.kvShape()...), Out: flashdecode.Float32(whole, p.qShape()...),
		LSE: flashdecode.Float32(wholeLSE, lseShape...), SeqLens: flashdecode.Int32(lens, 5),
	}); err != nil {
		t.Fatal(err)
	}
	outs, lses := decodeParts(t, handle, p, q, k, v, lens, []int{0, 100, 150, 300})
	states := func(from int) []flashdecode.MergeState {
		var found []flashdecode.MergeState
		for s := from; s < len(outs); s++ {
			found = append(found, flashdecode.MergeState{
				Out: flashdecode.Float32(outs[s], p.qShape()...), LSE: flashdecode.Float32(lses[s], lseShape...)})
		}
		return found
	}
	out, lse := make([]float32, len(q)), make([]float32, 5*8)
	if err := handle.MergeStates(&flashdecode.MergeArgs{
		States: states(0), Out: flashdecode.Float32(out, p.qShape()...), LSE: flashdecode.Float32(lse, lseShape...),
	}); err != nil {
		t.Fatal(err)
	}
	assertClose(t, widen(out), widen(whole), 2e-5)
	want, wantLSE := p.reference(widen(q), widen(k), widen(v), []int{300, 0, 1, 150, 299}, 1.0/8)
	assertClose(t, widen(out), want, 2e-5)
	for i, w := range wantLSE {
		if math.IsInf(w, -1) != math.IsInf(float64(lse[i]), -1) || (!math.IsInf(w, -1) && math.Abs(float64(lse[i])-w) > 1e-4) {
			t.Fatalf("lse[%d] = %g, want %g", i, lse[i], w)
		}
	}
	for _, x := range out[8*64 : 2*8*64] {
		if x != 0 {
			t.Fatal("a sequence of no tokens is not zeros")
		}
	}

	// In place, into the first part's own slices (the same memory, shape and strides): the same bits.
	first := append([]float32(nil), outs[0]...)
	firstLSE := append([]float32(nil), lses[0]...)
	inPlace := flashdecode.MergeArgs{
		States: append([]flashdecode.MergeState{{
			Out: flashdecode.Float32(first, p.qShape()...), LSE: flashdecode.Float32(firstLSE, lseShape...)}}, states(1)...),
		Out: flashdecode.Float32(first, p.qShape()...), LSE: flashdecode.Float32(firstLSE, lseShape...),
	}
	if err := handle.MergeStatesOnStream(&inPlace, 0); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "in place", first, out)
	sameBits(t, "lse in place", firstLSE, lse)

	// f16 states into a bf16 output: each of its own dtype.
	merged := make([]uint16, len(q))
	args := flashdecode.MergeArgs{Out: flashdecode.BFloat16(merged, p.qShape()...)}
	for s := range outs {
		half := make([]uint16, len(q))
		for i, x := range outs[s] {
			half[i] = toFloat16(x)
		}
		args.States = append(args.States, flashdecode.MergeState{
			Out: flashdecode.Float16(half, p.qShape()...), LSE: flashdecode.Float32(lses[s], lseShape...)})
	}
	if err := handle.MergeStates(&args); err != nil {
		t.Fatal(err)
	}
	got := make([]float64, len(merged))
	for i, bits := range merged {
		got[i] = fromBFloat16(bits)
	}
	assertClose(t, got, want, 1.6e-2)
}

// TestMergeStatesOfTheMostStates: MaxMergeStates states, each data pointer
// its own argument on the way to C, against a float64 merge.
func TestMergeStatesOfTheMostStates(t *testing.T) {
	needs03(t)
	const rows, dim = 6, 16
	handle := cpuHandle(t)
	states := make([]flashdecode.MergeState, flashdecode.MaxMergeStates)
	outs := make([][]float32, len(states))
	lses := make([][]float32, len(states))
	for s := range states {
		outs[s] = values(rows*dim, uint64(100+s))
		lses[s] = values(rows, uint64(200+s))
		for i := range lses[s] {
			lses[s][i] *= 8
		}
		if s%7 == 3 {
			lses[s][s%rows] = float32(math.Inf(-1)) // an empty state for one row
			outs[s][s%rows*dim] = float32(math.NaN())
		}
		states[s] = flashdecode.MergeState{
			Out: flashdecode.Float32(outs[s], 1, 1, rows, dim), LSE: flashdecode.Float32(lses[s], 1, 1, rows)}
	}
	out, lse := make([]float32, rows*dim), make([]float32, rows)
	err := handle.MergeStates(&flashdecode.MergeArgs{
		States: states, Out: flashdecode.Float32(out, 1, 1, rows, dim), LSE: flashdecode.Float32(lse, 1, 1, rows)})
	if err != nil {
		t.Fatal(err)
	}
	want, wantLSE := make([]float64, rows*dim), make([]float64, rows)
	for r := 0; r < rows; r++ {
		peak := math.Inf(-1)
		for s := range states {
			peak = math.Max(peak, float64(lses[s][r]))
		}
		total := 0.0
		for s := range states {
			if math.IsInf(float64(lses[s][r]), -1) {
				continue
			}
			w := math.Exp(float64(lses[s][r]) - peak)
			total += w
			for d := 0; d < dim; d++ {
				want[r*dim+d] += w * float64(outs[s][r*dim+d])
			}
		}
		for d := 0; d < dim; d++ {
			want[r*dim+d] /= total
		}
		wantLSE[r] = peak + math.Log(total)
	}
	assertClose(t, widen(out), want, 1e-5)
	assertClose(t, widen(lse), wantLSE, 1e-6)
}

// TestMergeStatesEmptyAndNaNRows: empty states (LSE -inf) are not read, NaN
// in them included; a row of empty states is zeros with LSE -inf; a NaN
// LSE makes its row NaN.
func TestMergeStatesEmptyAndNaNRows(t *testing.T) {
	needs03(t)
	out0, out1 := make([]float32, 12), make([]float32, 12)
	for i := range out0 {
		out0[i], out1[i] = float32(i+1), float32(math.NaN())
	}
	inf, nan := float32(math.Inf(-1)), float32(math.NaN())
	lse0, lse1 := []float32{0.5, inf, nan}, []float32{inf, inf, 1}
	out, lse := make([]float32, 12), make([]float32, 3)
	err := cpuHandle(t).MergeStates(&flashdecode.MergeArgs{
		States: []flashdecode.MergeState{
			{Out: flashdecode.Float32(out0, 1, 1, 3, 4), LSE: flashdecode.Float32(lse0, 1, 1, 3)},
			{Out: flashdecode.Float32(out1, 1, 1, 3, 4), LSE: flashdecode.Float32(lse1, 1, 1, 3)},
		},
		Out: flashdecode.Float32(out, 1, 1, 3, 4), LSE: flashdecode.Float32(lse, 1, 1, 3),
	})
	if err != nil {
		t.Fatal(err)
	}
	sameBits(t, "row 0", out[:4], out0[:4])
	if lse[0] != 0.5 || !math.IsInf(float64(lse[1]), -1) || !math.IsNaN(float64(lse[2])) {
		t.Fatalf("lse %v", lse)
	}
	for i := 4; i < 8; i++ {
		if out[i] != 0 || math.Signbit(float64(out[i])) {
			t.Fatalf("out[%d] = %g in a row of empty states", i, out[i])
		}
	}
	for i := 8; i < 12; i++ {
		if !math.IsNaN(float64(out[i])) {
			t.Fatalf("out[%d] = %g in a row with a NaN LSE", i, out[i])
		}
	}
}

func TestMergeStatesErrorsWriteNothing(t *testing.T) {
	needs03(t)
	handle := cpuHandle(t)
	a, b, la := values(2*8*16, 41), values(2*8*16, 42), values(2*8, 43)
	half := make([]uint16, 2*8)
	shared := values(2*8*16+1, 44)
	out := make([]float32, 2*8*16)
	for i := range out {
		out[i] = 7
	}
	state := func(data, lse []float32) flashdecode.MergeState {
		return flashdecode.MergeState{Out: flashdecode.Float32(data, 2, 1, 8, 16), LSE: flashdecode.Float32(lse, 2, 1, 8)}
	}
	many := make([]flashdecode.MergeState, flashdecode.MaxMergeStates+1)
	for i := range many {
		many[i] = state(a, la)
	}
	cases := []struct {
		name   string
		args   flashdecode.MergeArgs
		status flashdecode.Status
		needle string
	}{
		{"heads", flashdecode.MergeArgs{States: []flashdecode.MergeState{state(a, la),
			{Out: flashdecode.Float32(b, 2, 1, 4, 16), LSE: flashdecode.Float32(la, 2, 1, 8)}}},
			flashdecode.ErrInvalidShape, "states_out[1]: heads must be 8 (from out), got 4"},
		{"lse dtype", flashdecode.MergeArgs{States: []flashdecode.MergeState{
			{Out: flashdecode.Float32(a, 2, 1, 8, 16), LSE: flashdecode.Float16(half, 2, 1, 8)}}},
			flashdecode.ErrInvalidDType, "states_lse[0]: dtype must be f32"},
		{"merged lse dtype", flashdecode.MergeArgs{States: []flashdecode.MergeState{state(a, la)},
			LSE: flashdecode.BFloat16(half, 2, 1, 8)}, flashdecode.ErrInvalidDType, "lse: dtype must be f32"},
		{"no states", flashdecode.MergeArgs{}, flashdecode.ErrInvalidArgument, "num_states must be in [1, 64], got 0"},
		{"too many states", flashdecode.MergeArgs{States: many}, flashdecode.ErrInvalidArgument,
			"invalid argument: num_states must be in [1, 64], got 65"},
		{"slice too short", flashdecode.MergeArgs{States: []flashdecode.MergeState{state(a, la), state(b, la[:8])}},
			flashdecode.ErrInvalidShape, "states_lse[1]: shape [2 1 8] with strides [8 8 1] reaches element 15, but the slice has 8"},
		{"device memory", flashdecode.MergeArgs{States: []flashdecode.MergeState{state(a, la),
			{Out: flashdecode.Device(0xdead0000, flashdecode.Float32Type, 2, 1, 8, 16), LSE: flashdecode.Float32(la, 2, 1, 8)}}},
			flashdecode.ErrInvalidArgument, "states_out[1]: is device memory, but the handle runs on the CPU backend"},
		{"overlap", flashdecode.MergeArgs{States: []flashdecode.MergeState{state(a, la), state(shared[:2*8*16], la)},
			Out: flashdecode.Float32(shared[1:], 2, 1, 8, 16)},
			flashdecode.ErrInvalidArgument, "overlap those of input states_out[1]"},
	}
	for _, c := range cases {
		if c.args.Out.Shape() == nil {
			c.args.Out = flashdecode.Float32(out, 2, 1, 8, 16)
		}
		expectError(t, handle.MergeStates(&c.args), c.status, c.needle)
		for i, x := range out {
			if x != 7 {
				t.Fatalf("%s: out[%d] was written", c.name, i)
			}
		}
	}
	handle.Close()
	expectError(t, handle.MergeStates(&flashdecode.MergeArgs{States: []flashdecode.MergeState{state(a, la)},
		Out: flashdecode.Float32(out, 2, 1, 8, 16)}), flashdecode.ErrInvalidHandle, "the handle is closed")
}
