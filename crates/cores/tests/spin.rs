//! The reference handlers of cores/spin, compiled with the system C
//! compiler, run by the sPIN engine on messages cut into random chunks:
//! each result must equal the same computation done on the whole message,
//! and rulesets must route each message to its handler set (or to none).

use crate::support::cc;
use cc::selector;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::spin::{
    Budgets, Context, ContextMemory, Engine, Handlers, NativeHandlers, Outcome, Pool,
};
use corefarm_toolchain::{require_tool, Tool};
use rand::{Rng, SeedableRng};

/// A reference handler set alone in a shared object.
fn compile(dir: &Path, set: &str) -> PathBuf {
    cc::shared_object(
        &[cc::reference(set)],
        "c11",
        &[],
        &dir.join(format!("{set}.so")),
    )
}

const SETS: [(&str, u32); 4] = [("sum", 1), ("filter", 2), ("histogram", 3), ("strided", 4)];

/// An engine with the four reference sets, and each set's memory (its counters).
fn engine_and_memory(
    dir: &Path,
    pool: Arc<Pool>,
    budgets: Budgets,
) -> (Engine, Vec<Arc<ContextMemory>>) {
    let memories: Vec<_> = SETS
        .iter()
        .map(|_| Arc::new(ContextMemory::new(0, 2)))
        .collect();
    let contexts = SETS
        .iter()
        .zip(&memories)
        .map(|(&(set, word0), memory)| Context {
            ruleset: selector(word0),
            handlers: Arc::new(NativeHandlers::open(&compile(dir, set), set).unwrap()),
            memory: memory.clone(),
            budgets,
        })
        .collect();
    (Engine::new(contexts, pool).unwrap(), memories)
}

fn new_engine(dir: &Path, pool: Arc<Pool>, budgets: Budgets) -> Engine {
    engine_and_memory(dir, pool, budgets).0
}

fn header(word0: u32, params: [u32; 3]) -> Vec<u8> {
    [word0, params[0], params[1], params[2]]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// Feeds `msg` in chunks of random multiples of 16 bytes (the last one
/// whatever is left) and waits for the outcome.
fn run(engine: &Engine, id: u32, msg: &[u8], rng: &mut impl Rng) -> Option<Outcome> {
    let mut cuts = vec![0];
    while *cuts.last().unwrap() < msg.len() {
        let step = 16 * rng.gen_range(1..=64);
        cuts.push((cuts.last().unwrap() + step).min(msg.len()));
    }
    let bytes = Bytes::copy_from_slice(msg);
    let piece = |i: usize| bytes.slice(cuts[i]..cuts[i + 1]);
    let last = cuts.len() - 2;
    let mut m = engine
        .begin(id, msg.len() as u64)
        .first_chunk(piece(0), last == 0)?;
    for i in 1..=last {
        m.chunk(piece(i), i == last);
    }
    Some(m.finish(Duration::from_secs(60)).expect("tail ran").outcome)
}

#[test]
fn reference_handlers_match_the_whole_message_computation() {
    if !require_tool(
        Tool::Cxx,
        "reference_handlers_match_the_whole_message_computation",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let budgets = Budgets {
        scratch: 1 << 20,
        ..Budgets::default()
    };
    let engine = new_engine(dir.path(), Arc::new(Pool::new(4).unwrap()), budgets);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for round in 0..40u32 {
        let n = rng.gen_range(0..2000usize) * 16;
        let data: Vec<u8> = (0..n).map(|_| rng.gen()).collect();

        // sum of int32 values
        let mut msg = header(1, [0; 3]);
        msg.extend_from_slice(&data);
        let want: i64 = data
            .chunks_exact(4)
            .map(|w| i32::from_le_bytes(w.try_into().unwrap()) as i64)
            .sum();
        let got = run(&engine, round, &msg, &mut rng).unwrap();
        assert_eq!(
            got,
            Outcome::Result(want.to_le_bytes().to_vec()),
            "sum, round {round}"
        );

        // filter: records with the int32 at byte 4 >= threshold, in order
        let threshold: i32 = rng.gen_range(-1000..1000) * 1_000_000;
        let mut msg = header(2, [threshold as u32, 0, 0]);
        msg.extend_from_slice(&data);
        let want: Vec<u8> = data
            .chunks_exact(16)
            .filter(|r| i32::from_le_bytes(r[4..8].try_into().unwrap()) >= threshold)
            .flatten()
            .copied()
            .collect();
        let got = run(&engine, round, &msg, &mut rng).unwrap();
        let expect = if want.is_empty() {
            Outcome::Forward // nothing emitted: the cores get it, as spin.h says
        } else {
            Outcome::Result(want)
        };
        assert_eq!(got, expect, "filter, round {round}");

        // histogram of bytes
        let mut msg = header(3, [0; 3]);
        msg.extend_from_slice(&data);
        let mut bins = [0u64; 256];
        data.iter().for_each(|&b| bins[b as usize] += 1);
        let want: Vec<u8> = bins.iter().flat_map(|c| c.to_le_bytes()).collect();
        let got = run(&engine, round, &msg, &mut rng).unwrap();
        assert_eq!(got, Outcome::Result(want), "histogram, round {round}");

        // strided unpack: count blocks of `block` bytes every `stride` bytes
        let block = rng.gen_range(1..64u32);
        let stride = block + rng.gen_range(0..64u32);
        let count = rng.gen_range(1..200u32);
        let packed: Vec<u8> = (0..count * block).map(|_| rng.gen()).collect();
        let mut msg = header(4, [count, block, stride]);
        msg.extend_from_slice(&packed);
        let mut want = vec![0u8; (count * stride) as usize];
        for (i, blk) in packed.chunks(block as usize).enumerate() {
            let at = i * stride as usize;
            want[at..at + block as usize].copy_from_slice(blk);
        }
        let got = run(&engine, round, &msg, &mut rng).unwrap();
        assert_eq!(got, Outcome::Result(want), "strided, round {round}");
    }
}

#[test]
fn unmatched_failing_and_over_budget_messages() {
    if !require_tool(Tool::Cxx, "unmatched_failing_and_over_budget_messages") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pool = Arc::new(Pool::new(2).unwrap());
    let engine = new_engine(dir.path(), pool.clone(), Budgets::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    // No ruleset matches word 0 = 99: the message goes to the cores untouched.
    assert_eq!(run(&engine, 1, &header(99, [0; 3]), &mut rng), None);
    // The strided head refuses a datatype larger than the scratchpad
    // budget: that message fails with the handler's name, others go on.
    let too_big = header(4, [1 << 20, 16, 16]);
    match run(&engine, 2, &too_big, &mut rng).unwrap() {
        Outcome::Failed(why) => {
            assert!(
                why.contains("handler set strided") && why.contains("Head"),
                "{why}"
            )
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    let mut ok = header(1, [0; 3]);
    ok.extend_from_slice(&7i32.to_le_bytes());
    assert_eq!(
        run(&engine, 3, &ok, &mut rng),
        Some(Outcome::Result(7i64.to_le_bytes().to_vec()))
    );
    // An output budget smaller than the histogram: the tail's emit fails.
    let small = new_engine(
        dir.path(),
        pool,
        Budgets {
            output: 100,
            ..Budgets::default()
        },
    );
    match run(&small, 4, &header(3, [0; 3]), &mut rng).unwrap() {
        Outcome::Failed(why) => assert!(why.contains("output budget of 100"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn counters_and_names() {
    if !require_tool(Tool::Cxx, "counters_and_names") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let h = NativeHandlers::open(&compile(dir.path(), "sum"), "sum").unwrap();
    assert_eq!(h.name(), "handler set sum");
    assert!(NativeHandlers::open(&compile(dir.path(), "sum"), "nosuch")
        .err()
        .unwrap()
        .contains("defines none of nosuch_head"));
    assert!(NativeHandlers::open(Path::new("/nonexistent.so"), "sum").is_err());
    let pool = Arc::new(Pool::new(2).unwrap());
    let (engine, memories) = engine_and_memory(dir.path(), pool, Budgets::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut msg = header(1, [0; 3]);
    msg.extend_from_slice(&[1u8; 4096]);
    for id in 0..3 {
        assert!(matches!(
            run(&engine, id, &msg, &mut rng),
            Some(Outcome::Result(_))
        ));
    }
    // The sum set counted three messages of msg.len() bytes; the others none.
    assert_eq!(memories[0].counters(), vec![3, 3 * msg.len() as u64]);
    assert_eq!(memories[2].counters(), vec![0, 0]);
}
