// The per-split softmax state and the arithmetic that merges states. All in
// base 2: scores arrive already multiplied by softmax_scale * log2(e) (folded
// into q), so exp2 replaces exp. A state with m = -inf is empty: it has seen
// no key and contributes nothing to a merge.
#pragma once

#include "backend/cuda/element.cuh"

namespace fd {
namespace cuda {

constexpr float kLn2 = 0.6931471805599453f;

__device__ inline float negative_infinity() { return __int_as_float(0xff800000); }

// One thread's share of one query head's online softmax: the running max m,
// the running sum l of exp2(score - m), and kVector elements of the
// unnormalised accumulator sum exp2(score - m) * v.
struct SoftmaxState {
  float m;
  float l;
  float acc[kVector];

  __device__ void reset() {
    m = negative_infinity();
    l = 0.0f;
#pragma unroll
    for (int i = 0; i < kVector; ++i) acc[i] = 0.0f;
  }

  // Makes room for a block of scores whose largest is block_max: rescales l
  // and acc to the new running max. Returns false while nothing finite has
  // been seen (then there is nothing to add).
  __device__ bool rescale(float block_max) {
    const float m_new = fmaxf(m, block_max);
    if (m_new == negative_infinity()) return false;
    const float alpha = exp2f(m - m_new);  // 0 when m was -inf
    l *= alpha;
#pragma unroll
    for (int i = 0; i < kVector; ++i) acc[i] *= alpha;
    m = m_new;
    return true;
  }

  // exp2(score - m): 0 for a masked (-inf) score.
  __device__ float weight(float score) const { return exp2f(score - m); }

  __device__ void add(float p, const float (&v)[kVector]) {
    l += p;
#pragma unroll
    for (int i = 0; i < kVector; ++i) acc[i] = fmaf(p, v[i], acc[i]);
  }
};

// Weight of a partial state with max m_part when states are merged to the
// common max m_max (>= m_part): 0 for an empty state.
__device__ inline float merge_weight(float m_part, float m_max) {
  return m_part == negative_infinity() ? 0.0f : exp2f(m_part - m_max);
}

// Programmatic dependent launch (sm_90 and later; no-ops in code built for
// older architectures, where the host never asks for it). Every kernel of
// this library is launched so that it may be scheduled while the previous
// kernel on the stream finishes, and waits here, before its first memory
// access, until that grid has finished and its writes are visible; each
// then lets the next kernel be scheduled. Without the launch attribute both
// return at once.
__device__ __forceinline__ void grid_dependency_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The first statement of both split kernels. Launched programmatically
// after the previous kernel on the stream (sm_90+), a split kernel waits for
// it to finish, and its writes to be visible, before touching any memory (q
// may be its output; its merge may still read this workspace). Then the
// merge, or the next decode's split kernel, may be scheduled once every CTA
// of this grid has got here; they wait in turn for this grid to finish.
__device__ __forceinline__ void split_kernel_prologue() {
  grid_dependency_wait();
  grid_dependency_launch_dependents();
}

// Natural-log log-sum-exp of a merged state; -inf when it is empty.
__device__ inline float natural_lse(float m, float l) {
  return m == negative_infinity() ? negative_infinity() : (m + log2f(l)) * kLn2;
}

}  // namespace cuda
}  // namespace fd
