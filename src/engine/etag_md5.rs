//! `--check-md5`: an object uploaded in one PUT has the MD5 of its bytes for its ETag (AWS S3
//! without SSE-KMS or SSE-C, MinIO, Garage, Ceph RGW), so where the server keeps no full-object
//! checksum that ETag still checks the whole object from the server's disk to DEST. It is opt-in
//! because MD5 costs more CPU than everything else hydrator does to a byte (docs/security.md
//! gives the figure), and because an ETag of MD5's shape is not always an MD5 (SSE-KMS on AWS).
//! An ETag with a `-N` suffix (a multipart upload) is not an MD5 and is not checked. When asked,
//! every object with an MD5 ETag is checked, whether or not the server also sent a checksum.
//!
//! An object fetched into one buffer is hashed from that buffer; a larger one is read back from
//! its partial file once all its parts are written, since its parts arrive out of order and MD5
//! can only run from the first byte to the last.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use md5::{Digest, Md5};

use crate::error::PartError;

/// Read at a time when hashing a file back.
const READ_BACK: usize = 1 << 20;

/// The MD5 an ETag states: 32 hex digits, in quotes or not.
pub(super) fn etag_md5(etag: &str) -> Option<[u8; 16]> {
    let hex = etag.trim_matches('"');
    if hex.len() != 32 {
        return None;
    }
    let mut md5 = [0u8; 16];
    for (byte, pair) in md5.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(md5)
}

/// `bytes`' MD5 against `expected`.
pub(super) fn check_bytes(expected: [u8; 16], bytes: &[u8]) -> Result<(), PartError> {
    compare(expected, Md5::digest(bytes).into())
}

/// The MD5 of the first `size` bytes of `file` against `expected`.
pub(super) fn check_file(
    expected: [u8; 16],
    file: &File,
    size: u64,
) -> io::Result<Result<(), PartError>> {
    let mut md5 = Md5::new();
    let mut buf = vec![0u8; READ_BACK];
    let mut offset = 0;
    while offset < size {
        let want = (size - offset).min(READ_BACK as u64) as usize;
        let n = file.read_at(&mut buf[..want], offset)?;
        if n == 0 {
            let short = format!("the file ended at {offset} of {size} bytes");
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, short));
        }
        md5.update(&buf[..n]);
        offset += n as u64;
    }
    Ok(compare(expected, md5.finalize().into()))
}

fn compare(expected: [u8; 16], actual: [u8; 16]) -> Result<(), PartError> {
    match expected == actual {
        true => Ok(()),
        false => Err(PartError::Md5Mismatch {
            expected: lower_hex(&expected),
            actual: lower_hex(&actual),
        }),
    }
}

fn lower_hex(md5: &[u8; 16]) -> String {
    md5.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_etag_of_32_hex_digits_states_an_md5() {
        let md5 = etag_md5("\"900150983cd24fb0d6963f7d28e17f72\"").unwrap();
        assert_eq!(lower_hex(&md5), "900150983cd24fb0d6963f7d28e17f72");
        assert!(etag_md5("900150983cd24fb0d6963f7d28e17f72").is_some());
        assert!(etag_md5("\"900150983cd24fb0d6963f7d28e17f72-3\"").is_none());
        assert!(etag_md5("\"900150983cd24fb0d6963f7d28e17fzz\"").is_none());
        assert!(etag_md5("\"\"").is_none());
    }

    #[test]
    fn bytes_and_files_are_checked_against_the_md5() {
        let abc = etag_md5("900150983cd24fb0d6963f7d28e17f72").unwrap(); // MD5("abc")
        assert!(check_bytes(abc, b"abc").is_ok());
        assert!(matches!(
            check_bytes(abc, b"abd"),
            Err(PartError::Md5Mismatch { .. })
        ));
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, b"abcdef").unwrap();
        assert!(check_file(abc, &file, 3).unwrap().is_ok());
        assert!(check_file(abc, &file, 4).unwrap().is_err());
        assert!(
            check_file(abc, &file, 10).is_err(),
            "a short file is an error"
        );
    }
}
