//! Pooled, 4 KiB-aligned write buffers. The pool is the bound on data in flight: a GET that
//! finds no free buffer waits, so a slow disk slows the network instead of growing memory.
//! A part smaller than a buffer gets a buffer of its own size (still under a pool permit, not
//! recycled): 50 tiny objects in flight held 50 MiB of full-size buffers before.

use std::alloc::{self, Layout};
use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Semaphore;

/// Alignment that O_DIRECT needs for buffers, offsets and lengths on common filesystems.
pub(crate) const DIRECT_IO_ALIGN: usize = 4096;
/// Size of one pooled write buffer. Parts stream through several of these.
pub(crate) const WRITE_BUFFER_SIZE: usize = 1 << 20;

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
        // SAFETY: the layout has a non-zero size. Left uninitialised (zeroing a small buffer
        // cost a `memset` per small object): bytes are only read below `len`, which counts
        // bytes written.
        let raw = unsafe { alloc::alloc(Self::layout(capacity)) };
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

    /// Size of a full pooled buffer.
    pub(crate) fn buffer_size(&self) -> usize {
        self.inner.buffer_size
    }

    /// Waits for a free buffer for `remaining` more bytes: a full-size pooled one, or an
    /// exact-size one (rounded up to the O_DIRECT alignment) when less than a buffer is left.
    pub(crate) async fn acquire_for(&self, remaining: u64) -> PooledBuf {
        let size = self.inner.buffer_size;
        if remaining >= size as u64 {
            return self.acquire().await;
        }
        self.permit().await;
        let capacity = (remaining as usize)
            .max(1)
            .next_multiple_of(DIRECT_IO_ALIGN);
        PooledBuf {
            buf: Some(AlignedBuf::new(capacity)),
            pool: self.inner.clone(),
            recycle: false,
        }
    }

    async fn permit(&self) {
        self.inner
            .permits
            .acquire()
            .await
            .expect("the pool semaphore is never closed")
            .forget();
    }

    /// Waits for a free full-size buffer.
    pub async fn acquire(&self) -> PooledBuf {
        self.permit().await;
        let buf = self
            .inner
            .free
            .lock()
            .expect("pool lock")
            .pop()
            .unwrap_or_else(|| AlignedBuf::new(self.inner.buffer_size));
        PooledBuf {
            buf: Some(buf),
            pool: self.inner.clone(),
            recycle: true,
        }
    }
}

/// A buffer on loan from the pool; it goes back when dropped (after its write).
pub struct PooledBuf {
    buf: Option<AlignedBuf>,
    pool: Arc<PoolInner>,
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

    /// Reads once from `reader` into the free space, at most `most` bytes (not 0), and keeps
    /// what it read: the bytes land here with no copy on the way when `reader` reads a socket.
    /// Returns how many (0 at its end).
    pub(crate) async fn read_from<R>(&mut self, reader: &mut R, most: usize) -> io::Result<usize>
    where
        R: AsyncRead + Unpin + ?Sized,
    {
        let buf = self.buf.as_mut().expect("buffer present until drop");
        let room = (buf.capacity - buf.len).min(most);
        assert!(room > 0, "a read needs room");
        // SAFETY: the `room` bytes from `len` are in the allocation this buffer owns; `ReadBuf`
        // writes them without reading them.
        let free = unsafe {
            let start = buf.ptr.as_ptr().add(buf.len).cast::<MaybeUninit<u8>>();
            std::slice::from_raw_parts_mut(start, room)
        };
        let mut read = ReadBuf::uninit(free);
        let into = read.filled().as_ptr() as usize;
        poll_fn(|cx| Pin::new(&mut *reader).poll_read(cx, &mut read)).await?;
        let at = read.filled().as_ptr() as usize;
        assert_eq!(into, at, "read into the buffer itself");
        let n = read.filled().len();
        buf.len += n;
        Ok(n)
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        let buf = self.buf();
        // SAFETY: the first `len` bytes are initialised (`fill_from`, `read_from` and
        // `pad_for_direct_io` write each byte they count).
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
    fn drop(&mut self) {
        if let Some(mut buf) = self.buf.take() {
            if self.recycle {
                buf.len = 0;
                self.pool.free.lock().expect("pool lock").push(buf);
            }
            self.pool.permits.add_permits(1);
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
    async fn reads_land_in_the_buffer_up_to_its_capacity() {
        let pool = BufferPool::new(1, 8192);
        let data: Vec<u8> = (0..10_000).map(|i| (i % 251) as u8).collect();
        // A reader that gives at most 3,000 bytes a read, as a socket gives what has come.
        let chunks = data
            .chunks(3000)
            .map(|c| Ok::<_, io::Error>(bytes::Bytes::copy_from_slice(c)));
        let mut reader =
            tokio_util::io::StreamReader::new(futures::stream::iter(chunks.collect::<Vec<_>>()));
        let mut buf = pool.acquire().await;
        let mut reads = Vec::new();
        while !buf.is_full() {
            reads.push(buf.read_from(&mut reader, usize::MAX).await.unwrap());
        }
        assert_eq!(reads, [3000, 3000, 2192]);
        assert_eq!(buf.as_slice(), &data[..8192]);
        let rest = pool.acquire_for(10_000 - 8192);
        drop(buf);
        let mut rest = rest.await;
        assert_eq!(rest.read_from(&mut reader, usize::MAX).await.unwrap(), 808);
        assert_eq!(
            rest.read_from(&mut reader, 600).await.unwrap(),
            600,
            "at most as asked"
        );
        assert_eq!(rest.read_from(&mut reader, usize::MAX).await.unwrap(), 400);
        assert_eq!(
            rest.read_from(&mut reader, usize::MAX).await.unwrap(),
            0,
            "the end"
        );
        assert_eq!(rest.as_slice(), &data[8192..]);
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
