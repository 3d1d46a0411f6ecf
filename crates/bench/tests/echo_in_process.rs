//! Runs the echo benchmark against its in-process server and checks that
//! every message came back intact (the client compares each echoed byte).

use std::time::Duration;

use corefarm_bench::cpu::CpuTarget;
use corefarm_bench::echo::{run, EchoOptions};

#[test]
fn in_process_echo_round_trips_intact() {
    for (size, clients) in [(1usize, 2usize), (100_000, 1)] {
        let rep = run(&EchoOptions {
            addr: None,
            size,
            clients,
            duration: Duration::from_millis(400),
            warmup: Duration::from_millis(100),
            verify: true,
            // The server runs in this process: its CPU is ours.
            cpu_watch: vec![CpuTarget {
                label: "self".into(),
                pid: std::process::id(),
            }],
        })
        .unwrap();
        assert_eq!(rep.errors, 0, "{:?}", rep.error_samples);
        assert!(rep.messages > 0, "nothing echoed in the window: {rep:?}");
        assert_eq!(rep.bytes, rep.messages * size as u64);
        assert!(rep.total_messages >= rep.messages);
        assert!(rep.throughput_bps > 0.0);
        // Echoing kept this process busy for the whole window.
        assert_eq!(rep.cpu.len(), 1, "{rep:?}");
        assert_eq!(rep.cpu[0].label, "self");
        assert!(rep.cpu[0].cpu_s > 0.0, "{:?}", rep.cpu);
    }
}
