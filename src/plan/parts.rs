//! Part arithmetic: an object of `size` bytes is cut into `part_size` parts at multiples of
//! `part_size` (so each part is a BLAKE3 subtree, see `hash`).

use std::ops::Range;

/// The byte ranges of the parts of an object; an empty object has no parts.
pub(crate) fn part_ranges(size: u64, part_size: u64) -> impl Iterator<Item = Range<u64>> {
    (0..size.div_ceil(part_size)).map(move |i| {
        let start = i * part_size;
        start..(start + part_size).min(size)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_object() {
        let p = 1 << 20;
        assert_eq!(part_ranges(0, p).count(), 0);
        assert_eq!(part_ranges(1, p).collect::<Vec<_>>(), vec![0..1]);
        assert_eq!(part_ranges(p - 1, p).collect::<Vec<_>>(), vec![0..p - 1]);
        assert_eq!(part_ranges(p, p).collect::<Vec<_>>(), vec![0..p]);
        assert_eq!(
            part_ranges(p + 1, p).collect::<Vec<_>>(),
            vec![0..p, p..p + 1]
        );
        assert_eq!(part_ranges(3 * p, p).count(), 3);
    }
}
