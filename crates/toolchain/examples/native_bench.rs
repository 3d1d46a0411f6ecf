//! Per-job cost of a native soft core, run by hand (nothing asserts on time):
//!
//!     cargo run --release -p corefarm-toolchain --example native_bench [jobs]
//!
//! Builds the 64×64 matrix multiplier of cores/matmul, loads it the way a
//! node does (`corefarm_cores::load`) and times `Core::process` beside a bare
//! call of the C function, with aligned buffers and with the input at a
//! 12-byte offset (where a data message's payload starts after the SMP
//! header and id, so the core copies it once).

use std::time::{Duration, Instant};

use corefarm_cores::{load, Core, LoadOptions};

const IN: usize = 32768;
const OUT: usize = 16384;

fn best_of(rounds: usize, jobs: u32, mut job: impl FnMut()) -> Duration {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..jobs {
                job();
            }
            t.elapsed() / jobs
        })
        .min()
        .expect("at least one round")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let jobs: u32 = std::env::args().nth(1).map_or(Ok(2000), |a| a.parse())?;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("cores/matmul/matmul.cpp");
    let entry = "mat_mul_64x64";
    let dir = tempfile::tempdir()?;
    let so = dir.path().join("matmul.so");
    corefarm_toolchain::build_native(&src, &so)?;
    let img = corefarm_toolchain::build_native_image(&src, entry, 1, IN as u32, OUT as u32, "mm")?;
    let cfg = corefarm_cores::image::configuration(img.into())?;
    let mut loaded = load(&cfg, &LoadOptions::default())?;
    let core: &mut Box<dyn Core> = &mut loaded.cores[0];

    // SAFETY: the object was just built from cores/matmul/matmul.cpp, whose
    // entry has the native ABI's signature `void (const uint8_t *, uint8_t *)`.
    let lib = unsafe { libloading::Library::new(&so) }?;
    // SAFETY: as above; `f` is used only while `lib` is alive.
    let f = unsafe { lib.get::<unsafe extern "C" fn(*const u8, *mut u8)>(entry.as_bytes()) }?;

    let mut inbuf = vec![0u8; IN + 16];
    for (i, b) in inbuf.iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    let mut out = vec![0u8; OUT];
    println!(
        "buffers 16-byte aligned: input {}, output {}",
        inbuf.as_ptr() as usize % 16 == 0,
        out.as_ptr() as usize % 16 == 0
    );
    let rounds = 6;
    let (mut raw, mut aligned, mut offset) = (Duration::MAX, Duration::MAX, Duration::MAX);
    // Interleaved rounds, best of each: other load on the machine only
    // ever adds time.
    for _ in 0..rounds {
        raw = raw.min(best_of(1, jobs, || {
            // SAFETY: IN readable and OUT writable bytes, as the ABI requires.
            unsafe { f(inbuf.as_ptr(), out.as_mut_ptr()) }
        }));
        aligned = aligned.min(best_of(1, jobs, || {
            core.process(&inbuf[..IN], &mut out).expect("job");
        }));
        offset = offset.min(best_of(1, jobs, || {
            core.process(&inbuf[12..12 + IN], &mut out).expect("job");
        }));
    }
    println!("best of {rounds} rounds of {jobs} jobs, per job:");
    println!("  bare C call                      {raw:?}");
    println!("  Core::process, aligned           {aligned:?}");
    println!("  Core::process, input at offset 12 {offset:?}");
    Ok(())
}
