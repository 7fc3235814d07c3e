//! Bounded wait-free SPSC queues between the control thread and one shard, each with a wakeup.
//!
//! Control→shard: an `rtrb` ring plus the shard's eventfd `Waker` (the shard keeps a READ posted
//! on it, so a push wakes a shard blocked in `io_uring_enter`). Shard→control: an `rtrb` ring plus
//! `Thread::unpark` of the control thread. No locks, no allocation per message.

use std::thread::Thread;

use super::ring::Waker;

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

/// Shard end of a shard→control queue.
#[derive(Debug)]
pub struct ControlSender<E> {
    tx: rtrb::Producer<E>,
    control: Thread,
}

impl<E> ControlSender<E> {
    pub fn new(tx: rtrb::Producer<E>, control: Thread) -> ControlSender<E> {
        ControlSender { tx, control }
    }

    pub fn send(&mut self, event: E) -> Result<(), MailboxFull<E>> {
        self.tx
            .push(event)
            .map_err(|rtrb::PushError::Full(e)| MailboxFull(e))?;
        self.control.unpark();
        Ok(())
    }
}
