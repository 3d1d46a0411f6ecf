use super::*;

#[test]
fn result_check_accepts_echoed_tags_only() {
    let sent = InFlight {
        ts: 123_456_789,
        count: 3,
    };
    let mut out = vec![0xAAu8; 3 * 20];
    for (i, o) in out.chunks_exact_mut(20).enumerate() {
        stamp(o, sent.ts, 7, i as u32);
    }
    assert_eq!(check_result(&out, 7, &sent, 20), None);
    // Wrong size.
    assert!(check_result(&out[..40], 7, &sent, 20)
        .unwrap()
        .contains("expected 3 outputs"));
    // Timestamp of the second output not echoed.
    let mut bad = out.clone();
    bad[20] ^= 1;
    assert!(check_result(&bad, 7, &sent, 20)
        .unwrap()
        .contains("output 1"));
    // Outputs swapped between messages (ids differ).
    assert!(check_result(&out, 8, &sent, 20).is_some());
}

#[test]
fn options_are_validated() {
    let mut o = UserBenchOptions {
        input_size: 8,
        ..Default::default()
    };
    assert!(validate(&o).is_err());
    o.input_size = 16;
    assert!(validate(&o).is_ok());
    o.count = 0;
    assert!(validate(&o).is_err());
    o.count = 1 << 20;
    o.input_size = 1 << 10;
    assert!(validate(&o).unwrap_err().to_string().contains("SMP limit"));
    o.count = 1;
    o.rate_hz = Some(0.0);
    assert!(validate(&o).is_err());
}
