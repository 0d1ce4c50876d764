//! Each writer backend writing a real 64 MiB file in 1 MiB pooled buffers, buffered and with
//! O_DIRECT, in a temporary directory (`TMPDIR` chooses the filesystem).

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hydrator::config::IoBackendChoice;
use hydrator::write::buffer::BufferPool;
use hydrator::write::{WriteJob, Writers};
use tokio::sync::oneshot;

const FILE: usize = 64 << 20;
const BUFFER: usize = 1 << 20;

fn write_file(
    runtime: &tokio::runtime::Runtime,
    writers: &Writers,
    path: &std::path::Path,
    direct: bool,
) {
    let mut options = File::options();
    options.write(true).create(true).truncate(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let file = Arc::new(options.open(path).expect("open the bench file"));
    let pool = BufferPool::new(32, BUFFER);
    let block = vec![0x5au8; BUFFER];
    runtime.block_on(async {
        let mut waits = Vec::with_capacity(FILE / BUFFER);
        for i in 0..FILE / BUFFER {
            let mut buf = pool.acquire().await;
            buf.fill_from(&block);
            let (done, wait) = oneshot::channel();
            writers.writer.submit(WriteJob {
                file: file.clone(),
                offset: (i * BUFFER) as u64,
                buf,
                done,
            });
            waits.push(wait);
        }
        for wait in waits {
            wait.await
                .expect("writer answered")
                .expect("write succeeded");
        }
    });
    file.sync_data().expect("sync");
}

fn writers(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut group = c.benchmark_group("write_64MiB");
    group.throughput(Throughput::Bytes(FILE as u64));
    group.sample_size(10);
    for (name, choice) in [
        ("pwrite", IoBackendChoice::Pwrite),
        ("io_uring", IoBackendChoice::IoUring),
    ] {
        let Ok(writers) = Writers::start(choice) else {
            eprintln!("{name}: not available here, skipped");
            continue;
        };
        for direct in [false, true] {
            let path = dir.path().join(format!("{name}-{direct}"));
            let label = format!("{name}/{}", if direct { "o_direct" } else { "buffered" });
            group.bench_function(label, |b| {
                b.iter(|| write_file(&runtime, &writers, &path, direct))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, writers);
criterion_main!(benches);
