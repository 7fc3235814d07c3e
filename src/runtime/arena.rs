//! The shard's registered buffer arena: one anonymous mapping cut into fixed-size slots.
//!
//! Owned by one shard (the mapping is created and first touched on the shard's pinned thread so
//! its pages land on the local NUMA node); a slot may be *released* from any thread because a
//! slot frozen into `bytes::Bytes` travels wherever the Bytes goes. The free list is a bounded
//! lock-free queue allocated once, so taking and returning a slot never allocates or locks.
//!
//! Why fixed slots: a Kafka response frame announces its length up front, so a shard can pick a
//! slot, receive the whole frame into it, hand it to the fetch client as `Bytes` (zero-copy
//! record slices) and write those slices straight from the registered memory with WRITE_FIXED.
#![allow(unsafe_code)]

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_queue::ArrayQueue;

use crate::limits::{
    ARENA_BYTES_MAX, ARENA_REGISTERED_CHUNK_BYTES_MAX, ARENA_SLOTS_MAX, ARENA_SLOT_BYTES_MAX,
    ARENA_SLOT_BYTES_MIN,
};

/// Why an arena could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    #[error("arena slot size {slot_bytes} B is outside [{min}, {max}]")]
    SlotSize {
        slot_bytes: usize,
        min: usize,
        max: usize,
    },
    #[error("arena slot count {slots} is outside [1, {max}]")]
    SlotCount { slots: usize, max: usize },
    #[error("arena of {bytes} B exceeds the per-shard maximum of {max} B")]
    TooBig { bytes: usize, max: usize },
    #[error("mmap of a {bytes} B arena failed: {source}")]
    Map { bytes: usize, source: io::Error },
}

/// The anonymous mapping backing an arena; unmapped when the last slot and the arena are gone.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory with no thread affinity. Concurrent access is governed by
// slot ownership: each slot is either free (untouched), owned by exactly one `SlotBuf` (one
// writer), or frozen into `Bytes` (readers only).
unsafe impl Send for Mapping {}
// SAFETY: see `Send`; `&Mapping` only exposes the base pointer and length.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned; no slot borrows remain because every
        // `SlotBuf` holds an `Arc` to the shared state that owns this mapping. Pages still
        // registered with a ring stay pinned by the kernel, so unmapping cannot fault it.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        assert!(rc == 0, "munmap of an arena we mapped failed");
    }
}

struct Shared {
    map: Mapping,
    slot_bytes: usize,
    slots: usize,
    free: ArrayQueue<u32>,
    /// Per slot: its `SlotBuf` plus the prefixes shared out of it (`share_filled`) still alive.
    /// The last one to go returns the slot to `free`.
    holders: Box<[AtomicU32]>,
}

impl Shared {
    fn release(&self, index: u32) {
        if self.holders[index as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
            let pushed = self.free.push(index);
            assert!(pushed.is_ok(), "a slot returned twice to its arena");
        }
    }
}

/// A registered-buffer arena: `slots` slots of `slot_bytes` each. Owned by one shard.
#[derive(Clone)]
pub struct Arena {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("slot_bytes", &self.shared.slot_bytes)
            .field("slots", &self.shared.slots)
            .field("free", &self.shared.free.len())
            .finish()
    }
}

/// One registered buffer the kernel knows by index: a run of whole slots at most 1 GiB long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisteredChunk {
    pub index: u16,
    pub addr: usize,
    pub len: usize,
}

impl Arena {
    /// Maps (and hints huge pages for) an arena. Must run on the owning shard's thread.
    pub fn new(slot_bytes: usize, slots: usize) -> Result<Arena, ArenaError> {
        if !(ARENA_SLOT_BYTES_MIN..=ARENA_SLOT_BYTES_MAX).contains(&slot_bytes) {
            return Err(ArenaError::SlotSize {
                slot_bytes,
                min: ARENA_SLOT_BYTES_MIN,
                max: ARENA_SLOT_BYTES_MAX,
            });
        }
        if !(1..=ARENA_SLOTS_MAX).contains(&slots) {
            return Err(ArenaError::SlotCount {
                slots,
                max: ARENA_SLOTS_MAX,
            });
        }
        let bytes = slot_bytes * slots;
        if bytes > ARENA_BYTES_MAX {
            return Err(ArenaError::TooBig {
                bytes,
                max: ARENA_BYTES_MAX,
            });
        }
        // SAFETY: a fresh private anonymous mapping at a kernel-chosen address; no existing memory
        // is affected. The result is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(ArenaError::Map {
                bytes,
                source: io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| ArenaError::Map {
            bytes,
            source: io::Error::other("mmap returned null"),
        })?;
        let map = Mapping { base, len: bytes };
        // SAFETY: advice on our own fresh mapping. MADV_HUGEPAGE is only a hint (fewer TLB misses,
        // fewer bvecs per registered buffer); failure (THP disabled) is harmless, so it is ignored.
        let _ = unsafe { libc::madvise(ptr, bytes, libc::MADV_HUGEPAGE) };
        let free = ArrayQueue::new(slots);
        for i in 0..slots {
            let pushed = free.push(i as u32);
            assert!(pushed.is_ok(), "free list sized for every slot");
        }
        Ok(Arena {
            shared: Arc::new(Shared {
                map,
                slot_bytes,
                slots,
                free,
                holders: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            }),
        })
    }

    pub fn slot_bytes(&self) -> usize {
        self.shared.slot_bytes
    }

    pub fn slots(&self) -> usize {
        self.shared.slots
    }

    /// Total bytes mapped (what registration locks against RLIMIT_MEMLOCK).
    pub fn bytes(&self) -> usize {
        self.shared.map.len
    }

    pub fn free_slots(&self) -> usize {
        self.shared.free.len()
    }

    /// Takes a free slot, or `None` when every slot is in use (the caller backs off).
    pub fn take(&self) -> Option<SlotBuf> {
        let index = self.shared.free.pop()?;
        let was = self.shared.holders[index as usize].swap(1, Ordering::AcqRel);
        assert_eq!(was, 0, "a free slot has no holders");
        Some(SlotBuf {
            shared: Arc::clone(&self.shared),
            index,
            len: 0,
            shared_len: 0,
        })
    }

    /// The chunks to pass to `register_buffers`, each a run of whole slots of at most 1 GiB, so a
    /// slot never straddles two registered buffers.
    pub fn chunks(&self) -> Vec<RegisteredChunk> {
        let per_chunk_slots = (ARENA_REGISTERED_CHUNK_BYTES_MAX / self.shared.slot_bytes).max(1);
        let chunk_bytes = per_chunk_slots * self.shared.slot_bytes;
        let base = self.shared.map.base.as_ptr() as usize;
        let total = self.shared.map.len;
        (0..total.div_ceil(chunk_bytes))
            .map(|i| RegisteredChunk {
                index: i as u16,
                addr: base + i * chunk_bytes,
                len: chunk_bytes.min(total - i * chunk_bytes),
            })
            .collect()
    }
}

/// A slot taken from an arena, exclusively owned: the receive side fills it, then freezes it into
/// `Bytes`. Dropping it (or the last `Bytes` made from it) returns the slot to the free list.
pub struct SlotBuf {
    shared: Arc<Shared>,
    index: u32,
    len: usize,
    /// The first bytes handed out by `share_filled`: never written again.
    shared_len: usize,
}

impl std::fmt::Debug for SlotBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotBuf")
            .field("index", &self.index)
            .field("len", &self.len)
            .finish()
    }
}

impl SlotBuf {
    fn base(&self) -> *mut u8 {
        // SAFETY: index < slots (free list only holds valid indexes), so the offset stays inside
        // the mapping.
        unsafe {
            self.shared
                .map
                .base
                .as_ptr()
                .add(self.index as usize * self.shared.slot_bytes)
        }
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn capacity(&self) -> usize {
        self.shared.slot_bytes
    }

    /// Bytes filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn remaining(&self) -> usize {
        self.shared.slot_bytes - self.len
    }

    /// Where the next received byte goes; the kernel writes up to `remaining()` bytes there.
    pub fn spare_ptr(&mut self) -> *mut u8 {
        // SAFETY: len <= slot_bytes, so the result is inside (or one past) this slot.
        unsafe { self.base().add(self.len) }
    }

    /// Records that `n` more bytes were filled (by a completed RECV or by `extend`).
    pub fn advance(&mut self, n: usize) {
        assert!(n <= self.remaining(), "advance past the slot end");
        self.len += n;
    }

    /// Forgets the filled bytes (the slot is reused for another frame).
    pub fn clear(&mut self) {
        assert_eq!(
            self.shared_len, 0,
            "a slot whose bytes were shared is never refilled"
        );
        self.len = 0;
    }

    /// Copies `data` after the filled bytes; for tests and small headers.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        assert!(data.len() <= self.remaining(), "extend past the slot end");
        // SAFETY: the destination range lies inside this slot, which this SlotBuf owns exclusively;
        // `data` cannot alias it because no shared borrow of the spare part exists.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.spare_ptr(), data.len()) };
        self.len += data.len();
    }

    /// The filled bytes.
    pub fn filled(&self) -> &[u8] {
        // SAFETY: the slot is inside the mapping, owned by self; anonymous mappings are
        // zero-initialised so every byte is initialised; the borrow ties the slice to self.
        unsafe { std::slice::from_raw_parts(self.base(), self.len) }
    }

    /// Hands the bytes filled so far out as `Bytes` without copying, while the rest of the
    /// slot goes on being filled: a response's first partitions are read while its last ones
    /// arrive. The shared bytes are never written again (only bytes past `len` are, and
    /// `clear` refuses); the slot returns to the free list when this `SlotBuf` and every
    /// shared prefix (and its slices) are gone.
    pub fn share_filled(&mut self) -> Bytes {
        self.shared.holders[self.index as usize].fetch_add(1, Ordering::AcqRel);
        self.shared_len = self.len;
        Bytes::from_owner(SharedPrefix {
            shared: Arc::clone(&self.shared),
            index: self.index,
            ptr: self.base(),
            len: self.len,
        })
    }

    /// Hands the filled bytes out as `Bytes` without copying; the slot returns to the free list
    /// when the last clone (or slice) is dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(FrozenSlot(self))
    }
}

impl Drop for SlotBuf {
    fn drop(&mut self) {
        self.shared.release(self.index);
    }
}

/// The `Bytes` owner of a prefix shared out of a slot still being filled.
struct SharedPrefix {
    shared: Arc<Shared>,
    index: u32,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the prefix is read-only for as long as it lives (`SlotBuf` writes only past it), and
// the mapping it points into lives as long as `shared`.
unsafe impl Send for SharedPrefix {}
// SAFETY: see `Send`: shared references only read.
unsafe impl Sync for SharedPrefix {}

impl AsRef<[u8]> for SharedPrefix {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is the filled start of a slot inside the mapping `shared`
        // keeps alive; no writer touches it again (see `SlotBuf::share_filled`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for SharedPrefix {
    fn drop(&mut self) {
        self.shared.release(self.index);
    }
}

/// The `Bytes` owner of a frozen slot: read-only from here on.
struct FrozenSlot(SlotBuf);

impl AsRef<[u8]> for FrozenSlot {
    fn as_ref(&self) -> &[u8] {
        self.0.filled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: freezing a slot does not copy, and the slot is free again only once the last Bytes
    // (including sub-slices) is dropped.
    #[test]
    fn slot_returns_to_free_list_when_last_bytes_dropped() {
        let arena = Arena::new(ARENA_SLOT_BYTES_MIN, 2).unwrap();
        let mut slot = arena.take().unwrap();
        slot.extend_from_slice(b"hello world");
        let slot_ptr = slot.filled().as_ptr();
        assert_eq!(arena.free_slots(), 1);
        let bytes = slot.freeze();
        assert_eq!(bytes.as_ptr(), slot_ptr, "freeze must not copy");
        let tail = bytes.slice(6..);
        let clone = bytes.clone();
        drop(bytes);
        assert_eq!(arena.free_slots(), 1);
        drop(clone);
        assert_eq!(arena.free_slots(), 1);
        assert_eq!(&tail[..], b"world");
        drop(tail);
        assert_eq!(arena.free_slots(), 2);
    }

    // Goal: a prefix shared while the slot is still filled keeps its bytes, the slot goes on
    // filling after it, and the slot is free only once the SlotBuf, its frozen whole and every
    // shared prefix are gone, in any order.
    #[test]
    fn shared_prefixes_hold_the_slot_until_the_last_goes() {
        let arena = Arena::new(ARENA_SLOT_BYTES_MIN, 1).unwrap();
        let mut slot = arena.take().unwrap();
        slot.extend_from_slice(b"hello ");
        let first = slot.share_filled();
        slot.extend_from_slice(b"world");
        let second = slot.share_filled().slice(6..);
        assert_eq!((&first[..], &second[..]), (&b"hello "[..], &b"world"[..]));
        assert_eq!(
            first.as_ptr(),
            slot.filled().as_ptr(),
            "sharing must not copy"
        );
        let whole = slot.freeze();
        drop(whole);
        assert_eq!(arena.free_slots(), 0);
        drop(second);
        assert_eq!(arena.free_slots(), 0);
        assert_eq!(&first[..], b"hello ");
        drop(first);
        assert_eq!(arena.free_slots(), 1);
        let mut again = arena.take().unwrap();
        again.clear();
    }

    // Goal: an exhausted arena says so instead of handing out a slot twice.
    #[test]
    fn exhausted_arena_returns_none() {
        let arena = Arena::new(ARENA_SLOT_BYTES_MIN, 1).unwrap();
        let a = arena.take().unwrap();
        assert!(arena.take().is_none());
        drop(a);
        assert!(arena.take().is_some());
    }

    // Goal: bad sizes are typed errors, not panics or giant mappings.
    #[test]
    fn rejects_bad_sizes() {
        assert!(matches!(
            Arena::new(10, 1),
            Err(ArenaError::SlotSize { .. })
        ));
        assert!(matches!(
            Arena::new(ARENA_SLOT_BYTES_MIN, 0),
            Err(ArenaError::SlotCount { .. })
        ));
    }

    // Goal: chunks cover the mapping exactly, with whole slots each.
    #[test]
    fn chunks_cover_arena() {
        let arena = Arena::new(ARENA_SLOT_BYTES_MIN, 3).unwrap();
        let chunks = arena.chunks();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].len, 3 * ARENA_SLOT_BYTES_MIN);
    }
}
