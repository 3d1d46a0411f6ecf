//! A message fed to the handler worker piece by piece as it arrives
//! (`HandlerWorker::begin`, `feed`, `finish`: what a node does with the
//! chunks of a message on a link that negotiated chunks) runs its payload
//! handlers before its last bytes exist. The observable: the payload
//! handler writes one byte to a FIFO per chunk, and the test reads the
//! first one before it has fed the rest of the message.

use crate::support::cc;

use std::io::Read;
use std::path::Path;
use std::process::Command;

use corefarm_cores::spin::{BudgetSpec, HandlerSet, Mode, Outcome, Rule, Ruleset};
use corefarm_cores::worker::HandlerWorker;
use corefarm_cores::{LoadOptions, WorkerCommand};

const PROBE: &str = r#"
#include <corefarm/spin.h>
#include <fcntl.h>
#include <unistd.h>

int probe_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    int fd = open(PROBE_FIFO, O_WRONLY);
    if (fd < 0) return 3;
    char b = (char)('0' + a->chunk_index);
    int ok = write(fd, &b, 1) == 1;
    close(fd);
    __atomic_fetch_add((uint64_t *)a->scratch, 1, __ATOMIC_RELAXED);
    return ok ? 0 : 4;
}

int probe_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    uint64_t n = __atomic_load_n((uint64_t *)a->scratch, __ATOMIC_ACQUIRE);
    return ops->emit(ops->ctx, (const uint8_t *)&n, sizeof n);
}
"#;

fn compile(dir: &Path, fifo: &Path) -> Vec<u8> {
    let define = format!("PROBE_FIFO=\"{}\"", fifo.display());
    cc::from_text(dir, "probe", PROBE, "gnu11", &[define])
}

#[test]
fn payload_handlers_run_before_the_last_chunk_is_fed() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("probe.fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success(), "mkfifo");
    let set = HandlerSet {
        name: "probe".into(),
        ruleset: Ruleset {
            mode: Mode::And,
            rules: vec![Rule {
                index: 0,
                mask: u32::MAX,
                start: 0x50,
                end: 0x50,
            }],
        },
        budgets: BudgetSpec {
            scratch: 64,
            counters: 1,
            ..BudgetSpec::default()
        },
        result_type: None,
    };
    let opts = LoadOptions {
        worker: WorkerCommand::Program(env!("CARGO_BIN_EXE_corefarm-core-worker").into()),
        ..LoadOptions::default()
    };
    let mut w = HandlerWorker::start(&compile(dir.path(), &fifo), vec![set], 2, &opts).unwrap();
    let mut msg = [0u8; 64];
    msg[0] = 0x50;
    let ctx = w.select(&msg[..16]).expect("the probe set matches");
    w.begin(ctx, 1, msg.len() as u64).unwrap();
    // Three of the four 16-byte chunks: their payload handlers run now.
    w.feed(&msg[..48], 16);
    // Read and write: the FIFO never reads as ended between two handlers.
    let mut probe = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let mut b = [0u8; 3];
        let n = probe.read(&mut b).unwrap();
        assert!(n > 0, "the handlers stopped writing");
        seen.extend_from_slice(&b[..n]);
    }
    seen.sort();
    assert_eq!(
        seen, b"012",
        "three payload handlers ran, the last chunk unfed"
    );
    w.feed(&msg[48..], 16);
    let mut last = [0u8; 1];
    probe.read_exact(&mut last).unwrap();
    assert_eq!(&last, b"3");
    let done = w.finish();
    assert_eq!(done.outcome, Outcome::Result(4u64.to_le_bytes().to_vec()));

    // A message the node stops feeding midway fails, and the next works.
    w.begin(ctx, 2, 64).unwrap();
    w.feed(&msg[..16], 16);
    probe.read_exact(&mut last).unwrap();
    match w.finish().outcome {
        Outcome::Failed(why) => assert!(why.contains("after 16 of its 64 bytes"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    w.begin(ctx, 3, 16).unwrap();
    w.feed(&msg[..16], 16);
    probe.read_exact(&mut last).unwrap();
    assert_eq!(
        w.finish().outcome,
        Outcome::Result(1u64.to_le_bytes().to_vec())
    );
}
