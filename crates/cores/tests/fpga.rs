//! FPGA backend against a regular file standing in for the HPS-to-FPGA
//! bridge: a test thread plays the hardware cores through its own mapping
//! of the same file, and the programmer is a shell command that records its
//! call.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::fpga::{FpgaOptions, Programmer};
use corefarm_cores::image::{self, ArtifactKind};
use corefarm_cores::{load, CoreError, DriverOptions, LoadError, LoadOptions};
use corefarm_smp::{Configuration, CoreInfo};
use corefarm_toolchain::ImageBuilder;
use memmap2::MmapRaw;

const BASE: u64 = 0xC000_0000;
const SPAN: u64 = 1 << 20;
/// Upper bits the fake core puts next to done, so that it can tell the
/// driver's write-1-to-clear (which stores a plain 1) from its own value.
const TAG: u64 = 1 << 32;

struct FakeCores {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for FakeCores {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// Plays every core of `table` (out[i] = in[i] ^ 0x5A); cores listed in
/// `stuck` accept start and never finish.
fn fake_cores(file: &Path, table: Vec<CoreInfo>, size: usize, stuck: Vec<usize>) -> FakeCores {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let map = MmapRaw::map_raw(&f).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let thread = std::thread::spawn(move || {
        let p = map.as_mut_ptr();
        let off = |a: u32| (a as u64 - BASE) as usize;
        // SAFETY (rd, wr and the byte copy below): the callers' tables put
        // every window (CSR words, `size`-byte memories) inside the
        // SPAN-byte file, which `map` (owned by this thread) maps whole;
        // word offsets are multiples of 8 in a page-aligned mapping.
        let rd = |o: usize| unsafe { std::ptr::read_volatile(p.add(o) as *const u64) };
        let wr = |o: usize, v: u64| unsafe { std::ptr::write_volatile(p.add(o) as *mut u64, v) };
        while !s2.load(Ordering::SeqCst) {
            for (k, c) in table.iter().enumerate() {
                let ctl = off(c.control);
                if rd(ctl + 0x18) == 1 {
                    wr(ctl + 0x18, 0); // the driver's write-1-to-clear
                }
                if rd(ctl + 0x08) & 1 == 1 {
                    wr(ctl + 0x08, 0);
                    wr(ctl, 1); // busy
                    if stuck.contains(&k) {
                        continue;
                    }
                    for i in 0..size {
                        // SAFETY: see `rd` above.
                        unsafe {
                            let b = std::ptr::read_volatile(p.add(off(c.input) + i));
                            std::ptr::write_volatile(p.add(off(c.output) + i), b ^ 0x5A);
                        }
                    }
                    wr(ctl, 0);
                    wr(ctl + 0x18, 1 | TAG);
                }
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    });
    FakeCores {
        stop,
        thread: Some(thread),
    }
}

struct Setup {
    dir: tempfile::TempDir,
    bridge: std::path::PathBuf,
    log: std::path::PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let bridge = dir.path().join("bridge");
    std::fs::File::create(&bridge)
        .unwrap()
        .set_len(SPAN)
        .unwrap();
    let log = dir.path().join("programmer.log");
    Setup { dir, bridge, log }
}

fn fpga_opts(s: &Setup, programmer: Programmer, timeout_ms: u64) -> LoadOptions {
    LoadOptions {
        fpga: Some(FpgaOptions {
            programmer,
            device: s.bridge.clone(),
            device_offset: 0,
            base: BASE,
            span: SPAN,
            interrupts: None,
        }),
        driver: DriverOptions {
            timeout: Duration::from_millis(timeout_ms),
            poll: Duration::from_micros(200),
        },
        ..LoadOptions::default()
    }
}

/// Records its arguments and the bitstream file's content.
fn recording_programmer(s: &Setup) -> Programmer {
    let log = s.log.display().to_string();
    Programmer::Command(vec![
        "sh".into(),
        "-c".into(),
        format!("echo \"$@\" > {log}.args; cp \"$1\" {log}.rbf"),
        "programmer".into(),
        "{bitstream}".into(),
        "--flag".into(),
    ])
}

#[test]
fn image_with_bitstream_runs_on_a_file_backed_bridge() {
    let s = setup();
    let table = image::default_core_table(2, 64, 64).unwrap();
    let rbf = b"\x00\x01\x02fake-rbf".to_vec();
    let img = ImageBuilder::new("xor", 64, 64, table.clone())
        .artifact(image::FPGA_TARGET, ArtifactKind::Bitstream, "", rbf.clone())
        .build()
        .unwrap();
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let _cores = fake_cores(&s.bridge, table, 64, vec![1]);
    let mut loaded = load(&cfg, &fpga_opts(&s, recording_programmer(&s), 300)).unwrap();
    assert!(
        loaded.description.contains("fpga xor"),
        "{}",
        loaded.description
    );

    // The programmer ran once with the bitstream's path substituted.
    let args = std::fs::read_to_string(format!("{}.args", s.log.display())).unwrap();
    assert!(args.trim_end().ends_with(".rbf --flag"), "{args}");
    assert_eq!(
        std::fs::read(format!("{}.rbf", s.log.display())).unwrap(),
        rbf
    );

    // Core 1 hangs: timeout, while core 0 keeps working.
    let input: Vec<u8> = (0..64).collect();
    let mut out = vec![0u8; 64];
    let e = loaded.cores[1].process(&input, &mut out).unwrap_err();
    assert!(matches!(e, CoreError::Timeout(_)), "{e}");
    for j in 0..5u8 {
        let input: Vec<u8> = (0..64).map(|i| i * 3 + j).collect();
        let mut out = vec![0u8; 64];
        loaded.cores[0].process(&input, &mut out).unwrap();
        assert_eq!(out, input.iter().map(|b| b ^ 0x5A).collect::<Vec<_>>());
    }
    assert_eq!(loaded.cores[0].stats().jobs, 5);
}

#[test]
fn raw_bitstream_with_bridge_relative_table_and_stdin_programmer() {
    let s = setup();
    // Bridge-relative addresses, like Platform Designer's (seed 000 fig. 4.6).
    let table = vec![CoreInfo {
        control: 0x8_4140,
        input: 0x5_0000,
        output: 0x8_0000,
    }];
    let cfg = Configuration {
        input_size: 24,
        output_size: 24,
        cores: table.clone(),
        bitstream: Bytes::from_static(b"raw-rbf-bytes"),
    };
    let abs: Vec<CoreInfo> = table
        .iter()
        .map(|c| CoreInfo {
            control: c.control + BASE as u32,
            input: c.input + BASE as u32,
            output: c.output + BASE as u32,
        })
        .collect();
    let _cores = fake_cores(&s.bridge, abs, 24, vec![]);
    let log = s.log.display().to_string();
    let prog = Programmer::Command(vec!["sh".into(), "-c".into(), format!("cat > {log}")]);
    let mut loaded = load(&cfg, &fpga_opts(&s, prog, 5000)).unwrap();
    assert_eq!(std::fs::read(&s.log).unwrap(), b"raw-rbf-bytes");
    let input = [7u8; 24];
    let mut out = [0u8; 24];
    loaded.cores[0].process(&input, &mut out).unwrap();
    assert_eq!(out, [7 ^ 0x5A; 24]);
}

#[test]
fn programmer_failure_and_bad_windows_are_refused() {
    let s = setup();
    let cfg = Configuration {
        input_size: 16,
        output_size: 16,
        cores: image::default_core_table(1, 16, 16).unwrap(),
        bitstream: Bytes::from_static(b"rbf"),
    };
    let failing = Programmer::Command(vec![
        "sh".into(),
        "-c".into(),
        "echo no board >&2; exit 3".into(),
    ]);
    let e = match load(&cfg, &fpga_opts(&s, failing, 100)) {
        Err(e) => e,
        Ok(_) => panic!("failing programmer accepted"),
    };
    assert!(
        matches!(e, LoadError::Backend(_)) && e.to_string().contains("no board"),
        "{e}"
    );

    let mut far = cfg.clone();
    far.cores[0].output = 0xF000_0000;
    let e = match load(&far, &fpga_opts(&s, recording_programmer(&s), 100)) {
        Err(e) => e,
        Ok(_) => panic!("window outside the bridge accepted"),
    };
    assert!(
        e.to_string().contains("outside the HPS-to-FPGA bridge"),
        "{e}"
    );
    // Refused before programming.
    assert!(!Path::new(&format!("{}.args", s.log.display())).exists());
    drop(s.dir);
}

#[test]
fn fpga_manager_programmer_uses_sysfs_files() {
    let s = setup();
    let mgr = s.dir.path().join("fpga0");
    let fw = s.dir.path().join("firmware");
    std::fs::create_dir_all(&mgr).unwrap();
    std::fs::create_dir_all(&fw).unwrap();
    std::fs::write(mgr.join("state"), "operating\n").unwrap();
    let p = Programmer::FpgaManager {
        manager: mgr.clone(),
        firmware_dir: fw.clone(),
    };
    corefarm_cores::fpga::program(&p, b"bits").unwrap();
    let name = std::fs::read_to_string(mgr.join("firmware")).unwrap();
    assert_eq!(name, corefarm_cores::fpga::FIRMWARE_NAME);
    assert_eq!(std::fs::read(fw.join(&name)).unwrap(), b"bits");
    // Another bitstream rewrites the same file: one on the card, not one each.
    corefarm_cores::fpga::program(&p, b"other bits").unwrap();
    assert_eq!(std::fs::read(fw.join(&name)).unwrap(), b"other bits");
    assert_eq!(std::fs::read_dir(&fw).unwrap().count(), 1);
    std::fs::write(mgr.join("state"), "write error\n").unwrap();
    let e = corefarm_cores::fpga::program(&p, b"bits").unwrap_err();
    assert!(e.to_string().contains("write error"), "{e}");
}
