// SPDX-License-Identifier: Apache-2.0
//! A library older than this crate's header: a real 0.2.0 build named by
//! `$FLASHDECODE_OLD_LIBRARY` (the CTest test rust_old_library builds it from
//! the git history with bindings/tools/old_library.sh). It loads and decodes
//! as 0.2 does; the 0.3 features fail with `Status::Unsupported`, naming the
//! version they need. Without the variable every test here passes vacuously.

use flashdecode::{AppendArgs, AttentionMask, DecodeArgs, Library, MergeArgs, Options, Status, Tensor, TensorMut};

fn old_library() -> Option<Library> {
    match std::env::var_os("FLASHDECODE_OLD_LIBRARY") {
        Some(path) if !path.is_empty() => Some(Library::open(&path).expect("the 0.2 library loads")),
        _ => {
            eprintln!("FLASHDECODE_OLD_LIBRARY names no 0.2 library: nothing to test");
            None
        }
    }
}

#[test]
fn loads_and_decodes_without_the_new_features() {
    let library = match old_library() {
        Some(library) => library,
        None => return,
    };
    assert_eq!(library.minor(), 2);
    assert!(library.version().starts_with("0.2."), "{}", library.version());
    assert!(library.functions().fd_check_contents.is_none());

    let q = vec![0.5f32; 2 * 8 * 64];
    let k = vec![0.25f32; 2 * 100 * 2 * 64];
    let v = vec![1.5f32; k.len()];
    let lens = [100, 37];
    let mut out = vec![0f32; q.len()];
    let mut handle = library.create_handle(&Options::cpu().num_threads(2)).unwrap();
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &[2, 1, 8, 64]).unwrap(),
        Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
        Tensor::f32(&v, &[2, 100, 2, 64]).unwrap(),
        TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap(),
    )
    .seq_lens(Tensor::i32(&lens, &[2]).unwrap())
    .num_splits(3);
    assert_eq!(handle.describe_plan(&args).unwrap().num_splits, 3);
    handle.decode(&mut args).unwrap();
    drop(args);
    assert!(out.iter().all(|&x| (x - 1.5).abs() < 1e-6));

    let needs = |error: flashdecode::Error, feature: &str| {
        assert_eq!(error.status(), Some(Status::Unsupported), "{}", error);
        let wanted = format!("{} needs libflashdecode 0.3 or later; ", feature);
        assert!(error.message().contains(&wanted), "{}", error);
        assert!(
            error.message().ends_with(&format!("is version {}", library.version())),
            "{}",
            error
        );
    };
    needs(
        library.create_handle(&Options::cpu().check_contents(true)).unwrap_err(),
        "check_contents",
    );
    needs(handle.check_contents().unwrap_err(), "check_contents");
    let mut q_out = q.clone();
    let mut args = DecodeArgs::in_place(
        TensorMut::f32(&mut q_out, &[2, 1, 8, 64]).unwrap(),
        Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
        Tensor::f32(&v, &[2, 100, 2, 64]).unwrap(),
    );
    needs(handle.decode(&mut args).unwrap_err(), "an in-place decode");
    drop(args);
    assert_eq!(q_out, q, "nothing written");
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &[2, 1, 8, 64]).unwrap(),
        Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
        Tensor::f32(&v, &[2, 100, 2, 64]).unwrap(),
        TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap(),
    )
    .split_tokens(64);
    needs(handle.decode(&mut args).unwrap_err(), "split_tokens");
    needs(handle.workspace_size(&args).unwrap_err(), "split_tokens");
    needs(handle.describe_plan(&args).unwrap_err(), "split_tokens");
    let mut args = args.split_tokens(0);
    handle.decode(&mut args).unwrap();
    drop(args);

    // The attention variants, each by the name of its builder method.
    let slopes = [0.5f32; 8];
    let variants: [(&str, for<'a> fn(DecodeArgs<'a>, &'a [f32]) -> DecodeArgs<'a>); 6] = [
        ("mask", |a, _| a.mask(AttentionMask::None)),
        ("window_left", |a, _| a.window_left(16)),
        ("logit_softcap", |a, _| a.logit_softcap(30.0)),
        ("alibi_slopes", |a, s| a.alibi_slopes(Tensor::f32(s, &[8]).unwrap())),
        ("sinks", |a, s| a.sinks(Tensor::f32(s, &[8]).unwrap())),
        ("q_lens", |a, _| {
            static Q_LENS: [i32; 2] = [1, 0];
            a.q_lens(Tensor::i32(&Q_LENS, &[2]).unwrap())
        }),
    ];
    for (feature, set) in variants {
        let mut args = set(
            DecodeArgs::new(
                Tensor::f32(&q, &[2, 1, 8, 64]).unwrap(),
                Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
                Tensor::f32(&v, &[2, 100, 2, 64]).unwrap(),
                TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap(),
            ),
            &slopes,
        );
        needs(handle.decode(&mut args).unwrap_err(), feature);
        needs(handle.describe_plan(&args).unwrap_err(), feature);
    }
    // Several query tokens are 0.2's own refusal.
    let q4 = vec![0.5f32; 2 * 4 * 8 * 64];
    let mut out4 = vec![0f32; q4.len()];
    let error = handle
        .decode(&mut DecodeArgs::new(
            Tensor::f32(&q4, &[2, 4, 8, 64]).unwrap(),
            Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
            Tensor::f32(&v, &[2, 100, 2, 64]).unwrap(),
            TensorMut::f32(&mut out4, &[2, 4, 8, 64]).unwrap(),
        ))
        .unwrap_err();
    assert_eq!(error.status(), Some(Status::Unsupported), "{}", error);
    assert!(error.message().contains("q_len must be 1"), "{}", error);

    assert!(library.functions().fd_merge_states.is_none());
    let lse = vec![0f32; 2 * 8];
    let mut merged = vec![0f32; q.len()];
    let mut args = MergeArgs::new(TensorMut::f32(&mut merged, &[2, 1, 8, 64]).unwrap()).state(
        Tensor::f32(&out, &[2, 1, 8, 64]).unwrap(),
        Tensor::f32(&lse, &[2, 1, 8]).unwrap(),
    );
    needs(handle.merge_states(&mut args).unwrap_err(), "merge_states");
    let mut scratch = vec![0f32; q.len()];
    let mut no_states = MergeArgs::new(TensorMut::f32(&mut scratch, &[2, 1, 8, 64]).unwrap());
    needs(handle.merge_states(&mut no_states).unwrap_err(), "merge_states"); // before any argument is read

    // 8-bit caches, their scales and append_kv are 0.3's.
    assert!(library.functions().fd_append_kv.is_none());
    let cache = vec![0i8; 2 * 100 * 2 * 64];
    let one = [0.5f32];
    let cache_shape = [2, 100, 2, 64];
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &[2, 1, 8, 64]).unwrap(),
        Tensor::i8(&cache, &cache_shape).unwrap(),
        Tensor::i8(&cache, &cache_shape).unwrap(),
        TensorMut::f32(&mut scratch, &[2, 1, 8, 64]).unwrap(),
    );
    needs(handle.decode(&mut args).unwrap_err(), "an 8-bit cache");
    drop(args);
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &[2, 1, 8, 64]).unwrap(),
        Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
        Tensor::i8(&cache, &cache_shape).unwrap(), // v alone 8-bit: refused as 0.3's too
        TensorMut::f32(&mut scratch, &[2, 1, 8, 64]).unwrap(),
    );
    needs(handle.decode(&mut args).unwrap_err(), "an 8-bit cache");
    drop(args);
    let mut args = DecodeArgs::new(
        Tensor::f32(&q, &[2, 1, 8, 64]).unwrap(),
        Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
        Tensor::f32(&v, &[2, 100, 2, 64]).unwrap(),
        TensorMut::f32(&mut scratch, &[2, 1, 8, 64]).unwrap(),
    )
    .v_scale(Tensor::scale_per_tensor(&one, &cache_shape).unwrap());
    needs(handle.decode(&mut args).unwrap_err(), "v_scale");
    drop(args);
    let new = vec![0f32; 2 * 2 * 64];
    let (mut k8, mut v8) = (cache.clone(), cache.clone());
    let mut args = AppendArgs::new(
        Tensor::f32(&new, &[2, 1, 2, 64]).unwrap(),
        Tensor::f32(&new, &[2, 1, 2, 64]).unwrap(),
        TensorMut::i8(&mut k8, &cache_shape).unwrap(),
        TensorMut::i8(&mut v8, &cache_shape).unwrap(),
    );
    needs(handle.append_kv(&mut args).unwrap_err(), "append_kv");
}

#[test]
fn validates_contents_as_0_2_did() {
    // 0.2's CPU backend checks seq_lens on every decode; 0.3 clamps unless asked to check.
    let library = match old_library() {
        Some(library) => library,
        None => return,
    };
    let q = vec![0.5f32; 2 * 8 * 64];
    let k = vec![0.25f32; 2 * 100 * 2 * 64];
    let mut out = vec![0f32; q.len()];
    let mut handle = library.create_handle(&Options::cpu().num_threads(2)).unwrap();
    let error = handle
        .decode(
            &mut DecodeArgs::new(
                Tensor::f32(&q, &[2, 1, 8, 64]).unwrap(),
                Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
                Tensor::f32(&k, &[2, 100, 2, 64]).unwrap(),
                TensorMut::f32(&mut out, &[2, 1, 8, 64]).unwrap(),
            )
            .seq_lens(Tensor::i32(&[100, 101], &[2]).unwrap()),
        )
        .unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidLength), "{}", error);
}
