// SPDX-License-Identifier: Apache-2.0
//! A small decode on the CPU backend: two sequences of different lengths
//! (a ragged batch), 8 query heads over 2 KV heads, f32, with the
//! log-sum-exp. Prints the plan and a few outputs, and checks one output row
//! against a float64 computation.
//!
//! ```sh
//! FLASHDECODE_LIBRARY=$PWD/../../build/stage/lib/libflashdecode.so.0 cargo run --example decode
//! ```

use flashdecode::{DecodeArgs, Library, Options, Tensor, TensorMut};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (batch, heads, kv_heads, capacity, dim) = (2i64, 8i64, 2i64, 64i64, 16i64);
    let lens = [64i32, 7]; // tokens of each sequence; the rest of the cache is never read
    let q: Vec<f32> = (0..batch * heads * dim)
        .map(|i| ((i % 5) as f32 - 2.0) * 0.25)
        .collect();
    let k: Vec<f32> = (0..batch * capacity * kv_heads * dim)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1)
        .collect();
    let v: Vec<f32> = (0..k.len()).map(|i| (i % 13) as f32).collect();
    let mut out = vec![0f32; q.len()];
    let mut lse = vec![0f32; (batch * heads) as usize];

    let library = Library::load()?; // $FLASHDECODE_LIBRARY, else libflashdecode.so.0
    let mut handle = library.create_handle(&Options::cpu())?;
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &[batch, 1, heads, dim])?,
        Tensor::f32(&k, &[batch, capacity, kv_heads, dim])?,
        Tensor::f32(&v, &[batch, capacity, kv_heads, dim])?,
        TensorMut::f32(&mut out, &[batch, 1, heads, dim])?,
    )
    .seq_lens(Tensor::i32(&lens, &[batch])?)
    .lse(TensorMut::f32(&mut lse, &[batch, 1, heads])?);
    let plan = handle.describe_plan(&args)?;
    handle.decode(&mut args)?;
    drop(args); // releases the borrows of out and lse

    println!("flashdecode {} on {:?}", library.version(), handle.backend());
    println!(
        "plan: kernel {}, {} split(s) of {} tokens, merge {:?}",
        plan.kernel, plan.num_splits, plan.split_tokens, plan.merge
    );
    for b in 0..batch as usize {
        let row = &out[b * (heads * dim) as usize..][..4];
        println!(
            "sequence {} ({} tokens), head 0: out[..4] = {:?}, lse = {:.4}",
            b,
            lens[b],
            row,
            lse[b * heads as usize]
        );
    }

    // Sequence 1, query head 5 (KV head 5 / (8 / 2) = 1), in float64.
    let (b, h, g) = (1usize, 5usize, 1usize);
    let (heads, kv_heads, capacity, dim) = (heads as usize, kv_heads as usize, capacity as usize, dim as usize);
    let scale = 1.0 / (dim as f64).sqrt();
    let key = |j: usize, d: usize| ((b * capacity + j) * kv_heads + g) * dim + d;
    let scores: Vec<f64> = (0..lens[b] as usize)
        .map(|j| {
            scale
                * (0..dim)
                    .map(|d| q[(b * heads + h) * dim + d] as f64 * k[key(j, d)] as f64)
                    .sum::<f64>()
        })
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    for d in 0..dim {
        let expected: f64 = scores
            .iter()
            .enumerate()
            .map(|(j, s)| (s - max).exp() / sum * v[key(j, d)] as f64)
            .sum();
        let got = out[(b * heads + h) * dim + d] as f64;
        if (got - expected).abs() > 1e-4 * expected.abs().max(1.0) {
            return Err(format!("out[{}][{}][{}] is {}, float64 says {}", b, h, d, got, expected).into());
        }
    }
    let expected_lse = max + sum.ln();
    if (lse[b * heads + h] as f64 - expected_lse).abs() > 1e-4 {
        return Err(format!(
            "lse[{}][{}] is {}, float64 says {}",
            b,
            h,
            lse[b * heads + h],
            expected_lse
        )
        .into());
    }
    println!("sequence 1, head 5 matches a float64 computation");
    Ok(())
}
