//! `build_image` end to end: sizes and types derived from the sources,
//! disagreeing statements refused with both numbers, Verilator's lint
//! warnings shown and `strict` failing on them.

use std::path::PathBuf;

use corefarm_cores::image::Image;
use corefarm_toolchain::{
    build_image, require_tool, BuildError, BuildSpec, SizeError, Tool, ToolchainError,
};

const SAXPY: &str = r#"
#include "corefarm/hls.h"
#define N 256
hls_avalon_agent_component
component void saxpy(hls_avalon_agent_memory_argument(8 + 2 * N * 4) int32_t *in,
                     hls_avalon_agent_memory_argument(N * 4) int32_t *out) {
    for (int i = 0; i < N; i++) out[i] = in[0] * in[2 + i] + in[2 + N + i];
}
"#;

/// A core summing its input words into a 16-bit accumulator (the bug lint
/// catches: a 32-bit sum truncated into 16 bits). `PARAMS` is replaced by
/// size parameter declarations, or nothing.
const ACC_V: &str = r#"
module acc #(parameter WORDS = 4) (
    input clock, input resetn,
    input [31:0] avs_cra_address, input avs_cra_read, input avs_cra_write,
    input [63:0] avs_cra_writedata, input [7:0] avs_cra_byteenable, output [63:0] avs_cra_readdata,
    input [31:0] avs_in_address, input avs_in_read, input avs_in_write,
    input [63:0] avs_in_writedata, input [7:0] avs_in_byteenable, output reg [63:0] avs_in_readdata,
    input [31:0] avs_out_address, input avs_out_read, input avs_out_write,
    input [63:0] avs_out_writedata, input [7:0] avs_out_byteenable, output reg [63:0] avs_out_readdata,
    output irq);
    PARAMS
    reg [63:0] mem_in[0:WORDS-1];
    reg [63:0] mem_out[0:WORDS-1];
    wire busy, finish;
    cf_csr csr (.clock(clock), .resetn(resetn), .address(avs_cra_address), .read(avs_cra_read),
        .write(avs_cra_write), .writedata(avs_cra_writedata), .byteenable(avs_cra_byteenable),
        .readdata(avs_cra_readdata), .finish(finish), .busy(busy), .irq(irq));
    reg [31:0] idx;
    reg [15:0] sum;
    assign finish = busy && idx == WORDS;
    always @(posedge clock)
        if (!resetn || !busy) begin idx <= 32'd0; sum <= 16'd0; end
        else if (idx < WORDS) begin
            sum <= sum + mem_in[idx][31:0];
            mem_out[idx] <= {48'd0, sum};
            idx <= idx + 32'd1;
        end
    integer b;
    always @(posedge clock) begin
        if (avs_in_write && avs_in_address < WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_in_byteenable[b]) mem_in[avs_in_address][8*b+:8] <= avs_in_writedata[8*b+:8];
        if (avs_in_read)
            avs_in_readdata <= avs_in_address < WORDS ? mem_in[avs_in_address] : 64'd0;
        if (avs_out_write && avs_out_address < WORDS)
            for (b = 0; b < 8; b = b + 1)
                if (avs_out_byteenable[b]) mem_out[avs_out_address][8*b+:8] <= avs_out_writedata[8*b+:8];
        if (avs_out_read)
            avs_out_readdata <= avs_out_address < WORDS ? mem_out[avs_out_address] : 64'd0;
    end
endmodule
"#;

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn hls_spec(dir: &tempfile::TempDir) -> BuildSpec {
    BuildSpec {
        name: "saxpy".into(),
        cores: 1,
        hls: Some((write(dir, "saxpy.cpp", SAXPY), "saxpy".into())),
        ..BuildSpec::default()
    }
}

fn verilog_spec(dir: &tempfile::TempDir, params: &str) -> BuildSpec {
    let v = write(dir, "acc.v", &ACC_V.replace("PARAMS", params));
    BuildSpec {
        name: "acc".into(),
        cores: 1,
        verilog: Some((vec![v], "acc".into())),
        ..BuildSpec::default()
    }
}

/// The sizes error and its text (what `corefarm image build` prints).
fn sizes_error(r: Result<corefarm_toolchain::Built, BuildError>) -> (SizeError, String) {
    match r {
        Err(BuildError::Sizes(e)) => {
            let text = e.to_string();
            (e, text)
        }
        other => panic!("expected a sizes error, got {other:?}"),
    }
}

#[test]
fn hls_sizes_and_types_are_derived_when_omitted() {
    if !require_tool(Tool::Cxx, "hls_sizes_and_types_are_derived_when_omitted") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let built = build_image(&hls_spec(&dir)).unwrap();
    let m = Image::parse(built.image.into()).unwrap().manifest;
    assert_eq!((m.input_size, m.output_size), (2056, 1024));
    assert_eq!(m.input_type.unwrap().to_string(), "int32[514]");
    assert_eq!(m.output_type.unwrap().to_string(), "int32[256]");
    assert!(
        built.notes[0]
            .starts_with("input: 2056 bytes, int32[514] (from the first argument of saxpy in "),
        "{:?}",
        built.notes
    );

    // Agreeing flags are fine; a type reshapes the output.
    let built = build_image(&BuildSpec {
        input_size: Some(2056),
        output_type: Some("int32[16,16]".parse().unwrap()),
        ..hls_spec(&dir)
    })
    .unwrap();
    assert_eq!(built.manifest.output_type.unwrap().shape, vec![16, 16]);
}

#[test]
fn hls_sizes_that_disagree_with_the_source_are_refused() {
    if !require_tool(
        Tool::Cxx,
        "hls_sizes_that_disagree_with_the_source_are_refused",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (kind, e) = sizes_error(build_image(&BuildSpec {
        input_size: Some(2048),
        output_size: Some(1024),
        ..hls_spec(&dir)
    }));
    assert!(
        matches!(
            kind,
            SizeError::Disagree {
                first: 2048,
                bytes: 2056,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.starts_with(
            "input size: --input-size says 2048 bytes but the first argument of saxpy in "
        ) && e.ends_with("saxpy.cpp says 2056 bytes"),
        "{e}"
    );
    let (kind, e) = sizes_error(build_image(&BuildSpec {
        output_type: Some("int16[512]".parse().unwrap()),
        ..hls_spec(&dir)
    }));
    assert!(
        matches!(
            kind,
            SizeError::ElementType {
                side: "output",
                declared: "int32",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.contains("int16 elements") && e.contains("pointer to int32"),
        "{e}"
    );
}

#[test]
fn verilog_sizes_come_from_parameters_and_must_agree() {
    if !require_tool(
        Tool::Verilator,
        "verilog_sizes_come_from_parameters_and_must_agree",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let params = "localparam INPUT_SIZE = 8 * WORDS, OUTPUT_SIZE = 8 * WORDS;";
    // Refused before anything is compiled: the parameter says 32.
    let (kind, e) = sizes_error(build_image(&BuildSpec {
        input_size: Some(64),
        ..verilog_spec(&dir, params)
    }));
    assert!(
        matches!(
            kind,
            SizeError::Disagree {
                first: 64,
                bytes: 32,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e,
        "input size: --input-size says 64 bytes but parameter INPUT_SIZE of module acc says 32 bytes"
    );
    // Without parameters and sizes, the build says what to give.
    let (kind, e) = sizes_error(build_image(&verilog_spec(&dir, "")));
    assert!(
        matches!(kind, SizeError::Unknown { side: "input", .. }),
        "{e}"
    );
    assert_eq!(
        e,
        "cannot tell the input size: the Verilog top module acc declares no INPUT_SIZE \
         parameter; give --input-size (or --input-type)"
    );

    // Lint: the truncating accumulator is a warning; strict fails on it
    // (at Verilation, before the C++ compile).
    let e = build_image(&BuildSpec {
        strict: true,
        ..verilog_spec(&dir, params)
    })
    .unwrap_err();
    let BuildError::Toolchain(ToolchainError::Lint(ws)) = &e else {
        panic!("expected a lint error, got {e:?}");
    };
    assert!(
        ws.iter()
            .any(|w| w.starts_with("%Warning-WIDTH") && w.contains("acc.v")),
        "{ws:?}"
    );
    assert!(e.to_string().contains("--strict makes them errors"), "{e}");

    let built = build_image(&verilog_spec(&dir, params)).unwrap();
    assert_eq!(
        (built.manifest.input_size, built.manifest.output_size),
        (32, 32)
    );
    assert!(
        built
            .warnings
            .iter()
            .any(|w| w.starts_with("%Warning-WIDTH") && w.contains("sum")),
        "{:?}",
        built.warnings
    );
}

#[test]
fn verilog_memories_must_hold_the_sizes() {
    if !require_tool(Tool::Verilator, "verilog_memories_must_hold_the_sizes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // No parameters: the flags decide, and the probe through the bus finds
    // 4-word (32-byte) memories.
    let (kind, e) = sizes_error(build_image(&BuildSpec {
        input_size: Some(64),
        output_size: Some(32),
        ..verilog_spec(&dir, "")
    }));
    assert!(
        matches!(
            kind,
            SizeError::Memory {
                side: "input",
                need: 8,
                words: 4,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e,
        "input size: 64 bytes need 8 64-bit words of input memory, but the input memory of \
         Verilog module acc holds 4 words (32 bytes; probed through its bus)"
    );
}

/// A CRC-32 over 4096-byte blocks, as a user writes it: bytes in, one
/// word out.
const CRC32: &str = r#"
#include "corefarm/hls.h"
hls_avalon_agent_component
component void crc32(hls_avalon_agent_memory_argument(4096) uint8_t *in,
                     hls_avalon_agent_memory_argument(4) uint32_t *out) {
    uint32_t c = 0xFFFFFFFFu;
    for (int i = 0; i < 4096; i++) {
        c ^= in[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    out[0] = ~c;
}
component void scale(hls_avalon_agent_memory_argument(64) unsigned char *in,
                     hls_avalon_agent_memory_argument(64) float *out) {
    for (int i = 0; i < 16; i++) out[i] = in[i] * 0.5f;
}
"#;

#[test]
fn byte_memories_record_uint8() {
    if !require_tool(Tool::Cxx, "byte_memories_record_uint8") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = write(&dir, "crc.cpp", CRC32);
    let spec = |entry: &str| BuildSpec {
        name: entry.into(),
        cores: 1,
        hls: Some((src.clone(), entry.into())),
        ..BuildSpec::default()
    };
    let types = |b: &corefarm_toolchain::Built| {
        let t = |t: &Option<corefarm_cores::image::DataType>| t.as_ref().map(|t| t.to_string());
        (t(&b.manifest.input_type), t(&b.manifest.output_type))
    };
    // A uint8_t * input is a uint8 memory: clients can then refuse an
    // int32 array instead of sending it as four inputs.
    let built = build_image(&spec("crc32")).unwrap();
    assert_eq!(
        types(&built),
        (Some("uint8[4096]".into()), Some("uint32[1]".into()))
    );
    assert!(
        built.notes[0].starts_with("input: 4096 bytes, uint8[4096] (from the first argument"),
        "{:?}",
        built.notes
    );
    let built = build_image(&spec("scale")).unwrap();
    assert_eq!(
        types(&built),
        (Some("uint8[64]".into()), Some("float32[16]".into()))
    );
    // The flag still retypes a byte memory.
    let built = build_image(&BuildSpec {
        input_type: Some("int8[4096]".parse().unwrap()),
        ..spec("crc32")
    })
    .unwrap();
    assert_eq!(types(&built).0.as_deref(), Some("int8[4096]"));
}
