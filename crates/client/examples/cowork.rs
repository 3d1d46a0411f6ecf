//! Measures all-local, all-cluster and co-worked runs of one image at a few
//! workload sizes and prints a Markdown table (docs/cowork.md). Driven by
//! examples/cowork/bench.sh, which builds the image and starts the cluster:
//!
//!     cowork IMAGE USERS_ADDR [THREADS] [N...]
//!
//! Each N uses fresh random inputs and one timed run per mode, after one
//! untimed warm-up run per mode at the largest N (it also gives the
//! co-worked side its estimates, as a long-lived program would have).
//! Every co-worked result is checked against the all-cluster result.

use std::time::Instant;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions, Cowork, CoworkOptions};

const WINDOW: usize = 16;

fn inputs(n: usize, size: usize, seed: u64) -> Vec<Bytes> {
    // xorshift: reproducible, no extra dependency.
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            let v: Vec<u8> = (0..size)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            Bytes::from(v)
        })
        .collect()
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, users, rest @ ..] = &args[..] else {
        return Err("usage: cowork IMAGE USERS_ADDR [THREADS] [N...]".into());
    };
    let threads: usize = rest.first().map_or(Ok(2), |t| t.parse())?;
    let sizes: Vec<usize> = if rest.len() > 1 {
        rest[1..]
            .iter()
            .map(|n| n.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![4, 16, 64, 256, 1024]
    };
    let cfg = corefarm_cores::image::configuration(Bytes::from(std::fs::read(image)?))?;
    let opts = |nodes| ClientOptions {
        nodes,
        ..ClientOptions::default()
    };
    let client = Client::connect(users, opts(None))?;
    client.configure(&cfg)?;
    // All-local: a client that never configures (asks for no nodes), so
    // the co-working splitter keeps everything on this machine.
    let observer = Client::connect(users, opts(Some(0)))?;
    let copts = CoworkOptions {
        threads,
        ..CoworkOptions::default()
    };
    let local = Cowork::load(&cfg, copts.clone())?;
    let cowork = Cowork::load(&cfg, copts)?;
    let input_size = cfg.input_size as usize;

    let max = *sizes.iter().max().unwrap_or(&1);
    let warm = inputs(max, input_size, 99);
    client
        .map(warm.iter().cloned(), WINDOW)
        .collect::<Result<Vec<_>, _>>()?;
    observer.map_cowork(&warm, WINDOW, &local)?;
    client.map_cowork(&warm, WINDOW, &cowork)?;

    println!(
        "image: {} ({} B in, {} B out); {}; cluster: {} node(s), window {WINDOW}",
        image,
        cfg.input_size,
        cfg.output_size,
        cowork.description(),
        client.nodes().map_or("?".into(), |n| n.to_string())
    );
    println!();
    println!("| N | all-local ms | all-cluster ms | cowork ms | cowork local/cluster | cowork ÷ best | N_L |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (k, &n) in sizes.iter().enumerate() {
        let ins = inputs(n, input_size, k as u64 + 1);
        let (cl, t_cluster) = timed(|| {
            client
                .map(ins.iter().cloned(), WINDOW)
                .collect::<Result<Vec<_>, _>>()
        });
        let cl = cl?;
        let (lo, t_local) = timed(|| observer.map_cowork(&ins, WINDOW, &local));
        let lo = lo?;
        let (co, t_cowork) = timed(|| client.map_cowork(&ins, WINDOW, &cowork));
        let co = co?;
        if lo.results != cl || co.results != cl {
            return Err(format!("N = {n}: results differ between modes").into());
        }
        let best = t_local.min(t_cluster);
        println!(
            "| {n} | {:.2} | {:.2} | {:.2} | {}/{} | {:.2} | {} |",
            t_local * 1e3,
            t_cluster * 1e3,
            t_cowork * 1e3,
            co.report.local_items,
            co.report.cluster_items,
            t_cowork / best,
            co.report
                .break_even()
                .map_or("?".into(), |b| format!("{b:.1}")),
        );
    }
    let e = cowork.estimates();
    println!();
    println!(
        "estimates after the runs: X_c = {:.0}/s, X_a = {:.0}/s, D_a = {:.3} ms, O_c = {:.3} ms, O_0 = {:.3} ms",
        e.x_c.unwrap_or(f64::NAN),
        e.x_a.unwrap_or(f64::NAN),
        e.d_a.unwrap_or(f64::NAN) * 1e3,
        e.o_c.unwrap_or(f64::NAN) * 1e3,
        e.o_0.unwrap_or(f64::NAN) * 1e3,
    );
    Ok(())
}
