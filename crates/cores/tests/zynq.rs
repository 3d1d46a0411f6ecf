//! The Zynq backend, and the Cyclone V backend's interrupts, against a fake
//! board tree: sysfs attributes as files, a regular file standing in for
//! each UIO map and the u-dma-buf buffer, a socket for each UIO interrupt,
//! and a thread playing the core behind them (`zynq::fake::FakeCore`).

use std::time::Duration;

use bytes::Bytes;
use corefarm_board::fake::{FakeInterrupt, TempTree};
use corefarm_board::{BoardError, Piece};
use corefarm_cores::fpga::{FpgaOptions, Programmer};
use corefarm_cores::image::{self, ArtifactKind};
use corefarm_cores::zynq::fake::{FakeCore, Played};
use corefarm_cores::zynq::{ZynqOptions, ZYNQ_TARGET};
use corefarm_cores::{load, DriverOptions, LoadError, LoadOptions, Loaded};
use corefarm_smp::{Configuration, CoreInfo};
use corefarm_toolchain::ImageBuilder;

const REGS: u64 = 0x43c0_0000;
const SIZE: usize = 64;
const CORE: CoreInfo = CoreInfo {
    control: REGS as u32,
    input: REGS as u32 + 0x1000,
    output: REGS as u32 + 0x2000,
};

/// A board with an FPGA manager, the core's UIO device and a buffer.
fn board() -> TempTree {
    let t = TempTree::new();
    t.fpga_manager("fpga0", "operating");
    t.uio(0, "corefarm-core", &[(REGS, 0x1_0000)]);
    t.udmabuf(0, 0x3f00_0000, 1 << 20);
    t
}

fn zynq(t: &TempTree, interrupts: bool) -> LoadOptions {
    LoadOptions {
        native: false,
        rtl: false,
        zynq: Some(ZynqOptions {
            root: t.root(),
            interrupts,
            ..ZynqOptions::default()
        }),
        driver: DriverOptions {
            timeout: Duration::from_secs(20),
            poll: Duration::from_millis(1),
        },
        ..LoadOptions::default()
    }
}

fn raw(bitstream: &'static [u8]) -> Configuration {
    Configuration {
        input_size: SIZE as u32,
        output_size: SIZE as u32,
        cores: vec![CORE],
        bitstream: Bytes::from_static(bitstream),
    }
}

fn play(t: &TempTree, irq: Option<FakeInterrupt>) -> FakeCore {
    let regs = t.root().path("/dev/uio0");
    FakeCore::start(&regs, REGS, CORE, SIZE, Duration::from_millis(1), irq)
}

fn run_jobs(loaded: &mut Loaded, n: u8) {
    for j in 0..n {
        let input: Vec<u8> = (0..SIZE as u8).map(|i| i.wrapping_mul(3) + j).collect();
        let mut out = vec![0u8; SIZE];
        loaded.cores[0].process(&input, &mut out).unwrap();
        let want: Vec<u8> = input.iter().map(|b| b.wrapping_add(1)).collect();
        assert_eq!(out, want, "job {j}");
    }
}

#[test]
fn an_image_for_both_families_runs_its_zynq_bitstream_by_interrupt() {
    let t = board();
    let img = ImageBuilder::new("inc", SIZE as u32, SIZE as u32, vec![CORE])
        .artifact(
            image::FPGA_TARGET,
            ArtifactKind::Bitstream,
            "",
            b"rbf".to_vec(),
        )
        .artifact(
            ZYNQ_TARGET,
            ArtifactKind::Bitstream,
            "",
            b"zynq-bin".to_vec(),
        )
        .build()
        .unwrap();
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let core = play(&t, Some(FakeInterrupt::bind(&t.root(), 0)));
    let mut loaded = load(&cfg, &zynq(&t, true)).unwrap();
    assert!(
        loaded
            .description
            .contains("zynq inc (fpga-zynq, interrupts)"),
        "{}",
        loaded.description
    );
    let r = t.root();
    assert_eq!(
        std::fs::read(r.path("/lib/firmware/corefarm.bin")).unwrap(),
        b"zynq-bin"
    );
    let attr = r.path("/sys/class/fpga_manager/fpga0/firmware");
    assert_eq!(std::fs::read_to_string(attr).unwrap(), "corefarm.bin");
    run_jobs(&mut loaded, 5);
    // Every job ended with an interrupt the driver had enabled.
    assert_eq!(
        core.stop(),
        Played {
            jobs: 5,
            interrupts: 5
        }
    );
}

#[test]
fn without_interrupts_the_driver_polls() {
    let t = board();
    let core = play(&t, Some(FakeInterrupt::bind(&t.root(), 0)));
    let mut loaded = load(&raw(b"raw-bin"), &zynq(&t, false)).unwrap();
    assert!(
        loaded.description.contains("polling"),
        "{}",
        loaded.description
    );
    run_jobs(&mut loaded, 3);
    assert_eq!(
        core.stop(),
        Played {
            jobs: 3,
            interrupts: 0
        }
    );
}

#[test]
fn an_interrupt_that_never_comes_delays_a_job_without_failing_it() {
    let t = board();
    // The socket is there, but the core never fires it (a device tree
    // naming the wrong interrupt): each wait ends at its bound and the done
    // register is read.
    let _silent = FakeInterrupt::bind(&t.root(), 0);
    let core = play(&t, None);
    let mut loaded = load(&raw(b"raw-bin"), &zynq(&t, true)).unwrap();
    run_jobs(&mut loaded, 2);
    assert_eq!(core.stop().jobs, 2);
}

#[test]
fn an_interrupt_that_fails_leaves_the_core_polled() {
    let t = board();
    // The interrupt goes away once the node opened it (as a UIO device
    // without an interrupt fails its reads and writes): the first wait
    // fails, and the jobs go on by polling.
    let gone = FakeInterrupt::bind(&t.root(), 0);
    let core = play(&t, None);
    let mut loaded = load(&raw(b"raw-bin"), &zynq(&t, true)).unwrap();
    drop(gone);
    run_jobs(&mut loaded, 3);
    assert_eq!(core.stop().jobs, 3);
}

#[test]
fn missing_pieces_are_refused_before_the_fpga_is_programmed() {
    let firmware_attr = |t: &TempTree| {
        std::fs::read_to_string(t.root().path("/sys/class/fpga_manager/fpga0/firmware")).unwrap()
    };
    // No buffer.
    let t = board();
    let _irq = FakeInterrupt::bind(&t.root(), 0);
    std::fs::remove_dir_all(t.root().path("/sys/class/u-dma-buf")).unwrap();
    match load(&raw(b"bin"), &zynq(&t, true)) {
        Err(LoadError::Board(BoardError::Missing { piece, .. })) => {
            assert_eq!(piece, Piece::UdmaBuf)
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("loaded without a u-dma-buf buffer"),
    }
    assert_eq!(firmware_attr(&t), "", "the FPGA was programmed");

    // No UIO device maps the core's registers.
    let t = board();
    let _irq = FakeInterrupt::bind(&t.root(), 0);
    let mut cfg = raw(b"bin");
    cfg.cores[0].control = 0x8000_0000;
    match load(&cfg, &zynq(&t, true)) {
        Err(LoadError::Board(BoardError::NoUioAt { addr, .. })) => assert_eq!(addr, 0x8000_0000),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("loaded a core no UIO device maps"),
    }
    assert_eq!(firmware_attr(&t), "");

    // At start: each piece in turn.
    let t = TempTree::new();
    let opts = ZynqOptions {
        root: t.root(),
        ..ZynqOptions::default()
    };
    let piece = |o: &ZynqOptions| o.check().unwrap_err().piece();
    assert_eq!(piece(&opts), Some(Piece::FpgaManager));
    t.fpga_manager("fpga0", "operating");
    assert_eq!(piece(&opts), Some(Piece::Uio));
    t.uio(0, "corefarm-core", &[(REGS, 0x1_0000)]);
    assert_eq!(piece(&opts), Some(Piece::UdmaBuf));
    t.udmabuf(0, 0x3f00_0000, 1 << 20);
    opts.check().unwrap();
}

#[test]
fn the_cyclone_v_bridge_waits_on_its_uio_interrupt() {
    const BASE: u64 = 0xC000_0000;
    const SPAN: u64 = 1 << 20;
    let t = TempTree::new();
    // The bridge through /dev/mem; UIO only for the core's interrupt, its
    // node's reg covering the core's CSR.
    let bridge = t.root().path("/bridge");
    std::fs::write(&bridge, vec![0u8; SPAN as usize]).unwrap();
    let core = CoreInfo {
        control: BASE as u32 + 0x4_0000,
        input: BASE as u32 + 0x5_0000,
        output: BASE as u32 + 0x6_0000,
    };
    t.uio(0, "corefarm-core", &[(u64::from(core.control), 0x20)]);
    let irq = FakeInterrupt::bind(&t.root(), 0);
    let played = FakeCore::start(
        &bridge,
        BASE,
        core,
        SIZE,
        Duration::from_millis(1),
        Some(irq),
    );
    let opts = LoadOptions {
        native: false,
        rtl: false,
        fpga: Some(FpgaOptions {
            programmer: Programmer::Command(vec!["true".into()]),
            device: bridge.clone(),
            device_offset: 0,
            base: BASE,
            span: SPAN,
            interrupts: Some(t.root()),
        }),
        driver: DriverOptions {
            timeout: Duration::from_secs(20),
            poll: Duration::from_millis(1),
        },
        ..LoadOptions::default()
    };
    let mut cfg = raw(b"rbf");
    cfg.cores = vec![core];
    let mut loaded = load(&cfg, &opts).unwrap();
    assert!(
        loaded.description.contains("interrupts"),
        "{}",
        loaded.description
    );
    run_jobs(&mut loaded, 4);
    assert_eq!(
        played.stop(),
        Played {
            jobs: 4,
            interrupts: 4
        }
    );
}
