//! End-to-end checksums. BLAKE3 proves what hydrator wrote is what it received; where the
//! server keeps a full-object CRC (CRC64NVME, which AWS and Garage compute for new objects, or
//! CRC32/CRC32C chosen by the uploader), hydrator also proves what it received is what was
//! uploaded. Parts are CRC'd as they stream and the part CRCs are combined in offset order
//! (`crc(A‖B)` from `crc(A)`, `crc(B)` and `len(B)`), so no byte is read twice. Composite
//! (per-upload-part) checksums cannot be compared with hydrator's parts and are not used.

use aws_sdk_s3::types::ChecksumType;
use crc_fast::{checksum_combine, CrcAlgorithm, Digest};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
}

impl Algorithm {
    fn crc(self) -> CrcAlgorithm {
        match self {
            Algorithm::Crc32 => CrcAlgorithm::Crc32IsoHdlc,
            Algorithm::Crc32c => CrcAlgorithm::Crc32Iscsi,
            Algorithm::Crc64Nvme => CrcAlgorithm::Crc64Nvme,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Crc64Nvme => "CRC64NVME",
        }
    }

    pub(crate) fn digest(self) -> Digest {
        Digest::new(self.crc())
    }
}

/// The server's checksum of a whole object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FullObjectChecksum {
    pub algorithm: Algorithm,
    pub value: u64,
}

/// Picks the strongest full-object checksum among a response's checksum headers. A CRC32 or
/// CRC32C of a multipart upload (an ETag ending in `-N`) is the composite of its upload parts
/// unless the server says `FULL_OBJECT`: some servers send it bare, without `-N` and without a
/// checksum type, and it is then not comparable to the bytes as a whole. CRC64NVME is always
/// full-object.
pub(crate) fn full_object(
    checksum_type: Option<&ChecksumType>,
    etag: &str,
    crc64nvme: Option<&str>,
    crc32c: Option<&str>,
    crc32: Option<&str>,
) -> Option<FullObjectChecksum> {
    let multipart = etag.trim_matches('"').contains('-');
    let comparable = |algorithm: Algorithm| match checksum_type {
        Some(ChecksumType::FullObject) => true,
        Some(ChecksumType::Composite) => false,
        _ => !multipart || algorithm == Algorithm::Crc64Nvme,
    };
    [
        (Algorithm::Crc64Nvme, crc64nvme),
        (Algorithm::Crc32c, crc32c),
        (Algorithm::Crc32, crc32),
    ]
    .into_iter()
    .find_map(|(algorithm, text)| {
        let text = text.filter(|_| comparable(algorithm))?;
        if text.contains('-') {
            return None; // "<base64>-<parts>": composite
        }
        let bytes = aws_smithy_types::base64::decode(text).ok()?;
        if bytes.len() > 8 || bytes.is_empty() {
            return None;
        }
        let value = bytes.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b));
        Some(FullObjectChecksum { algorithm, value })
    })
}

/// The CRC of a whole object from its parts' `(crc, length)` in offset order.
pub(crate) fn combine(algorithm: Algorithm, parts: &[(u64, u64)]) -> u64 {
    let mut parts = parts.iter();
    let Some(&(first, _)) = parts.next() else {
        return algorithm.digest().finalize();
    };
    parts.fold(first, |acc, &(crc, len)| {
        checksum_combine(algorithm.crc(), acc, crc, len)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_crcs_combine_to_the_whole() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 253) as u8).collect();
        for algorithm in [Algorithm::Crc32, Algorithm::Crc32c, Algorithm::Crc64Nvme] {
            let mut whole = algorithm.digest();
            whole.update(&data);
            let parts: Vec<(u64, u64)> = data
                .chunks(30_000)
                .map(|c| {
                    let mut d = algorithm.digest();
                    d.update(c);
                    (d.finalize(), c.len() as u64)
                })
                .collect();
            assert_eq!(
                combine(algorithm, &parts),
                whole.finalize(),
                "{}",
                algorithm.name()
            );
        }
    }

    #[test]
    fn parses_headers() {
        // CRC32 of "hello world" is 0x0d4a1185, as S3 sends it: base64 of the big-endian bytes.
        let c = full_object(None, "\"abc\"", None, None, Some("DUoRhQ==")).unwrap();
        assert_eq!(
            c,
            FullObjectChecksum {
                algorithm: Algorithm::Crc32,
                value: 0x0d4a_1185
            }
        );
        let mut d = Algorithm::Crc32.digest();
        d.update(b"hello world");
        assert_eq!(d.finalize(), c.value);
        assert!(full_object(
            Some(&ChecksumType::Composite),
            "abc",
            None,
            None,
            Some("DUoRhQ==")
        )
        .is_none());
        assert!(full_object(None, "abc", None, None, Some("DUoRhQ==-3")).is_none());
        assert!(full_object(None, "abc", None, None, None).is_none());
        // A multipart upload's bare CRC32 without a checksum type is its composite.
        assert!(full_object(None, "\"abc-3\"", None, None, Some("DUoRhQ==")).is_none());
        let full = Some(&ChecksumType::FullObject);
        assert!(full_object(full, "\"abc-3\"", None, None, Some("DUoRhQ==")).is_some());
        let nvme = full_object(None, "abc-3", Some("AAAAAAAAAAE="), None, None).unwrap();
        assert_eq!(nvme.algorithm, Algorithm::Crc64Nvme);
    }
}
