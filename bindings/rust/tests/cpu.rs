// SPDX-License-Identifier: Apache-2.0
//! The binding on the CPU backend: numerics against a float64 reference,
//! every error path, workspace control and thread rules. The library comes
//! from `$FLASHDECODE_LIBRARY` (the CTest suite points it at the staged
//! install) or the system.

use flashdecode::{
    Backend, CudaStream, DType, DecodeArgs, Error, Handle, HostWorkspace, Library, Memory, Merge, MergeArgs, Options,
    PlanInfo, Schedule, Status, Tensor, TensorMut,
};

mod common;
use common::{bf16_bits_to_f64, f16_bits_to_f64, f32_to_bf16_bits, f32_to_f16_bits, values, widen};

fn library() -> Library {
    Library::load().expect("load libflashdecode (set FLASHDECODE_LIBRARY)")
}

fn cpu_handle() -> Handle {
    library()
        .create_handle(&Options::cpu().num_threads(2))
        .expect("CPU handle")
}

/// A CPU handle that checks seq_lens and block_table contents.
fn checked_handle() -> Handle {
    library()
        .create_handle(&Options::cpu().num_threads(2).check_contents(true))
        .expect("checked CPU handle")
}

/// Decode attention in f64 over NHD data: q `[b][h][d]`, k/v `[b][n][hk][d]`.
/// Returns out `[b][h][d]` and lse `[b][h]`.
struct Problem {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    kv_len: usize,
    dim: usize,
}

impl Problem {
    fn reference(&self, q: &[f64], k: &[f64], v: &[f64], lens: &[usize], scale: f64) -> (Vec<f64>, Vec<f64>) {
        let Problem {
            batch,
            heads,
            kv_heads,
            kv_len,
            dim,
        } = *self;
        let group = heads / kv_heads;
        let mut out = vec![0.0; batch * heads * dim];
        let mut lse = vec![f64::NEG_INFINITY; batch * heads];
        for b in 0..batch {
            for h in 0..heads {
                let g = h / group;
                let scores: Vec<f64> = (0..lens[b])
                    .map(|j| {
                        let key = &k[((b * kv_len + j) * kv_heads + g) * dim..][..dim];
                        scale
                            * key
                                .iter()
                                .zip(&q[(b * heads + h) * dim..][..dim])
                                .map(|(x, y)| x * y)
                                .sum::<f64>()
                    })
                    .collect();
                if scores.is_empty() {
                    continue;
                }
                let peak = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - peak).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (j, w) in weights.iter().enumerate() {
                    let value = &v[((b * kv_len + j) * kv_heads + g) * dim..][..dim];
                    for d in 0..dim {
                        out[(b * heads + h) * dim + d] += w / total * value[d];
                    }
                }
                lse[b * heads + h] = peak + total.ln();
            }
        }
        (out, lse)
    }

    fn shapes(&self) -> ([i64; 4], [i64; 4]) {
        let Problem {
            batch,
            heads,
            kv_heads,
            kv_len,
            dim,
        } = *self;
        (
            [batch as i64, 1, heads as i64, dim as i64],
            [batch as i64, kv_len as i64, kv_heads as i64, dim as i64],
        )
    }
}

fn assert_close(got: &[f64], expected: &[f64], tolerance: f64) {
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= tolerance * (1.0 + e.abs()),
            "element {}: got {}, expected {}",
            i,
            g,
            e
        );
    }
}

#[test]
fn library_reports_a_compatible_version() {
    let library = library();
    assert_eq!(library.version_number() / 10000, flashdecode::sys::VERSION_MAJOR);
    assert_eq!(library.version().split('.').next(), Some("0"));
    assert!(library.path().exists(), "{}", library.path().display());
    for status in Status::all() {
        let text = unsafe { std::ffi::CStr::from_ptr((library.functions().fd_status_string)(status.code())) };
        assert_eq!(text.to_str().unwrap(), status.summary());
        assert_eq!(Status::from_code(status.code()), Some(status));
    }
}

/// Three GQA sequences of 300, 0 and 17 tokens in a 300-token f32 cache:
/// the problem, q, k, v and the lengths.
fn ragged_gqa() -> (Problem, Vec<f32>, Vec<f32>, Vec<f32>, [i32; 3]) {
    let problem = Problem {
        batch: 3,
        heads: 8,
        kv_heads: 2,
        kv_len: 300,
        dim: 64,
    };
    let q = values(3 * 8 * 64, 1);
    let k = values(3 * 300 * 2 * 64, 2);
    let v = values(3 * 300 * 2 * 64, 3);
    (problem, q, k, v, [300, 0, 17])
}

#[test]
fn f32_gqa_with_ragged_lengths_and_lse() {
    let (problem, q, k, v, lens) = ragged_gqa();
    let (q_shape, kv_shape) = problem.shapes();
    let mut out = vec![f32::NAN; q.len()];
    let mut lse = vec![0f32; 3 * 8];
    let mut handle = cpu_handle();
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &q_shape).unwrap(),
        Tensor::f32(&k, &kv_shape).unwrap(),
        Tensor::f32(&v, &kv_shape).unwrap(),
        TensorMut::f32(&mut out, &q_shape).unwrap(),
    )
    .lse(TensorMut::f32(&mut lse, &[3, 1, 8]).unwrap())
    .seq_lens(Tensor::i32(&lens, &[3]).unwrap())
    .num_splits(5);
    handle.decode(&mut args).unwrap();

    let (expected, expected_lse) = problem.reference(&widen(&q), &widen(&k), &widen(&v), &[300, 0, 17], 1.0 / 8.0);
    assert_close(&widen(&out), &expected, 2e-5);
    assert!(
        out[8 * 64..2 * 8 * 64].iter().all(|&x| x == 0.0),
        "an empty sequence gives zeros"
    );
    assert!(lse[8..16].iter().all(|x| x.is_infinite() && *x < 0.0));
    for (got, want) in lse.iter().zip(&expected_lse) {
        if want.is_finite() {
            assert!((*got as f64 - want).abs() < 1e-4, "lse {} vs {}", got, want);
        }
    }
}

#[test]
fn in_place_decode_overwrites_the_query_with_the_output() {
    let (problem, q, k, v, lens) = ragged_gqa();
    let (q_shape, kv_shape) = problem.shapes();
    let mut q_out = q.clone();
    let mut handle = cpu_handle();
    let mut args = DecodeArgs::in_place(
        TensorMut::f32(&mut q_out, &q_shape).unwrap(),
        Tensor::f32(&k, &kv_shape).unwrap(),
        Tensor::f32(&v, &kv_shape).unwrap(),
    )
    .seq_lens(Tensor::i32(&lens, &[3]).unwrap())
    .num_splits(5);
    handle.decode(&mut args).unwrap();
    drop(args);
    let (expected, _) = problem.reference(&widen(&q), &widen(&k), &widen(&v), &[300, 0, 17], 1.0 / 8.0);
    assert_close(&widen(&q_out), &expected, 2e-5);
}

/// A 16-bit storage type as `half_and_bfloat16_bits` uses it: rounding from
/// f32, widening to f64, its tensor constructors and the error it allows.
struct Format16 {
    encode: fn(f32) -> u16,
    widen: fn(u16) -> f64,
    tensor: for<'a, 'b> fn(&'a [u16], &'b [i64]) -> flashdecode::Result<Tensor<'a>>,
    tensor_mut: for<'a, 'b> fn(&'a mut [u16], &'b [i64]) -> flashdecode::Result<TensorMut<'a>>,
    tolerance: f64,
}

#[test]
fn half_and_bfloat16_bits() {
    let problem = Problem {
        batch: 2,
        heads: 4,
        kv_heads: 4,
        kv_len: 64,
        dim: 32,
    };
    let (q_shape, kv_shape) = problem.shapes();
    let (q, k, v) = (
        values(2 * 4 * 32, 4),
        values(2 * 64 * 4 * 32, 5),
        values(2 * 64 * 4 * 32, 6),
    );
    let lens = [64, 64];
    let mut handle = cpu_handle();
    let formats = [
        Format16 {
            encode: f32_to_f16_bits,
            widen: f16_bits_to_f64,
            tensor: |data, shape| Tensor::f16(data, shape),
            tensor_mut: |data, shape| TensorMut::f16(data, shape),
            tolerance: 2e-3,
        },
        Format16 {
            encode: f32_to_bf16_bits,
            widen: bf16_bits_to_f64,
            tensor: |data, shape| Tensor::bf16(data, shape),
            tensor_mut: |data, shape| TensorMut::bf16(data, shape),
            tolerance: 1.6e-2,
        },
    ];
    for format in &formats {
        let encode = |x: &[f32]| x.iter().map(|&value| (format.encode)(value)).collect::<Vec<u16>>();
        let widen = |x: &[u16]| x.iter().map(|&bits| (format.widen)(bits)).collect::<Vec<f64>>();
        let (q16, k16, v16) = (encode(&q), encode(&k), encode(&v));
        let mut out = vec![0u16; q16.len()];
        let mut args = DecodeArgs::new(
            (format.tensor)(&q16, &q_shape).unwrap(),
            (format.tensor)(&k16, &kv_shape).unwrap(),
            (format.tensor)(&v16, &kv_shape).unwrap(),
            (format.tensor_mut)(&mut out, &q_shape).unwrap(),
        );
        handle.decode(&mut args).unwrap();
        drop(args);
        let (expected, _) = problem.reference(&widen(&q16), &widen(&k16), &widen(&v16), &lens, 1.0 / 32f64.sqrt());
        assert_close(&widen(&out), &expected, format.tolerance);
    }
}

#[test]
fn bhnd_strides_and_paged_cache_agree_with_dense() {
    let problem = Problem {
        batch: 2,
        heads: 4,
        kv_heads: 2,
        kv_len: 48,
        dim: 16,
    };
    let (q_shape, kv_shape) = problem.shapes();
    let q = values(2 * 4 * 16, 7);
    let k = values(2 * 48 * 2 * 16, 8);
    let v = values(2 * 48 * 2 * 16, 9);
    let mut handle = cpu_handle();
    let mut dense = vec![0f32; q.len()];
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &q_shape).unwrap(),
        Tensor::f32(&k, &kv_shape).unwrap(),
        Tensor::f32(&v, &kv_shape).unwrap(),
        TensorMut::f32(&mut dense, &q_shape).unwrap(),
    )
    .softmax_scale(0.5)
    .num_splits(1);
    handle.decode(&mut args).unwrap();
    let (expected, _) = problem.reference(&widen(&q), &widen(&k), &widen(&v), &[48, 48], 0.5);
    assert_close(&widen(&dense), &expected, 2e-5);

    // The same cache stored BHND: [batch][kv_heads][kv_len][dim], described by strides.
    let to_bhnd = |x: &[f32]| {
        let mut y = vec![0f32; x.len()];
        for b in 0..2 {
            for n in 0..48 {
                for h in 0..2 {
                    let from = ((b * 48 + n) * 2 + h) * 16;
                    let to = ((b * 2 + h) * 48 + n) * 16;
                    y[to..to + 16].copy_from_slice(&x[from..from + 16]);
                }
            }
        }
        y
    };
    let (kt, vt) = (to_bhnd(&k), to_bhnd(&v));
    let bhnd = [2 * 48 * 16, 16, 48 * 16, 1];
    let mut strided = vec![0f32; q.len()];
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &q_shape).unwrap(),
        Tensor::f32(&kt, &kv_shape).unwrap().with_strides(&bhnd).unwrap(),
        Tensor::f32(&vt, &kv_shape).unwrap().with_strides(&bhnd).unwrap(),
        TensorMut::f32(&mut strided, &q_shape).unwrap(),
    )
    .softmax_scale(0.5)
    .num_splits(1);
    handle.decode(&mut args).unwrap();
    assert_eq!(
        strided, dense,
        "layout is only strides: the same plan gives the same bits"
    );

    // A paged cache: 6 pages of 16 tokens, sequence 0 on pages [4, 0, 2], sequence 1 on [1, 5, 3].
    let table = [4i32, 0, 2, 1, 5, 3];
    let mut pool_k = vec![0f32; 6 * 16 * 2 * 16];
    let mut pool_v = pool_k.clone();
    let page_elements = 16 * 2 * 16;
    for b in 0..2 {
        for j in 0..3 {
            let page = table[b * 3 + j] as usize;
            let from = (b * 48 + j * 16) * 2 * 16;
            pool_k[page * page_elements..][..page_elements].copy_from_slice(&k[from..from + page_elements]);
            pool_v[page * page_elements..][..page_elements].copy_from_slice(&v[from..from + page_elements]);
        }
    }
    let mut paged = vec![0f32; q.len()];
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &q_shape).unwrap(),
        Tensor::f32(&pool_k, &[6, 16, 2, 16]).unwrap(),
        Tensor::f32(&pool_v, &[6, 16, 2, 16]).unwrap(),
        TensorMut::f32(&mut paged, &q_shape).unwrap(),
    )
    .block_table(Tensor::i32(&table, &[2, 3]).unwrap())
    .softmax_scale(0.5)
    .num_splits(1);
    handle.decode(&mut args).unwrap();
    assert_close(&widen(&paged), &expected, 2e-5);
}

#[test]
fn describe_plan_reports_the_cpu_plan() {
    let (q, k) = (values(8 * 64, 12), values(512 * 2 * 64, 13));
    let mut out = vec![0f32; q.len()];
    let handle = cpu_handle();
    let args = DecodeArgs::new(
        Tensor::f32(&q, &[1, 1, 8, 64]).unwrap(),
        Tensor::f32(&k, &[1, 512, 2, 64]).unwrap(),
        Tensor::f32(&k, &[1, 512, 2, 64]).unwrap(),
        TensorMut::f32(&mut out, &[1, 1, 8, 64]).unwrap(),
    )
    .num_splits(5);
    let info = handle.describe_plan(&args).unwrap();
    assert_eq!(
        info,
        PlanInfo {
            backend: Backend::Cpu,
            num_splits: 5,
            split_tokens: 103,
            workspace_bytes: handle.workspace_size(&args).unwrap(),
            kernel: "cpu".to_string(),
            merge: Merge::Separate,
            launches: 0,
            blocks: 2 * 5,
            schedule: Schedule::Fixed,
        }
    );
}

#[test]
fn workspace_size_reserve_and_own_memory() {
    let (q, k) = (values(8 * 64, 10), values(512 * 2 * 64, 11));
    let mut out = vec![0f32; q.len()];
    let mut handle = cpu_handle();
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &[1, 1, 8, 64]).unwrap(),
        Tensor::f32(&k, &[1, 512, 2, 64]).unwrap(),
        Tensor::f32(&k, &[1, 512, 2, 64]).unwrap(),
        TensorMut::f32(&mut out, &[1, 1, 8, 64]).unwrap(),
    )
    .num_splits(4);
    let bytes = handle.workspace_size(&args).unwrap();
    assert!(bytes >= 8 * 4 * 64 * 4, "{} bytes", bytes);
    handle.reserve_workspace(bytes).unwrap();
    handle.decode(&mut args).unwrap();

    assert!(handle
        .set_host_workspace(HostWorkspace::new(bytes).unwrap())
        .unwrap()
        .is_none());
    handle.decode(&mut args).unwrap();
    let small = HostWorkspace::new(256).unwrap();
    let previous = handle.set_host_workspace(small).unwrap();
    assert_eq!(previous.map(|w| w.len()), Some(bytes));
    let error = handle.decode(&mut args).unwrap_err();
    assert_eq!(error.status(), Some(Status::WorkspaceTooSmall));
    assert!(error.message().contains("the caller's workspace has 256"), "{}", error);
    assert_eq!(handle.use_library_workspace().unwrap().map(|w| w.len()), Some(256));
    handle.decode(&mut args).unwrap();

    let error = handle.reserve_workspace(usize::MAX / 2).unwrap_err();
    assert_eq!(error.status(), Some(Status::OutOfMemory));
}

/// A valid problem: 2 sequences, 8 query heads over 2 KV heads, head_dim 64.
struct Buffers {
    q: Vec<f32>,
    k: Vec<f32>,
    out: Vec<f32>,
}

fn buffers() -> Buffers {
    Buffers {
        q: values(2 * 8 * 64, 12),
        k: values(2 * 100 * 2 * 64, 13),
        out: vec![7.0; 2 * 8 * 64],
    }
}

fn expect_refused(result: Result<(), Error>, status: Status, needle: &str) {
    let error = result.expect_err("the call should fail");
    assert_eq!(error.status(), Some(status), "{}", error);
    assert!(
        error.message().contains(needle),
        "{:?} does not contain {:?}",
        error.message(),
        needle
    );
    assert!(
        error.to_string().starts_with(&format!("{}: ", status.summary())),
        "{}",
        error
    );
}

#[test]
fn library_errors_carry_its_message_and_write_nothing() {
    let mut handle = cpu_handle();
    let mut b = buffers();
    let q_shape = [2, 1, 8, 64];
    let kv_shape = [2, 100, 2, 64];
    let half = vec![0u16; 2 * 100 * 2 * 64];
    let mut long_out = vec![7.0f32; 2 * 65 * 8 * 16];
    let cases: Vec<(&str, Status, &str)> = vec![
        ("splits", Status::InvalidSplits, "num_splits must be in [0, 1024]"),
        ("scale", Status::InvalidArgument, "softmax_scale must be finite"),
        ("heads", Status::InvalidHeadCount, "must be a multiple of kv_heads"),
        (
            "stride",
            Status::InvalidStride,
            "k: stride of head_dim must be 1, got 2",
        ),
        (
            "split_tokens and num_splits",
            Status::InvalidSplits,
            "split_tokens (64) and num_splits (2) are both set",
        ),
        (
            "negative split_tokens",
            Status::InvalidSplits,
            "split_tokens must be in [0, 2147483647]",
        ),
        (
            "query tokens",
            Status::InvalidShape,
            "out: q_len must be 2 (from q), got 1",
        ),
        (
            "too many query tokens",
            Status::InvalidShape,
            "q: q_len must be in [1, 64], got 65",
        ),
        (
            "negative window",
            Status::InvalidArgument,
            "window_left must be positive (0: no window), got -3",
        ),
        (
            "negative softcap",
            Status::InvalidArgument,
            "logit_softcap must be finite and positive (0: none), got -1",
        ),
        (
            "softcap NaN",
            Status::InvalidArgument,
            "logit_softcap must be finite and positive (0: none), got nan",
        ),
        (
            "alibi heads",
            Status::InvalidShape,
            "alibi_slopes: q_heads must be 8 (from q), got 4",
        ),
        ("sinks dtype", Status::InvalidDType, "sinks: dtype must be f32, got f16"),
        (
            "dtypes differ",
            Status::InvalidDType,
            "k: dtype must be f32 (that of q) or an 8-bit cache dtype (e4m3, e5m2, i8), got f16",
        ),
        ("shape", Status::InvalidShape, "v: batch must be 2 (from k)"),
    ];
    for (case, status, needle) in cases {
        let q = Tensor::f32(&b.q, &q_shape).unwrap();
        let k = Tensor::f32(&b.k, &kv_shape).unwrap();
        let out = TensorMut::f32(&mut b.out, &q_shape).unwrap();
        let mut args = match case {
            "splits" => DecodeArgs::new(q, k, k, out).num_splits(2000),
            "scale" => DecodeArgs::new(q, k, k, out).softmax_scale(f64::INFINITY),
            "heads" => {
                let k3 = Tensor::f32(&b.k[..2 * 100 * 3 * 16], &[2, 100, 3, 16]).unwrap();
                let q3 = Tensor::f32(&b.q[..2 * 8 * 16], &[2, 1, 8, 16]).unwrap();
                let out3 = TensorMut::f32(&mut b.out[..2 * 8 * 16], &[2, 1, 8, 16]).unwrap();
                DecodeArgs::new(q3, k3, k3, out3)
            }
            "stride" => {
                let wide = Tensor::f32(&b.k, &[2, 100, 2, 32])
                    .unwrap()
                    .with_strides(&[12800, 128, 64, 2])
                    .unwrap();
                let q32 = Tensor::f32(&b.q[..2 * 8 * 32], &[2, 1, 8, 32]).unwrap();
                let out32 = TensorMut::f32(&mut b.out[..2 * 8 * 32], &[2, 1, 8, 32]).unwrap();
                DecodeArgs::new(q32, wide, wide, out32)
            }
            "split_tokens and num_splits" => DecodeArgs::new(q, k, k, out).split_tokens(64).num_splits(2),
            "negative split_tokens" => DecodeArgs::new(q, k, k, out).split_tokens(-1),
            "query tokens" => {
                let q2 = Tensor::f32(&b.q, &[2, 2, 4, 64]).unwrap();
                let out1 = TensorMut::f32(&mut b.out[..2 * 4 * 64], &[2, 1, 4, 64]).unwrap();
                DecodeArgs::new(q2, k, k, out1)
            }
            "too many query tokens" => {
                let q65 = Tensor::f32(&b.k[..2 * 65 * 8 * 16], &[2, 65, 8, 16]).unwrap();
                let k16 = Tensor::f32(&b.k[..2 * 100 * 2 * 16], &[2, 100, 2, 16]).unwrap();
                DecodeArgs::new(q65, k16, k16, TensorMut::f32(&mut long_out, &[2, 65, 8, 16]).unwrap())
            }
            "negative window" => DecodeArgs::new(q, k, k, out).window_left(-3),
            "negative softcap" => DecodeArgs::new(q, k, k, out).logit_softcap(-1.0),
            "softcap NaN" => DecodeArgs::new(q, k, k, out).logit_softcap(f32::NAN),
            "alibi heads" => DecodeArgs::new(q, k, k, out).alibi_slopes(Tensor::f32(&b.q[..4], &[4]).unwrap()),
            "sinks dtype" => DecodeArgs::new(q, k, k, out).sinks(Tensor::f16(&half[..8], &[8]).unwrap()),
            "dtypes differ" => {
                let k16 = Tensor::f16(&half, &kv_shape).unwrap();
                DecodeArgs::new(q, k16, k16, out)
            }
            "shape" => {
                let v1 = Tensor::f32(&b.k[..100 * 2 * 64], &[1, 100, 2, 64]).unwrap();
                DecodeArgs::new(q, k, v1, out)
            }
            _ => unreachable!(),
        };
        expect_refused(handle.decode(&mut args), status, needle);
        drop(args);
        assert!(b.out.iter().all(|&x| x == 7.0), "{}: the output was written", case);
        assert!(long_out.iter().all(|&x| x == 7.0), "{}: the output was written", case);
    }
}

/// Bad seq_lens and block_table contents: errors from a checking handle,
/// clamped by default (0.3). Each case: lengths, block table (None: dense),
/// the clamped ones, the status and message of a checking handle.
#[test]
fn contents_are_checked_on_request_and_clamped_by_default() {
    type Case<'a> = (
        &'a [i32],
        Option<&'a [i32]>,
        &'a [i32],
        Option<&'a [i32]>,
        Status,
        &'a str,
    );
    let cases: [Case<'_>; 4] = [
        (
            &[100, 101],
            None,
            &[100, 100],
            None,
            Status::InvalidLength,
            "seq_lens[1] must be in [0, 100]",
        ),
        (
            &[-5, 30],
            None,
            &[0, 30],
            None,
            Status::InvalidLength,
            "seq_lens[0] must be in [0, 100]",
        ),
        (
            &[50, 50],
            Some(&[0, 9]),
            &[50, 50],
            Some(&[0, 3]),
            Status::InvalidBlockTable,
            "block_table[1][0] must be in [0, 4)",
        ),
        (
            &[50, 50],
            Some(&[-2, 1]),
            &[50, 50],
            Some(&[0, 1]),
            Status::InvalidBlockTable,
            "block_table[0][0] must be in [0, 4)",
        ),
    ];
    let b = buffers();
    let mut checked = checked_handle();
    let mut unchecked = library().create_handle(&Options::cpu().num_threads(2)).unwrap();
    for (lens, table, clamped_lens, clamped_table, status, needle) in cases {
        let decode = |handle: &mut Handle, lens: &[i32], table: Option<&[i32]>| -> Result<Vec<f32>, Error> {
            let mut out = vec![7.0f32; 2 * 8 * 64];
            let q = Tensor::f32(&b.q, &[2, 1, 8, 64]).unwrap();
            let mut args = match table {
                None => {
                    let k = Tensor::f32(&b.k, &[2, 100, 2, 64]).unwrap();
                    DecodeArgs::new(q, k, k, TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap())
                }
                Some(table) => {
                    let pool = Tensor::f32(&b.k, &[4, 50, 2, 64]).unwrap();
                    DecodeArgs::new(q, pool, pool, TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap())
                        .block_table(Tensor::i32(table, &[2, 1]).unwrap())
                }
            }
            .seq_lens(Tensor::i32(lens, &[2]).unwrap());
            handle.decode(&mut args)?;
            drop(args);
            Ok(out)
        };
        expect_refused(decode(&mut checked, lens, table).map(|_| ()), status, needle);
        checked.check_contents().unwrap(); // the CPU backend reported it from decode: nothing is left
        if std::env::var_os("FLASHDECODE_CHECKS").is_none() {
            let got = decode(&mut unchecked, lens, table).unwrap();
            let want = decode(&mut unchecked, clamped_lens, clamped_table).unwrap();
            assert_eq!(got, want, "{}: clamped", needle);
            assert!(got.iter().all(|x| x.is_finite()));
        }
    }
    if std::env::var_os("FLASHDECODE_CHECKS").is_none() {
        expect_refused(
            unchecked.check_contents(),
            Status::InvalidArgument,
            "handle: it checks nothing",
        );
    }
}

/// split_tokens (0.3): a sequence alone gives bitwise its result in a batch,
/// whatever the batch, its capacity, seq_lens and the thread count.
#[test]
fn split_tokens_makes_results_batch_invariant() {
    let problem = Problem {
        batch: 4,
        heads: 8,
        kv_heads: 2,
        kv_len: 300,
        dim: 64,
    };
    let (q_shape, kv_shape) = problem.shapes();
    let q = values(4 * 8 * 64, 21);
    let k = values(4 * 300 * 2 * 64, 22);
    let v = values(4 * 300 * 2 * 64, 23);
    let lens = [300i32, 129, 0, 77];
    let mut out = vec![0f32; q.len()];
    let mut lse = vec![0f32; 4 * 8];
    let mut handle = cpu_handle();
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &q_shape).unwrap(),
        Tensor::f32(&k, &kv_shape).unwrap(),
        Tensor::f32(&v, &kv_shape).unwrap(),
        TensorMut::f32(&mut out, &q_shape).unwrap(),
    )
    .lse(TensorMut::f32(&mut lse, &[4, 1, 8]).unwrap())
    .seq_lens(Tensor::i32(&lens, &[4]).unwrap())
    .split_tokens(32);
    let info = handle.describe_plan(&args).unwrap();
    assert!(info.split_tokens >= 32, "{:?}", info);
    assert_eq!(
        info.num_splits as i64,
        (300 + info.split_tokens - 1) / info.split_tokens
    );
    handle.decode(&mut args).unwrap();
    drop(args);
    let (expected, _) = problem.reference(&widen(&q), &widen(&k), &widen(&v), &[300, 129, 0, 77], 1.0 / 8.0);
    assert_close(&widen(&out), &expected, 2e-5);

    let mut one = library().create_handle(&Options::cpu().num_threads(1)).unwrap();
    for (b, &len) in lens.iter().enumerate() {
        let len = len as usize;
        // Alone: its own cache of its length (copied out of the batch's), no seq_lens, one thread.
        let row = |x: &[f32]| -> Vec<f32> { x[b * 300 * 2 * 64..][..len * 2 * 64].to_vec() };
        let (k1, v1) = (row(&k), row(&v));
        let mut out1 = vec![0f32; 8 * 64];
        let mut lse1 = vec![0f32; 8];
        let mut args = DecodeArgs::new(
            Tensor::f32(&q[b * 8 * 64..][..8 * 64], &[1, 1, 8, 64]).unwrap(),
            Tensor::f32(&k1, &[1, len as i64, 2, 64]).unwrap(),
            Tensor::f32(&v1, &[1, len as i64, 2, 64]).unwrap(),
            TensorMut::f32(&mut out1, &[1, 1, 8, 64]).unwrap(),
        )
        .lse(TensorMut::f32(&mut lse1, &[1, 1, 8]).unwrap())
        .split_tokens(32);
        one.decode(&mut args).unwrap();
        drop(args);
        assert_eq!(&out1[..], &out[b * 8 * 64..][..8 * 64], "sequence {} alone", b);
        assert_eq!(
            lse1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            lse[b * 8..][..8].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "lse of sequence {} alone",
            b
        );
    }
}

#[test]
fn binding_refuses_before_calling() {
    let mut handle = cpu_handle();
    let b = buffers();

    let error = Tensor::f32(&b.q, &[2, 1, 8, 65]).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidShape));
    assert!(error.message().contains("but the slice has 1024"), "{}", error);
    let error = Tensor::f32(&b.q, &[2, 1, 8, 64])
        .unwrap()
        .with_strides(&[512, 512, 64, 2])
        .unwrap_err();
    assert!(error.message().contains("reaches element"), "{}", error);
    let error = Tensor::f32(&b.q, &[2, 1, 8, 64])
        .unwrap()
        .with_strides(&[512, 512, -64, 1])
        .unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidStride));
    let error = Tensor::f32(&b.q, &[2, 1, 1, 8, 64]).unwrap_err();
    assert!(error.message().contains("5 dimensions"), "{}", error);
    let error = Tensor::f32(&b.q, &[2, -1, 8, 64]).unwrap_err();
    assert!(error.message().contains("negative extent"), "{}", error);

    // Device memory given to a CPU handle is refused before anything reads it.
    let mut out = vec![0f32; 2 * 8 * 64];
    let fake_device = unsafe { Tensor::device(0xdead_0000 as *const _, DType::F32, &[2, 100, 2, 64]).unwrap() };
    assert_eq!(fake_device.memory(), Memory::Device);
    let mut args = DecodeArgs::new(
        Tensor::f32(&b.q, &[2, 1, 8, 64]).unwrap(),
        fake_device,
        fake_device,
        TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap(),
    );
    expect_refused(
        handle.decode(&mut args),
        Status::InvalidArgument,
        "k: is device memory, but the handle runs on the CPU",
    );
    expect_refused(
        handle.decode_on(&mut args, CudaStream::LEGACY_DEFAULT),
        Status::InvalidArgument,
        "is device memory",
    );

    let mut out = vec![0f32; 2 * 8 * 64];
    let k = Tensor::f32(&b.k, &[2, 100, 2, 64]).unwrap();
    let mut args = DecodeArgs::new(
        Tensor::f32(&b.q, &[2, 1, 8, 64]).unwrap(),
        k,
        k,
        TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap(),
    )
    .softmax_scale(0.0);
    expect_refused(handle.decode(&mut args), Status::InvalidArgument, "leave it unset");
}

#[test]
fn options_and_loading_errors() {
    let library = library();
    let error = library.create_handle(&Options::cpu().num_threads(-1)).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidArgument));
    assert!(error.message().contains("num_threads must be >= 0"), "{}", error);
    let error = library.create_handle(&Options::cuda(4096)).unwrap_err();
    assert_eq!(error.status(), Some(Status::NoDevice));
    assert!(error.message().contains("CUDA device 4096"), "{}", error);
    match library.create_handle(&Options::cuda(0)) {
        Ok(handle) => assert_eq!(handle.backend(), Backend::Cuda),
        Err(error) => assert!(
            matches!(error.status(), Some(Status::NoDevice) | Some(Status::Unsupported)),
            "{}",
            error
        ),
    }
    let automatic = library.create_handle(&Options::default()).unwrap();
    assert!(matches!(automatic.backend(), Backend::Cpu | Backend::Cuda));

    let error = Library::open("/nonexistent/libflashdecode.so.0").unwrap_err();
    assert_eq!(error.status(), None);
    assert!(
        error.message().contains("cannot load /nonexistent/libflashdecode.so.0"),
        "{}",
        error
    );
    let error = Library::open("libc.so.6").unwrap_err();
    assert!(
        error.message().contains("does not export fd_version_number"),
        "{}",
        error
    );
}

/// A library of an older minor version lacks later functions; the loader
/// must say its version, not that a function is missing. Built from C stubs
/// with the system compiler (`cc`, which builds the library itself).
#[test]
fn older_minor_version_is_refused_by_its_version() {
    let directory = std::env::temp_dir().join(format!("flashdecode-fake-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let source = directory.join("fake.c");
    std::fs::write(
        &source,
        "unsigned fd_version_number(void) { return 100u; }\n\
         const char *fd_version_string(void) { return \"0.1.0\"; }\n",
    )
    .unwrap();
    let library = directory.join("libflashdecode.so.0");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("cc builds the fake library");
    assert!(built.success(), "cc failed to build the fake library");
    let error = Library::open(&library).unwrap_err();
    let _ = std::fs::remove_dir_all(&directory);
    assert!(
        error
            .message()
            .contains("is version 0.1.0; this crate needs 0.x with x >= 2"),
        "{}",
        error
    );
}

#[test]
fn handles_move_between_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<Handle>();
    assert_send::<Library>();
    let (q, k) = (values(4 * 32, 14), values(64 * 4 * 32, 15));
    let expected = {
        let mut out = vec![0f32; q.len()];
        let tq = Tensor::f32(&q, &[1, 1, 4, 32]).unwrap();
        let tk = Tensor::f32(&k, &[1, 64, 4, 32]).unwrap();
        cpu_handle()
            .decode(&mut DecodeArgs::new(
                tq,
                tk,
                tk,
                TensorMut::f32(&mut out, &[1, 1, 4, 32]).unwrap(),
            ))
            .unwrap();
        out
    };
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let mut handle = cpu_handle();
            let (q, k) = (q.clone(), k.clone());
            std::thread::spawn(move || {
                let mut out = vec![0f32; q.len()];
                let tk = Tensor::f32(&k, &[1, 64, 4, 32]).unwrap();
                let mut args = DecodeArgs::new(
                    Tensor::f32(&q, &[1, 1, 4, 32]).unwrap(),
                    tk,
                    tk,
                    TensorMut::f32(&mut out, &[1, 1, 4, 32]).unwrap(),
                );
                handle.decode(&mut args).unwrap();
                out
            })
        })
        .collect();
    for worker in workers {
        assert_eq!(worker.join().unwrap(), expected);
    }
}

/// The (out, lse) states of `problem`'s NHD cache cut along kv_len at
/// `cuts`: each part a strided view of the whole cache, its lengths the
/// tokens each sequence has in it (none, for some).
fn decode_parts(
    handle: &mut Handle,
    problem: &Problem,
    (q, k, v): (&[f32], &[f32], &[f32]),
    lens: &[i32],
    cuts: &[usize],
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let (q_shape, _) = problem.shapes();
    let (batch, heads, kv_heads, kv_len, dim) = (
        problem.batch,
        problem.heads,
        problem.kv_heads,
        problem.kv_len,
        problem.dim,
    );
    let row = (kv_heads * dim) as i64;
    cuts.windows(2)
        .map(|cut| {
            let (start, stop) = (cut[0], cut[1]);
            let shape = [batch as i64, (stop - start) as i64, kv_heads as i64, dim as i64];
            let strides = [kv_len as i64 * row, row, dim as i64, 1];
            let part_lens: Vec<i32> = lens
                .iter()
                .map(|&len| (len - start as i32).clamp(0, (stop - start) as i32))
                .collect();
            let mut out = vec![0f32; q.len()];
            let mut lse = vec![0f32; batch * heads];
            let mut args = DecodeArgs::new(
                Tensor::f32(q, &q_shape).unwrap(),
                Tensor::f32(&k[start * kv_heads * dim..], &shape)
                    .unwrap()
                    .with_strides(&strides)
                    .unwrap(),
                Tensor::f32(&v[start * kv_heads * dim..], &shape)
                    .unwrap()
                    .with_strides(&strides)
                    .unwrap(),
                TensorMut::f32(&mut out, &q_shape).unwrap(),
            )
            .lse(TensorMut::f32(&mut lse, &[batch as i64, 1, heads as i64]).unwrap())
            .seq_lens(Tensor::i32(&part_lens, &[batch as i64]).unwrap());
            handle.decode(&mut args).unwrap();
            drop(args);
            (out, lse)
        })
        .collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|x| x.to_bits()).collect()
}

/// merge_states (0.3): a cache decoded in parts (some empty for some
/// sequences) and merged is the decode of the whole; in place too; f16
/// states of another dtype than the bf16 output.
#[test]
fn merge_states_of_parts_is_the_whole() {
    let problem = Problem {
        batch: 5,
        heads: 8,
        kv_heads: 2,
        kv_len: 300,
        dim: 64,
    };
    let (q_shape, kv_shape) = problem.shapes();
    let lse_shape = [5, 1, 8];
    let q = values(5 * 8 * 64, 31);
    let k = values(5 * 300 * 2 * 64, 32);
    let v = values(5 * 300 * 2 * 64, 33);
    let lens = [300i32, 0, 1, 150, 299];
    let mut handle = cpu_handle();
    let mut whole = vec![0f32; q.len()];
    let mut whole_lse = vec![0f32; 5 * 8];
    handle
        .decode(
            &mut DecodeArgs::new(
                Tensor::f32(&q, &q_shape).unwrap(),
                Tensor::f32(&k, &kv_shape).unwrap(),
                Tensor::f32(&v, &kv_shape).unwrap(),
                TensorMut::f32(&mut whole, &q_shape).unwrap(),
            )
            .lse(TensorMut::f32(&mut whole_lse, &lse_shape).unwrap())
            .seq_lens(Tensor::i32(&lens, &[5]).unwrap()),
        )
        .unwrap();
    let parts = decode_parts(&mut handle, &problem, (&q, &k, &v), &lens, &[0, 100, 150, 300]);
    let mut out = vec![7f32; q.len()];
    let mut lse = vec![7f32; 5 * 8];
    let mut args = MergeArgs::new(TensorMut::f32(&mut out, &q_shape).unwrap())
        .lse(TensorMut::f32(&mut lse, &lse_shape).unwrap())
        .states(
            parts
                .iter()
                .map(|(o, l)| (Tensor::f32(o, &q_shape).unwrap(), Tensor::f32(l, &lse_shape).unwrap())),
        );
    assert_eq!(args.num_states(), 3);
    handle.merge_states(&mut args).unwrap();
    drop(args);
    assert_close(&widen(&out), &widen(&whole), 2e-5);
    let (expected, expected_lse) =
        problem.reference(&widen(&q), &widen(&k), &widen(&v), &[300, 0, 1, 150, 299], 1.0 / 8.0);
    assert_close(&widen(&out), &expected, 2e-5);
    for (i, (&got, &want)) in lse.iter().zip(&expected_lse).enumerate() {
        assert!(
            (got.is_infinite() && want.is_infinite() && got < 0.0) || (got as f64 - want).abs() < 1e-4,
            "lse[{}]: got {}, expected {}",
            i,
            got,
            want
        );
    }
    assert!(
        out[8 * 64..2 * 8 * 64].iter().all(|&x| x == 0.0),
        "a sequence of no tokens is zeros"
    );

    // In place, into the first part's own buffers: the same bits.
    let (mut first, mut first_lse) = parts[0].clone();
    let mut args = MergeArgs::in_place(
        TensorMut::f32(&mut first, &q_shape).unwrap(),
        TensorMut::f32(&mut first_lse, &lse_shape).unwrap(),
    )
    .state(
        Tensor::f32(&parts[1].0, &q_shape).unwrap(),
        Tensor::f32(&parts[1].1, &lse_shape).unwrap(),
    )
    .state(
        Tensor::f32(&parts[2].0, &q_shape).unwrap(),
        Tensor::f32(&parts[2].1, &lse_shape).unwrap(),
    );
    assert_eq!(args.num_states(), 3);
    handle.merge_states_on(&mut args, CudaStream::LEGACY_DEFAULT).unwrap();
    drop(args);
    assert_eq!(bits(&first), bits(&out));
    assert_eq!(bits(&first_lse), bits(&lse));
    // In place with the merged LSE elsewhere: the first part's LSE is only read.
    let (mut first, first_lse) = parts[0].clone();
    let mut kept_lse = first_lse.clone();
    let mut other_lse = vec![0f32; 5 * 8];
    let mut args = MergeArgs::in_place(
        TensorMut::f32(&mut first, &q_shape).unwrap(),
        TensorMut::f32(&mut kept_lse, &lse_shape).unwrap(),
    )
    .lse(TensorMut::f32(&mut other_lse, &lse_shape).unwrap())
    .states(
        parts[1..]
            .iter()
            .map(|(o, l)| (Tensor::f32(o, &q_shape).unwrap(), Tensor::f32(l, &lse_shape).unwrap())),
    );
    handle.merge_states(&mut args).unwrap();
    drop(args);
    assert_eq!(bits(&first), bits(&out));
    assert_eq!(bits(&other_lse), bits(&lse));
    assert_eq!(bits(&kept_lse), bits(&first_lse));

    // f16 states, of another dtype than the bf16 output (the library converts).
    let halves: Vec<Vec<u16>> = parts
        .iter()
        .map(|(o, _)| o.iter().map(|&x| f32_to_f16_bits(x)).collect())
        .collect();
    let mut merged = vec![0u16; q.len()];
    let mut args = MergeArgs::new(TensorMut::bf16(&mut merged, &q_shape).unwrap()).states(
        halves
            .iter()
            .zip(&parts)
            .map(|(h, (_, l))| (Tensor::f16(h, &q_shape).unwrap(), Tensor::f32(l, &lse_shape).unwrap())),
    );
    handle.merge_states(&mut args).unwrap();
    drop(args);
    let merged: Vec<f64> = merged.iter().map(|&b| bf16_bits_to_f64(b)).collect();
    assert_close(&merged, &expected, 1.6e-2);
}

/// Empty states (LSE -inf) are not read, NaN in them included; a row of
/// empty states is zeros with LSE -inf; a NaN LSE makes its row NaN.
#[test]
fn merge_states_empty_and_nan_rows() {
    let out0: Vec<f32> = (1..=12).map(|x| x as f32).collect();
    let out1 = vec![f32::NAN; 12];
    let lse0 = [0.5f32, f32::NEG_INFINITY, f32::NAN];
    let lse1 = [f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0];
    let (mut out, mut lse) = (vec![7f32; 12], vec![7f32; 3]);
    let mut handle = cpu_handle();
    handle
        .merge_states(
            &mut MergeArgs::new(TensorMut::f32(&mut out, &[1, 1, 3, 4]).unwrap())
                .lse(TensorMut::f32(&mut lse, &[1, 1, 3]).unwrap())
                .state(
                    Tensor::f32(&out0, &[1, 1, 3, 4]).unwrap(),
                    Tensor::f32(&lse0, &[1, 1, 3]).unwrap(),
                )
                .state(
                    Tensor::f32(&out1, &[1, 1, 3, 4]).unwrap(),
                    Tensor::f32(&lse1, &[1, 1, 3]).unwrap(),
                ),
        )
        .unwrap();
    assert_eq!(&out[..4], &out0[..4]);
    assert_eq!(lse[0], 0.5);
    assert!(out[4..8].iter().all(|&x| x == 0.0 && x.is_sign_positive()));
    assert!(lse[1] == f32::NEG_INFINITY);
    assert!(out[8..].iter().all(|x| x.is_nan()) && lse[2].is_nan());
}

#[test]
fn merge_states_errors_name_the_argument_and_write_nothing() {
    let mut handle = cpu_handle();
    let a = values(2 * 8 * 16, 41);
    let b = values(2 * 8 * 16, 42);
    let la = values(2 * 8, 43);
    let half = vec![0u16; 2 * 8];
    let mut out = vec![7f32; 2 * 8 * 16];
    let shape = [2, 1, 8, 16];
    let lse_shape = [2, 1, 8];
    let fake_device = unsafe { Tensor::device(0xdead_0000 as *const _, DType::F32, &shape).unwrap() };
    let cases: Vec<(&str, Status, &str)> = vec![
        (
            "heads",
            Status::InvalidShape,
            "states_out[1]: heads must be 8 (from out), got 4",
        ),
        ("lse dtype", Status::InvalidDType, "states_lse[0]: dtype must be f32"),
        (
            "lse shape",
            Status::InvalidShape,
            "states_lse[1]: batch must be 2 (from out), got 1",
        ),
        ("merged lse dtype", Status::InvalidDType, "lse: dtype must be f32"),
        (
            "no states",
            Status::InvalidArgument,
            "num_states must be in [1, 64], got 0",
        ),
        (
            "65 states",
            Status::InvalidArgument,
            "num_states must be in [1, 64], got 65",
        ),
        (
            "device memory",
            Status::InvalidArgument,
            "states_out[1]: is device memory, but the handle runs on the CPU backend",
        ),
    ];
    fn good(t: &[f32]) -> Tensor<'_> {
        Tensor::f32(t, &[2, 1, 8, 16]).unwrap()
    }
    fn good_lse(t: &[f32]) -> Tensor<'_> {
        Tensor::f32(t, &[2, 1, 8]).unwrap()
    }
    for (case, status, needle) in cases {
        let mut merged_lse = vec![0u16; 2 * 8];
        let args = MergeArgs::new(TensorMut::f32(&mut out, &shape).unwrap());
        let mut args = match case {
            "heads" => args
                .state(good(&a), good_lse(&la))
                .state(Tensor::f32(&b[..2 * 4 * 16], &[2, 1, 4, 16]).unwrap(), good_lse(&la)),
            "lse dtype" => args
                .state(good(&a), Tensor::f16(&half, &lse_shape).unwrap())
                .state(good(&b), good_lse(&la)),
            "lse shape" => args
                .state(good(&a), good_lse(&la))
                .state(good(&b), Tensor::f32(&la[..8], &[1, 1, 8]).unwrap()),
            "merged lse dtype" => args
                .state(good(&a), good_lse(&la))
                .lse(TensorMut::f16(&mut merged_lse, &lse_shape).unwrap()),
            "no states" => args,
            "65 states" => args.states((0..65).map(|_| (good(&a), good_lse(&la)))),
            "device memory" => args.state(good(&a), good_lse(&la)).state(fake_device, good_lse(&la)),
            _ => unreachable!(),
        };
        expect_refused(handle.merge_states(&mut args), status, needle);
        drop(args);
        assert!(out.iter().all(|&x| x == 7.0), "{}: the output was written", case);
    }
}
