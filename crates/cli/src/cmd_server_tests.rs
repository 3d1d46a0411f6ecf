//! Tests of the node manager's flags (`NodeTuning` in cmd_node.rs, shared
//! by `corefarm node` and `corefarm local`): what each flag sets in the
//! node's options, and which values are refused.

use clap::Parser;
use corefarm_cores::fpga::Programmer;

use crate::cmd_node::NodeTuning;

#[derive(Parser)]
struct T {
    #[command(flatten)]
    node: NodeTuning,
}

fn parse(args: &[&str]) -> Result<corefarm_node::NodeOptions, clap::Error> {
    let t = T::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
    Ok(t.node.options("127.0.0.1:1".into()))
}

#[test]
fn defaults_are_native_and_rtl_without_fpga() {
    let o = parse(&[]).unwrap();
    assert!(o.load.native && o.load.rtl && o.load.fpga.is_none());
    assert_eq!(o.load.driver.timeout, std::time::Duration::from_secs(10));
}

#[test]
fn backends_restrict_what_loads() {
    let o = parse(&["--backends", "rtl"]).unwrap();
    assert!(!o.load.native && o.load.rtl && o.load.fpga.is_none());
    let o = parse(&["--backends", "native", "--core-timeout", "2.5"]).unwrap();
    assert!(o.load.native && !o.load.rtl);
    assert_eq!(
        o.load.driver.timeout,
        std::time::Duration::from_millis(2500)
    );
    assert!(parse(&["--backends", "gpu"]).is_err());
    assert!(parse(&["--core-timeout", "0"]).is_err());
    assert!(parse(&["--core-timeout", "inf"]).is_err());
}

#[test]
fn fpga_options_map_to_the_backend() {
    let o = parse(&[
        "--backends",
        "fpga,native",
        "--fpga-device",
        "/tmp/bridge",
        "--fpga-base",
        "0xFF200000",
        "--fpga-span",
        "65536",
        "--fpga-programmer",
        "sh -c 'cat {bitstream} > /dev/null'",
    ])
    .unwrap();
    assert!(o.load.native && !o.load.rtl);
    let f = o.load.fpga.expect("fpga enabled");
    assert_eq!(f.device, std::path::PathBuf::from("/tmp/bridge"));
    assert_eq!(
        (f.base, f.device_offset, f.span),
        (0xFF20_0000, 0xFF20_0000, 65536)
    );
    assert_eq!(
        f.programmer,
        Programmer::Command(vec![
            "sh".into(),
            "-c".into(),
            "cat {bitstream} > /dev/null".into()
        ])
    );
    let o = parse(&["--backends", "fpga", "--fpga-device-offset", "0"]).unwrap();
    let f = o.load.fpga.unwrap();
    assert_eq!((f.base, f.device_offset), (0xC000_0000, 0));
    assert_eq!(f.programmer, Programmer::default());
    assert!(parse(&["--fpga-base", "0xZZ"]).is_err());
    assert!(parse(&["--fpga-programmer", "dd 'of=x"]).is_err());
    assert!(parse(&["--fpga-programmer", "  "]).is_err());
}

#[test]
fn local_passes_its_node_flags_on_including_the_streaming_ones() {
    #[derive(Parser)]
    struct L {
        #[command(flatten)]
        node: crate::cmd_local::LocalNodeArgs,
    }
    let l = L::try_parse_from(["l", "--spin-chunk-size", "1024", "--spin-threads", "2"]).unwrap();
    let o = l.node.options().unwrap();
    assert_eq!((o.spin.chunk_size, o.spin.threads), (1024, 2));
    let l = L::try_parse_from(["l"]).unwrap();
    let d = parse(&[]).unwrap();
    let o = l.node.options().unwrap();
    assert_eq!(
        (o.spin.chunk_size, o.spin.threads),
        (d.spin.chunk_size, d.spin.threads)
    );
    assert!(L::try_parse_from(["l", "--spin-threads", "0"]).is_err());
    // A node runs user cores in worker processes only: no flag loads them
    // into its own process.
    assert!(L::try_parse_from(["l", "--isolation", "in-process"]).is_err());
    assert!(parse(&["--isolation", "in-process"]).is_err());
}
