//! BLAKE3 of whole files assembled from independently hashed parts.
//!
//! Parts have a power-of-two size `P` (≥ 1 KiB) and start at multiples of `P`, so each part is a
//! complete BLAKE3 subtree. A part is hashed on its own (`set_input_offset`, `finalize_non_root`)
//! as its bytes stream in, in any order, and only its 32-byte chaining value is kept. The file's
//! root hash is then rebuilt by merging chaining values along BLAKE3's tree shape
//! (`left_subtree_len`), which gives exactly `blake3::hash(file)` without reading the file again.

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

/// Hasher for one part of a file, positioned at the part's offset.
pub struct PartHasher {
    hasher: blake3::Hasher,
    single_part: bool,
}

/// The result of hashing one part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartDigest {
    /// The part is the whole file: this is already the file's root hash.
    Root(blake3::Hash),
    /// The chaining value of a part that is one subtree of a larger file.
    Subtree(ChainingValue),
}

impl PartHasher {
    /// `single_part` is true when the part covers the whole file (the file fits in one part).
    pub fn new(offset: u64, single_part: bool) -> Self {
        let mut hasher = blake3::Hasher::new();
        if !single_part {
            hasher.set_input_offset(offset);
        }
        Self {
            hasher,
            single_part,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    pub fn finish(&self) -> PartDigest {
        if self.single_part {
            PartDigest::Root(self.hasher.finalize())
        } else {
            PartDigest::Subtree(self.hasher.finalize_non_root())
        }
    }
}

/// Merges the digests of all parts of a file of `file_len` bytes cut into `part_size` parts.
///
/// `parts` must hold one digest per part, in offset order. Panics if the shape is inconsistent
/// (a bug in the caller, never a property of input data).
pub fn merge_parts(parts: &[PartDigest], file_len: u64, part_size: u64) -> blake3::Hash {
    assert!(part_size.is_power_of_two() && part_size >= blake3::CHUNK_LEN as u64);
    if let [PartDigest::Root(hash)] = parts {
        return *hash;
    }
    let cvs: Vec<ChainingValue> = parts
        .iter()
        .map(|p| match p {
            PartDigest::Subtree(cv) => *cv,
            PartDigest::Root(_) => panic!("root digest in a multi-part file"),
        })
        .collect();
    assert_eq!(cvs.len() as u64, file_len.div_ceil(part_size));
    let (left, right) = split_subtree(&cvs, file_len, part_size);
    merge_subtrees_root(&left, &right, Mode::Hash)
}

/// Splits a multi-part subtree of `len` bytes into its two children's chaining values.
fn split_subtree(
    cvs: &[ChainingValue],
    len: u64,
    part_size: u64,
) -> (ChainingValue, ChainingValue) {
    let left_len = left_subtree_len(len);
    let left_parts = (left_len / part_size) as usize;
    let left = subtree_cv(&cvs[..left_parts], left_len, part_size);
    let right = subtree_cv(&cvs[left_parts..], len - left_len, part_size);
    (left, right)
}

fn subtree_cv(cvs: &[ChainingValue], len: u64, part_size: u64) -> ChainingValue {
    if cvs.len() == 1 {
        return cvs[0];
    }
    let (left, right) = split_subtree(cvs, len, part_size);
    merge_subtrees_non_root(&left, &right, Mode::Hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hash_in_parts(data: &[u8], part_size: u64) -> blake3::Hash {
        let single = data.len() as u64 <= part_size;
        let digests: Vec<PartDigest> = if data.is_empty() {
            vec![PartHasher::new(0, true).finish()]
        } else {
            data.chunks(part_size as usize)
                .enumerate()
                .map(|(i, chunk)| {
                    let mut h = PartHasher::new(i as u64 * part_size, single);
                    h.update(chunk);
                    h.finish()
                })
                .collect()
        };
        merge_parts(&digests, data.len() as u64, part_size)
    }

    #[test]
    fn boundaries_match_blake3() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for part_size in [1024u64, 2048, 4096, 16384] {
            for len in [
                0,
                1,
                1023,
                1024,
                1025,
                2047,
                2048,
                2049,
                4096 * 3 + 1,
                70_000,
            ] {
                let slice = &data[..len];
                assert_eq!(
                    hash_in_parts(slice, part_size),
                    blake3::hash(slice),
                    "len {len} part {part_size}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn merge_equals_blake3(len in 0usize..300_000, shift in 10u32..15, seed in any::<u8>()) {
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed | 1)).collect();
            let part_size = 1u64 << shift;
            prop_assert_eq!(hash_in_parts(&data, part_size), blake3::hash(&data));
        }
    }
}
