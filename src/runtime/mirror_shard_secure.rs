//! TLS and SASL for the shard's source connections (a child of `mirror_shard`).
//!
//! After the ring's CONNECT completes, a secured source goes to `Link::Securing`: every RECV
//! completion is fed to the connection's `SecureLink` and what it wants sent goes out with
//! SEND, until it reports `Ready`. Then:
//! - SASL_PLAINTEXT drops the link, and responses are received straight into arena slots and
//!   written from there, as on PLAINTEXT (zero-copy holds);
//! - SSL and SASL_SSL keep it: the slot holds ciphertext, the link decrypts into its own
//!   buffer, and whole frames are cut from that buffer for the fetcher (the records are copied
//!   once by the decryption; the file write is then an ordinary WRITE from that buffer).
//!
//! A refused login or certificate stops every partition of that connection with a reason that
//! starts with "authentication failed", and the shard does not reconnect on its own: the
//! control thread marks the partitions FAILED (not retryable) and only a new start (after
//! the operator fixed the credentials) adds them, and so reconnects, again.

use std::time::Instant;

use bytes::Bytes;

use super::{notice, Cx, Link, MirrorShard, Source, SourceSpec};
use crate::fetch::blocking::host_of;
use crate::fetch::security::{LinkStatus, SecureLink};
use crate::runtime::arena::SlotBuf;

/// Two partitions share a connection only when everything about it is the same, so one
/// mirror's credentials and client.id never carry another mirror's traffic.
pub(super) fn same_connection(a: &SourceSpec, b: &SourceSpec) -> bool {
    a.broker_id == b.broker_id
        && a.addr == b.addr
        && a.client_id == b.client_id
        && a.security == b.security
}

/// A source whose login was refused has no connection and no reconnect pending; a partition
/// added to it again (after a new start) must connect.
pub(super) fn reconnect_if_refused(shard: &mut MirrorShard, cx: &mut Cx<'_>, i: usize) {
    let src = &shard.sources[i];
    if src.link == Link::Down && !src.timer_armed {
        shard.connect(cx, i);
    }
}

impl Source {
    /// Whether received bytes must go through the security layer.
    pub(super) fn secure_reads(&self) -> bool {
        self.secure
            .as_ref()
            .is_some_and(|l| !l.is_ready() || l.uses_tls())
    }
}

impl MirrorShard {
    /// TCP is up on a secured source: start the TLS handshake or SASL exchange.
    pub(super) fn start_secure(&mut self, cx: &mut Cx<'_>, i: usize) {
        let src = &mut self.sources[i];
        let link = SecureLink::new(
            &src.spec.security,
            host_of(&src.spec.addr),
            &src.spec.client_id,
        )
        .and_then(|mut l| l.start().map(|_| l));
        match link {
            Ok(link) => {
                src.secure = Some(link);
                src.link = Link::Securing;
                // The handshake is bounded like a request: a silent broker is dropped.
                src.securing_since = Some(Instant::now());
                let limit = Self::request_limit(src);
                self.arm_deadline(cx, i, limit);
                self.flush_secure(cx, i);
                self.ensure_recv(cx, i);
            }
            Err(e) if e.is_authentication() => self.refused(cx, i, e.to_string()),
            Err(e) => self.disconnect(cx, i, e.to_string()),
        }
    }

    /// Sends what the security layer has queued, unless a SEND is in flight (its completion
    /// calls this again). Returns whether a SEND went out.
    pub(super) fn flush_secure(&mut self, cx: &mut Cx<'_>, i: usize) -> bool {
        let src = &mut self.sources[i];
        if src.sending {
            return false;
        }
        let Some(data) = src.secure.as_mut().and_then(SecureLink::take_outgoing) else {
            return false;
        };
        self.send(cx, i, data);
        true
    }

    /// The bytes to put on the socket for a framed request: sealed by TLS when the link has it.
    pub(super) fn wire_bytes(
        &mut self,
        cx: &mut Cx<'_>,
        i: usize,
        request: Bytes,
    ) -> Option<Bytes> {
        let src = &mut self.sources[i];
        let Some(link) = src.secure.as_mut().filter(|l| l.uses_tls()) else {
            return Some(request);
        };
        match link.seal(&request) {
            Ok(()) => link.take_outgoing(),
            Err(e) => {
                self.disconnect(cx, i, e.to_string());
                None
            }
        }
    }

    /// A RECV on a connection whose bytes go through the security layer.
    pub(super) fn on_secure_recv(&mut self, cx: &mut Cx<'_>, i: usize, slot: SlotBuf) {
        let Some(link) = self.sources[i].secure.as_mut() else {
            return;
        };
        let status = link.receive(slot.filled());
        // The bytes now live in the link (decrypted, or as SASL frames); the slot goes back.
        drop(slot);
        let status = match status {
            Ok(s) => s,
            Err(e) if e.is_authentication() => return self.refused(cx, i, e.to_string()),
            Err(e) => return self.disconnect(cx, i, e.to_string()),
        };
        if status == LinkStatus::Handshaking {
            self.flush_secure(cx, i);
            self.ensure_recv(cx, i);
            return;
        }
        let src = &mut self.sources[i];
        if src.link == Link::Securing {
            src.link = Link::Up;
            src.securing_since = None;
            if !src.secure.as_ref().is_some_and(SecureLink::uses_tls) {
                // SASL_PLAINTEXT: from here on, the zero-copy path.
                src.secure = None;
            }
            if !self.flush_secure(cx, i) {
                self.drive(cx, i);
            }
            return;
        }
        loop {
            let next = match self.sources[i].secure.as_mut() {
                Some(link) => link.next_frame(),
                None => return,
            };
            let body = match next {
                Ok(Some(body)) => body,
                Ok(None) => break,
                Err(e) => return self.disconnect(cx, i, e.to_string()),
            };
            if let Err(why) = self.handle_frame(cx, i, body) {
                return self.disconnect(cx, i, why);
            }
        }
        if !self.flush_secure(cx, i) {
            self.drive(cx, i);
        }
        self.ensure_recv(cx, i);
    }

    /// The source refused our credentials or certificates: stop every partition fetched over
    /// this connection (the reason starts with "authentication failed") and stay down.
    fn refused(&mut self, cx: &mut Cx<'_>, i: usize, why: String) {
        // It stops partitions, whose response writes may still be in flight.
        self.complete_staged(cx);
        let why = format!("{why} (source broker {})", self.sources[i].spec.addr);
        for at in self.locs(i) {
            if self.log_mut(at).is_some() {
                // A refused login or certificate: retrying cannot help until the operator acts.
                self.stop_partition(cx, at, why.clone(), false);
            }
        }
        self.reset_connection(i);
        notice(cx, why);
    }
}
