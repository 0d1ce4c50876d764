//! Bytes in flight to the disk, bounded by a pool of permits: a GET that finds no free permit
//! waits, so a slow disk slows the network instead of growing memory. A permit stands for one
//! buffer's worth of bytes, held in one of two forms:
//! - [`ChunkList`], for buffered writes: the chunks as the HTTP client received them, written
//!   with one vectored write. Nothing is copied: copying every byte into a buffer of ours cost
//!   a tenth of the CPU on large objects. The chunks keep the client's read buffers (hyper:
//!   ≤ 408 KiB each) alive until written, so a permit pins at most its bytes plus the rest of
//!   the two read buffers its first and last chunks were cut from.
//! - [`PooledBuf`], 4 KiB-aligned, for O_DIRECT, which needs aligned memory: the bytes are
//!   copied in. A part smaller than a buffer gets a buffer of its own size (still under a
//!   permit, not recycled): 50 tiny objects in flight held 50 MiB of full-size buffers before.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use tokio::sync::Semaphore;

/// Alignment that O_DIRECT needs for buffers, offsets and lengths on common filesystems.
pub(crate) const DIRECT_IO_ALIGN: usize = 4096;
/// Size of one pooled write buffer. Parts stream through several of these.
pub(crate) const WRITE_BUFFER_SIZE: usize = 1 << 20;
/// Chunks in one vectored write, far below the kernel's `IOV_MAX` (1024): a server that
/// trickles tiny chunks gets more writes, not longer ones.
const MAX_CHUNKS: usize = 64;

/// A fixed-capacity byte buffer aligned to `DIRECT_IO_ALIGN`.
struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, DIRECT_IO_ALIGN).expect("valid buffer layout")
    }

    fn new(capacity: usize) -> Self {
        assert!(capacity > 0 && capacity.is_multiple_of(DIRECT_IO_ALIGN));
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(Self::layout(capacity)) };
        let ptr =
            NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(Self::layout(capacity)));
        Self {
            ptr,
            capacity,
            len: 0,
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) }
    }
}

struct PoolInner {
    free: Mutex<Vec<AlignedBuf>>,
    permits: Semaphore,
    buffer_size: usize,
}

/// A bounded pool of write buffers, allocated on first use and reused after.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

impl BufferPool {
    pub fn new(buffers: usize, buffer_size: usize) -> Self {
        Self {
            inner: Arc::new(PoolInner {
                free: Mutex::new(Vec::with_capacity(buffers)),
                permits: Semaphore::new(buffers),
                buffer_size,
            }),
        }
    }

    /// Waits for a free buffer for `remaining` more bytes: a full-size pooled one, or an
    /// exact-size one (rounded up to the O_DIRECT alignment) when less than a buffer is left.
    pub(crate) async fn acquire_for(&self, remaining: u64) -> PooledBuf {
        let size = self.inner.buffer_size;
        if remaining >= size as u64 {
            return self.acquire().await;
        }
        let permit = self.permit().await;
        let capacity = (remaining as usize)
            .max(1)
            .next_multiple_of(DIRECT_IO_ALIGN);
        PooledBuf {
            buf: Some(AlignedBuf::new(capacity)),
            permit,
            recycle: false,
        }
    }

    async fn permit(&self) -> Permit {
        self.inner
            .permits
            .acquire()
            .await
            .expect("the pool semaphore is never closed")
            .forget();
        Permit(self.inner.clone())
    }

    /// Waits for a permit to gather up to a buffer's worth of the `remaining` bytes of a part.
    pub async fn acquire_chunks(&self, remaining: u64) -> ChunkList {
        let permit = self.permit().await;
        ChunkList {
            chunks: Vec::new(),
            len: 0,
            capacity: remaining.min(self.inner.buffer_size as u64) as usize,
            permit,
        }
    }

    /// Waits for a free full-size buffer.
    pub async fn acquire(&self) -> PooledBuf {
        let permit = self.permit().await;
        let buf = self
            .inner
            .free
            .lock()
            .expect("pool lock")
            .pop()
            .unwrap_or_else(|| AlignedBuf::new(self.inner.buffer_size));
        PooledBuf {
            buf: Some(buf),
            permit,
            recycle: true,
        }
    }
}

/// One buffer's worth of bytes in flight; given back to the pool when dropped.
pub struct Permit(Arc<PoolInner>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.permits.add_permits(1);
    }
}

/// Received chunks on their way to one vectored write, under one permit.
pub struct ChunkList {
    chunks: Vec<Bytes>,
    len: usize,
    capacity: usize,
    permit: Permit,
}

impl ChunkList {
    /// Keeps as much of `data` as fits, without copying it, and returns the rest.
    pub fn take_from(&mut self, mut data: Bytes) -> Bytes {
        let rest = data.split_off(data.len().min(self.capacity - self.len));
        if !data.is_empty() {
            self.len += data.len();
            self.chunks.push(data);
        }
        rest
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len == self.capacity || self.chunks.len() == MAX_CHUNKS
    }

    /// The chunks to write, and the permit to drop once they are written.
    pub(crate) fn into_parts(self) -> (Vec<Bytes>, Permit) {
        (self.chunks, self.permit)
    }
}

/// Drops the first `written` bytes of `chunks`, after a write that took only part of them.
pub(crate) fn consume(chunks: &mut Vec<Bytes>, mut written: usize) {
    let done = chunks
        .iter()
        .take_while(|chunk| {
            let whole = written >= chunk.len();
            if whole {
                written -= chunk.len();
            }
            whole
        })
        .count();
    chunks.drain(..done);
    if let Some(first) = chunks.first_mut() {
        first.advance(written);
    }
}

/// A buffer on loan from the pool; it goes back when dropped (after its write).
pub struct PooledBuf {
    buf: Option<AlignedBuf>,
    permit: Permit,
    /// Full-size buffers go back to the free list; exact-size ones are freed.
    recycle: bool,
}

impl PooledBuf {
    fn buf(&self) -> &AlignedBuf {
        self.buf.as_ref().expect("buffer present until drop")
    }

    pub(crate) fn len(&self) -> usize {
        self.buf().len
    }

    pub(crate) fn is_full(&self) -> bool {
        self.buf().len == self.buf().capacity
    }

    /// Copies as much of `data` as fits and returns how many bytes were taken.
    pub fn fill_from(&mut self, data: &[u8]) -> usize {
        let buf = self.buf.as_mut().expect("buffer present until drop");
        let n = data.len().min(buf.capacity - buf.len);
        // SAFETY: `n` bytes fit after `len` in the allocation; `data` does not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr.as_ptr().add(buf.len), n);
        }
        buf.len += n;
        n
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        let buf = self.buf();
        // SAFETY: the first `len` bytes are initialised (the allocation is zeroed).
        unsafe { std::slice::from_raw_parts(buf.ptr.as_ptr(), buf.len) }
    }

    /// Extends the length with zeros up to the next multiple of `DIRECT_IO_ALIGN`, for the last
    /// O_DIRECT write of a file (the file is truncated to its real size afterwards).
    pub(crate) fn pad_for_direct_io(&mut self) {
        let buf = self.buf.as_mut().expect("buffer present until drop");
        let padded = buf.len.next_multiple_of(DIRECT_IO_ALIGN);
        // SAFETY: `padded` ≤ capacity since capacity is a multiple of the alignment.
        unsafe { std::ptr::write_bytes(buf.ptr.as_ptr().add(buf.len), 0, padded - buf.len) };
        buf.len = padded;
    }
}

impl Drop for PooledBuf {
    /// Recycles the buffer before the permit (a field, dropped after this) lets the next one in.
    fn drop(&mut self) {
        if let Some(mut buf) = self.buf.take().filter(|_| self.recycle) {
            buf.len = 0;
            self.permit.0.free.lock().expect("pool lock").push(buf);
        }
    }
}

// SAFETY: the pointer stays valid and fixed while the PooledBuf lives (heap allocation owned by
// it); `len` bytes are initialised and `capacity` is the allocation size.
unsafe impl tokio_uring::buf::IoBuf for PooledBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.buf().ptr.as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.buf().len
    }

    fn bytes_total(&self) -> usize {
        self.buf().capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pool_bounds_and_recycles() {
        let pool = BufferPool::new(2, 8192);
        let mut a = pool.acquire().await;
        let b = pool.acquire().await;
        assert_eq!(a.fill_from(&[7u8; 10_000]), 8192);
        assert!(a.is_full());
        assert_eq!(a.as_slice().as_ptr() as usize % DIRECT_IO_ALIGN, 0);
        let third = tokio::time::timeout(std::time::Duration::from_millis(50), pool.acquire());
        assert!(third.await.is_err(), "a third buffer must wait");
        drop(a);
        let c = pool.acquire().await;
        assert_eq!(c.len(), 0, "a recycled buffer comes back empty");
        drop((b, c));
    }

    #[tokio::test]
    async fn a_small_remainder_gets_an_exact_buffer_under_a_permit() {
        let pool = BufferPool::new(1, 8192);
        let mut small = pool.acquire_for(100).await;
        assert_eq!(
            small.fill_from(&[3u8; 5000]),
            DIRECT_IO_ALIGN,
            "rounded up to the alignment"
        );
        let second = tokio::time::timeout(std::time::Duration::from_millis(50), pool.acquire());
        assert!(
            second.await.is_err(),
            "the small buffer holds the only permit"
        );
        drop(small);
        assert!(pool.inner.free.lock().unwrap().is_empty(), "not recycled");
        assert_eq!(pool.acquire_for(8192).await.fill_from(&[0u8; 9000]), 8192);
    }

    #[tokio::test]
    async fn chunk_lists_take_without_copying_and_hold_a_permit() {
        let pool = BufferPool::new(1, 8192);
        let mut list = pool.acquire_chunks(10_000).await;
        let data = Bytes::from(vec![9u8; 6000]);
        let address = data.as_ptr();
        assert!(list.take_from(data).is_empty());
        let rest = list.take_from(Bytes::from(vec![8u8; 6000]));
        assert_eq!((list.len(), rest.len()), (8192, 3808), "capped at a buffer");
        assert!(list.is_full());
        let (chunks, permit) = list.into_parts();
        assert_eq!(chunks[0].as_ptr(), address, "not copied");
        let second = tokio::time::timeout(std::time::Duration::from_millis(50), pool.acquire());
        assert!(second.await.is_err(), "the list holds the only permit");
        drop(permit);
        let mut last = pool.acquire_chunks(100).await;
        assert_eq!(
            last.take_from(rest).len(),
            3708,
            "only what the part has left"
        );
    }

    #[test]
    fn consume_drops_written_bytes_across_chunks() {
        let mut chunks = vec![
            Bytes::from_static(b"abc"),
            Bytes::from_static(b"defg"),
            Bytes::from_static(b"hi"),
        ];
        consume(&mut chunks, 5);
        assert_eq!(chunks, [&b"fg"[..], &b"hi"[..]]);
        consume(&mut chunks, 2);
        assert_eq!(chunks, [&b"hi"[..]]);
        consume(&mut chunks, 2);
        assert!(chunks.is_empty());
    }

    #[tokio::test]
    async fn padding_reaches_alignment_with_zeros() {
        let pool = BufferPool::new(1, 8192);
        let mut a = pool.acquire().await;
        a.fill_from(&[1u8; 5000]);
        a.pad_for_direct_io();
        assert_eq!(a.len(), 8192);
        assert!(a.as_slice()[5000..].iter().all(|&b| b == 0));
    }
}
