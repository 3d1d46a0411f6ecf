//! `corefarm image …`: build and inspect configuration images
//! (format: docs/images.md).

mod sign;

use std::path::PathBuf;

use anyhow::{bail, Context};
use corefarm_cores::image::{self, DataType, Image};
use corefarm_smp::CoreInfo;
use corefarm_toolchain::BuildSpec;

#[derive(clap::Subcommand)]
pub enum ImageCmd {
    /// Build a configuration image from HLS C++, Verilog and/or a Cyclone V bitstream.
    ///
    /// Every source given becomes one artifact, so one image can serve
    /// nodes of different kinds: `--hls` is compiled with the C++ compiler
    /// into a native soft core for this machine (`native-<arch>-linux`),
    /// `--verilog` is Verilated into an RTL simulation (`rtl-<arch>-linux`),
    /// `--rbf` is embedded as is (fpga-cyclonev). Without `--core-table`
    /// the default table of docs/images.md is used for `--cores` cores.
    ///
    /// Sizes come from the sources: the HLS entry's two
    /// hls_avalon_agent_memory_argument(N) (evaluated by the compiler) and
    /// the Verilog top module's INPUT_SIZE/OUTPUT_SIZE parameters. Give
    /// --input-size/--output-size when no source states them; given, they
    /// must agree. The Verilog memories are probed and must hold the sizes.
    /// Verilator's warnings are shown; --strict makes them errors.
    ///
    /// Example: corefarm image build --hls cores/vadd/vadd.cpp --entry vadd
    ///   --verilog cores/vadd/vadd.v --top vadd --cores 4 --name vadd -o vadd.cfimg
    #[command(verbatim_doc_comment)]
    Build(Box<BuildArgs>),
    /// Combine images of one function (e.g. an Intel-style and an AMD-style
    /// build) into one image carrying all their artifacts; each node runs
    /// the one it supports. Sizes, types and core tables must agree.
    ///
    /// Example: corefarm image merge vadd-intel.cfimg vadd-amd.cfimg -o vadd.cfimg
    #[command(verbatim_doc_comment)]
    Merge(MergeArgs),
    /// Show an image's manifest, artifacts and checksum status.
    ///
    /// Exits with an error if any checksum fails. A file without the image
    /// magic is reported as a raw bitstream.
    Inspect(InspectArgs),
    /// Make an Ed25519 key pair for signing images (KEY and KEY.pub).
    ///
    /// Example: corefarm image keygen -o ops.key   # then: corefarm node --trust ops.key.pub
    #[command(verbatim_doc_comment)]
    Keygen(sign::KeygenArgs),
    /// Sign an image with a key from `image keygen`: nodes started with
    /// `--trust PUBKEY` run only images signed by a key they trust.
    ///
    /// The signature covers the image header and manifest and the SHA-256
    /// of every artifact (docs/images.md); it is appended as a trailer.
    Sign(sign::SignArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// HLS C/C++ source of the hardware core (compiled natively with corefarm/hls.h).
    #[arg(long, value_name = "FILE", requires = "entry")]
    hls: Option<PathBuf>,
    /// Name of the component function in the HLS source (the C symbol nodes call).
    #[arg(long, value_name = "NAME", requires = "hls")]
    entry: Option<String>,
    /// CPU architectures of the native artifacts, comma separated: x86_64,
    /// armv7 (hard-float, the Cyclone V HPS), aarch64. Default: this
    /// machine's. Other architectures use Debian's cross compilers
    /// (g++-arm-linux-gnueabihf, g++-aarch64-linux-gnu) or
    /// `$COREFARM_CXX_<ARCH>`; each node loads the artifact of its own CPU.
    #[arg(long, value_name = "ARCH,...", value_delimiter = ',', requires = "hls",
          value_parser = clap::builder::PossibleValuesParser::new(["x86_64", "armv7", "aarch64"]))]
    arch: Vec<String>,
    /// Verilog sources of the core (the port list of cores/README.md).
    #[arg(long, value_name = "FILE", num_args = 1.., requires = "top")]
    verilog: Vec<PathBuf>,
    /// Top module of the Verilog sources.
    #[arg(long, value_name = "NAME")]
    top: Option<String>,
    /// Streaming handler sets: a JSON list of {name, ruleset, budgets}
    /// (docs/streams.md), their code compiled from --handler-source.
    #[arg(long, value_name = "FILE.json", requires = "handler_source")]
    handlers: Option<PathBuf>,
    /// C sources of the handler sets (include <corefarm/spin.h>).
    #[arg(long, value_name = "FILE", num_args = 1.., requires = "handlers")]
    handler_source: Vec<PathBuf>,
    /// Cyclone V raw binary file (Quartus RBF) to embed as the fpga-cyclonev artifact.
    #[arg(long, value_name = "FILE")]
    rbf: Option<PathBuf>,
    /// Number of cores for the default core table.
    #[arg(long, default_value_t = 1, conflicts_with = "core_table")]
    cores: u32,
    /// Explicit core table: control:input:output base addresses per core,
    /// comma separated, decimal or 0x-hex (e.g. 0x84140:0x50000:0x80000,...).
    #[arg(long, value_name = "TABLE")]
    core_table: Option<String>,
    /// Bytes of one input (default: from the sources; given, it must agree with them).
    #[arg(long)]
    input_size: Option<u32>,
    /// Bytes of one output (default: from the sources; given, it must agree with them).
    #[arg(long)]
    output_size: Option<u32>,
    /// Element type and shape of one input, e.g. `int16[4127]` or `int32[2,64,64]`
    /// (little-endian, C order; default: the HLS input pointer's element type).
    #[arg(long, value_name = "TYPE")]
    input_type: Option<DataType>,
    /// Element type and shape of one output, e.g. `int32[64,64]`.
    #[arg(long, value_name = "TYPE")]
    output_type: Option<DataType>,
    /// Fail the build on Verilator's warnings (they are always shown).
    #[arg(long)]
    strict: bool,
    /// The vendor flow of the sources: `intel` (HLS component with Avalon
    /// agent memories, Verilog with the Avalon port list) or `amd` (a Vitis
    /// HLS top function with m_axi pointers and `s_axilite port=return`,
    /// Verilog with an AXI4-Lite slave and an AXI4 master). An AMD build
    /// reads the arguments from the --hls source.
    #[arg(long, default_value = "intel", value_parser = parse_family)]
    family: image::Family,
    /// AMD: a scalar argument's value, fixed in the image (NAME=VALUE,
    /// repeatable); scalars not given come from each job's input.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_scalar)]
    scalar: Vec<(String, u32)>,
    /// Name recorded in the manifest, shown in node logs (default: the HLS
    /// entry, else the Verilog top, else the output file's stem).
    #[arg(long)]
    name: Option<String>,
    /// Where to write the image.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct MergeArgs {
    /// The images to combine (name and core table from the first).
    #[arg(required = true, num_args = 2..)]
    images: Vec<PathBuf>,
    /// Where to write the combined image.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct InspectArgs {
    /// The image file.
    file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: ImageCmd) -> anyhow::Result<()> {
    match cmd {
        ImageCmd::Build(a) => build(*a),
        ImageCmd::Merge(a) => merge(a),
        ImageCmd::Inspect(a) => inspect(a),
        ImageCmd::Keygen(a) => sign::keygen(a),
        ImageCmd::Sign(a) => sign::sign(a),
    }
}

fn number(s: &str) -> anyhow::Result<u32> {
    let s = s.trim().replace('_', "");
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.with_context(|| format!("{s:?} is not a 32-bit address"))
}

fn parse_table(s: &str) -> anyhow::Result<Vec<CoreInfo>> {
    s.split(',')
        .filter(|e| !e.trim().is_empty())
        .enumerate()
        .map(|(i, e)| {
            let parts: Vec<&str> = e.split(':').collect();
            let [c, inp, out] = parts.as_slice() else {
                bail!("core table entry {i} ({e:?}) is not control:input:output");
            };
            Ok(CoreInfo {
                control: number(c)?,
                input: number(inp)?,
                output: number(out)?,
            })
        })
        .collect()
}

fn parse_family(s: &str) -> Result<image::Family, image::UnknownFamily> {
    s.parse()
}

fn parse_scalar(s: &str) -> anyhow::Result<(String, u32)> {
    let (name, value) = s
        .split_once('=')
        .context("expected NAME=VALUE, e.g. n=1024")?;
    Ok((name.trim().to_string(), number(value.trim())?))
}

fn merge(a: MergeArgs) -> anyhow::Result<()> {
    let images = a
        .images
        .iter()
        .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let merged = corefarm_toolchain::merge_images(&images)?;
    std::fs::write(&a.out, &merged).with_context(|| format!("writing {}", a.out.display()))?;
    let m = Image::parse(merged.into())?.manifest;
    let arts: Vec<String> = m
        .artifacts
        .iter()
        .map(|x| format!("{} ({})", x.target, x.family))
        .collect();
    eprintln!("wrote {} (artifacts: {})", a.out.display(), arts.join(", "));
    Ok(())
}

fn build(a: BuildArgs) -> anyhow::Result<()> {
    if a.hls.is_none() && a.verilog.is_empty() && a.rbf.is_none() {
        bail!("nothing to build: give at least one of --hls, --verilog or --rbf");
    }
    let core_table = a.core_table.as_deref().map(parse_table).transpose()?;
    if core_table.as_ref().is_some_and(|t| t.is_empty()) {
        bail!("--core-table lists no cores");
    }
    let name = a
        .name
        .or_else(|| a.entry.clone())
        .or_else(|| a.top.clone())
        .or_else(|| a.out.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "image".into());
    let spec = BuildSpec {
        name,
        input_size: a.input_size,
        output_size: a.output_size,
        input_type: a.input_type,
        output_type: a.output_type,
        cores: a.cores,
        core_table,
        hls: a.hls.zip(a.entry),
        arches: a.arch,
        verilog: (!a.verilog.is_empty()).then(|| (a.verilog, a.top.unwrap_or_default())),
        rbf: a.rbf,
        strict: a.strict,
        handler_sets: match &a.handlers {
            Some(p) => serde_json::from_slice(
                &std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| {
                format!(
                    "{}: not a list of handler sets (docs/streams.md)",
                    p.display()
                )
            })?,
            None => Vec::new(),
        },
        handler_sources: a.handler_source,
        family: a.family,
        scalars: a.scalar,
    };
    let built = corefarm_toolchain::build_image(&spec)?;
    for w in &built.warnings {
        // Verilator's own warnings already start with "%Warning-<kind>:".
        let prefix = if w.starts_with('%') { "" } else { "warning: " };
        eprintln!("{prefix}{w}");
    }
    std::fs::write(&a.out, &built.image).with_context(|| format!("writing {}", a.out.display()))?;
    for n in &built.notes {
        eprintln!("{n}");
    }
    let m = &built.manifest;
    let targets: Vec<String> = m
        .artifacts
        .iter()
        .map(|x| format!("{} ({})", x.target, x.family))
        .collect();
    let n = m.cores.len();
    eprintln!(
        "wrote {} ({n} core{}; artifacts: {})",
        a.out.display(),
        if n == 1 { "" } else { "s" },
        targets.join(", ")
    );
    Ok(())
}

fn describe_arg(a: &image::Argument) -> String {
    match a {
        image::Argument::In { name, size } => format!("{name} (in, {size} B)"),
        image::Argument::Out { name, size } => format!("{name} (out, {size} B)"),
        image::Argument::Scalar {
            name,
            value: Some(v),
        } => format!("{name} = {v}"),
        image::Argument::Scalar { name, value: None } => format!("{name} (from the input)"),
    }
}

fn inspect(a: InspectArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    // Not a bitstream either: a node would be sent nothing to program.
    anyhow::ensure!(
        !bytes.is_empty(),
        "{} is empty: neither a corefarm image nor a bitstream",
        a.file.display()
    );
    if !image::is_image(&bytes) {
        if a.json {
            println!(
                "{}",
                serde_json::json!({"file": a.file, "kind": "raw-bitstream", "bytes": bytes.len()})
            );
        } else {
            println!(
                "{}: not a corefarm image; a node treats its {} bytes as a raw Cyclone V bitstream",
                a.file.display(),
                bytes.len()
            );
        }
        return Ok(());
    }
    let total = bytes.len();
    // What status, `top` and metrics show for the function this image
    // configures, so a user can tell which one is theirs.
    let digest = corefarm_server::metrics::bitstream_digest(&bytes);
    let bytes = bytes::Bytes::from(bytes);
    let shown = image::configuration(bytes.clone())
        .map(|c| corefarm_server::metrics::function_label(&c))
        .ok();
    let img = Image::parse(bytes)
        .with_context(|| format!("{} is not a valid image", a.file.display()))?;
    let status = img.verify();
    let bad = status.iter().filter(|r| r.is_err()).count();
    let (signer, signer_json, bad_signature) = sign::describe(&img);
    let m = &img.manifest;
    if a.json {
        let artifacts: Vec<_> = m
            .artifacts
            .iter()
            .zip(&status)
            .map(|(x, st)| {
                let mut v = serde_json::to_value(x).expect("plain data");
                v["checksum_ok"] = st.is_ok().into();
                v
            })
            .collect();
        let mut manifest = serde_json::to_value(m).expect("plain data");
        manifest["artifacts"] = artifacts.into();
        println!(
            "{}",
            serde_json::json!({
                "file": a.file, "kind": "image", "bytes": total,
                "version": image::VERSION, "manifest": manifest, "checksums_ok": bad == 0,
                "sha256": digest, "function": shown,
                "signature": signer_json,
            })
        );
    } else {
        println!(
            "{}: corefarm image v{}, {total} bytes",
            a.file.display(),
            image::VERSION
        );
        println!("name:        {}", m.name);
        println!("sha256:      {digest}");
        if let Some(shown) = &shown {
            println!("shown as:    {shown} (in status, top and metrics)");
        }
        println!("signed by:   {signer}");
        let typed = |t: &Option<DataType>| t.as_ref().map_or(String::new(), |t| format!(", {t}"));
        println!(
            "input size:  {} bytes{}",
            m.input_size,
            typed(&m.input_type)
        );
        println!(
            "output size: {} bytes{}",
            m.output_size,
            typed(&m.output_type)
        );
        println!("cores:       {}", m.cores.len());
        for (i, c) in m.cores.iter().enumerate() {
            println!(
                "  core {i:>3}: control {:#010x}  input {:#010x}  output {:#010x}",
                c.control, c.input, c.output
            );
        }
        println!("artifacts:   {}", m.artifacts.len());
        for (x, st) in m.artifacts.iter().zip(&status) {
            let entry = if x.entry.is_empty() {
                String::new()
            } else {
                format!(" entry {}", x.entry)
            };
            let check = match st {
                Ok(()) => "sha256 ok".to_string(),
                Err(e) => format!("BAD: {e}"),
            };
            println!(
                "  {:<22} {:<9} {:<5} {:>10} bytes{entry}  {check}",
                x.target,
                x.kind.name(),
                x.family.name(),
                x.length
            );
            if let Some(c) = x.control.as_ref().filter(|c| !c.args.is_empty()) {
                let args: Vec<String> = c.args.iter().map(describe_arg).collect();
                println!("    ap_ctrl_hs arguments: {}", args.join(", "));
            }
        }
        if !m.handler_sets.is_empty() {
            println!("handler sets: {} (docs/streams.md)", m.handler_sets.len());
        }
        for h in &m.handler_sets {
            let rules: Vec<String> = h
                .ruleset
                .rules
                .iter()
                .map(|r| {
                    format!(
                        "{:#x} <= w[{}] & {:#x} <= {:#x}",
                        r.start, r.index, r.mask, r.end
                    )
                })
                .collect();
            let b = &h.budgets;
            let result = h
                .result_type
                .as_ref()
                .map_or(String::new(), |t| format!(", results {t}"));
            println!(
                "  {:<16} {:?}: {}  (scratch {} B, shared {} B, {} counters, output {} B, {} ms per call{result})",
                h.name,
                h.ruleset.mode,
                rules.join(", "),
                b.scratch,
                b.shared,
                b.counters,
                b.output,
                b.per_call_ms
            );
        }
    }
    if bad > 0 {
        bail!("{bad} artifact(s) fail their checksum");
    }
    if bad_signature {
        bail!("the image's signature does not verify");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_table_parsing() {
        let t = parse_table("0x84140:0x50000:0x80000, 16:32:0x40").unwrap();
        assert_eq!(
            t[0],
            CoreInfo {
                control: 0x84140,
                input: 0x50000,
                output: 0x80000
            }
        );
        assert_eq!(
            t[1],
            CoreInfo {
                control: 16,
                input: 32,
                output: 64
            }
        );
        assert!(parse_table("1:2").is_err());
        assert!(parse_table("1:2:zz").is_err());
        assert!(parse_table("1:2:0x1_0000_0000").is_err());
    }
}
