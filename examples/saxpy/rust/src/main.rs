//! saxpy user program: configures the cluster with an image, streams
//! random inputs through it and checks every result.
//!
//!     cargo run --release --manifest-path examples/saxpy/rust/Cargo.toml -- HOST:PORT saxpy.cfimg
use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};

const N: usize = 256;
const INPUT_SIZE: usize = 8 + 2 * N * 4; // a, pad, x[N], y[N] (int32 LE)
const OUTPUT_SIZE: usize = N * 4; // a*x + y (int32 LE, wrapping)
const BATCH: usize = 8; // inputs per data message
const MESSAGES: usize = 500;

/// One data message of BATCH random inputs and its expected result.
fn make_batch(seed: &mut u64) -> (Bytes, Vec<u8>) {
    let mut next = || {
        // xorshift64: reproducible without extra crates
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed as u32
    };
    let (mut msg, mut expect) = (Vec::with_capacity(BATCH * INPUT_SIZE), Vec::new());
    for _ in 0..BATCH {
        let a = next();
        let xy: Vec<u32> = (0..2 * N).map(|_| next()).collect();
        msg.extend_from_slice(&a.to_le_bytes());
        msg.extend_from_slice(&[0; 4]);
        xy.iter()
            .for_each(|v| msg.extend_from_slice(&v.to_le_bytes()));
        for i in 0..N {
            let r = a.wrapping_mul(xy[i]).wrapping_add(xy[N + i]);
            expect.extend_from_slice(&r.to_le_bytes());
        }
    }
    (Bytes::from(msg), expect)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, image] = args.as_slice() else {
        return Err("usage: saxpy-user HOST:PORT saxpy.cfimg".into());
    };
    // Sizes and core table come from the image's manifest.
    let cfg = corefarm_cores::image::configuration(std::fs::read(image)?.into())?;
    assert_eq!(
        (cfg.input_size, cfg.output_size),
        (INPUT_SIZE as u32, OUTPUT_SIZE as u32)
    );

    let client = Client::connect(addr, ClientOptions::default())?;
    client.configure(&cfg)?; // Err carries the nodes' reasons
    let mut seed = 0x5eed_u64;
    let batches: Vec<(Bytes, Vec<u8>)> = (0..MESSAGES).map(|_| make_batch(&mut seed)).collect();
    let inputs = batches.iter().map(|(m, _)| m.clone());
    // Results in input order, at most 16 data messages in flight.
    for (i, result) in client.map(inputs, 16).enumerate() {
        if result?[..] != batches[i].1[..] {
            return Err(format!("data message {i}: wrong result").into());
        }
    }
    println!(
        "{} inputs on {} nodes: all results correct",
        MESSAGES * BATCH,
        client.nodes().unwrap_or(0)
    );
    Ok(())
}
