//! "Did you mean": the known name nearest to one that names nothing, by edit distance, for a
//! prefix that lists nothing and a catalog dataset name that is not in the catalog.

/// The candidate nearest to `wanted` (fewest single-character insertions, deletions and
/// substitutions), when it is near enough to be a typo: at most one edit in three characters,
/// and at least one. The first of equally near candidates wins; `wanted` itself is never
/// suggested.
pub(crate) fn closest<'a>(
    wanted: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let most = (wanted.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .filter(|candidate| *candidate != wanted)
        .map(|candidate| (edit_distance(wanted, candidate), candidate))
        .filter(|(distance, _)| *distance <= most)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, a_char) in a.chars().enumerate() {
        let mut current = Vec::with_capacity(b.len() + 1);
        current.push(i + 1);
        for (j, b_char) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(a_char != *b_char);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("vision-2026", "vison-2026"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("imagenet", "imagenet"), 0);
    }

    #[test]
    fn suggests_the_nearest_typo_only() {
        let prefixes = ["vision-2025", "vision-2026", "audio-2026"];
        assert_eq!(closest("vison-2026", prefixes), Some("vision-2026"));
        assert_eq!(closest("vision-2027", prefixes), Some("vision-2025"));
        assert_eq!(closest("imagnet", ["coco", "imagenet"]), Some("imagenet"));
        // Too far to be a typo, or the very name.
        assert_eq!(closest("laion", ["imagenet", "coco"]), None);
        assert_eq!(closest("coco", ["coco"]), None);
        assert_eq!(closest("ab", ["xy"]), None);
        assert_eq!(closest("ab", ["abc"]), Some("abc"));
    }
}
