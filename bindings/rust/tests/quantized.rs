// SPDX-License-Identifier: Apache-2.0
//! 8-bit K/V caches (since 0.3) on the CPU backend: E4M3, E5M2 and i8 caches
//! with per-tensor, per-KV-head and per-token scales against a float64
//! reference over the dequantized values (stored value * scale), and
//! `append_kv`'s rounding against the header's rules. The library's own
//! validation checks what the crate passes; the numerics need the CPU
//! backend's 8-bit decode and fd_append_kv, and are skipped (with a line on
//! stderr) while a library's backend still refuses them as it did before it had them.

use flashdecode::{AppendArgs, DType, DecodeArgs, Handle, Library, Options, Status, Tensor, TensorMut};

mod common;
use common::{bf16_bits_to_f64, f16_bits_to_f64, f32_to_bf16_bits, f32_to_f16_bits, values};

const CACHES: [DType; 3] = [DType::E4m3, DType::E5m2, DType::I8];
const QUERIES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scales {
    None,
    Tensor,
    Head,
    Token,
}
const SCALES: [Scales; 4] = [Scales::None, Scales::Tensor, Scales::Head, Scales::Token];

fn cpu_handle() -> Handle {
    Library::load()
        .expect("load libflashdecode (set FLASHDECODE_LIBRARY)")
        .create_handle(&Options::cpu().num_threads(2))
        .expect("CPU handle")
}

// ---- the formats ------------------------------------------------------------------

/// The value of an 8-bit cache element (NaN for fp8 NaNs, +-inf for E5M2's infinities).
fn dequantize(byte: u8, dtype: DType) -> f64 {
    let (exponent_bits, mantissa_bits) = match dtype {
        DType::E4m3 => (4, 3),
        DType::E5m2 => (5, 2),
        _ => return byte as i8 as f64,
    };
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let bias = (1 << (exponent_bits - 1)) - 1;
    let top = (1 << exponent_bits) - 1;
    let exponent = ((byte >> mantissa_bits) as i32) & top;
    let mantissa = (byte & ((1 << mantissa_bits) - 1)) as i32;
    let fraction = mantissa as f64 / (1 << mantissa_bits) as f64;
    if dtype == DType::E5m2 && exponent == top {
        return if mantissa == 0 { sign * f64::INFINITY } else { f64::NAN };
    }
    if dtype == DType::E4m3 && exponent == top && mantissa == 7 {
        return f64::NAN;
    }
    if exponent == 0 {
        sign * fraction * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + fraction) * 2f64.powi(exponent - bias)
    }
}

fn rint(x: f64) -> f64 {
    let floor = x.floor();
    let rest = x - floor;
    if rest > 0.5 || (rest == 0.5 && floor % 2.0 != 0.0) {
        floor + 1.0
    } else {
        floor
    }
}

/// The append rounding of `x` (= new / scale in f32) to an 8-bit cache element.
fn quantize(x: f32, dtype: DType) -> u8 {
    if dtype == DType::I8 {
        if x.is_nan() {
            return 0;
        }
        return rint(x as f64).clamp(-127.0, 127.0) as i8 as u8;
    }
    if x.is_nan() {
        return 0x7f;
    }
    let largest: u8 = if dtype == DType::E4m3 { 0x7e } else { 0x7b };
    let magnitude = (x as f64).abs().min(dequantize(largest, dtype));
    let mut best = 0u8;
    for code in 1..=largest {
        let (distance, best_distance) = (
            (dequantize(code, dtype) - magnitude).abs(),
            (dequantize(best, dtype) - magnitude).abs(),
        );
        if distance < best_distance || (distance == best_distance && code % 2 == 0) {
            best = code;
        }
    }
    best | if x.is_sign_negative() { 0x80 } else { 0 }
}

fn scale_values(mode: Scales, shape: [usize; 3], seed: u64) -> Vec<f32> {
    let count = match mode {
        Scales::None => 0,
        Scales::Tensor => 1,
        Scales::Head => shape[2],
        Scales::Token => shape[0] * shape[1] * shape[2],
    };
    values(count, seed).iter().map(|x| 0.02 + 0.01 * x).collect()
}

/// The scale of position (b, t, h) in a scale mode.
fn scale_at(mode: Scales, scales: &[f32], shape: [usize; 3], b: usize, t: usize, h: usize) -> f32 {
    match mode {
        Scales::None => 1.0,
        Scales::Tensor => scales[0],
        Scales::Head => scales[h],
        Scales::Token => scales[(b * shape[1] + t) * shape[2] + h],
    }
}

fn scale_tensor<'a>(mode: Scales, scales: &'a [f32], cache_shape: &[i64]) -> Option<Tensor<'a>> {
    match mode {
        Scales::None => None,
        Scales::Tensor => Some(Tensor::scale_per_tensor(scales, cache_shape).unwrap()),
        Scales::Head => Some(Tensor::scale_per_head(scales, cache_shape).unwrap()),
        Scales::Token => Some(Tensor::scale_per_token(scales, cache_shape).unwrap()),
    }
}

/// Float64 decode attention over a dense `[batch, kv_len, kv_heads, dim]` cache, one query
/// token a sequence (`q` is `[batch, heads, dim]`), sequence b's first `lens[b]` keys:
/// `[batch, heads, dim]`.
fn reference(q: &[f64], k: &[f64], v: &[f64], lens: &[i32], shape: [usize; 4], heads: usize) -> Vec<f64> {
    let [batch, kv_len, kv_heads, dim] = shape;
    let mut out = vec![0f64; batch * heads * dim];
    for b in 0..batch {
        let len = lens[b] as usize;
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let row = &q[(b * heads + h) * dim..][..dim];
            let at = |t: usize| ((b * kv_len + t) * kv_heads + g) * dim;
            let scores: Vec<f64> = (0..len)
                .map(|t| row.iter().zip(&k[at(t)..][..dim]).map(|(a, c)| a * c).sum::<f64>() / (dim as f64).sqrt())
                .collect();
            let peak = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - peak).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..dim {
                out[(b * heads + h) * dim + d] = (0..len).map(|t| weights[t] * v[at(t) + d]).sum::<f64>() / total;
            }
        }
    }
    out
}

// ---- decode -----------------------------------------------------------------------

#[test]
fn decode_matches_dequantized_reference() {
    let mut handle = cpu_handle();
    let (batch, kv_len, kv_heads, heads, dim) = (2usize, 40usize, 2usize, 4usize, 32usize);
    let shape = [batch, kv_len, kv_heads];
    let cache_shape = [batch as i64, kv_len as i64, kv_heads as i64, dim as i64];
    let q_shape = [batch as i64, 1, heads as i64, dim as i64];
    let lens = [40i32, 17];
    let q_values = values(batch * heads * dim, 1);
    for (seed, (&cache, &query, &mode)) in CACHES
        .iter()
        .flat_map(|c| QUERIES.iter().flat_map(move |q| SCALES.iter().map(move |s| (c, q, s))))
        .enumerate()
    {
        let seed = seed as u64 * 7;
        let (k_scales, v_scales) = (scale_values(mode, shape, seed + 2), scale_values(mode, shape, seed + 3));
        // Stored values whose dequantized values are about [-1, 1): quantized from value / scale.
        let store = |scales: &[f32], seed: u64| -> Vec<u8> {
            let raw = values(batch * kv_len * kv_heads * dim, seed);
            // Unscaled int8: small integers (scores of ±100-sized keys lose 1e-5 in f32).
            let spread = if cache == DType::I8 && mode == Scales::None {
                10.0
            } else {
                1.0
            };
            raw.iter()
                .enumerate()
                .map(|(i, &x)| {
                    let (b, t, h) = (
                        i / (kv_len * kv_heads * dim),
                        i / (kv_heads * dim) % kv_len,
                        i / dim % kv_heads,
                    );
                    quantize(x * spread / scale_at(mode, scales, shape, b, t, h), cache)
                })
                .collect()
        };
        let (k_bytes, v_bytes) = (store(&k_scales, seed + 4), store(&v_scales, seed + 5));
        let dequantized = |bytes: &[u8], scales: &[f32]| -> Vec<f64> {
            bytes
                .iter()
                .enumerate()
                .map(|(i, &byte)| {
                    let (b, t, h) = (
                        i / (kv_len * kv_heads * dim),
                        i / (kv_heads * dim) % kv_len,
                        i / dim % kv_heads,
                    );
                    dequantize(byte, cache) * scale_at(mode, scales, shape, b, t, h) as f64
                })
                .collect()
        };
        let (k64, v64) = (dequantized(&k_bytes, &k_scales), dequantized(&v_bytes, &v_scales));

        let (q_f16, q_bf16): (Vec<u16>, Vec<u16>) = (
            q_values.iter().map(|&x| f32_to_f16_bits(x)).collect(),
            q_values.iter().map(|&x| f32_to_bf16_bits(x)).collect(),
        );
        let (q_tensor, q64): (Tensor<'_>, Vec<f64>) = match query {
            DType::F32 => (
                Tensor::f32(&q_values, &q_shape).unwrap(),
                q_values.iter().map(|&x| x as f64).collect(),
            ),
            DType::F16 => (
                Tensor::f16(&q_f16, &q_shape).unwrap(),
                q_f16.iter().map(|&h| f16_bits_to_f64(h)).collect(),
            ),
            _ => (
                Tensor::bf16(&q_bf16, &q_shape).unwrap(),
                q_bf16.iter().map(|&b| bf16_bits_to_f64(b)).collect(),
            ),
        };
        let mut out_f32 = vec![0f32; batch * heads * dim];
        let mut out_u16 = vec![0u16; batch * heads * dim];
        let out = match query {
            DType::F32 => TensorMut::f32(&mut out_f32, &q_shape).unwrap(),
            DType::F16 => TensorMut::f16(&mut out_u16, &q_shape).unwrap(),
            _ => TensorMut::bf16(&mut out_u16, &q_shape).unwrap(),
        };
        let k = Tensor::bytes(&k_bytes, cache, &cache_shape).unwrap();
        let v = Tensor::bytes(&v_bytes, cache, &cache_shape).unwrap();
        let seq_lens = Tensor::i32(&lens, &[batch as i64]).unwrap();
        let mut args = DecodeArgs::new(q_tensor, k, v, out).seq_lens(seq_lens);
        if let Some(scale) = scale_tensor(mode, &k_scales, &cache_shape) {
            args = args.k_scale(scale);
        }
        if let Some(scale) = scale_tensor(mode, &v_scales, &cache_shape) {
            args = args.v_scale(scale);
        }
        handle
            .decode(&mut args)
            .unwrap_or_else(|e| panic!("{:?} q {:?} {:?}: {}", cache, query, mode, e));
        drop(args);

        let tolerance = match query {
            DType::F32 => 2e-5,
            DType::F16 => 2e-3,
            _ => 1.6e-2,
        };
        let want = reference(&q64, &k64, &v64, &lens, [batch, kv_len, kv_heads, dim], heads);
        for (index, expected) in want.iter().enumerate() {
            let got = match query {
                DType::F32 => out_f32[index] as f64,
                DType::F16 => f16_bits_to_f64(out_u16[index]),
                _ => bf16_bits_to_f64(out_u16[index]),
            };
            assert!(
                (got - expected).abs() <= tolerance * (1.0 + expected.abs()),
                "{:?} q {:?} {:?}: out[{}] = {}, expected {}",
                cache,
                query,
                mode,
                index,
                got,
                expected
            );
        }
    }
}

/// A paged 8-bit cache: pages of 8 tokens in a shuffled pool, per-head and
/// per-token scales laid out like the pool, every byte past a sequence's
/// length (and every page no table uses) a NaN code, or for i8 the largest
/// code under a huge per-token scale, which must not reach out.
#[test]
fn paged_decode_matches_dequantized_reference() {
    let mut handle = cpu_handle();
    let (batch, kv_len, kv_heads, heads, dim) = (3usize, 29usize, 2usize, 8usize, 16usize);
    let page_size = 8usize;
    let max_pages = kv_len.div_ceil(page_size);
    let num_pages = batch * max_pages + 2; // two pages no table uses
    let lens = [29i32, 9, 1];
    // Entry i is page 5i mod num_pages: every sequence's pages scattered over the pool.
    let table: Vec<i32> = (0..batch * max_pages).map(|i| (i * 5 % num_pages) as i32).collect();
    let pool_shape = [num_pages as i64, page_size as i64, kv_heads as i64, dim as i64];
    let slots = [1usize, num_pages * page_size, kv_heads]; // the scales' [1, slots, kv_heads] view
    let q_shape = [batch as i64, 1, heads as i64, dim as i64];
    let q_values = values(batch * heads * dim, 11);
    for (seed, (&cache, &mode)) in CACHES
        .iter()
        .flat_map(|c| [Scales::Head, Scales::Token].iter().map(move |s| (c, s)))
        .enumerate()
    {
        let seed = 100 + seed as u64 * 7;
        // A pool and its scales, and the dense [batch, kv_len, kv_heads, dim] values it holds.
        let store = |seed: u64| -> (Vec<u8>, Vec<f32>, Vec<f64>) {
            let raw = values(batch * kv_len * kv_heads * dim, seed);
            let mut bytes = vec![0x7fu8; num_pages * page_size * kv_heads * dim]; // NaN in both fp8 formats
            let mut scales = scale_values(mode, slots, seed + 1);
            if mode == Scales::Token && cache == DType::I8 {
                scales.iter_mut().for_each(|s| *s = 1e30);
            }
            let mut dense = vec![0f64; raw.len()];
            for b in 0..batch {
                for t in 0..lens[b] as usize {
                    let slot = table[b * max_pages + t / page_size] as usize * page_size + t % page_size;
                    for h in 0..kv_heads {
                        let at = ((b * kv_len + t) * kv_heads + h) * dim;
                        if mode == Scales::Token {
                            scales[slot * kv_heads + h] = 0.02 + 0.01 * raw[at];
                        }
                        let scale = scale_at(mode, &scales, slots, 0, slot, h);
                        let spread = if cache == DType::I8 { 0.5 } else { 1.0 };
                        for d in 0..dim {
                            let code = quantize(raw[at + d] * spread / scale, cache);
                            bytes[(slot * kv_heads + h) * dim + d] = code;
                            dense[at + d] = dequantize(code, cache) * scale as f64;
                        }
                    }
                }
            }
            (bytes, scales, dense)
        };
        let (k_bytes, k_scales, k64) = store(seed + 2);
        let (v_bytes, v_scales, v64) = store(seed + 3);
        let mut out = vec![f32::NAN; batch * heads * dim];
        let mut args = DecodeArgs::new(
            Tensor::f32(&q_values, &q_shape).unwrap(),
            Tensor::bytes(&k_bytes, cache, &pool_shape).unwrap(),
            Tensor::bytes(&v_bytes, cache, &pool_shape).unwrap(),
            TensorMut::f32(&mut out, &q_shape).unwrap(),
        )
        .seq_lens(Tensor::i32(&lens, &[batch as i64]).unwrap())
        .block_table(Tensor::i32(&table, &[batch as i64, max_pages as i64]).unwrap())
        .k_scale(scale_tensor(mode, &k_scales, &pool_shape).unwrap())
        .v_scale(scale_tensor(mode, &v_scales, &pool_shape).unwrap());
        handle
            .decode(&mut args)
            .unwrap_or_else(|e| panic!("{:?} {:?}: {}", cache, mode, e));
        drop(args);

        let q64: Vec<f64> = q_values.iter().map(|&x| x as f64).collect();
        let want = reference(&q64, &k64, &v64, &lens, [batch, kv_len, kv_heads, dim], heads);
        for (index, expected) in want.iter().enumerate() {
            let got = out[index] as f64;
            assert!(
                (got - expected).abs() <= 2e-5 * (1.0 + expected.abs()),
                "{:?} {:?}: out[{}] = {}, expected {}",
                cache,
                mode,
                index,
                got,
                expected
            );
        }
    }
}

// ---- append_kv ----------------------------------------------------------------------

#[test]
fn append_rounds_as_the_header_says() {
    let mut handle = cpu_handle();
    let (batch, capacity, kv_heads, dim, new_len) = (3usize, 6usize, 2usize, 16usize, 2usize);
    let shape = [batch, capacity, kv_heads];
    let cache_shape = [batch as i64, capacity as i64, kv_heads as i64, dim as i64];
    let new_shape = [batch as i64, new_len as i64, kv_heads as i64, dim as i64];
    let lens = [6i32, 3, 1]; // the last sequence: one new token falls before position 0
    for &cache in &CACHES {
        for &mode in &SCALES {
            let scales = scale_values(mode, shape, 11);
            let mut new: Vec<f32> = values(batch * new_len * kv_heads * dim, 12)
                .iter()
                .map(|x| x * 8.0)
                .collect();
            new[0] = f32::NAN;
            new[1] = 1e30;
            new[2] = -1e30;
            new[3] = f32::INFINITY;
            let sentinel = 0x11u8;
            let (mut k, mut v) = (
                vec![sentinel; batch * capacity * kv_heads * dim],
                vec![sentinel; k_len(&shape, dim)],
            );
            let new_t = Tensor::f32(&new, &new_shape).unwrap();
            let mut args = AppendArgs::new(
                new_t,
                new_t,
                TensorMut::bytes(&mut k, cache, &cache_shape).unwrap(),
                TensorMut::bytes(&mut v, cache, &cache_shape).unwrap(),
            )
            .seq_lens(Tensor::i32(&lens, &[batch as i64]).unwrap());
            if let Some(scale) = scale_tensor(mode, &scales, &cache_shape) {
                args = args.k_scale(scale).v_scale(scale);
            }
            handle
                .append_kv(&mut args)
                .unwrap_or_else(|e| panic!("{:?} {:?}: {}", cache, mode, e));
            drop(args);
            for b in 0..batch {
                for t in 0..capacity {
                    let i = t as i64 - (lens[b] as i64 - new_len as i64);
                    for h in 0..kv_heads {
                        for d in 0..dim {
                            let index = ((b * capacity + t) * kv_heads + h) * dim + d;
                            let expected = if (0..new_len as i64).contains(&i) && t < lens[b] as usize {
                                let x = new[((b * new_len + i as usize) * kv_heads + h) * dim + d];
                                quantize(x / scale_at(mode, &scales, shape, b, t, h), cache)
                            } else {
                                sentinel
                            };
                            for (name, got) in [("k", k[index]), ("v", v[index])] {
                                let (g, e) = (dequantize(got, cache), dequantize(expected, cache));
                                assert!(
                                    g == e || (g.is_nan() && e.is_nan()),
                                    "{:?} {:?}: {}[{}, {}, {}, {}] = {:#04x}, expected {:#04x}",
                                    cache,
                                    mode,
                                    name,
                                    b,
                                    t,
                                    h,
                                    d,
                                    got,
                                    expected
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn k_len(shape: &[usize; 3], dim: usize) -> usize {
    shape[0] * shape[1] * shape[2] * dim
}

// ---- what is refused ----------------------------------------------------------------

#[test]
fn scales_pass_validation_in_every_form() {
    // The strides the crate builds are the header's: the size query validates them as decode does.
    let handle = cpu_handle();
    let (q, cache, mut out) = (
        vec![0f32; 2 * 4 * 32],
        vec![0i8; 2 * 10 * 2 * 32],
        vec![0f32; 2 * 4 * 32],
    );
    let (one, heads, tokens) = ([0.5f32], [0.5f32, 2.0], vec![1f32; 2 * 10 * 2]);
    let cache_shape = [2, 10, 2, 32];
    let q_t = Tensor::f32(&q, &[2, 1, 4, 32]).unwrap();
    let k = Tensor::i8(&cache, &cache_shape).unwrap();
    let plain = handle
        .workspace_size(&DecodeArgs::new(
            q_t,
            k,
            k,
            TensorMut::f32(&mut out, &[2, 1, 4, 32]).unwrap(),
        ))
        .unwrap();
    for scale in [
        Tensor::scale_per_tensor(&one, &cache_shape).unwrap(),
        Tensor::scale_per_head(&heads, &cache_shape).unwrap(),
        Tensor::scale_per_token(&tokens, &cache_shape).unwrap(),
    ] {
        let out_t = TensorMut::f32(&mut out, &[2, 1, 4, 32]).unwrap();
        let args = DecodeArgs::new(q_t, k, k, out_t).k_scale(scale).v_scale(scale);
        assert_eq!(handle.workspace_size(&args).unwrap(), plain);
    }
    assert_eq!(
        Tensor::scale_per_head(&heads, &cache_shape).unwrap().strides(),
        &[0, 0, 1]
    );
    assert_eq!(
        Tensor::scale_per_tensor(&one, &cache_shape).unwrap().shape(),
        &[2, 10, 2]
    );
    assert_eq!(Tensor::i8(&cache, &cache_shape).unwrap().dtype(), DType::I8);
    let bytes: Vec<u8> = cache.iter().map(|&x| x as u8).collect();
    assert_eq!(
        Tensor::bytes(&bytes, DType::E5m2, &cache_shape).unwrap().dtype(),
        DType::E5m2
    );
}

#[test]
fn quantized_errors_name_the_argument() {
    let mut handle = cpu_handle();
    let (q, mut out) = (vec![0f32; 2 * 4 * 32], vec![7f32; 2 * 4 * 32]);
    let (wide, cache) = (vec![0f32; 2 * 10 * 2 * 32], vec![0i8; 2 * 10 * 2 * 32]);
    let cache_shape = [2, 10, 2, 32];
    let (one, three) = ([0.5f32], [1f32; 3]);
    let q_t = Tensor::f32(&q, &[2, 1, 4, 32]).unwrap();
    let wide_t = Tensor::f32(&wide, &cache_shape).unwrap();
    let i8_t = Tensor::i8(&cache, &cache_shape).unwrap();

    let out_t = TensorMut::f32(&mut out, &[2, 1, 4, 32]).unwrap();
    let scale = Tensor::scale_per_tensor(&one, &cache_shape).unwrap();
    let error = handle
        .decode(&mut DecodeArgs::new(q_t, wide_t, wide_t, out_t).k_scale(scale))
        .unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidDType), "{}", error);
    assert!(error.message().contains("k_scale"), "{}", error);

    let out_t = TensorMut::f32(&mut out, &[2, 1, 4, 32]).unwrap();
    let scale = Tensor::f32(&three, &[3]).unwrap(); // a 1-d tensor as it is: not the cache's rank
    let error = handle
        .decode(&mut DecodeArgs::new(q_t, i8_t, i8_t, out_t).v_scale(scale))
        .unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidShape), "{}", error);
    assert!(error.message().contains("v_scale"), "{}", error);
    assert!(out.iter().all(|&x| x == 7.0));
    let error = Tensor::scale_per_head(&three[..1], &cache_shape).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidShape), "{}", error);
    // A slice longer than the form takes (per query head, say) is refused, not read in part.
    let error = Tensor::scale_per_head(&three, &cache_shape).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidShape), "{}", error);
    assert!(error.message().contains("scale_per_head"), "{}", error);
    let error = Tensor::scale_per_tensor(&three[..2], &cache_shape).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidShape), "{}", error);
    let error = Tensor::scale_per_token(&three, &cache_shape).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidShape), "{}", error);
    let error = Tensor::bytes(&[0u8; 4], DType::F16, &[4]).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidDType), "{}", error);

    // append_kv: a scale on a 16-bit cache, and new tokens of another head count.
    let new = vec![0f32; 2 * 2 * 32];
    let new_t = Tensor::f32(&new, &[2, 1, 2, 32]).unwrap();
    let (mut k16, mut v16) = (vec![0u16; 2 * 10 * 2 * 32], vec![0u16; 2 * 10 * 2 * 32]);
    let scale = Tensor::scale_per_tensor(&one, &cache_shape).unwrap();
    let mut args = AppendArgs::new(
        new_t,
        new_t,
        TensorMut::f16(&mut k16, &cache_shape).unwrap(),
        TensorMut::f16(&mut v16, &cache_shape).unwrap(),
    )
    .v_scale(scale);
    let error = handle.append_kv(&mut args).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidDType), "{}", error);
    assert!(error.message().contains("v_scale"), "{}", error);
    let narrow = Tensor::f32(&new[..2 * 32], &[2, 1, 1, 32]).unwrap();
    let (mut k8, mut v8) = (vec![0i8; 2 * 10 * 2 * 32], vec![5i8; 2 * 10 * 2 * 32]);
    let mut args = AppendArgs::new(
        new_t,
        narrow,
        TensorMut::i8(&mut k8, &cache_shape).unwrap(),
        TensorMut::i8(&mut v8, &cache_shape).unwrap(),
    );
    let error = handle.append_kv(&mut args).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidShape), "{}", error);
    assert!(error.message().contains("v_new"), "{}", error);
    assert!(args.v().dtype() == DType::I8);
    drop(args);
    assert!(v8.iter().all(|&x| x == 5));
}
