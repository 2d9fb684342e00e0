//! The sampler chain through its public API: greedy picks, seeded reproducibility, each sampler's
//! analytic effect, the drawn distribution against the softmax, and the refusals.

use minfer::sampling::{argmax, Sampler, SamplingError, SamplingParams};

/// Plain sampling from the softmax: no truncation, no penalties, temperature 1.
fn unfiltered() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        repeat_penalty: 1.0,
        ..SamplingParams::default()
    }
}

fn sampler(params: SamplingParams) -> Sampler {
    Sampler::new(params).expect("valid parameters")
}

fn draw_counts(params: SamplingParams, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut sampler = sampler(params);
    let mut counts = vec![0; logits.len()];
    for _ in 0..draws {
        counts[sampler.sample(logits, &[]).unwrap() as usize] += 1;
    }
    counts
}

/// Deterministic pseudo-random logits in [-8, 8), generated without the crate's own generator.
fn noisy_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 16.0 - 8.0
        })
        .collect()
}

/// Feeds each drawn token back as history, as a generation loop does, so penalties take part.
fn generate(sampler: &mut Sampler, logits: &[f32], steps: usize) -> Vec<u32> {
    let mut history = vec![3, 1, 4, 1, 5];
    for _ in 0..steps {
        let token = sampler.sample(logits, &history).unwrap();
        history.push(token);
    }
    history.split_off(5)
}

#[test]
fn defaults_are_llama_cpp_sampling_defaults_with_seed_42() {
    let p = SamplingParams::default();
    assert_eq!(p.temperature, 0.8);
    assert_eq!(p.top_k, 40);
    assert_eq!(p.top_p, 0.95);
    assert_eq!(p.repeat_penalty, 1.1);
    assert_eq!(p.frequency_penalty, 0.0);
    assert_eq!(p.presence_penalty, 0.0);
    assert_eq!(p.penalty_last_n, 64);
    assert_eq!(p.seed, 42);
    assert_eq!(p.validate(), Ok(()));
    assert_eq!(SamplingParams::greedy().validate(), Ok(()));
}

#[test]
fn greedy_picks_the_argmax_with_ties_going_to_the_lowest_id() {
    let logits = [0.5, 2.0, 1.0, 2.0, -3.0];
    let mut greedy = sampler(SamplingParams::greedy());
    assert_eq!(greedy.sample(&logits, &[]), Ok(1));
    assert_eq!(argmax(&logits), Ok(1));
    assert_eq!(argmax(&[7.0; 9]), Ok(0));
    assert_eq!(argmax(&[f32::NEG_INFINITY, -1e30, f32::NEG_INFINITY]), Ok(1));
}

#[test]
fn greedy_ignores_the_history_because_its_penalties_are_neutral() {
    let logits = [0.5, 2.0, 1.0];
    let mut greedy = sampler(SamplingParams::greedy());
    assert_eq!(greedy.sample(&logits, &[1, 1, 1, 1]), Ok(1));
}

#[test]
fn temperature_zero_still_applies_the_penalties_before_the_argmax() {
    let logits = [2.0, 1.9, -0.5];
    let mut sampler = sampler(SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    });
    assert_eq!(sampler.sample(&logits, &[]), Ok(0));
    // 2.0 / 1.1 = 1.82 falls below 1.9.
    assert_eq!(sampler.sample(&logits, &[0]), Ok(1));
}

#[test]
fn the_same_seed_reproduces_the_same_token_sequence() {
    let logits = noisy_logits(1000, 1);
    let mut a = sampler(SamplingParams::default());
    let mut b = sampler(SamplingParams::default());
    let first = generate(&mut a, &logits, 500);
    assert_eq!(first, generate(&mut b, &logits, 500));
    // Not a constant sequence, or the comparison would prove nothing.
    assert!(first.iter().any(|&t| t != first[0]));

    a.reset();
    assert_eq!(first, generate(&mut a, &logits, 500));
}

#[test]
fn different_seeds_give_different_token_sequences() {
    let logits = noisy_logits(1000, 2);
    let runs: Vec<Vec<u32>> = [42, 43, 0, u64::MAX]
        .into_iter()
        .map(|seed| {
            generate(
                &mut sampler(SamplingParams {
                    seed,
                    ..SamplingParams::default()
                }),
                &logits,
                200,
            )
        })
        .collect();
    for i in 0..runs.len() {
        for j in i + 1..runs.len() {
            assert_ne!(runs[i], runs[j], "runs {i} and {j}");
        }
    }
}

#[test]
fn top_k_1_always_returns_the_argmax_whatever_the_temperature() {
    let logits = noisy_logits(5000, 3);
    let best = argmax(&logits).unwrap();
    for temperature in [1e-6, 0.8, 1.0, 5.0, 1e6] {
        let mut sampler = sampler(SamplingParams {
            temperature,
            top_k: 1,
            top_p: 1.0,
            ..SamplingParams::default()
        });
        for _ in 0..200 {
            assert_eq!(sampler.sample(&logits, &[]), Ok(best), "temperature {temperature}");
        }
    }
}

#[test]
fn top_k_only_ever_draws_among_the_k_highest_logits() {
    let logits = noisy_logits(2000, 4);
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    let kept = &order[..5];
    let counts = draw_counts(
        SamplingParams {
            top_k: 5,
            temperature: 100.0,
            ..unfiltered()
        },
        &logits,
        5000,
    );
    for (id, &count) in counts.iter().enumerate() {
        assert_eq!(count > 0, kept.contains(&(id as u32)), "token {id} drawn {count} times");
    }
}

#[test]
fn top_p_keeps_exactly_the_analytic_prefix() {
    // Token probabilities 0.3, 0.05, 0.5, 0.15: the best-first order is 2, 0, 3, 1.
    let logits = [0.3f32.ln(), 0.05f32.ln(), 0.5f32.ln(), 0.15f32.ln()];
    for (top_p, kept) in [
        (0.4, &[2][..]),
        (0.5, &[2]),
        (0.7, &[2, 0]),
        (0.8, &[2, 0]),
        (0.81, &[2, 0, 3]),
        (0.95, &[2, 0, 3]),
        (0.96, &[2, 0, 3, 1]),
        (1.0, &[2, 0, 3, 1]),
    ] {
        // A high temperature flattens what is kept, so every kept token shows up, but runs after
        // top-p and so cannot change the set.
        let counts = draw_counts(
            SamplingParams {
                top_p,
                temperature: 10.0,
                ..unfiltered()
            },
            &logits,
            4000,
        );
        for (id, &count) in counts.iter().enumerate() {
            assert_eq!(
                count > 0,
                kept.contains(&(id as u32)),
                "top_p {top_p}: token {id} drawn {count} times"
            );
        }
    }
}

#[test]
fn top_p_renormalises_the_kept_tokens() {
    // With probabilities 0.5 and 0.3 kept, draws split 5 : 3.
    let logits = [0.3f32.ln(), 0.05f32.ln(), 0.5f32.ln(), 0.15f32.ln()];
    let n = 20_000;
    let counts = draw_counts(
        SamplingParams {
            top_p: 0.7,
            ..unfiltered()
        },
        &logits,
        n,
    );
    let expected = 0.5 / 0.8 * n as f64;
    let sigma = (n as f64 * 0.625 * 0.375).sqrt();
    assert!((counts[2] as f64 - expected).abs() < 5.0 * sigma, "{counts:?}");
    assert_eq!(counts[0] + counts[2], n);
}

/// Which of token 0 (the penalised one) and a probe logit at token 1 greedy picks tells whether
/// the penalised logit lies above or below the probe.
fn penalised_above(logit: f32, probe: f32, history: &[u32], params: SamplingParams) -> bool {
    let mut sampler = sampler(SamplingParams {
        temperature: 0.0,
        ..params
    });
    sampler.sample(&[logit, probe], history).unwrap() == 0
}

#[test]
fn penalties_match_llama_cpp_on_a_tiny_row() {
    let params = SamplingParams {
        repeat_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplingParams::default()
    };
    // A positive logit is divided: 3 / 2 - 2 * 0.5 - 0.25 = 0.25.
    assert!(penalised_above(3.0, 0.249, &[0, 0], params.clone()));
    assert!(!penalised_above(3.0, 0.251, &[0, 0], params.clone()));
    // A negative logit is multiplied: -1 * 2 - 3 * 0.5 - 0.25 = -3.75.
    assert!(penalised_above(-1.0, -3.751, &[0, 0, 0], params.clone()));
    assert!(!penalised_above(-1.0, -3.749, &[0, 0, 0], params.clone()));
    // Zero counts as non-positive: 0 * 2 - 0.5 - 0.25 = -0.75.
    assert!(penalised_above(0.0, -0.751, &[0], params.clone()));
    assert!(!penalised_above(0.0, -0.749, &[0], params.clone()));
    // A token outside the history keeps its logit: here the probe is penalised and token 0 is not.
    assert!(penalised_above(1.0, 1.001, &[1], params.clone()));
}

#[test]
fn negative_frequency_and_presence_penalties_reward_repetition() {
    let params = SamplingParams {
        repeat_penalty: 1.0,
        frequency_penalty: -0.5,
        presence_penalty: -0.25,
        ..SamplingParams::default()
    };
    // 1 + 2 * 0.5 + 0.25 = 2.25.
    assert!(penalised_above(1.0, 2.249, &[0, 0], params.clone()));
    assert!(!penalised_above(1.0, 2.251, &[0, 0], params.clone()));
}

#[test]
fn only_the_last_penalty_last_n_tokens_are_penalised() {
    let with_last_n = |penalty_last_n| SamplingParams {
        repeat_penalty: 2.0,
        penalty_last_n,
        ..SamplingParams::default()
    };
    let logits = [1.0, 0.9];
    let history = [1, 0];
    let pick = |n| {
        sampler(SamplingParams {
            temperature: 0.0,
            ..with_last_n(n)
        })
        .sample(&logits, &history)
    };
    // Nothing penalised: 1.0 wins.
    assert_eq!(pick(0), Ok(0));
    // Window [0]: 0.5 against 0.9.
    assert_eq!(pick(1), Ok(1));
    // Window [1, 0]: 0.5 against 0.45.
    assert_eq!(pick(2), Ok(0));
    assert_eq!(pick(usize::MAX), Ok(0));

    // Occurrences before the window do not count towards the frequency penalty: 3 - 2 * 1 = 1.
    let params = SamplingParams {
        repeat_penalty: 1.0,
        frequency_penalty: 1.0,
        penalty_last_n: 2,
        ..SamplingParams::default()
    };
    assert!(penalised_above(3.0, 0.99, &[0, 0, 0, 0], params.clone()));
    assert!(!penalised_above(3.0, 1.01, &[0, 0, 0, 0], params));
}

#[test]
fn twenty_thousand_draws_match_the_softmax_within_five_standard_errors() {
    let logits = [0.0f32, 1.0, 2.0, 0.5];
    let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
    let n = 20_000;
    for seed in [42, 7, 123_456_789] {
        let counts = draw_counts(SamplingParams { seed, ..unfiltered() }, &logits, n);
        for (id, &count) in counts.iter().enumerate() {
            let p = f64::from(logits[id]).exp() / z;
            let expected = p * n as f64;
            let sigma = (n as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (count as f64 - expected).abs() < 5.0 * sigma,
                "seed {seed}, token {id}: {count} draws, expected {expected:.0} ± {sigma:.0}"
            );
        }
    }
}

#[test]
fn temperature_scales_the_distribution() {
    // At temperature 2 the softmax of [0, 2] is that of [0, 1].
    let n = 20_000;
    let counts = draw_counts(
        SamplingParams {
            temperature: 2.0,
            ..unfiltered()
        },
        &[0.0, 2.0],
        n,
    );
    let p = 1.0 / (1.0 + (-1.0f64).exp());
    let sigma = (n as f64 * p * (1.0 - p)).sqrt();
    assert!((counts[1] as f64 - p * n as f64).abs() < 5.0 * sigma, "{counts:?}");
}

#[test]
fn temperature_approaching_zero_concentrates_on_the_argmax() {
    let logits = [1.0, 1.5, 0.5, 1.49];
    for temperature in [1e-3, 1e-6, 1e-30, f32::MIN_POSITIVE, 1e-45] {
        let counts = draw_counts(
            SamplingParams {
                temperature,
                ..unfiltered()
            },
            &logits,
            1000,
        );
        assert_eq!(counts, [0, 1000, 0, 0], "temperature {temperature}");
    }
    // Whereas at temperature 1 every token shows up.
    let counts = draw_counts(unfiltered(), &logits, 1000);
    assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
}

#[test]
fn masked_tokens_are_never_drawn() {
    let logits = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0];
    let counts = draw_counts(unfiltered(), &logits, 2000);
    assert_eq!(counts[0] + counts[2], 0);
    assert!(counts[1] > 0 && counts[3] > 0);
}

#[test]
fn a_full_vocabulary_row_samples_within_top_k_with_the_defaults() {
    let logits = noisy_logits(152_064, 5);
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    let mut defaults = sampler(SamplingParams::default());
    let mut top_p_only = sampler(SamplingParams {
        top_k: 0,
        ..SamplingParams::default()
    });
    for _ in 0..50 {
        let token = defaults.sample(&logits, &[]).unwrap();
        assert!(order[..40].contains(&token), "token {token}");
        // Top-p alone over this nearly flat row keeps most of it; the draw must still be a token.
        let token = top_p_only.sample(&logits, &[]).unwrap();
        assert!((token as usize) < logits.len());
    }
}

#[test]
fn invalid_parameters_are_errors_naming_the_parameter_and_value() {
    let cases = [
        (
            "temperature",
            SamplingParams {
                temperature: -0.5,
                ..SamplingParams::default()
            },
        ),
        (
            "temperature",
            SamplingParams {
                temperature: f32::NAN,
                ..SamplingParams::default()
            },
        ),
        (
            "temperature",
            SamplingParams {
                temperature: f32::INFINITY,
                ..SamplingParams::default()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: 0.0,
                ..SamplingParams::default()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: 1.5,
                ..SamplingParams::default()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: -0.1,
                ..SamplingParams::default()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: f32::NAN,
                ..SamplingParams::default()
            },
        ),
        (
            "repeat_penalty",
            SamplingParams {
                repeat_penalty: 0.0,
                ..SamplingParams::default()
            },
        ),
        (
            "repeat_penalty",
            SamplingParams {
                repeat_penalty: -1.1,
                ..SamplingParams::default()
            },
        ),
        (
            "repeat_penalty",
            SamplingParams {
                repeat_penalty: f32::NAN,
                ..SamplingParams::default()
            },
        ),
        (
            "frequency_penalty",
            SamplingParams {
                frequency_penalty: f32::INFINITY,
                ..SamplingParams::default()
            },
        ),
        (
            "presence_penalty",
            SamplingParams {
                presence_penalty: f32::NAN,
                ..SamplingParams::default()
            },
        ),
    ];
    for (parameter, params) in cases {
        let err = Sampler::new(params.clone()).expect_err(parameter);
        match &err {
            SamplingError::InvalidParameter { name, .. } => assert_eq!(*name, parameter),
            other => panic!("{parameter}: unexpected {other:?}"),
        }
        assert!(
            matches!(params.validate(), Err(SamplingError::InvalidParameter { name, .. }) if name == parameter),
            "{parameter}"
        );
        assert!(err.to_string().contains(parameter), "{err}");
    }
    let err = Sampler::new(SamplingParams {
        temperature: -0.5,
        ..SamplingParams::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("temperature = -0.5"), "{err}");
}

#[test]
fn extreme_but_meaningful_parameters_are_accepted() {
    for params in [
        SamplingParams {
            top_k: -1,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_k: i32::MAX,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 1e-9,
            ..SamplingParams::default()
        },
        SamplingParams {
            repeat_penalty: 0.5,
            ..SamplingParams::default()
        },
        SamplingParams {
            frequency_penalty: -2.0,
            presence_penalty: -2.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            penalty_last_n: 0,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
    ] {
        let mut sampler = Sampler::new(params.clone()).unwrap();
        assert!(sampler.sample(&[0.1, 0.4, 0.2], &[1, 2, 1]).is_ok(), "{params:?}");
    }
}

#[test]
fn nan_and_positive_infinite_logits_are_errors_naming_the_index() {
    let mut sampler = sampler(SamplingParams::default());
    let err = sampler.sample(&[0.0, 1.0, f32::NAN, 2.0], &[]).unwrap_err();
    assert!(
        matches!(err, SamplingError::InvalidLogit { index: 2, value } if value.is_nan()),
        "{err:?}"
    );
    assert!(err.to_string().contains("logits[2]"), "{err}");
    assert_eq!(
        sampler.sample(&[0.0, f32::INFINITY], &[]),
        Err(SamplingError::InvalidLogit {
            index: 1,
            value: f32::INFINITY
        })
    );
    assert!(matches!(
        argmax(&[f32::NAN]),
        Err(SamplingError::InvalidLogit { index: 0, .. })
    ));
    let mut greedy = self::sampler(SamplingParams::greedy());
    assert!(matches!(
        greedy.sample(&[1.0, f32::NAN], &[]),
        Err(SamplingError::InvalidLogit { index: 1, .. })
    ));
}

#[test]
fn an_empty_row_is_an_error() {
    assert_eq!(
        sampler(SamplingParams::default()).sample(&[], &[]),
        Err(SamplingError::EmptyLogits)
    );
    assert_eq!(argmax(&[]), Err(SamplingError::EmptyLogits));
}

#[test]
fn a_fully_masked_row_is_an_error_rather_than_an_arbitrary_token() {
    let row = [f32::NEG_INFINITY; 8];
    assert_eq!(
        sampler(SamplingParams::default()).sample(&row, &[]),
        Err(SamplingError::NoViableToken)
    );
    assert_eq!(
        sampler(SamplingParams::greedy()).sample(&row, &[]),
        Err(SamplingError::NoViableToken)
    );
    assert_eq!(argmax(&row), Err(SamplingError::NoViableToken));
}

#[test]
fn a_history_token_outside_the_row_is_an_error() {
    let mut sampler = sampler(SamplingParams::default());
    assert_eq!(
        sampler.sample(&[0.0, 1.0], &[0, 2]),
        Err(SamplingError::TokenOutOfRange { token: 2, n_vocab: 2 })
    );
    // Outside the penalty window it is never read.
    let mut sampler = self::sampler(SamplingParams {
        penalty_last_n: 1,
        ..SamplingParams::default()
    });
    assert!(sampler.sample(&[0.0, 1.0], &[7, 0]).is_ok());
}
