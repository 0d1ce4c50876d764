//! BLAKE3 of one part (as the engine hashes each pooled buffer) and the merge of part chaining
//! values into a file hash.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hydrator::hash::{merge_parts, PartDigest, PartHasher};

const PART: u64 = 8 << 20;
const BUFFER: usize = 1 << 20;

fn part_hash(c: &mut Criterion) {
    let data = hydrator::demo::dataset::content(1, PART);
    let mut group = c.benchmark_group("blake3_part");
    group.throughput(Throughput::Bytes(PART));
    group.bench_function("8MiB_in_1MiB_buffers", |b| {
        b.iter(|| {
            let mut hasher = PartHasher::new(PART, false);
            for buffer in data.chunks(BUFFER) {
                hasher.update(buffer);
            }
            hasher.finish()
        })
    });
    group.finish();
}

fn merge(c: &mut Criterion) {
    let mut group = c.benchmark_group("blake3_merge");
    for parts in [16u64, 256, 4096] {
        let digests: Vec<PartDigest> = (0..parts)
            .map(|i| {
                let mut hasher = PartHasher::new(i * PART, false);
                hasher.update(&[i as u8; 64]);
                hasher.finish()
            })
            .collect();
        let len = (parts - 1) * PART + 64;
        group.bench_with_input(
            BenchmarkId::from_parameter(parts),
            &digests,
            |b, digests| b.iter(|| merge_parts(digests, len, PART)),
        );
    }
    group.finish();
}

criterion_group!(benches, part_hash, merge);
criterion_main!(benches);
