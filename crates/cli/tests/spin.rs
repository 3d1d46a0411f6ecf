//! Streaming handlers through a real node (`corefarm local`, one node): an
//! image built by `corefarm image build --handlers` carries the reference
//! handler sets of cores/spin and an echo core. Each reference set's
//! result is exactly the whole-message computation — the bytes the handlers
//! emitted, no padding (the client agrees `any-length`; a seed-format
//! client still gets them padded to its fixed size) — an unmatched message goes
//! to the core, a handler that crashes, loops or overruns its output
//! budget fails only its message (the next one succeeds), and an image
//! whose handler set does not exist is refused at configuration. All of it
//! with and without chunks on the server↔node link.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_cores::image::{self, Image};
use corefarm_cores::spin::HandlerSet;
use rand::{Rng, SeedableRng};
use tools::Tool;

use crate::support;
use crate::tools;

const INPUT: usize = 16;
const OUTPUT: usize = 64;

/// One input of 16 bytes, one output of 64 (the handlers answer instead).
const ECHO: &str = include_str!("../../../tests/fixtures/spin/echo.cpp");

/// The reference sets as shipped (`cores/spin/sets.json`), with a time
/// budget no scheduling delay of a loaded machine comes near (the default
/// second is, when the test binaries share 2 CPUs with a build), and the
/// misbehaving sets of `faulty.c`. Only the hang set's time budget is under
/// test.
fn sets_json() -> String {
    let shipped = std::fs::read_to_string(root().join("cores/spin/sets.json")).unwrap();
    let mut sets: Vec<serde_json::Value> = serde_json::from_str(&shipped).unwrap();
    for s in &mut sets {
        s["budgets"]["per_call_ms"] = 60_000.into();
    }
    let names: Vec<&str> = sets.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["sum", "filter", "histogram", "strided"],
        "the shipped sets"
    );
    let set = |name: &str, word0: u32, budgets: &str| {
        format!(
            r#"{{"name":"{name}","ruleset":{{"mode":"and","rules":[{{"index":0,"mask":4294967295,"start":{word0},"end":{word0}}}]}},"budgets":{{"scratch":1048576{budgets}}}}}"#
        )
    };
    let faulty = [
        set("crash", 5, r#","per_call_ms":60000"#),
        set("hang", 6, r#","per_call_ms":300"#),
        set("greedy", 7, r#","output":10000,"per_call_ms":60000"#),
        r#"{"name":"never","ruleset":{"mode":"or","rules":[{"index":0,"mask":0,"start":1,"end":0}]}}"#.into(),
    ];
    for f in faulty {
        sets.push(serde_json::from_str(&f).unwrap());
    }
    serde_json::to_string(&sets).unwrap()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn build_image(dir: &Path) -> Bytes {
    let sources: Vec<PathBuf> = ["sum", "filter", "histogram", "strided", "faulty"]
        .iter()
        .map(|s| root().join(format!("cores/spin/{s}.c")))
        .collect();
    support::handler_image(dir, "spin-demo", ECHO, &sets_json(), &sources)
}

fn header(word0: u32, params: [u32; 3]) -> Vec<u8> {
    [word0, params[0], params[1], params[2]]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// What a seed-format user gets for handler output `want`: padded with
/// zeros to the message's result size (inputs × 64 bytes).
fn padded(msg_len: usize, mut want: Vec<u8>) -> Vec<u8> {
    want.resize(msg_len / INPUT * OUTPUT, 0);
    want
}

/// `got` is exactly `want`, which is not the fixed size: nothing padded.
fn exactly(got: Vec<u8>, msg_len: usize, want: Vec<u8>, what: &str) {
    assert_ne!(
        want.len(),
        msg_len / INPUT * OUTPUT,
        "{what}: pick another size"
    );
    assert_eq!(got.len(), want.len(), "{what}: the emitted length");
    assert_eq!(got, want, "{what}");
}

fn one(client: &Client, msg: &[u8]) -> Result<Vec<u8>, String> {
    let mut r: Vec<_> = client
        .map(std::iter::once(Bytes::copy_from_slice(msg)), 1)
        .collect();
    assert_eq!(r.len(), 1);
    r.pop()
        .unwrap()
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}

fn sum_of_seven(client: &Client) {
    let mut msg = header(1, [0; 3]);
    msg.extend_from_slice(&[7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let got = one(client, &msg).expect("the next message succeeds");
    exactly(got, msg.len(), 7i64.to_le_bytes().to_vec(), "sum of seven");
}

#[test]
fn streaming_handlers_on_a_real_node() {
    every_case(&[]);
}

/// The same with chunks on the node link: messages of more than 1 KiB reach
/// the node as chunks, and the handlers of a matched message are fed each
/// chunk as it arrives (results are the same, byte for byte).
#[test]
fn streaming_handlers_on_a_real_node_with_chunks_on_the_wire() {
    every_case(&["--node-chunk-size", "1024"]);
}

/// A client with the cluster's node: `corefarm local` prints its address
/// once the node has joined, which the server lets it do only after its
/// hello was answered, so a configuration cannot overtake that answer.
fn connect_after_hello(users: &str) -> Client {
    Client::connect(
        users,
        ClientOptions {
            nodes: Some(1),
            io_timeout: Some(Duration::from_secs(60)),
            ..ClientOptions::default()
        },
    )
    .unwrap()
}

/// A handler result longer than one message on the link (`--max-message`
/// less the id) fails that message with the limit; the next one succeeds.
#[test]
fn a_handler_result_beyond_one_message_fails_with_the_limit() {
    if !tools::available(&[Tool::Cxx], "this test compiles handlers and a core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path());
    // Room for the configuration (the image), not for the result below.
    let limit = (image.len() + 4096).max(64 << 10);
    let count = (limit / 64 + 100) as u32;
    assert!(
        count as usize * 64 + 16 <= 1 << 20,
        "the strided scratchpad holds it"
    );
    let (_local, users) = support::local_cluster(1, &["--max-message", &limit.to_string()]);
    let client = connect_after_hello(&users);
    client
        .configure(&image::configuration(image).unwrap())
        .unwrap();
    let e = one(&client, &header(4, [count, 16, 64])).unwrap_err();
    let want = format!(
        "handler set strided: emitted {} bytes, more than one result message carries on this \
         link ({} bytes)",
        count * 64,
        limit - 4
    );
    assert!(e.contains(&want), "{e}");
    sum_of_seven(&client);
}

/// A handler result longer than count × output size is held in the node's
/// memory guard until it is sent: one the guard cannot hold (`--memory-limit`
/// 64 KiB, a 128 000-byte result of a one-input message) fails that message
/// with the sizes (the node says `too-large`; the server passes it on as
/// the failed input of a core, like every node failure); its bytes and the
/// message's own go back, so the next one succeeds.
#[test]
fn a_handler_result_beyond_the_node_memory_guard_fails_with_its_size() {
    if !tools::available(&[Tool::Cxx], "this test compiles handlers and a core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path());
    let limit = 64 << 10;
    let (_local, users) = support::local_cluster(1, &["--memory-limit", &limit.to_string()]);
    let client = connect_after_hello(&users);
    client
        .configure(&image::configuration(image).unwrap())
        .unwrap();
    let count = 2000u32;
    let e = one(&client, &header(4, [count, 16, 64])).unwrap_err();
    let want = format!(
        "handler set strided: a result of {} bytes needs {} bytes more than the 64 reserved",
        count * 64,
        count * 64 - 64
    );
    assert!(e.contains(&want), "{e}");
    assert!(e.contains(&format!("of its {limit} bytes free")), "{e}");
    sum_of_seven(&client);
    // A longer result that fits is sent as emitted.
    let got = one(&client, &header(4, [300, 16, 64])).expect("300 × 64 bytes fit");
    assert_eq!(got.len(), 300 * 64);
}

fn every_case(extra: &[&str]) {
    if !tools::available(&[Tool::Cxx], "this test compiles handlers and a core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path());
    let manifest = Image::parse(image.clone()).unwrap().manifest;
    assert_eq!(manifest.handler_sets.len(), 8);
    let (_local, users) = support::local_cluster(1, extra);
    let client = connect_after_hello(&users);

    // A handler set the image's code does not define: refused with the reason.
    let bad = {
        let img = Image::parse(image.clone()).unwrap();
        let mut sets: Vec<HandlerSet> = manifest.handler_sets.clone();
        sets[0].name = "nosuch".into();
        let mut b = corefarm_toolchain::ImageBuilder::new(
            "bad",
            manifest.input_size,
            manifest.output_size,
            manifest.cores.clone(),
        )
        .handler_sets(sets);
        for (i, a) in manifest.artifacts.iter().enumerate() {
            let bytes = img.artifact_bytes(i).unwrap().to_vec();
            b = b.artifact(a.target.clone(), a.kind, a.entry.clone(), bytes);
        }
        Bytes::from(b.build().unwrap())
    };
    let e = client
        .configure(&image::configuration(bad).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("defines none of nosuch_head"), "{e}");

    let image_bytes = image.clone();
    client
        .configure(&image::configuration(image).unwrap())
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for round in 0..4 {
        let data: Vec<u8> = (0..rng.gen_range(200..3000usize) * 16)
            .map(|_| rng.gen())
            .collect();

        let mut msg = header(1, [0; 3]);
        msg.extend_from_slice(&data);
        let want: i64 = data
            .chunks_exact(4)
            .map(|w| i32::from_le_bytes(w.try_into().unwrap()) as i64)
            .sum();
        let got = one(&client, &msg).unwrap();
        exactly(
            got,
            msg.len(),
            want.to_le_bytes().to_vec(),
            &format!("sum {round}"),
        );

        let threshold: i32 = rng.gen_range(-1000..1000) * 1_000_000;
        let mut msg = header(2, [threshold as u32, 0, 0]);
        msg.extend_from_slice(&data);
        let kept: Vec<u8> = data
            .chunks_exact(16)
            .filter(|r| i32::from_le_bytes(r[4..8].try_into().unwrap()) >= threshold)
            .flatten()
            .copied()
            .collect();
        assert!(!kept.is_empty(), "the data has records above {threshold}");
        let got = one(&client, &msg).unwrap();
        exactly(got, msg.len(), kept, &format!("filter {round}"));

        let mut msg = header(3, [0; 3]);
        msg.extend_from_slice(&data);
        let mut bins = [0u64; 256];
        data.iter().for_each(|&b| bins[b as usize] += 1);
        let want: Vec<u8> = bins.iter().flat_map(|c| c.to_le_bytes()).collect();
        let got = one(&client, &msg).unwrap();
        exactly(got, msg.len(), want, &format!("histogram {round}"));

        let block = 16 * rng.gen_range(1..4u32);
        let stride = block * rng.gen_range(1..4u32);
        let count = rng.gen_range(1..200u32);
        let packed: Vec<u8> = (0..count * block).map(|_| rng.gen()).collect();
        let mut msg = header(4, [count, block, stride]);
        msg.extend_from_slice(&packed);
        let mut want = vec![0u8; (count * stride) as usize];
        for (i, blk) in packed.chunks(block as usize).enumerate() {
            let at = i * stride as usize;
            want[at..at + block as usize].copy_from_slice(blk);
        }
        let got = one(&client, &msg).unwrap();
        exactly(got, msg.len(), want, &format!("strided {round}"));
    }

    // No ruleset matches word 0 = 99 (the `never` set's rule matches
    // nothing), and a filter that keeps no record emits nothing: the echo
    // core answers each input of both.
    let mut unmatched = header(99, [1, 2, 3]);
    unmatched.extend_from_slice(&[5u8; 16]);
    let mut kept_none = header(2, [i32::MAX as u32, 0, 0]);
    kept_none.extend_from_slice(&[1u8; 64]);
    for msg in [unmatched, kept_none] {
        let got = one(&client, &msg).unwrap();
        assert_eq!(got.len(), msg.len() / INPUT * OUTPUT);
        for (inp, out) in msg.chunks(INPUT).zip(got.chunks(OUTPUT)) {
            assert_eq!(&out[..16], inp);
            assert!(out[16..].iter().all(|&b| b == 0xEE));
        }
    }

    let mut crash = header(5, [0; 3]);
    crash.extend_from_slice(&[0u8; 8192]);
    let e = one(&client, &crash).unwrap_err();
    assert!(
        e.contains("handler set crash: the payload handler crashed")
            && e.contains("SIGSEGV (an invalid memory access"),
        "{e}"
    );
    sum_of_seven(&client);

    let e = one(&client, &header(6, [0; 3])).unwrap_err();
    assert!(
        e.contains("handler set hang: Head handler still running") && e.contains("300ms"),
        "{e}"
    );
    sum_of_seven(&client);

    let mut greedy = header(7, [0; 3]);
    greedy.extend_from_slice(&[0u8; 4096]);
    let e = one(&client, &greedy).unwrap_err();
    assert!(e.contains("handler set greedy: Payload handler emitted more than the output budget of 10000 bytes"), "{e}");
    sum_of_seven(&client);

    // An unpacked vector of 100 blocks: 6400 bytes, less than the 101
    // inputs × 64 the message's fixed size would be, so not padded; and
    // with no packed data (one input, 64 bytes fixed) 6400 zeros, more
    // than it: delivered whole.
    let mut packed = header(4, [100, 16, 64]);
    let blocks: Vec<u8> = (0..1600u32).map(|i| (i % 251) as u8).collect();
    packed.extend_from_slice(&blocks);
    let mut want = vec![0u8; 6400];
    for (i, blk) in blocks.chunks(16).enumerate() {
        want[i * 64..i * 64 + 16].copy_from_slice(blk);
    }
    let want_packed = want.clone();
    exactly(
        one(&client, &packed).unwrap(),
        packed.len(),
        want,
        "strided",
    );
    let longer = header(4, [100, 16, 64]);
    let got = one(&client, &longer).unwrap();
    exactly(got, longer.len(), vec![0u8; 6400], "strided, longer");
    drop(client);

    // A seed-format user keeps its contract of inputs × 64 bytes: the sum
    // and the vector come padded, and a longer result fails its message,
    // which for a seed user ends the session (as a failed core does).
    let seed = Client::connect(
        &users,
        ClientOptions {
            legacy: true,
            io_timeout: Some(Duration::from_secs(60)),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    seed.configure(&image::configuration(image_bytes).unwrap())
        .unwrap();
    let mut msg = header(1, [0; 3]);
    msg.extend_from_slice(&[7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let got = one(&seed, &msg).unwrap();
    assert_eq!(got, padded(msg.len(), 7i64.to_le_bytes().to_vec()));
    let got = one(&seed, &packed).unwrap();
    assert_eq!(got, padded(packed.len(), want_packed));
    assert!(
        one(&seed, &longer).is_err(),
        "a longer result ends a seed session"
    );
}
