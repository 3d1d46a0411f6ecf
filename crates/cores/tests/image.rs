//! Configuration images written by corefarm-toolchain's builder and read
//! back by corefarm-cores: round trip, checksums, hostile bytes.

use bytes::Bytes;
use corefarm_cores::image::{
    configuration, default_core_table, ArtifactKind, Image, ImageError, FPGA_TARGET, MAGIC,
};
use corefarm_toolchain::ImageBuilder;

fn sample() -> Vec<u8> {
    ImageBuilder::new("vadd", 64, 32, default_core_table(2, 64, 32).unwrap())
        .artifact(
            "native-x86_64-linux",
            ArtifactKind::Native,
            "vadd",
            b"ELF-ish".to_vec(),
        )
        .artifact(FPGA_TARGET, ArtifactKind::Bitstream, "", vec![0xAA; 100])
        .build()
        .unwrap()
}

#[test]
fn round_trip() {
    let bytes = sample();
    assert_eq!(&bytes[..8], MAGIC);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 1);
    let img = Image::parse(Bytes::from(bytes)).unwrap();
    assert_eq!(img.manifest.name, "vadd");
    assert_eq!(img.manifest.cores.len(), 2);
    assert_eq!(img.targets(), vec!["native-x86_64-linux", FPGA_TARGET]);
    assert!(img.verify().iter().all(|r| r.is_ok()));
    assert_eq!(&img.verified_artifact(0).unwrap()[..], b"ELF-ish");
    assert_eq!(img.verified_artifact(1).unwrap().len(), 100);
    assert_eq!(img.manifest.artifacts[1].offset, 7);
}

#[test]
fn checksum_failure_is_reported() {
    let mut bytes = sample();
    let last = bytes.len() - 1;
    bytes[last] ^= 1; // corrupt the bitstream artifact
    let img = Image::parse(Bytes::from(bytes)).unwrap();
    assert!(img.verified_artifact(0).is_ok());
    let e = img.verified_artifact(1).unwrap_err();
    assert!(matches!(e, ImageError::Checksum { index: 1, .. }), "{e}");
    assert!(e.to_string().contains("checksum"));
}

#[test]
fn hostile_images_are_errors() {
    let good = sample();
    assert_eq!(
        Image::parse(Bytes::from_static(b"RBFDATA")).unwrap_err(),
        ImageError::NoMagic
    );
    // Every truncation of a valid image is an error, never a panic.
    for cut in 0..good.len() {
        let r = Image::parse(Bytes::copy_from_slice(&good[..cut]));
        assert!(r.is_err(), "truncated to {cut} bytes parsed");
    }
    let mut v = good.clone();
    v[8] = 2;
    assert_eq!(
        Image::parse(Bytes::from(v)).unwrap_err(),
        ImageError::Version(2)
    );
    let mut v = good.clone();
    v[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Image::parse(Bytes::from(v)).is_err());
    // An artifact pointing past the end.
    let mlen = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
    let json = std::str::from_utf8(&good[16..16 + mlen]).unwrap();
    let bad = json.replace("\"length\":100", "\"length\":101");
    let mut v = good[..16].to_vec();
    v[12..16].copy_from_slice(&(bad.len() as u32).to_le_bytes());
    v.extend_from_slice(bad.as_bytes());
    v.extend_from_slice(&good[16 + mlen..]);
    assert!(matches!(
        Image::parse(Bytes::from(v)),
        Err(ImageError::OutOfBounds { .. })
    ));
}

#[test]
fn configuration_from_image() {
    let bytes = Bytes::from(sample());
    let cfg = configuration(bytes.clone()).unwrap();
    assert_eq!(cfg.input_size, 64);
    assert_eq!(cfg.output_size, 32);
    assert_eq!(cfg.cores, default_core_table(2, 64, 32).unwrap());
    assert_eq!(cfg.bitstream, bytes);
}
