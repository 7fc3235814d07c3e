//! Reading the answer to a Fetch (a child of `fetcher`): part by part as its bytes arrive.
//!
//! A shard calls `handle_response_prefix` with the response received so far and
//! `handle_response` with all of it; both read on from where the last call stopped
//! (`wire::fetch_parts`), so each partition's records are validated and handed out as soon as
//! its entry is whole, while the rest of the response is still on the wire. The outcome is the
//! same however the bytes were split: the same parts in the same order reach the same handlers.
//! A response that turns out malformed past some partitions fails the request (backoff, full
//! fetch next) as before; the partitions before the fault keep their records, which were whole
//! and valid, exactly as if the source had sent a shorter response.

use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::{FetchRequest, TopicName};
use uuid::Uuid;

use super::{FetchEvent, Fetcher, FetcherError, Pending};
use crate::wire::fetch_parts::{FetchParts, Part};
use crate::wire::frame;

/// How far the answer to the Fetch in flight has been read.
#[derive(Debug)]
pub(super) struct FetchAnswer {
    parts: FetchParts,
    /// Bytes of the response header in front of the body.
    header_len: usize,
    /// The topic the partitions being read belong to.
    topic: Option<(TopicName, Uuid)>,
    /// A response-level error: the partitions are not read.
    ignore_partitions: bool,
}

impl Fetcher {
    /// Part of the answer to the Fetch in flight has arrived: `prefix` is the frame's body
    /// (response header included) received so far, `whole_len` the body's full length. Every
    /// partition whose entry is whole in `prefix` is handled now, as `handle_response` would;
    /// the rest waits for later calls and `handle_response` with the whole body. Does nothing
    /// while no Fetch is in flight. An error is a connection-level one (see `handle_response`).
    pub fn handle_response_prefix(
        &mut self,
        prefix: Bytes,
        whole_len: usize,
        now: Instant,
        events: &mut Vec<FetchEvent>,
    ) -> Result<(), FetcherError> {
        if !matches!(self.pending, Some(Pending::Fetch { .. })) || prefix.len() >= whole_len {
            return Ok(());
        }
        self.read_fetch_answer(&prefix, whole_len, false, now, events)
    }

    /// Reads the answer to the Fetch in flight on from where the last call stopped; with
    /// `whole`, to its end, which ends the request.
    pub(super) fn read_fetch_answer(
        &mut self,
        frame: &Bytes,
        whole_len: usize,
        whole: bool,
        now: Instant,
        events: &mut Vec<FetchEvent>,
    ) -> Result<(), FetcherError> {
        let Some(Pending::Fetch {
            version,
            full,
            session_id,
        }) = self.pending
        else {
            unreachable!("called with a Fetch in flight");
        };
        let mut answer = match self.answer.take() {
            Some(answer) => answer,
            None => {
                if !whole && !frame::response_header_whole::<FetchRequest>(frame, version) {
                    return Ok(());
                }
                let body = match self.conn.accept::<FetchRequest>(frame.clone()) {
                    Ok((_, body)) => body,
                    Err(e) => {
                        self.pending = None;
                        return Err(e.into());
                    }
                };
                FetchAnswer {
                    parts: FetchParts::new(version),
                    header_len: frame.len() - body.len(),
                    topic: None,
                    ignore_partitions: false,
                }
            }
        };
        let body = frame.slice(answer.header_len..);
        let body_len = whole_len - answer.header_len;
        let by_id = version >= 13;
        loop {
            match answer.parts.next(&body, body_len, whole) {
                // A part not whole yet, or (from a prefix) one that failed: the whole body
                // decides, at the same place.
                Ok(None) | Err(_) if !whole => {
                    self.answer = Some(answer);
                    return Ok(());
                }
                Ok(None) => unreachable!("a whole body ends in End or an error"),
                Ok(Some(Part::Head {
                    throttle_time_ms,
                    error_code,
                    session_id: got_session,
                })) => {
                    answer.ignore_partitions = !self.on_fetch_head(
                        throttle_time_ms,
                        error_code,
                        got_session,
                        version,
                        full,
                        session_id,
                        now,
                        events,
                    );
                }
                Ok(Some(Part::Topic { name, id })) => answer.topic = Some((name, id)),
                Ok(Some(Part::Partition(pd))) => {
                    if let Some(cap) = &self.cap {
                        cap.charge(pd.records.as_ref().map_or(0, |r| r.len()) as u64, now);
                    }
                    let (name, id) = answer.topic.as_ref().expect("partitions follow a topic");
                    if answer.ignore_partitions {
                        continue;
                    }
                    let Some(slot) = self.lookup(by_id, name, *id, pd.partition_index) else {
                        continue;
                    };
                    self.on_partition(slot, pd, now, events);
                    self.touch(slot);
                }
                Ok(Some(Part::End)) => {
                    self.pending = None;
                    return Ok(());
                }
                Err(e) => {
                    self.pending = None;
                    // After a response-level error the request has failed already.
                    if !answer.ignore_partitions {
                        self.request_failed(e.to_string(), now, events);
                    }
                    return Ok(());
                }
            }
        }
    }
}
