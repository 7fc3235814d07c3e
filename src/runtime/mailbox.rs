//! Bounded wait-free SPSC queues between the control thread and one shard, each with a wakeup.
//!
//! Control→shard: an `rtrb` ring plus the shard's eventfd `Waker` (the shard keeps a READ posted
//! on it, so a push wakes a shard blocked in `io_uring_enter`). Shard→control: an `rtrb` ring plus
//! `Thread::unpark` of the control thread. No locks, no allocation per message.

use std::collections::VecDeque;
use std::thread::Thread;

use super::ring::Waker;
use crate::limits::SHARD_EVENTS_HELD_MAX;

/// The queue was full; the message is handed back (the sender backs off or reports overload).
#[derive(Debug, thiserror::Error)]
#[error("mailbox full")]
pub struct MailboxFull<T>(pub T);

/// Control-thread end of a control→shard queue.
#[derive(Debug)]
pub struct ShardSender<M> {
    tx: rtrb::Producer<M>,
    waker: Waker,
}

impl<M> ShardSender<M> {
    pub fn new(tx: rtrb::Producer<M>, waker: Waker) -> ShardSender<M> {
        ShardSender { tx, waker }
    }

    pub fn send(&mut self, msg: M) -> Result<(), MailboxFull<M>> {
        self.tx
            .push(msg)
            .map_err(|rtrb::PushError::Full(m)| MailboxFull(m))?;
        // An eventfd write cannot fail for a counter this far from its maximum; if it ever did,
        // the shard still sees the message on its next loop iteration.
        let _ = self.waker.wake();
        Ok(())
    }
}

/// Shard end of a shard→control queue. An event that finds the queue full waits in `held`
/// (in order, up to `SHARD_EVENTS_HELD_MAX`) and goes out as the control thread drains the
/// queue: a shard handed thousands of partitions at once emits an event per partition faster
/// than a busy control thread reads them, and an event dropped there was a partition whose
/// stop the control thread never heard of (described as mirroring, fetched by nobody).
#[derive(Debug)]
pub struct ControlSender<E> {
    tx: rtrb::Producer<E>,
    control: Thread,
    held: VecDeque<E>,
}

impl<E> ControlSender<E> {
    pub fn new(tx: rtrb::Producer<E>, control: Thread) -> ControlSender<E> {
        ControlSender {
            tx,
            control,
            held: VecDeque::new(),
        }
    }

    /// Queues `event` after every event held before it; hands it back only when
    /// `SHARD_EVENTS_HELD_MAX` events are already waiting.
    pub fn send(&mut self, event: E) -> Result<(), MailboxFull<E>> {
        self.flush();
        if self.held.is_empty() {
            match self.tx.push(event) {
                Ok(()) => {
                    self.control.unpark();
                    return Ok(());
                }
                Err(rtrb::PushError::Full(e)) => self.held.push_back(e),
            }
        } else if self.held.len() >= SHARD_EVENTS_HELD_MAX {
            return Err(MailboxFull(event));
        } else {
            self.held.push_back(event);
        }
        // The control thread is woken even when nothing new fit: it drains the queue then.
        self.control.unpark();
        Ok(())
    }

    /// Moves held events into the queue as far as it has room (the shard calls it every turn).
    pub fn flush(&mut self) {
        let mut moved = false;
        while let Some(e) = self.held.pop_front() {
            match self.tx.push(e) {
                Ok(()) => moved = true,
                Err(rtrb::PushError::Full(e)) => {
                    self.held.push_front(e);
                    break;
                }
            }
        }
        if moved {
            self.control.unpark();
        }
    }

    /// Events waiting for room in the queue.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_that_find_the_queue_full_are_held_and_arrive_in_order() {
        let (tx, mut rx) = rtrb::RingBuffer::<u32>::new(4);
        let mut sender = ControlSender::new(tx, std::thread::current());
        for e in 0..10 {
            sender.send(e).expect("held, not refused");
        }
        assert_eq!(sender.held(), 6);
        let mut got = Vec::new();
        while got.len() < 10 {
            while let Ok(e) = rx.pop() {
                got.push(e);
            }
            sender.flush();
        }
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert_eq!(sender.held(), 0);
        // A new event goes straight to the queue again.
        sender.send(10).unwrap();
        assert_eq!(rx.pop().ok(), Some(10));
    }

    #[test]
    fn a_sender_holding_its_limit_hands_the_event_back() {
        let (tx, _rx) = rtrb::RingBuffer::<usize>::new(1);
        let mut sender = ControlSender::new(tx, std::thread::current());
        for e in 0..=SHARD_EVENTS_HELD_MAX {
            sender.send(e).unwrap();
        }
        assert_eq!(sender.held(), SHARD_EVENTS_HELD_MAX);
        assert!(matches!(sender.send(7), Err(MailboxFull(7))));
    }
}
