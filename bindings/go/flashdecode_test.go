// SPDX-License-Identifier: Apache-2.0

package flashdecode_test

import (
	"errors"
	"math"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	flashdecode "github.com/flashdecode/flashdecode/bindings/go"
)

func cpuHandle(t *testing.T) *flashdecode.Handle {
	t.Helper()
	handle, err := flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCPU, NumThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := handle.Close(); err != nil {
			t.Error(err)
		}
	})
	return handle
}

// values are deterministic numbers in [-1, 1).
// splitDecode: 8 query heads over 2 KV heads, 512 tokens, head_dim 64, in
// f32 from two seeds, with a given split count (a workspace to plan).
func splitDecode(qSeed, kSeed uint64, splits int) (flashdecode.DecodeArgs, []float32) {
	q, k := values(8*64, qSeed), values(512*2*64, kSeed)
	out := make([]float32, len(q))
	return flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, 1, 1, 8, 64), K: flashdecode.Float32(k, 1, 512, 2, 64),
		V: flashdecode.Float32(k, 1, 512, 2, 64), Out: flashdecode.Float32(out, 1, 1, 8, 64), NumSplits: splits,
	}, out
}

func values(count int, seed uint64) []float32 {
	state := seed*6364136223846793005 + 1442695040888963407
	out := make([]float32, count)
	for i := range out {
		state = state*6364136223846793005 + 1442695040888963407
		out[i] = float32(state>>40)/float32(1<<24)*2 - 1
	}
	return out
}

type problem struct{ batch, heads, kvHeads, kvLen, dim int }

func (p problem) qShape() []int64 { return []int64{int64(p.batch), 1, int64(p.heads), int64(p.dim)} }
func (p problem) kvShape() []int64 {
	return []int64{int64(p.batch), int64(p.kvLen), int64(p.kvHeads), int64(p.dim)}
}

// reference computes decode attention in float64 over NHD data; it returns
// out [b][h][d] and lse [b][h].
func (p problem) reference(q, k, v []float64, lens []int, scale float64) ([]float64, []float64) {
	group := p.heads / p.kvHeads
	out := make([]float64, p.batch*p.heads*p.dim)
	lse := make([]float64, p.batch*p.heads)
	for b := 0; b < p.batch; b++ {
		for h := 0; h < p.heads; h++ {
			g := h / group
			lse[b*p.heads+h] = math.Inf(-1)
			if lens[b] == 0 {
				continue
			}
			scores := make([]float64, lens[b])
			peak := math.Inf(-1)
			for j := range scores {
				for d := 0; d < p.dim; d++ {
					scores[j] += q[(b*p.heads+h)*p.dim+d] * k[((b*p.kvLen+j)*p.kvHeads+g)*p.dim+d]
				}
				scores[j] *= scale
				peak = math.Max(peak, scores[j])
			}
			total := 0.0
			for j := range scores {
				scores[j] = math.Exp(scores[j] - peak)
				total += scores[j]
			}
			for j, w := range scores {
				for d := 0; d < p.dim; d++ {
					out[(b*p.heads+h)*p.dim+d] += w / total * v[((b*p.kvLen+j)*p.kvHeads+g)*p.dim+d]
				}
			}
			lse[b*p.heads+h] = peak + math.Log(total)
		}
	}
	return out, lse
}

func widen(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

func assertClose(t *testing.T, got, want []float64, tolerance float64) {
	t.Helper()
	for i := range want {
		if math.Abs(got[i]-want[i]) > tolerance*(1+math.Abs(want[i])) {
			t.Fatalf("element %d: got %g, want %g", i, got[i], want[i])
		}
	}
}

func TestVersion(t *testing.T) {
	if flashdecode.VersionNumber()/10000 != flashdecode.HeaderVersionMajor {
		t.Fatalf("loaded %s, compiled against %d.%d", flashdecode.Version(), flashdecode.HeaderVersionMajor, flashdecode.HeaderVersionMinor)
	}
	if !strings.HasPrefix(flashdecode.Version(), "0.") {
		t.Fatalf("version %q", flashdecode.Version())
	}
}

func TestGroupedQueryRaggedWithLSE(t *testing.T) {
	p := problem{batch: 3, heads: 8, kvHeads: 2, kvLen: 300, dim: 64}
	q, k, v := values(3*8*64, 1), values(3*300*2*64, 2), values(3*300*2*64, 3)
	lens := []int32{300, 0, 17}
	out := make([]float32, len(q))
	lse := make([]float32, 3*8)
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, p.qShape()...), K: flashdecode.Float32(k, p.kvShape()...),
		V: flashdecode.Float32(v, p.kvShape()...), Out: flashdecode.Float32(out, p.qShape()...),
		LSE: flashdecode.Float32(lse, 3, 1, 8), SeqLens: flashdecode.Int32(lens, 3), NumSplits: 5,
	}
	if err := cpuHandle(t).Decode(&args); err != nil {
		t.Fatal(err)
	}
	wantOut, wantLSE := p.reference(widen(q), widen(k), widen(v), []int{300, 0, 17}, 1.0/8)
	assertClose(t, widen(out), wantOut, 2e-5)
	for i, want := range wantLSE {
		if math.IsInf(want, -1) != math.IsInf(float64(lse[i]), -1) ||
			(!math.IsInf(want, -1) && math.Abs(float64(lse[i])-want) > 1e-4) {
			t.Fatalf("lse[%d] = %g, want %g", i, lse[i], want)
		}
	}
}

func toFloat16(x float32) uint16 {
	bits := math.Float32bits(x)
	sign := uint16(bits>>16) & 0x8000
	exponent := int(bits>>23&0xff) - 127 + 15
	if x == 0 || exponent <= 0 {
		return sign
	}
	mantissa := bits & 0x7fffff
	half := uint32(exponent)<<10 | mantissa>>13
	if rest := mantissa & 0x1fff; rest > 0x1000 || (rest == 0x1000 && half&1 == 1) {
		half++
	}
	return sign | uint16(half)
}

func fromFloat16(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exponent, mantissa := int(h>>10&0x1f), float64(h&0x3ff)
	if exponent == 0 {
		return sign * mantissa * math.Pow(2, -24)
	}
	return sign * (1 + mantissa/1024) * math.Pow(2, float64(exponent-15))
}

func toBFloat16(x float32) uint16 {
	bits := math.Float32bits(x)
	return uint16((bits + 0x7fff + (bits>>16)&1) >> 16)
}

func fromBFloat16(b uint16) float64 { return float64(math.Float32frombits(uint32(b) << 16)) }

func TestHalfAndBFloat16Bits(t *testing.T) {
	p := problem{batch: 2, heads: 4, kvHeads: 4, kvLen: 64, dim: 32}
	q, k, v := values(2*4*32, 4), values(2*64*4*32, 5), values(2*64*4*32, 6)
	handle := cpuHandle(t)
	for _, kind := range []struct {
		name      string
		encode    func(float32) uint16
		decode    func(uint16) float64
		tensor    func([]uint16, ...int64) flashdecode.Tensor
		tolerance float64
	}{
		{"f16", toFloat16, fromFloat16, flashdecode.Float16, 2e-3},
		{"bf16", toBFloat16, fromBFloat16, flashdecode.BFloat16, 1.6e-2},
	} {
		encode := func(x []float32) ([]uint16, []float64) {
			bits, wide := make([]uint16, len(x)), make([]float64, len(x))
			for i := range x {
				bits[i] = kind.encode(x[i])
				wide[i] = kind.decode(bits[i])
			}
			return bits, wide
		}
		qb, qw := encode(q)
		kb, kw := encode(k)
		vb, vw := encode(v)
		out := make([]uint16, len(qb))
		args := flashdecode.DecodeArgs{
			Q: kind.tensor(qb, p.qShape()...), K: kind.tensor(kb, p.kvShape()...),
			V: kind.tensor(vb, p.kvShape()...), Out: kind.tensor(out, p.qShape()...),
		}
		if err := handle.Decode(&args); err != nil {
			t.Fatal(kind.name, err)
		}
		want, _ := p.reference(qw, kw, vw, []int{64, 64}, 1/math.Sqrt(32))
		got := make([]float64, len(out))
		for i, bits := range out {
			got[i] = kind.decode(bits)
		}
		assertClose(t, got, want, kind.tolerance)
	}
}

func TestStridesAndPagedCacheAgreeWithDense(t *testing.T) {
	p := problem{batch: 2, heads: 4, kvHeads: 2, kvLen: 48, dim: 16}
	q, k, v := values(2*4*16, 7), values(2*48*2*16, 8), values(2*48*2*16, 9)
	handle := cpuHandle(t)
	decode := func(args flashdecode.DecodeArgs) []float32 {
		out := make([]float32, len(q))
		args.Q, args.Out = flashdecode.Float32(q, p.qShape()...), flashdecode.Float32(out, p.qShape()...)
		args.SoftmaxScale, args.NumSplits = 0.5, 1
		if err := handle.Decode(&args); err != nil {
			t.Fatal(err)
		}
		return out
	}
	dense := decode(flashdecode.DecodeArgs{K: flashdecode.Float32(k, p.kvShape()...), V: flashdecode.Float32(v, p.kvShape()...)})
	want, _ := p.reference(widen(q), widen(k), widen(v), []int{48, 48}, 0.5)
	assertClose(t, widen(dense), want, 2e-5)

	// The same cache stored BHND, [batch][kv_heads][kv_len][dim], described by strides.
	toBHND := func(x []float32) []float32 {
		y := make([]float32, len(x))
		for b := 0; b < 2; b++ {
			for n := 0; n < 48; n++ {
				for h := 0; h < 2; h++ {
					copy(y[((b*2+h)*48+n)*16:][:16], x[((b*48+n)*2+h)*16:][:16])
				}
			}
		}
		return y
	}
	bhnd := []int64{2 * 48 * 16, 16, 48 * 16, 1}
	strided := decode(flashdecode.DecodeArgs{
		K: flashdecode.Float32(toBHND(k), p.kvShape()...).WithStrides(bhnd...),
		V: flashdecode.Float32(toBHND(v), p.kvShape()...).WithStrides(bhnd...),
	})
	for i := range dense {
		if strided[i] != dense[i] {
			t.Fatalf("strided[%d] = %g, dense %g: the same plan must give the same bits", i, strided[i], dense[i])
		}
	}

	// A paged cache: pages of 16 tokens; sequence 0 on pages 4, 0, 2, sequence 1 on 1, 5, 3.
	table := []int32{4, 0, 2, 1, 5, 3}
	pageElements := 16 * 2 * 16
	poolK, poolV := make([]float32, 6*pageElements), make([]float32, 6*pageElements)
	for b := 0; b < 2; b++ {
		for j := 0; j < 3; j++ {
			page, from := int(table[b*3+j]), (b*48+j*16)*2*16
			copy(poolK[page*pageElements:][:pageElements], k[from:])
			copy(poolV[page*pageElements:][:pageElements], v[from:])
		}
	}
	paged := decode(flashdecode.DecodeArgs{
		K: flashdecode.Float32(poolK, 6, 16, 2, 16), V: flashdecode.Float32(poolV, 6, 16, 2, 16),
		BlockTable: flashdecode.Int32(table, 2, 3),
	})
	assertClose(t, widen(paged), want, 2e-5)
}

func TestWorkspace(t *testing.T) {
	args, _ := splitDecode(10, 11, 4)
	handle := cpuHandle(t)
	bytes, err := handle.WorkspaceSize(&args)
	if err != nil || bytes < 8*4*64*4 {
		t.Fatalf("workspace size %d, %v", bytes, err)
	}
	if err := handle.ReserveWorkspace(bytes); err != nil {
		t.Fatal(err)
	}
	if err := handle.Decode(&args); err != nil {
		t.Fatal(err)
	}
	// Caller-owned memory must not be Go's: mmap gives page-aligned memory outside the Go heap.
	memory, err := syscall.Mmap(-1, 0, bytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(memory)
	address := uintptr(unsafe.Pointer(&memory[0]))
	if err := handle.SetWorkspace(address, bytes); err != nil {
		t.Fatal(err)
	}
	if err := handle.Decode(&args); err != nil {
		t.Fatal(err)
	}
	expectError(t, handle.SetWorkspace(address+8, 256), flashdecode.ErrInvalidArgument, "not aligned to 256 bytes")
	if err := handle.SetWorkspace(address, 256); err != nil {
		t.Fatal(err)
	}
	expectError(t, handle.Decode(&args), flashdecode.ErrWorkspaceTooSmall, "the caller's workspace has 256")
	if err := handle.SetWorkspace(0, 0); err != nil { // library-owned again, before the memory goes
		t.Fatal(err)
	}
	if err := handle.Decode(&args); err != nil {
		t.Fatal(err)
	}
	expectError(t, handle.ReserveWorkspace(math.MaxInt64/2), flashdecode.ErrOutOfMemory, "")
	expectError(t, handle.ReserveWorkspace(-1), flashdecode.ErrInvalidArgument, "-1 bytes")
}

// A HostWorkspace gives the bits of the library-owned workspace (same
// backend, same plan); too small, it fails as other caller memory does.
func TestHostWorkspace(t *testing.T) {
	args, out := splitDecode(16, 17, 4)
	handle := cpuHandle(t)
	decode := func(what string) {
		t.Helper()
		for i := range out {
			out[i] = 7
		}
		if err := handle.Decode(&args); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	decode("library-owned")
	want := append([]float32(nil), out...)
	same := func(what string) {
		t.Helper()
		for i := range want {
			if math.Float32bits(out[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d is %g, with the library-owned workspace %g", what, i, out[i], want[i])
			}
		}
	}
	bytes, err := handle.WorkspaceSize(&args)
	if err != nil || bytes < 8*4*64*4 {
		t.Fatalf("workspace size %d, %v", bytes, err)
	}
	workspace, err := flashdecode.NewHostWorkspace(bytes)
	if err != nil {
		t.Fatal(err)
	}
	defer workspace.Free()
	if workspace.Len() != bytes {
		t.Fatalf("Len %d, asked for %d", workspace.Len(), bytes)
	}
	if err := handle.SetHostWorkspace(workspace); err != nil {
		t.Fatal(err)
	}
	decode("HostWorkspace")
	same("HostWorkspace")

	small, err := flashdecode.NewHostWorkspace(256)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Free()
	if err := handle.SetHostWorkspace(small); err != nil {
		t.Fatal(err)
	}
	expectError(t, handle.Decode(&args), flashdecode.ErrWorkspaceTooSmall, "bytes needed, the caller's workspace has 256")
	if err := handle.UseLibraryWorkspace(); err != nil {
		t.Fatal(err)
	}
	decode("library-owned again")
	same("library-owned again")
}

// A HostWorkspace is one handle's at a time; Free is idempotent and, while
// a handle uses the memory, leaves it to the handle until it lets go.
func TestHostWorkspaceLifetime(t *testing.T) {
	_, err := flashdecode.NewHostWorkspace(-1)
	expectError(t, err, flashdecode.ErrInvalidArgument, "workspace: bytes must be >= 0, got -1")
	_, err = flashdecode.NewHostWorkspace(math.MaxInt64)
	expectError(t, err, flashdecode.ErrOutOfMemory, "workspace: cannot allocate")

	empty, err := flashdecode.NewHostWorkspace(0) // not NULL, which would mean library-owned
	if err != nil {
		t.Fatal(err)
	}
	first, second := cpuHandle(t), cpuHandle(t)
	if err := first.SetHostWorkspace(empty); err != nil {
		t.Fatal(err)
	}
	q, k := values(4*32, 18), values(64*4*32, 19)
	out := make([]float32, len(q))
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(q, 1, 1, 4, 32), K: flashdecode.Float32(k, 1, 64, 4, 32),
		V: flashdecode.Float32(k, 1, 64, 4, 32), Out: flashdecode.Float32(out, 1, 1, 4, 32), NumSplits: 3,
	}
	expectError(t, first.Decode(&args), flashdecode.ErrWorkspaceTooSmall, "the caller's workspace has 0")
	empty.Free()
	empty.Free()
	expectError(t, first.SetHostWorkspace(empty), flashdecode.ErrInvalidArgument, "the HostWorkspace was freed")
	expectError(t, second.SetHostWorkspace(empty), flashdecode.ErrInvalidArgument, "the HostWorkspace was freed")

	workspace, err := flashdecode.NewHostWorkspace(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer workspace.Free()
	if err := first.SetHostWorkspace(workspace); err != nil { // lets go of empty: freed now
		t.Fatal(err)
	}
	if err := first.SetHostWorkspace(workspace); err != nil { // again: still first's
		t.Fatal(err)
	}
	expectError(t, second.SetHostWorkspace(workspace), flashdecode.ErrInvalidArgument, "another handle's workspace")
	if err := first.Decode(&args); err != nil {
		t.Fatal(err)
	}
	want := append([]float32(nil), out...)
	if err := first.UseLibraryWorkspace(); err != nil {
		t.Fatal(err)
	}
	if err := second.SetHostWorkspace(workspace); err != nil {
		t.Fatalf("after the first handle let go: %v", err)
	}
	workspace.Free() // in use: second keeps it until it lets go
	for i := range out {
		out[i] = 7
	}
	if err := second.Decode(&args); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(out[i]) != math.Float32bits(want[i]) {
			t.Fatalf("after Free: element %d is %g, not %g", i, out[i], want[i])
		}
	}
	expectError(t, first.SetHostWorkspace(workspace), flashdecode.ErrInvalidArgument, "the HostWorkspace was freed")
	if err := second.Close(); err != nil { // lets go: the memory is freed
		t.Fatal(err)
	}
	workspace.Free()
	expectError(t, second.SetHostWorkspace(workspace), flashdecode.ErrInvalidHandle, "the handle is closed")
	kept, err := flashdecode.NewHostWorkspace(256)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Free() // before the cleanup closes first: left to first until then
	third := cpuHandle(t)
	if err := third.SetHostWorkspace(kept); err != nil {
		t.Fatal(err)
	}
	if err := third.Close(); err != nil {
		t.Fatal(err)
	}
	if err := first.SetHostWorkspace(kept); err != nil {
		t.Fatalf("after closing the handle that used it: %v", err)
	}
	expectError(t, first.SetHostWorkspace(nil), flashdecode.ErrNullPointer, "nil *HostWorkspace")

	if handle, err := flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCUDA}); err == nil {
		defer handle.Close()
		fresh, err := flashdecode.NewHostWorkspace(256)
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Free()
		expectError(t, handle.SetHostWorkspace(fresh), flashdecode.ErrInvalidArgument, "runs on the cuda backend")
	}
}

func expectError(t *testing.T, err error, status flashdecode.Status, needle string) {
	t.Helper()
	var failure *flashdecode.Error
	if !errors.As(err, &failure) {
		t.Fatalf("want a %v error, got %v", status, err)
	}
	if !errors.Is(err, status) || failure.Status != status {
		t.Fatalf("want status %v, got %v: %v", status, failure.Status, err)
	}
	if !strings.Contains(failure.Message, needle) || !strings.HasPrefix(err.Error(), status.Error()+": ") {
		t.Fatalf("message %q lacks %q or the %q prefix", failure.Message, needle, status.Error())
	}
}

func TestDescribePlan(t *testing.T) {
	args, _ := splitDecode(12, 13, 5)
	handle := cpuHandle(t)
	info, err := handle.DescribePlan(&args)
	if err != nil {
		t.Fatal(err)
	}
	bytes, err := handle.WorkspaceSize(&args)
	if err != nil {
		t.Fatal(err)
	}
	want := flashdecode.PlanInfo{Backend: flashdecode.BackendCPU, NumSplits: 5, SplitTokens: 103, WorkspaceBytes: bytes,
		Kernel: "cpu", Merge: flashdecode.MergeSeparate, Launches: 0, Blocks: 2 * 5,
		Schedule: flashdecode.ScheduleFixed}
	if info != want {
		t.Fatalf("plan %+v, want %+v", info, want)
	}
	if info.Merge.String() != "separate" {
		t.Fatalf("merge %q", info.Merge.String())
	}
	if info.Schedule.String() != "fixed" || flashdecode.Schedule(9).String() != "Schedule(9)" {
		t.Fatalf("schedule %q", info.Schedule.String())
	}
	args.NumSplits = -1
	_, err = handle.DescribePlan(&args)
	expectError(t, err, flashdecode.ErrInvalidSplits, "num_splits")
}

func TestErrorsCarryTheMessageAndWriteNothing(t *testing.T) {
	handle := cpuHandle(t)
	q, k := values(2*8*64, 12), values(2*100*2*64, 13)
	half := make([]uint16, len(k))
	out, longOut := make([]float32, len(q)), make([]float32, 2*65*8*16)
	for i := range out {
		out[i] = 7
	}
	for i := range longOut {
		longOut[i] = 7
	}
	valid := func() flashdecode.DecodeArgs {
		return flashdecode.DecodeArgs{
			Q: flashdecode.Float32(q, 2, 1, 8, 64), K: flashdecode.Float32(k, 2, 100, 2, 64),
			V: flashdecode.Float32(k, 2, 100, 2, 64), Out: flashdecode.Float32(out, 2, 1, 8, 64),
		}
	}
	cases := []struct {
		name   string
		change func(*flashdecode.DecodeArgs)
		status flashdecode.Status
		needle string
	}{
		{"splits", func(a *flashdecode.DecodeArgs) { a.NumSplits = 2000 }, flashdecode.ErrInvalidSplits, "num_splits must be in [0, 1024]"},
		{"scale", func(a *flashdecode.DecodeArgs) { a.SoftmaxScale = math.Inf(1) }, flashdecode.ErrInvalidArgument, "softmax_scale must be finite"},
		{"dtype", func(a *flashdecode.DecodeArgs) { a.K = flashdecode.Float16(half, 2, 100, 2, 64) }, flashdecode.ErrInvalidDType, "k: dtype must be f32"},
		{"heads", func(a *flashdecode.DecodeArgs) {
			a.Q, a.Out = flashdecode.Float32(q, 2, 1, 8, 16), flashdecode.Float32(out, 2, 1, 8, 16)
			a.K, a.V = flashdecode.Float32(k, 2, 100, 3, 16), flashdecode.Float32(k, 2, 100, 3, 16)
		}, flashdecode.ErrInvalidHeadCount, "must be a multiple of kv_heads"},
		{"stride", func(a *flashdecode.DecodeArgs) {
			a.K = flashdecode.Float32(k, 2, 100, 2, 32).WithStrides(12800, 128, 64, 2)
		}, flashdecode.ErrInvalidStride, "k: stride of head_dim must be 1, got 2"},
		{"shape", func(a *flashdecode.DecodeArgs) { a.V = flashdecode.Float32(k, 1, 100, 2, 64) }, flashdecode.ErrInvalidShape, "v: batch must be 2 (from k)"},
		{"query tokens (0.3)", func(a *flashdecode.DecodeArgs) {
			a.Q = flashdecode.Float32(q, 2, 2, 4, 64)
		}, flashdecode.ErrInvalidShape, "out: q_len must be 2 (from q), got 1"},
		{"too many query tokens (0.3)", func(a *flashdecode.DecodeArgs) {
			a.Q, a.Out = flashdecode.Float32(k, 2, 65, 8, 16), flashdecode.Float32(longOut, 2, 65, 8, 16)
			a.K, a.V = flashdecode.Float32(k, 2, 100, 2, 16), flashdecode.Float32(k, 2, 100, 2, 16)
		}, flashdecode.ErrInvalidShape, "q: q_len must be in [1, 64], got 65"},
		{"negative window (0.3)", func(a *flashdecode.DecodeArgs) { a.WindowLeft = -3 }, flashdecode.ErrInvalidArgument, "window_left must be positive (0: no window), got -3"},
		{"negative softcap (0.3)", func(a *flashdecode.DecodeArgs) { a.LogitSoftcap = -1 }, flashdecode.ErrInvalidArgument, "logit_softcap must be finite and positive (0: none), got -1"},
		{"softcap NaN (0.3)", func(a *flashdecode.DecodeArgs) { a.LogitSoftcap = float32(math.NaN()) }, flashdecode.ErrInvalidArgument, "logit_softcap must be finite and positive (0: none), got nan"},
		{"mask (0.3)", func(a *flashdecode.DecodeArgs) { a.Mask = 2 }, flashdecode.ErrInvalidArgument, "mask must be FD_MASK_CAUSAL (0) or FD_MASK_NONE (1), got 2"},
		{"alibi heads (0.3)", func(a *flashdecode.DecodeArgs) { a.AlibiSlopes = flashdecode.Float32(q, 4) }, flashdecode.ErrInvalidShape, "alibi_slopes: q_heads must be 8 (from q), got 4"},
		{"sinks dtype (0.3)", func(a *flashdecode.DecodeArgs) { a.Sinks = flashdecode.Float16(half, 8) }, flashdecode.ErrInvalidDType, "sinks: dtype must be f32, got f16"},
		// Refused by the binding before any call:
		{"slice too short", func(a *flashdecode.DecodeArgs) { a.Q = flashdecode.Float32(q[:100], 2, 1, 8, 64) }, flashdecode.ErrInvalidShape, "q: shape [2 1 8 64] with strides [512 512 64 1] reaches element 1023, but the slice has 100"},
		{"negative stride", func(a *flashdecode.DecodeArgs) { a.K = a.K.WithStrides(12800, 128, -64, 1) }, flashdecode.ErrInvalidStride, "k: strides [12800 128 -64 1] have a negative stride"},
		{"rank", func(a *flashdecode.DecodeArgs) { a.Q = flashdecode.Float32(q, 1, 2, 1, 8, 64) }, flashdecode.ErrInvalidShape, "q: 5 dimensions"},
		{"strides count", func(a *flashdecode.DecodeArgs) { a.Q = a.Q.WithStrides(1, 1) }, flashdecode.ErrInvalidStride, "q: 2 strides for 4 dimensions"},
		{"extent sum overflow", func(a *flashdecode.DecodeArgs) {
			a.Q = flashdecode.Float32(q, 3, 3, 3, 4).WithStrides((1<<62)/3, (1<<62)/3, (1<<62)/3, 1)
		}, flashdecode.ErrInvalidStride, "q: shape [3 3 3 4] with strides"},
		{"device memory", func(a *flashdecode.DecodeArgs) {
			a.V = flashdecode.Device(0xdead0000, flashdecode.Float32Type, 2, 100, 2, 64)
		}, flashdecode.ErrInvalidArgument, "v: is device memory, but the handle runs on the CPU backend"},
		{"splits range", func(a *flashdecode.DecodeArgs) { a.NumSplits = 1 << 40 }, flashdecode.ErrInvalidSplits, "does not fit in 32 bits"},
		{"device address 0", func(a *flashdecode.DecodeArgs) {
			a.V = flashdecode.Device(0, flashdecode.Float32Type, 2, 100, 2, 64)
		}, flashdecode.ErrInvalidArgument, "v: is device memory, but the handle runs on the CPU backend"},
		{"device sinks (0.3)", func(a *flashdecode.DecodeArgs) {
			a.Sinks = flashdecode.Device(0xdead0000, flashdecode.Float32Type, 8)
		}, flashdecode.ErrInvalidArgument, "sinks: is device memory, but the handle runs on the CPU backend"},
		{"slopes slice too short (0.3)", func(a *flashdecode.DecodeArgs) { a.AlibiSlopes = flashdecode.Float32(q[:7], 8) }, flashdecode.ErrInvalidShape, "alibi_slopes: shape [8] with strides [1] reaches element 7, but the slice has 7"},
	}
	for _, c := range cases {
		if strings.HasSuffix(c.name, " (0.3)") && !flashdecode.HeaderHas03 {
			continue // a 0.2 header: TestWithoutThe03Header checks these fail with ErrUnsupported
		}
		args := valid()
		c.change(&args)
		expectError(t, handle.Decode(&args), c.status, c.needle)
		for i, x := range out {
			if x != 7 {
				t.Fatalf("%s: out[%d] was written", c.name, i)
			}
		}
		for i, x := range longOut {
			if x != 7 {
				t.Fatalf("%s: longOut[%d] was written", c.name, i)
			}
		}
	}
}

// A batch of 0 is a no-op for the library; empty slices have no first
// element, and must not reach it as NULL pointers.
func TestEmptyBatchIsANoOp(t *testing.T) {
	handle := cpuHandle(t)
	args := flashdecode.DecodeArgs{
		Q: flashdecode.Float32(nil, 0, 1, 8, 64), K: flashdecode.Float32([]float32{}, 0, 100, 2, 64),
		V: flashdecode.Float32(nil, 0, 100, 2, 64), Out: flashdecode.Float32(nil, 0, 1, 8, 64),
		SeqLens: flashdecode.Int32(nil, 0),
	}
	if err := handle.Decode(&args); err != nil {
		t.Fatalf("batch 0: %v", err)
	}
}

func TestOptionsAndLifetime(t *testing.T) {
	_, err := flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCPU, NumThreads: -1})
	expectError(t, err, flashdecode.ErrInvalidArgument, "num_threads must be >= 0")
	_, err = flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCUDA, Device: 4096})
	expectError(t, err, flashdecode.ErrNoDevice, "CUDA device 4096")
	if handle, err := flashdecode.New(flashdecode.Options{Backend: flashdecode.BackendCUDA}); err == nil {
		handle.Close()
	} else if !errors.Is(err, flashdecode.ErrNoDevice) && !errors.Is(err, flashdecode.ErrUnsupported) {
		t.Fatal(err)
	}

	handle, err := flashdecode.New(flashdecode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if b := handle.Backend(); b != flashdecode.BackendCPU && b != flashdecode.BackendCUDA {
		t.Fatalf("auto resolved to %v", b)
	}
	if err := handle.Close(); err != nil {
		t.Fatal(err)
	}
	if err := handle.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	expectError(t, handle.ReserveWorkspace(0), flashdecode.ErrInvalidHandle, "the handle is closed")
	expectError(t, handle.Decode(&flashdecode.DecodeArgs{}), flashdecode.ErrInvalidHandle, "the handle is closed")
}

func TestOneHandleSharedByGoroutines(t *testing.T) {
	handle := cpuHandle(t)
	q, k := values(4*32, 14), values(64*4*32, 15)
	decode := func() []float32 {
		out := make([]float32, len(q))
		args := flashdecode.DecodeArgs{
			Q: flashdecode.Float32(q, 1, 1, 4, 32), K: flashdecode.Float32(k, 1, 64, 4, 32),
			V: flashdecode.Float32(k, 1, 64, 4, 32), Out: flashdecode.Float32(out, 1, 1, 4, 32), NumSplits: 3,
		}
		if err := handle.Decode(&args); err != nil {
			t.Error(err)
		}
		return out
	}
	want := decode()
	var group sync.WaitGroup
	for worker := 0; worker < 4; worker++ {
		group.Add(1)
		go func() {
			defer group.Done()
			for i := 0; i < 10; i++ {
				got := decode()
				for j := range want {
					if got[j] != want[j] {
						t.Errorf("element %d differs between goroutines", j)
						return
					}
				}
			}
		}()
	}
	group.Wait()
}
