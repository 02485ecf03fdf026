// SPDX-License-Identifier: Apache-2.0

package flashdecode_test

import (
	"math"
	"os"
	"strings"
	"testing"

	flashdecode "github.com/flashdecode/flashdecode/bindings/go"
)

// What 0.3 added: content checks, SplitTokens, MergeStates (tested in
// merge_test.go) and the attention variants (variants_test.go). Built
// against a 0.2 header (the CTest test go_old_library), the package has
// none of them, and TestWithoutThe03Header checks that asking for them says
// so.

func needs03(t *testing.T) {
	t.Helper()
	if !flashdecode.HeaderHas03 {
		t.Skipf("compiled against flashdecode.h %d.%d: no 0.3 features", flashdecode.HeaderVersionMajor, flashdecode.HeaderVersionMinor)
	}
}

func TestContentsCheckedOnRequestClampedByDefault(t *testing.T) {
	needs03(t)
	q, k := values(2*8*64, 12), values(2*100*2*64, 13)
	decode := func(handle *flashdecode.Handle, lens, table []int32) ([]float32, error) {
		out := make([]float32, len(q))
		for i := range out {
			out[i] = 7
		}
		args := flashdecode.DecodeArgs{
			Q: flashdecode.Float32(q, 2, 1, 8, 64), K: flashdecode.Float32(k, 2, 100, 2, 64),
			V: flashdecode.Float32(k, 2, 100, 2, 64), Out: flashdecode.Float32(out, 2, 1, 8, 64),
			SeqLens: flashdecode.Int32(lens, 2),
		}
		if table != nil {
			args.K, args.V = flashdecode.Float32(k, 4, 50, 2, 64), flashdecode.Float32(k, 4, 50, 2, 64)
			args.BlockTable = flashdecode.Int32(table, 2, 1)
		}
		return out, handle.Decode(&args)
	}
	checked, err := flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCPU, NumThreads: 2, CheckContents: true})
	if err != nil {
		t.Fatal(err)
	}
	defer checked.Close()
	unchecked := cpuHandle(t)
	cases := []struct {
		lens, table, clampedLens, clampedTable []int32
		status                                 flashdecode.Status
		needle                                 string
	}{
		{[]int32{100, 101}, nil, []int32{100, 100}, nil, flashdecode.ErrInvalidLength, "seq_lens[1] must be in [0, 100]"},
		{[]int32{-5, 30}, nil, []int32{0, 30}, nil, flashdecode.ErrInvalidLength, "seq_lens[0] must be in [0, 100]"},
		{[]int32{50, 50}, []int32{0, 9}, []int32{50, 50}, []int32{0, 3}, flashdecode.ErrInvalidBlockTable, "block_table[1][0] must be in [0, 4)"},
		{[]int32{50, 50}, []int32{-2, 1}, []int32{50, 50}, []int32{0, 1}, flashdecode.ErrInvalidBlockTable, "block_table[0][0] must be in [0, 4)"},
	}
	for _, c := range cases {
		out, err := decode(checked, c.lens, c.table)
		expectError(t, err, c.status, c.needle)
		for i, x := range out {
			if x != 7 {
				t.Fatalf("%s: out[%d] was written", c.needle, i)
			}
		}
		if err := checked.CheckContents(); err != nil {
			t.Fatalf("the CPU backend reported it from Decode, nothing is left: %v", err)
		}
		if os.Getenv("FLASHDECODE_CHECKS") != "" {
			continue // the environment checks every handle
		}
		got, err := decode(unchecked, c.lens, c.table)
		if err != nil {
			t.Fatalf("%s: unchecked: %v", c.needle, err)
		}
		want, err := decode(unchecked, c.clampedLens, c.clampedTable)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] || math.IsNaN(float64(got[i])) {
				t.Fatalf("%s: element %d is %g, the clamped values give %g", c.needle, i, got[i], want[i])
			}
		}
	}
	if os.Getenv("FLASHDECODE_CHECKS") == "" {
		expectError(t, unchecked.CheckContents(), flashdecode.ErrInvalidArgument, "handle: it checks nothing")
	}
	if err := checked.CheckContentsOnStream(12345); err != nil { // the CPU backend ignores the stream
		t.Fatal(err)
	}
	checked.Close()
	expectError(t, checked.CheckContents(), flashdecode.ErrInvalidHandle, "the handle is closed")
}

// SplitTokens makes a sequence's result bitwise the same alone as in a
// batch, whatever the batch, its capacity, SeqLens and the thread count.
func TestSplitTokensIsBatchInvariant(t *testing.T) {
	needs03(t)
	p := problem{batch: 4, heads: 8, kvHeads: 2, kvLen: 300, dim: 64}
	q, k, v := values(4*8*64, 31), values(4*300*2*64, 32), values(4*300*2*64, 33)
	lens := []int32{300, 129, 0, 77}
	out := make([]float32, len(q))
	lse := make([]float32, 4*8)
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, p.qShape()...), K: flashdecode.Float32(k, p.kvShape()...),
		V: flashdecode.Float32(v, p.kvShape()...), Out: flashdecode.Float32(out, p.qShape()...),
		LSE: flashdecode.Float32(lse, 4, 1, 8), SeqLens: flashdecode.Int32(lens, 4), SplitTokens: 32,
	}
	handle := cpuHandle(t)
	info, err := handle.DescribePlan(&args)
	if err != nil {
		t.Fatal(err)
	}
	if info.SplitTokens < 32 || info.NumSplits != (300+info.SplitTokens-1)/info.SplitTokens {
		t.Fatalf("plan %+v", info)
	}
	if err := handle.Decode(&args); err != nil {
		t.Fatal(err)
	}
	want, _ := p.reference(widen(q), widen(k), widen(v), []int{300, 129, 0, 77}, 1.0/8)
	assertClose(t, widen(out), want, 2e-5)

	one, err := flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCPU, NumThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for b, length := range lens {
		n := int(length)
		k1 := append([]float32(nil), k[b*300*2*64:][:n*2*64]...)
		v1 := append([]float32(nil), v[b*300*2*64:][:n*2*64]...)
		out1, lse1 := make([]float32, 8*64), make([]float32, 8)
		alone := flashdecode.DecodeArgs{
			Q: flashdecode.Float32(q[b*8*64:][:8*64], 1, 1, 8, 64), K: flashdecode.Float32(k1, 1, int64(n), 2, 64),
			V: flashdecode.Float32(v1, 1, int64(n), 2, 64), Out: flashdecode.Float32(out1, 1, 1, 8, 64),
			LSE: flashdecode.Float32(lse1, 1, 1, 8), SplitTokens: 32,
		}
		if err := one.Decode(&alone); err != nil {
			t.Fatal(err)
		}
		for i := range out1 {
			if math.Float32bits(out1[i]) != math.Float32bits(out[b*8*64+i]) {
				t.Fatalf("sequence %d alone: element %d is %g, in the batch %g", b, i, out1[i], out[b*8*64+i])
			}
		}
		for i := range lse1 {
			if math.Float32bits(lse1[i]) != math.Float32bits(lse[b*8+i]) {
				t.Fatalf("sequence %d alone: lse %d is %g, in the batch %g", b, i, lse1[i], lse[b*8+i])
			}
		}
	}

	args.NumSplits = 2
	expectError(t, handle.Decode(&args), flashdecode.ErrInvalidSplits, "split_tokens (32) and num_splits (2) are both set")
	args.NumSplits, args.SplitTokens = 0, -1
	expectError(t, handle.Decode(&args), flashdecode.ErrInvalidSplits, "split_tokens must be in [0, 2147483647]")
}

// Built against a 0.2 header, the 0.3 features fail with ErrUnsupported
// naming the version they need, and everything else works.
func TestWithoutThe03Header(t *testing.T) {
	if flashdecode.HeaderHas03 {
		if flashdecode.HeaderVersionMinor < 3 {
			t.Fatalf("HeaderHas03 with header %d.%d", flashdecode.HeaderVersionMajor, flashdecode.HeaderVersionMinor)
		}
		return // the features themselves are tested above
	}
	needs := func(err error, feature string) {
		t.Helper()
		expectError(t, err, flashdecode.ErrUnsupported, feature+" needs flashdecode 0.3 or later; this package was compiled against flashdecode.h 0.2")
	}
	_, err := flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCPU, CheckContents: true})
	needs(err, "Options.CheckContents")
	handle := cpuHandle(t)
	needs(handle.CheckContents(), "Handle.CheckContents")
	q, k := values(8*64, 1), values(100*2*64, 2)
	out := make([]float32, len(q))
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, 1, 1, 8, 64), K: flashdecode.Float32(k, 1, 100, 2, 64),
		V: flashdecode.Float32(k, 1, 100, 2, 64), Out: flashdecode.Float32(out, 1, 1, 8, 64), SplitTokens: 64,
	}
	needs(handle.Decode(&args), "DecodeArgs.SplitTokens")
	_, err = handle.DescribePlan(&args)
	needs(err, "DecodeArgs.SplitTokens")
	args.SplitTokens = 0
	if err := handle.Decode(&args); err != nil {
		t.Fatal(err)
	}
	// The attention variants, each by its field; several query tokens are 0.2's own refusal.
	slopes := values(8, 3)
	for _, variant := range []struct {
		field string
		set   func(*flashdecode.DecodeArgs)
	}{
		{"DecodeArgs.Mask", func(a *flashdecode.DecodeArgs) { a.Mask = flashdecode.MaskNone }},
		{"DecodeArgs.WindowLeft", func(a *flashdecode.DecodeArgs) { a.WindowLeft = 16 }},
		{"DecodeArgs.LogitSoftcap", func(a *flashdecode.DecodeArgs) { a.LogitSoftcap = 30 }},
		{"DecodeArgs.AlibiSlopes", func(a *flashdecode.DecodeArgs) { a.AlibiSlopes = flashdecode.Float32(slopes, 8) }},
		{"DecodeArgs.Sinks", func(a *flashdecode.DecodeArgs) { a.Sinks = flashdecode.Float32(slopes, 8) }},
		{"DecodeArgs.KScale", func(a *flashdecode.DecodeArgs) {
			a.KScale = flashdecode.ScalePerTensor(slopes[:1], 1, 100, 2, 64)
		}},
		{"DecodeArgs.VScale", func(a *flashdecode.DecodeArgs) { a.VScale = flashdecode.ScalePerHead(slopes[:2], 1, 100, 2, 64) }},
		{"DecodeArgs.QLens", func(a *flashdecode.DecodeArgs) { a.QLens = flashdecode.Int32([]int32{1}, 1) }},
		{"an 8-bit cache", func(a *flashdecode.DecodeArgs) {
			cache := make([]int8, 100*2*64)
			a.K, a.V = flashdecode.Int8(cache, 1, 100, 2, 64), flashdecode.Int8(cache, 1, 100, 2, 64)
		}},
	} {
		with := args
		variant.set(&with)
		needs(handle.Decode(&with), variant.field)
		_, err := handle.WorkspaceSize(&with)
		needs(err, variant.field)
	}
	if flashdecode.MaxQLen != 1 {
		t.Fatalf("MaxQLen %d with a 0.2 header", flashdecode.MaxQLen)
	}
	q4, out4 := values(4*8*64, 4), make([]float32, 4*8*64)
	several := args
	several.Q, several.Out = flashdecode.Float32(q4, 1, 4, 8, 64), flashdecode.Float32(out4, 1, 4, 8, 64)
	expectError(t, handle.Decode(&several), flashdecode.ErrUnsupported, "q_len must be 1")
	lse := make([]float32, 8)
	needs(handle.MergeStates(&flashdecode.MergeArgs{
		States: []flashdecode.MergeState{{Out: flashdecode.Float32(out, 1, 1, 8, 64), LSE: flashdecode.Float32(lse, 1, 1, 8)}},
		Out:    flashdecode.Float32(q, 1, 1, 8, 64),
	}), "Handle.MergeStates")
	needs(handle.MergeStates(&flashdecode.MergeArgs{}), "Handle.MergeStates") // before any argument is read
	needs(handle.AppendKV(&flashdecode.AppendArgs{}), "Handle.AppendKV")
	if !strings.HasPrefix(flashdecode.Version(), "0.2.") {
		t.Fatalf("a 0.2 header with library %s", flashdecode.Version())
	}
}
