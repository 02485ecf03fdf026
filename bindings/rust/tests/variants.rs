// SPDX-License-Identifier: Apache-2.0
//! The attention variants of 0.3 on the CPU backend: several query tokens
//! per sequence, causal or not, ragged query lengths, sliding windows, logit
//! softcaps, ALiBi and attention sinks, alone and together, with GQA, ragged lengths, paged
//! caches and every dtype, against a float64 reference written here from the
//! header's definition ("Attention variants" in flashdecode.h).

use flashdecode::{AttentionMask, DType, DecodeArgs, Handle, Library, Options, Status, Tensor, TensorMut};

mod common;
use common::{bf16_bits_to_f64, f16_bits_to_f64, f32_to_bf16_bits, f32_to_f16_bits, values, widen};

fn cpu_handle() -> Handle {
    Library::load()
        .expect("load libflashdecode (set FLASHDECODE_LIBRARY)")
        .create_handle(&Options::cpu().num_threads(2))
        .expect("CPU handle")
}

/// The variants as the reference takes them (None: not set).
#[derive(Clone, Default)]
struct Variants {
    full: bool, // AttentionMask::None
    window_left: Option<i64>,
    logit_softcap: Option<f32>,
    alibi_slopes: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
    scale: Option<f64>,
    q_lens: Option<Vec<i32>>,
}

impl Variants {
    /// `args` with these variants set.
    fn apply<'a>(&'a self, mut args: DecodeArgs<'a>) -> DecodeArgs<'a> {
        if self.full {
            args = args.mask(AttentionMask::None);
        }
        if let Some(window) = self.window_left {
            args = args.window_left(window);
        }
        if let Some(cap) = self.logit_softcap {
            args = args.logit_softcap(cap);
        }
        if let Some(slopes) = &self.alibi_slopes {
            args = args.alibi_slopes(Tensor::f32(slopes, &[slopes.len() as i64]).unwrap());
        }
        if let Some(sinks) = &self.sinks {
            args = args.sinks(Tensor::f32(sinks, &[sinks.len() as i64]).unwrap());
        }
        if let Some(scale) = self.scale {
            args = args.softmax_scale(scale);
        }
        if let Some(q_lens) = &self.q_lens {
            args = args.q_lens(Tensor::i32(q_lens, &[q_lens.len() as i64]).unwrap());
        }
        args
    }

    /// Sequence b's query token count: its q_lens entry clamped to [0, q_len], else q_len.
    fn q_len_of(&self, b: usize, q_len: usize) -> usize {
        self.q_lens
            .as_ref()
            .map_or(q_len, |q_lens| q_lens[b].clamp(0, q_len as i32) as usize)
    }
}

/// A problem's sizes; q is `[batch, q_len, heads, dim]`, k and v `[batch, kv_len, kv_heads, dim]` (NHD).
#[derive(Clone, Copy)]
struct Sizes {
    batch: usize,
    q_len: usize,
    heads: usize,
    kv_heads: usize,
    kv_len: usize,
    dim: usize,
}

impl Sizes {
    fn q_shape(&self) -> [i64; 4] {
        [self.batch as i64, self.q_len as i64, self.heads as i64, self.dim as i64]
    }
    fn kv_shape(&self) -> [i64; 4] {
        [
            self.batch as i64,
            self.kv_len as i64,
            self.kv_heads as i64,
            self.dim as i64,
        ]
    }
    fn lse_shape(&self) -> [i64; 3] {
        [self.batch as i64, self.q_len as i64, self.heads as i64]
    }
    fn q_count(&self) -> usize {
        self.batch * self.q_len * self.heads * self.dim
    }
    fn kv_count(&self) -> usize {
        self.batch * self.kv_len * self.kv_heads * self.dim
    }

    /// Attention of every query token in f64, from the definition: token t of
    /// a sequence of length L with n query tokens (its q_lens entry, else
    /// q_len) sits at `pos = L - n + t`, and the tokens t >= n are padding,
    /// never read (zeros, LSE -inf or the sink); key j is seen if
    /// `j < L`, `j <= pos` unless full, `pos - j < W` with a window; its score
    /// is `scale q.k`, capped, plus `slope (j - pos)`; `exp(sink)` joins the
    /// denominator. Returns out `[b][t][h][d]` and lse `[b][t][h]`.
    fn reference(&self, q: &[f64], k: &[f64], v: &[f64], lens: &[usize], o: &Variants) -> (Vec<f64>, Vec<f64>) {
        let Sizes {
            batch,
            q_len,
            heads,
            kv_heads,
            kv_len,
            dim,
        } = *self;
        let scale = o.scale.unwrap_or(1.0 / (dim as f64).sqrt());
        let group = heads / kv_heads;
        let mut out = vec![0.0; self.q_count()];
        let mut lse = vec![f64::NEG_INFINITY; batch * q_len * heads];
        for b in 0..batch {
            let length = lens[b] as i64;
            let tokens = o.q_len_of(b, q_len);
            for t in 0..q_len {
                let pos = length - tokens as i64 + t as i64;
                for h in 0..heads {
                    let g = h / group;
                    let row = (b * q_len + t) * heads + h;
                    let query = &q[row * dim..][..dim];
                    let mut seen: Vec<(usize, f64)> = Vec::new();
                    let keys = if t < tokens { lens[b] } else { 0 }; // padding sees no key
                    for j in 0..keys {
                        let jj = j as i64;
                        if (!o.full && jj > pos) || o.window_left.map_or(false, |w| pos - jj >= w) {
                            continue;
                        }
                        let key = &k[((b * kv_len + j) * kv_heads + g) * dim..][..dim];
                        let mut s = scale * key.iter().zip(query).map(|(x, y)| x * y).sum::<f64>();
                        if let Some(c) = o.logit_softcap {
                            let c = c as f64;
                            s = c * (s / c).tanh();
                        }
                        if let Some(slopes) = &o.alibi_slopes {
                            s += slopes[h] as f64 * (jj - pos) as f64;
                        }
                        seen.push((j, s));
                    }
                    let sink = o.sinks.as_ref().map(|s| s[h] as f64);
                    let peak = seen
                        .iter()
                        .map(|&(_, s)| s)
                        .chain(sink)
                        .fold(f64::NEG_INFINITY, f64::max);
                    if peak == f64::NEG_INFINITY {
                        continue; // no key and no sink: zeros, -inf
                    }
                    let mut total = sink.map_or(0.0, |s| (s - peak).exp());
                    for &(_, s) in &seen {
                        total += (s - peak).exp();
                    }
                    for &(j, s) in &seen {
                        let value = &v[((b * kv_len + j) * kv_heads + g) * dim..][..dim];
                        let w = (s - peak).exp() / total;
                        for d in 0..dim {
                            out[row * dim + d] += w * value[d];
                        }
                    }
                    lse[row] = peak + total.ln();
                }
            }
        }
        (out, lse)
    }
}

fn assert_close(what: &str, got: &[f64], expected: &[f64], tolerance: f64) {
    assert_eq!(got.len(), expected.len(), "{}", what);
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let ok = if e.is_infinite() {
            g == e
        } else {
            (g - e).abs() <= tolerance * (1.0 + e.abs())
        };
        assert!(ok, "{}: element {}: got {}, expected {}", what, i, g, e);
    }
}

/// Decodes the f32 problem with `variants` (and `splits` splits when non-zero) and checks out
/// and lse against the reference; returns out.
fn check_f32(handle: &mut Handle, sizes: Sizes, seed: u64, lens: &[i32], variants: &Variants, splits: i32) -> Vec<f32> {
    let mut q = values(sizes.q_count(), seed);
    // The padding tokens of ragged query lengths are never read: NaN there would show.
    let row = sizes.heads * sizes.dim;
    for b in 0..sizes.batch {
        for t in variants.q_len_of(b, sizes.q_len)..sizes.q_len {
            q[(b * sizes.q_len + t) * row..][..row].fill(f32::NAN);
        }
    }
    let k = values(sizes.kv_count(), seed + 1);
    let v = values(sizes.kv_count(), seed + 2);
    let mut out = vec![f32::NAN; q.len()];
    let mut lse = vec![f32::NAN; sizes.batch * sizes.q_len * sizes.heads];
    let mut args = variants
        .apply(DecodeArgs::new(
            Tensor::f32(&q, &sizes.q_shape()).unwrap(),
            Tensor::f32(&k, &sizes.kv_shape()).unwrap(),
            Tensor::f32(&v, &sizes.kv_shape()).unwrap(),
            TensorMut::f32(&mut out, &sizes.q_shape()).unwrap(),
        ))
        .lse(TensorMut::f32(&mut lse, &sizes.lse_shape()).unwrap())
        .seq_lens(Tensor::i32(lens, &[sizes.batch as i64]).unwrap())
        .num_splits(splits);
    handle.decode(&mut args).unwrap();
    drop(args);
    let lens: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
    let (expected, expected_lse) = sizes.reference(&widen(&q), &widen(&k), &widen(&v), &lens, variants);
    assert_close("out", &widen(&out), &expected, 3e-5);
    assert_close("lse", &widen(&lse), &expected_lse, 1e-4);
    out
}

#[test]
fn query_tokens_causal_and_not() {
    let mut handle = cpu_handle();
    for q_len in [1usize, 2, 4, 16] {
        for full in [false, true] {
            let sizes = Sizes {
                batch: 4,
                q_len,
                heads: 8,
                kv_heads: 2,
                kv_len: 70,
                dim: 32,
            };
            // Among the lengths: one shorter than q_len (its first tokens see no key when causal), one empty.
            let lens = [70, 0, 17, q_len as i32 - 1];
            let variants = Variants {
                full,
                ..Variants::default()
            };
            let out = check_f32(&mut handle, sizes, 10 + q_len as u64, &lens, &variants, 0);
            let split = check_f32(&mut handle, sizes, 10 + q_len as u64, &lens, &variants, 5);
            assert_close("splits", &widen(&split), &widen(&out), 1e-5);
        }
    }
}

#[test]
fn windows_larger_equal_shorter_and_one() {
    let mut handle = cpu_handle();
    let sizes = Sizes {
        batch: 3,
        q_len: 4,
        heads: 8,
        kv_heads: 2,
        kv_len: 60,
        dim: 32,
    };
    for window in [65i64, 60, 7, 1] {
        for full in [false, true] {
            let variants = Variants {
                full,
                window_left: Some(window),
                ..Variants::default()
            };
            check_f32(&mut handle, sizes, 20, &[60, 5, 0], &variants, 0);
            check_f32(&mut handle, sizes, 20, &[60, 5, 0], &variants, 3);
        }
    }
}

#[test]
fn softcap_alibi_and_sinks() {
    let mut handle = cpu_handle();
    let sizes = Sizes {
        batch: 3,
        q_len: 4,
        heads: 8,
        kv_heads: 4,
        kv_len: 90,
        dim: 64,
    };
    let slopes: Vec<f32> = (0..8).map(|h| 2f32.powf(-(h + 1) as f32)).collect();
    let sinks: Vec<f32> = (0..8).map(|h| h as f32 * 0.5 - 2.0).collect();
    let cases = [
        Variants {
            logit_softcap: Some(2.0),
            scale: Some(1.0), // scores well above the cap
            ..Variants::default()
        },
        Variants {
            alibi_slopes: Some(slopes.clone()),
            ..Variants::default()
        },
        Variants {
            sinks: Some(sinks.clone()),
            ..Variants::default()
        },
        Variants {
            full: true,
            window_left: Some(20),
            logit_softcap: Some(3.0),
            alibi_slopes: Some(slopes),
            sinks: Some(sinks.clone()),
            scale: Some(0.5),
            q_lens: None,
        },
    ];
    for variants in &cases {
        check_f32(&mut handle, sizes, 30, &[90, 2, 0], variants, 0);
    }

    // With sinks, a sequence of no tokens is zeros with LSE = sink.
    let one = Sizes { batch: 1, ..sizes };
    let q = values(one.q_count(), 31);
    let k = values(one.kv_count(), 32);
    let mut out = vec![f32::NAN; q.len()];
    let mut lse = vec![f32::NAN; 4 * 8];
    let with_sinks = Variants {
        sinks: Some(sinks.clone()),
        ..Variants::default()
    };
    let mut args = with_sinks
        .apply(DecodeArgs::new(
            Tensor::f32(&q, &one.q_shape()).unwrap(),
            Tensor::f32(&k, &one.kv_shape()).unwrap(),
            Tensor::f32(&k, &one.kv_shape()).unwrap(),
            TensorMut::f32(&mut out, &one.q_shape()).unwrap(),
        ))
        .lse(TensorMut::f32(&mut lse, &one.lse_shape()).unwrap())
        .seq_lens(Tensor::i32(&[0], &[1]).unwrap());
    handle.decode(&mut args).unwrap();
    drop(args);
    assert!(out.iter().all(|&x| x == 0.0));
    for (i, &x) in lse.iter().enumerate() {
        assert!(
            (x - sinks[i % 8]).abs() <= 1e-6,
            "lse[{}] = {}, the sink is {}",
            i,
            x,
            sinks[i % 8]
        );
    }
}

/// Ragged query lengths: each sequence its own number of query tokens (none, all, some; more
/// than it has keys; entries outside [0, q_len] clamped), causal and not, split and not, alone and
/// with the other variants; the padding tokens of q are NaN and never read, and get zeros and LSE
/// -inf (the sink with sinks).
#[test]
fn ragged_query_lengths() {
    let mut handle = cpu_handle();
    let sizes = Sizes {
        batch: 6,
        q_len: 6,
        heads: 8,
        kv_heads: 2,
        kv_len: 50,
        dim: 32,
    };
    let lens = [50, 40, 3, 0, 25, 50];
    let sinks: Vec<f32> = (0..8).map(|h| h as f32 * 0.25 - 1.0).collect();
    let q_lens_cases = [
        vec![6, 0, 4, 2, 1, 3],  // full, none, more tokens than keys, an empty sequence, one, some
        vec![6, 6, 6, 6, 6, 6],  // every sequence all of q_len: as without q_lens
        vec![9, -3, 0, 6, 2, 5], // clamped to [0, 6]
    ];
    for q_lens in &q_lens_cases {
        for full in [false, true] {
            let variants = Variants {
                full,
                q_lens: Some(q_lens.clone()),
                ..Variants::default()
            };
            check_f32(&mut handle, sizes, 70, &lens, &variants, 0);
            check_f32(&mut handle, sizes, 70, &lens, &variants, 4);
        }
        let together = Variants {
            window_left: Some(9),
            logit_softcap: Some(4.0),
            alibi_slopes: Some((0..8).map(|h| 0.03 * (h + 1) as f32).collect()),
            sinks: Some(sinks.clone()),
            q_lens: Some(q_lens.clone()),
            ..Variants::default()
        };
        let out = check_f32(&mut handle, sizes, 71, &lens, &together, 3);
        // Padding with sinks: zeros (check_f32 checked its LSE against the sinks).
        let row = sizes.heads * sizes.dim;
        for b in 0..sizes.batch {
            for t in together.q_len_of(b, sizes.q_len)..sizes.q_len {
                let padding = &out[(b * sizes.q_len + t) * row..][..row];
                assert!(padding.iter().all(|&x| x == 0.0), "sequence {} token {}", b, t);
            }
        }
    }
}

/// A q_lens of the wrong dtype or shape is refused naming it; with content checks an entry
/// outside [0, q_len] is InvalidLength; in device memory, the binding refuses it on a CPU handle.
#[test]
fn q_lens_of_the_wrong_kind_are_refused() {
    let library = Library::load().expect("load libflashdecode (set FLASHDECODE_LIBRARY)");
    let mut handle = library.create_handle(&Options::cpu().num_threads(2)).unwrap();
    let mut checked = library
        .create_handle(&Options::cpu().num_threads(2).check_contents(true))
        .unwrap();
    let q = values(2 * 4 * 8 * 64, 80);
    let k = values(2 * 100 * 2 * 64, 81);
    let mut out = vec![7.0f32; q.len()];
    let as_f32 = [1.0f32, 2.0];
    let (three, two_by_one, good, too_many, negative) = ([1, 2, 3], [1, 2], [4, 2], [1, 5], [-1, 2]);
    let cases: [(&str, bool, Tensor<'_>, Status, &str); 6] = [
        (
            "f32",
            false,
            Tensor::f32(&as_f32, &[2]).unwrap(),
            Status::InvalidDType,
            "q_lens: dtype must be i32, got f32",
        ),
        (
            "[3]",
            false,
            Tensor::i32(&three, &[3]).unwrap(),
            Status::InvalidShape,
            "q_lens: batch must be 2 (from q), got 3",
        ),
        (
            "[2, 1]",
            false,
            Tensor::i32(&two_by_one, &[2, 1]).unwrap(),
            Status::InvalidShape,
            "q_lens: ndim must be 1, got 2",
        ),
        (
            "5 > q_len",
            true,
            Tensor::i32(&too_many, &[2]).unwrap(),
            Status::InvalidLength,
            "q_lens[1] must be in [0, 4]",
        ),
        (
            "-1",
            true,
            Tensor::i32(&negative, &[2]).unwrap(),
            Status::InvalidLength,
            "q_lens[0] must be in [0, 4]",
        ),
        (
            "device",
            false,
            unsafe { Tensor::device(0xdead_0000 as *const _, DType::I32, &[2]).unwrap() },
            Status::InvalidArgument,
            "q_lens: is device memory, but the handle runs on the CPU backend",
        ),
    ];
    for (case, check, q_lens, status, needle) in cases {
        let mut args = DecodeArgs::new(
            Tensor::f32(&q, &[2, 4, 8, 64]).unwrap(),
            Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
            Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
            TensorMut::f32(&mut out, &[2, 4, 8, 64]).unwrap(),
        )
        .q_lens(q_lens);
        let error = if check { &mut checked } else { &mut handle }
            .decode(&mut args)
            .unwrap_err();
        assert_eq!(error.status(), Some(status), "{}: {}", case, error);
        assert!(error.message().contains(needle), "{}: {}", case, error);
        drop(args);
        assert!(out.iter().all(|&x| x == 7.0), "{}: the output was written", case);
    }
    // The same entries within [0, q_len] pass the checks.
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &[2, 4, 8, 64]).unwrap(),
        Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
        Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
        TensorMut::f32(&mut out, &[2, 4, 8, 64]).unwrap(),
    )
    .q_lens(Tensor::i32(&good, &[2]).unwrap());
    checked.decode(&mut args).unwrap();
}

/// Every variant at once on a paged cache (HND pages) with ragged lengths and GQA, in f32, f16
/// and bf16, against the reference over the dense cache the pages hold.
#[test]
fn paged_ragged_gqa_in_every_dtype() {
    let mut handle = cpu_handle();
    let (batch, q_len, heads, kv_heads, dim, page, pages_per_sequence) =
        (3usize, 4usize, 8usize, 2usize, 32usize, 16usize, 4usize);
    let capacity = page * pages_per_sequence;
    let sizes = Sizes {
        batch,
        q_len,
        heads,
        kv_heads,
        kv_len: capacity,
        dim,
    };
    let lens = [64i32, 1, 37];
    let variants = Variants {
        full: false,
        window_left: Some(20),
        logit_softcap: Some(6.0),
        alibi_slopes: Some((0..heads).map(|h| 0.05 * (h + 1) as f32).collect()),
        sinks: Some((0..heads).map(|h| 0.25 * h as f32 - 1.0).collect()),
        scale: Some(0.3),
        q_lens: None,
    };
    let q32 = values(sizes.q_count(), 40);
    let k32 = values(sizes.kv_count(), 41);
    let v32 = values(sizes.kv_count(), 42);
    // Page p of sequence b is pool page table[b][p] = (b * 4 + p) * 5 % 12 (a permutation of 0..12),
    // stored HND: [page, kv_head, slot, dim].
    let num_pages = batch * pages_per_sequence;
    let table: Vec<i32> = (0..num_pages).map(|i| (i * 5 % num_pages) as i32).collect();
    let to_pool = |dense: &[f32]| -> Vec<f32> {
        let mut pool = vec![0f32; dense.len()];
        for b in 0..batch {
            for p in 0..pages_per_sequence {
                let target = table[b * pages_per_sequence + p] as usize;
                for s in 0..page {
                    for g in 0..kv_heads {
                        let from = ((b * capacity + p * page + s) * kv_heads + g) * dim;
                        let to = ((target * kv_heads + g) * page + s) * dim;
                        pool[to..to + dim].copy_from_slice(&dense[from..from + dim]);
                    }
                }
            }
        }
        pool
    };
    let (pool_k, pool_v) = (to_pool(&k32), to_pool(&v32));
    let pool_shape = [num_pages as i64, page as i64, kv_heads as i64, dim as i64];
    let hnd = [(kv_heads * page * dim) as i64, dim as i64, (page * dim) as i64, 1];
    let lens_usize: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        let (to_bits, from_bits): (fn(f32) -> u16, fn(u16) -> f64) = match dtype {
            DType::F16 => (f32_to_f16_bits, f16_bits_to_f64),
            _ => (f32_to_bf16_bits, bf16_bits_to_f64),
        };
        let bits = |x: &[f32]| -> Vec<u16> { x.iter().map(|&y| to_bits(y)).collect() };
        let (q16, k16, v16) = (bits(&q32), bits(&pool_k), bits(&pool_v));
        // What the library reads, in f64, for the reference.
        let read = |x: &[f32]| -> Vec<f64> {
            if dtype == DType::F32 {
                widen(x)
            } else {
                x.iter().map(|&y| from_bits(to_bits(y))).collect()
            }
        };
        let (expected, expected_lse) = sizes.reference(&read(&q32), &read(&k32), &read(&v32), &lens_usize, &variants);
        for splits in [0, 3] {
            let mut out32 = vec![f32::NAN; q32.len()];
            let mut out16 = vec![0u16; q32.len()];
            let mut lse = vec![f32::NAN; batch * q_len * heads];
            let (q, k, v, out) = match dtype {
                DType::F32 => (
                    Tensor::f32(&q32, &sizes.q_shape()).unwrap(),
                    Tensor::f32(&pool_k, &pool_shape).unwrap(),
                    Tensor::f32(&pool_v, &pool_shape).unwrap(),
                    TensorMut::f32(&mut out32, &sizes.q_shape()).unwrap(),
                ),
                DType::F16 => (
                    Tensor::f16(&q16, &sizes.q_shape()).unwrap(),
                    Tensor::f16(&k16, &pool_shape).unwrap(),
                    Tensor::f16(&v16, &pool_shape).unwrap(),
                    TensorMut::f16(&mut out16, &sizes.q_shape()).unwrap(),
                ),
                _ => (
                    Tensor::bf16(&q16, &sizes.q_shape()).unwrap(),
                    Tensor::bf16(&k16, &pool_shape).unwrap(),
                    Tensor::bf16(&v16, &pool_shape).unwrap(),
                    TensorMut::bf16(&mut out16, &sizes.q_shape()).unwrap(),
                ),
            };
            let mut args = variants
                .apply(DecodeArgs::new(
                    q,
                    k.with_strides(&hnd).unwrap(),
                    v.with_strides(&hnd).unwrap(),
                    out,
                ))
                .lse(TensorMut::f32(&mut lse, &sizes.lse_shape()).unwrap())
                .seq_lens(Tensor::i32(&lens, &[batch as i64]).unwrap())
                .block_table(Tensor::i32(&table, &[batch as i64, pages_per_sequence as i64]).unwrap())
                .num_splits(splits);
            handle.decode(&mut args).unwrap();
            drop(args);
            let (got, tolerance) = match dtype {
                DType::F32 => (widen(&out32), 3e-5),
                DType::F16 => (out16.iter().map(|&x| from_bits(x)).collect(), 3e-3),
                _ => (out16.iter().map(|&x| from_bits(x)).collect(), 2e-2),
            };
            assert_close(&format!("{:?} out", dtype), &got, &expected, tolerance);
            assert_close(&format!("{:?} lse", dtype), &widen(&lse), &expected_lse, 1e-4);
        }
    }
}

#[test]
fn the_binding_refuses_zero_for_none_and_wrong_memory() {
    let mut handle = cpu_handle();
    let q = values(2 * 8 * 64, 50);
    let k = values(2 * 100 * 2 * 64, 51);
    let mut out = vec![7.0f32; q.len()];
    let cases: [(&str, Status, &str); 3] = [
        (
            "window 0",
            Status::InvalidArgument,
            "window_left must not be 0; leave it unset for no window",
        ),
        (
            "softcap 0",
            Status::InvalidArgument,
            "logit_softcap must not be 0; leave it unset for no cap",
        ),
        (
            "device sinks",
            Status::InvalidArgument,
            "sinks: is device memory, but the handle runs on the CPU backend",
        ),
    ];
    for (case, status, needle) in cases {
        let args = DecodeArgs::new(
            Tensor::f32(&q, &[2, 1, 8, 64]).unwrap(),
            Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
            Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
            TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap(),
        );
        let mut args = match case {
            "window 0" => args.window_left(0),
            "softcap 0" => args.logit_softcap(-0.0),
            _ => args.sinks(unsafe { Tensor::device(0xdead_0000 as *const _, DType::F32, &[8]).unwrap() }),
        };
        let error = handle.decode(&mut args).unwrap_err();
        assert_eq!(error.status(), Some(status), "{}: {}", case, error);
        assert!(error.message().contains(needle), "{}: {}", case, error);
        if case != "device sinks" {
            // Refused before anything is read: the size query too.
            let error = handle.workspace_size(&args).unwrap_err();
            assert_eq!(error.status(), Some(status), "{}: {}", case, error);
        }
        drop(args);
        assert!(out.iter().all(|&x| x == 7.0), "{}: the output was written", case);
    }
}

/// The plan of a windowed decode cuts the window's keys, not the cache's.
#[test]
fn a_window_plans_its_keys_only() {
    let handle = cpu_handle();
    let q = values(2 * 2 * 4 * 32, 60);
    let k = values(2 * 400 * 2 * 32, 61);
    let mut out = vec![0f32; q.len()];
    let plan = |window: Option<i64>, out: &mut [f32]| {
        let mut args = DecodeArgs::new(
            Tensor::f32(&q, &[2, 2, 4, 32]).unwrap(),
            Tensor::f32(&k, &[2, 400, 2, 32]).unwrap(),
            Tensor::f32(&k, &[2, 400, 2, 32]).unwrap(),
            TensorMut::f32(out, &[2, 2, 4, 32]).unwrap(),
        )
        .num_splits(4);
        if let Some(window) = window {
            args = args.window_left(window);
        }
        let info = handle.describe_plan(&args).unwrap();
        assert_eq!(info.workspace_bytes, handle.workspace_size(&args).unwrap());
        info
    };
    let windowed = plan(Some(32), &mut out);
    let whole = plan(None, &mut out);
    assert_eq!((windowed.num_splits, whole.num_splits), (4, 4));
    assert!(windowed.split_tokens < whole.split_tokens, "{:?} {:?}", windowed, whole);
}
