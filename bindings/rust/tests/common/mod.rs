// SPDX-License-Identifier: Apache-2.0
//! Helpers the integration tests share: deterministic test values and the
//! f16/bf16 conversions their float64 references read outputs with.
#![allow(dead_code)] // each test crate uses its own subset

/// Deterministic values in [-1, 1).
pub fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&x| x as f64).collect()
}

pub fn f32_to_f16_bits(x: f32) -> u16 {
    // Round to nearest even; the test data is in the normal range of f16 (or zero).
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if x == 0.0 || exponent <= 0 {
        return sign;
    }
    let mantissa = bits & 0x7f_ffff;
    let mut half = ((exponent as u32) << 10) | (mantissa >> 13);
    let rest = mantissa & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && half & 1 == 1) {
        half += 1;
    }
    sign | half as u16
}

pub fn f16_bits_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = ((h >> 10) & 0x1f) as i32;
    let mantissa = (h & 0x3ff) as f64;
    match exponent {
        0 => sign * mantissa * 2f64.powi(-24),
        _ => sign * (1.0 + mantissa / 1024.0) * 2f64.powi(exponent - 15),
    }
}

pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

pub fn bf16_bits_to_f64(b: u16) -> f64 {
    f32::from_bits((b as u32) << 16) as f64
}
