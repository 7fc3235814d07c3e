//! Goal: the shard's steady-state ring ops do not call the allocator. Method: the `allocation-counter` global
//! allocator (it counts per thread, so other test threads do not interfere) around loops of fixed and
//! plain file writes, fdatasync, SEND/RECV into an arena slot, and TIMEOUTs, after one warm-up
//! round. Freezing a slot into `Bytes` costs exactly one small allocation (the `Bytes` owner
//! header, one per received frame, never per batch); that is measured too, so a change is seen.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

use kmirror::log::io::LogIo;
use kmirror::runtime::{Arena, OpBuf, Ring, RingIo};

fn wait_one(ring: &mut Ring) -> kmirror::runtime::Completion {
    loop {
        ring.submit_and_wait();
        if let Some(c) = ring.pop_completion() {
            return c;
        }
    }
}

fn round(
    ring: &mut Ring,
    arena: &Arena,
    file: &std::fs::File,
    heap: &[u8],
    sock: &std::os::unix::net::UnixStream,
    peer: &mut std::os::unix::net::UnixStream,
) {
    let mut slot = arena.take().unwrap();
    slot.extend_from_slice(heap);
    {
        let mut io = RingIo::new(ring);
        io.write_all_at(file, 0, slot.filled()).unwrap();
        io.write_all_at(file, 8192, heap).unwrap();
        io.sync_data(file).unwrap();
    }
    ring.timeout(1, Duration::from_micros(10)).unwrap();
    assert_eq!(wait_one(ring).result, -libc::ETIME);
    slot.clear();
    peer.write_all(&heap[..512]).unwrap();
    ring.recv(2, sock.as_raw_fd(), slot, 512).unwrap();
    let c = wait_one(ring);
    let OpBuf::Slot(slot) = c.buf else {
        panic!("recv returns its slot")
    };
    assert_eq!(slot.filled(), &heap[..c.result as usize]);
    drop(slot);
    let out = bytes::Bytes::from_static(b"0123456789");
    ring.send(3, sock.as_raw_fd(), out).unwrap();
    assert_eq!(wait_one(ring).result, 10);
    let mut got = [0u8; 10];
    peer.read_exact(&mut got).unwrap();
}

#[test]
fn steady_state_ring_ops_do_not_allocate() {
    let mut ring = Ring::new().unwrap();
    let arena = Arena::new(64 * 1024, 2).unwrap();
    ring.register_arena(&arena).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("f")).unwrap();
    let heap = vec![7u8; 4096];
    let (sock, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
    round(&mut ring, &arena, &file, &heap, &sock, &mut peer);

    let steady = allocation_counter::measure(|| {
        for _ in 0..200 {
            round(&mut ring, &arena, &file, &heap, &sock, &mut peer);
        }
    });
    assert_eq!(steady.count_total, 0, "steady-state ring ops allocated");

    let freezing = allocation_counter::measure(|| {
        for _ in 0..10 {
            let mut slot = arena.take().unwrap();
            slot.extend_from_slice(&heap);
            let b = slot.freeze();
            let part = b.slice(1..100);
            drop(b);
            drop(part);
        }
    });
    assert_eq!(freezing.count_total, 10, "one owner header per frozen slot");
}
