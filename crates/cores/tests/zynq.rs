//! The Zynq backend, and the Cyclone V backend's interrupts, against a fake
//! board tree: sysfs attributes as files, a regular file standing in for
//! each UIO map and the u-dma-buf buffer, a socket for each UIO interrupt,
//! and a thread playing the core behind them (`zynq::fake::FakeCore` for
//! an Avalon CSR core, `FakeAxiCore` for a Vitis `ap_ctrl_hs` one).

use std::time::Duration;

use bytes::Bytes;
use corefarm_board::fake::{FakeInterrupt, TempTree};
use corefarm_board::{BoardError, Piece};
use corefarm_cores::fpga::{FpgaOptions, Programmer};
use corefarm_cores::image::{self, Argument, ArtifactKind, Control, Family};
use corefarm_cores::zynq::fake::{FakeAxiCore, FakeCore, Played};
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
    let piece = |o: &ZynqOptions| match o.check() {
        Err(LoadError::Board(e)) => e.piece(),
        other => panic!("{other:?}"),
    };
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

/// Where the u-dma-buf buffer of [`board`] lies on the bus.
const DMA: u64 = 0x3f00_0000;

/// A Vitis vadd: `c[i] = a[i] + b[i] + k`, `k` from each message, `n` from
/// the manifest.
fn vadd_args() -> Vec<Argument> {
    let ptr = |name: &str, input: bool| match input {
        true => Argument::In {
            name: name.into(),
            size: SIZE as u32,
        },
        false => Argument::Out {
            name: name.into(),
            size: SIZE as u32,
        },
    };
    vec![
        ptr("a", true),
        ptr("b", true),
        ptr("c", false),
        Argument::Scalar {
            name: "k".into(),
            value: None,
        },
        Argument::Scalar {
            name: "n".into(),
            value: Some(SIZE as u32),
        },
    ]
}

fn vitis_image(cores: Vec<CoreInfo>) -> Configuration {
    let img = ImageBuilder::new("vadd", 4 + 2 * SIZE as u32, SIZE as u32, cores)
        .artifact_for(
            ZYNQ_TARGET,
            ArtifactKind::Bitstream,
            "",
            Family::Amd,
            Some(Control::ap_ctrl_hs(vadd_args())),
            b"vadd-bin".to_vec(),
        )
        .build()
        .unwrap();
    image::configuration(Bytes::from(img)).unwrap()
}

/// `n` Vitis vadd cores, each behind its own UIO device and interrupt,
/// sharing the u-dma-buf buffer; jobs go to them in turn. Checks the
/// results, and the registers each core found at each start.
fn run_vitis(n: usize, interrupts: bool) {
    let t = board();
    let regs = |i: usize| REGS + 0x1_0000 * i as u64;
    let table: Vec<CoreInfo> = (0..n)
        .map(|i| CoreInfo {
            control: regs(i) as u32,
            input: CORE.input + 0x1_0000 * i as u32,
            output: CORE.output + 0x1_0000 * i as u32,
        })
        .collect();
    let played: Vec<FakeAxiCore> = (0..n)
        .map(|i| {
            if i > 0 {
                t.uio(i as u32, "corefarm-core", &[(regs(i), 0x1_0000)]);
            }
            let irq = FakeInterrupt::bind(&t.root(), i as u32);
            FakeAxiCore::start(
                &t.root().path(format!("/dev/uio{i}")),
                &t.root().path("/dev/udmabuf0"),
                DMA,
                vadd_args(),
                Duration::from_millis(1),
                Some(irq),
            )
        })
        .collect();
    let mut loaded = load(&vitis_image(table), &zynq(&t, interrupts)).unwrap();
    const JOBS: u8 = 3;
    for k in 0..JOBS {
        for (c, core) in loaded.cores.iter_mut().enumerate() {
            let a: Vec<u8> = (0..SIZE as u8)
                .map(|i| i.wrapping_mul(5).wrapping_add(c as u8))
                .collect();
            let b: Vec<u8> = (0..SIZE as u8).map(|i| 200 - i).collect();
            let input = [&[k, 0, 0, 0][..], &a, &b].concat();
            let mut out = vec![0u8; SIZE];
            core.process(&input, &mut out).unwrap();
            let want: Vec<u8> = (0..SIZE)
                .map(|i| a[i].wrapping_add(b[i]).wrapping_add(k))
                .collect();
            assert_eq!(out, want, "core {c} job {k}, interrupts {interrupts}");
        }
    }
    // The buffer in equal parts of whole pages, one per core.
    let share = (1u64 << 20) / n as u64;
    for (c, core) in played.into_iter().enumerate() {
        let played = core.stop();
        assert_eq!(played.bad_pointers, 0);
        assert_eq!(played.jobs, u64::from(JOBS));
        // One interrupt per job and its status bit toggled off each time;
        // none of either when polling.
        let per_job = u64::from(interrupts) * u64::from(JOBS);
        assert_eq!(
            (played.interrupts, played.status_clears),
            (per_job, per_job),
            "core {c}, interrupts {interrupts}"
        );
        let base = (DMA + c as u64 * share) as u32;
        let (a, b, out) = (base, base + 0x1000, base + 0x2000);
        for (k, s) in played.started.iter().enumerate() {
            // ap_start alone (no auto_restart); the global and the ap_done
            // enables with interrupts, neither without.
            assert_eq!(s.ctrl, 1);
            assert_eq!((s.gie, s.ier), (interrupts.into(), interrupts.into()));
            // From 0x10: a, b, c as low word, high word, reserved; k and n
            // as value, reserved.
            assert_eq!(
                s.args,
                [a, 0, 0, b, 0, 0, out, 0, 0, k as u32, 0, SIZE as u32, 0],
                "core {c} job {k}"
            );
        }
    }
}

#[test]
fn a_vitis_core_runs_on_the_zynq_by_interrupt_and_by_polling() {
    run_vitis(1, true);
    run_vitis(1, false);
}

#[test]
fn vitis_cores_share_the_buffer_and_each_waits_on_its_own_interrupt() {
    run_vitis(2, true);
}

#[test]
fn an_overlay_programs_the_bitstream_where_the_board_has_configfs() {
    let t = board();
    t.configfs();
    let r = t.root();
    let dtbo = r.path("/design.dtbo");
    std::fs::write(&dtbo, b"dtbo").unwrap();
    let mut opts = zynq(&t, true);
    opts.zynq.as_mut().unwrap().overlay = Some(dtbo);
    let overlay = r.path("/sys/kernel/config/device-tree/overlays/corefarm");
    let manager_attr = r.path("/sys/class/fpga_manager/fpga0/firmware");
    let core = play(&t, Some(FakeInterrupt::bind(&r, 0)));
    for bits in [&b"first-bin"[..], b"second-bin"] {
        let mut cfg = raw(b"");
        cfg.bitstream = Bytes::from_static(bits);
        let mut loaded = load(&cfg, &opts).unwrap();
        run_jobs(&mut loaded, 1);
        // The bitstream where the overlay's firmware-name finds it, the
        // overlay applied from the firmware directory; a new overlay
        // directory each time (the last one's marker is gone).
        assert_eq!(
            std::fs::read(r.path("/lib/firmware/corefarm.bin")).unwrap(),
            bits
        );
        assert_eq!(
            std::fs::read(r.path("/lib/firmware/corefarm.dtbo")).unwrap(),
            b"dtbo"
        );
        assert_eq!(
            std::fs::read_to_string(overlay.join("path")).unwrap(),
            "corefarm.dtbo"
        );
        assert!(!overlay.join("marker").exists());
        std::fs::write(overlay.join("marker"), "").unwrap();
        assert_eq!(std::fs::read_to_string(&manager_attr).unwrap(), "");
    }
    // A board without the configfs interface: the FPGA manager.
    std::fs::remove_dir_all(r.path("/sys/kernel/config")).unwrap();
    opts.zynq.as_ref().unwrap().check().unwrap();
    let mut loaded = load(&raw(b"manager-bin"), &opts).unwrap();
    run_jobs(&mut loaded, 1);
    assert_eq!(
        std::fs::read_to_string(&manager_attr).unwrap(),
        "corefarm.bin"
    );
    assert_eq!(core.stop().jobs, 3);
}
