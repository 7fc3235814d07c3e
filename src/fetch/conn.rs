//! The protocol state of one connection to a source broker, without the socket.
//!
//! The driver that owns the socket asks this type to frame requests into its buffer and hands
//! back each response frame. Kafka answers requests on one connection in the order they were
//! sent, so a response must match the oldest outstanding request; anything else means we lost
//! track of the byte stream, and the connection is poisoned: every later call fails with the
//! same cause until the driver reconnects and calls `reset`.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::protocol::{Request, StrBytes};

use crate::limits::SOURCE_IN_FLIGHT_MAX;
use crate::wire::frame::{self, FrameError};

/// Errors of one connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    #[error("connection is poisoned: {0}")]
    Poisoned(String),
    #[error("{0} requests already in flight")]
    TooManyInFlight(usize),
    #[error("a response arrived with no request in flight")]
    UnexpectedResponse,
    #[error("response is for api {got}, the oldest request in flight is api {expected}")]
    WrongApi { expected: i16, got: i16 },
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// A request that was framed and awaits its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub correlation_id: i32,
    pub api_key: i16,
    pub api_version: i16,
}

/// Correlation ids, outstanding requests, throttling and poison for one source connection.
#[derive(Debug)]
pub struct Connection {
    client_id: StrBytes,
    next_correlation_id: i32,
    in_flight: VecDeque<InFlight>,
    poison: Option<String>,
    throttled_until: Option<Instant>,
    /// Every throttle_time_ms the broker sent on this client's connections, summed (for
    /// operators: how much a source quota holds this mirror back).
    throttled_ms_total: u64,
}

impl Connection {
    pub fn new(client_id: &str) -> Connection {
        Connection {
            client_id: StrBytes::from_string(client_id.to_owned()),
            next_correlation_id: 0,
            in_flight: VecDeque::with_capacity(SOURCE_IN_FLIGHT_MAX),
            poison: None,
            throttled_until: None,
            throttled_ms_total: 0,
        }
    }

    /// Forget everything tied to the old socket; call after reconnecting.
    pub fn reset(&mut self) {
        self.in_flight.clear();
        self.poison = None;
        self.throttled_until = None;
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn poison_reason(&self) -> Option<&str> {
        self.poison.as_deref()
    }

    /// Record a broker's throttle_time_ms. From the versions where the broker mutes the channel
    /// after answering (Fetch v8+, Metadata v6+, ...) the client must not send before it ends.
    pub fn throttle(&mut self, until: Instant) {
        self.throttled_until = Some(self.throttled_until.map_or(until, |t| t.max(until)));
    }

    /// Counts a throttle the broker asked for, in ms.
    pub fn record_throttle(&mut self, ms: u64) {
        self.throttled_ms_total = self.throttled_ms_total.saturating_add(ms);
    }

    pub fn throttled_ms_total(&self) -> u64 {
        self.throttled_ms_total
    }

    /// When the next request may be sent, if the broker asked us to wait.
    pub fn throttled_until(&self, now: Instant) -> Option<Instant> {
        self.throttled_until.filter(|t| *t > now)
    }

    fn check_usable(&self) -> Result<(), ConnError> {
        match &self.poison {
            Some(reason) => Err(ConnError::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }

    fn poison(&mut self, err: ConnError) -> ConnError {
        if self.poison.is_none() {
            self.poison = Some(err.to_string());
        }
        err
    }

    /// Frame `body` into `out` with the next correlation id and remember it as in flight.
    pub fn encode<R: Request>(
        &mut self,
        out: &mut BytesMut,
        version: i16,
        body: &R,
    ) -> Result<InFlight, ConnError> {
        self.check_usable()?;
        if self.in_flight.len() >= SOURCE_IN_FLIGHT_MAX {
            return Err(ConnError::TooManyInFlight(self.in_flight.len()));
        }
        let correlation_id = self.next_correlation_id;
        frame::encode_request(out, version, correlation_id, &self.client_id, body)?;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1).max(0);
        let sent = InFlight {
            correlation_id,
            api_key: R::KEY,
            api_version: version,
        };
        self.in_flight.push_back(sent);
        Ok(sent)
    }

    /// The request the next response frame must answer.
    pub fn oldest_in_flight(&self) -> Option<InFlight> {
        self.in_flight.front().copied()
    }

    /// Match a response frame (a body from `frame::split_frame`) to the oldest request, check
    /// its header, and return the request with the remaining response body.
    ///
    /// A mismatch poisons the connection. A body that later fails to decode does not: the frame
    /// boundaries are intact, so the next frame can still be read.
    pub fn accept<R: Request>(&mut self, mut frame: Bytes) -> Result<(InFlight, Bytes), ConnError> {
        self.check_usable()?;
        let Some(oldest) = self.in_flight.pop_front() else {
            return Err(self.poison(ConnError::UnexpectedResponse));
        };
        if oldest.api_key != R::KEY {
            return Err(self.poison(ConnError::WrongApi {
                expected: oldest.api_key,
                got: R::KEY,
            }));
        }
        match frame::strip_response_header::<R>(
            &mut frame,
            oldest.api_version,
            oldest.correlation_id,
        ) {
            Ok(()) => Ok((oldest, frame)),
            Err(e) => Err(self.poison(e.into())),
        }
    }

    /// `accept` plus decoding of the body.
    pub fn decode<R: Request>(&mut self, frame: Bytes) -> Result<R::Response, ConnError> {
        let (sent, body) = self.accept::<R>(frame)?;
        Ok(frame::decode_response_body::<R>(body, sent.api_version)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ResponseHeader;
    use kafka_protocol::messages::{FetchRequest, MetadataRequest, MetadataResponse};
    use kafka_protocol::protocol::{Encodable, HeaderVersion};

    fn response<R: Encodable + HeaderVersion>(resp: &R, version: i16, corr: i32) -> Bytes {
        let mut out = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(corr)
            .encode(&mut out, R::header_version(version))
            .unwrap();
        resp.encode(&mut out, version).unwrap();
        out.freeze()
    }

    #[test]
    fn responses_match_requests_in_order() {
        let mut conn = Connection::new("t");
        let mut out = BytesMut::new();
        let a = conn
            .encode(&mut out, 9, &MetadataRequest::default())
            .unwrap();
        let b = conn
            .encode(&mut out, 9, &MetadataRequest::default())
            .unwrap();
        assert_eq!(b.correlation_id, a.correlation_id + 1);
        let meta = MetadataResponse::default();
        conn.decode::<MetadataRequest>(response(&meta, 9, a.correlation_id))
            .unwrap();
        conn.decode::<MetadataRequest>(response(&meta, 9, b.correlation_id))
            .unwrap();
        assert_eq!(conn.in_flight(), 0);
    }

    // Goal: a response out of order poisons the connection for every later call, as the byte
    // stream can no longer be trusted; `reset` (after reconnect) clears it.
    #[test]
    fn correlation_mismatch_poisons_until_reset() {
        let mut conn = Connection::new("t");
        let mut out = BytesMut::new();
        let a = conn
            .encode(&mut out, 9, &MetadataRequest::default())
            .unwrap();
        let meta = MetadataResponse::default();
        let err = conn.decode::<MetadataRequest>(response(&meta, 9, a.correlation_id + 5));
        assert!(matches!(
            err,
            Err(ConnError::Frame(FrameError::CorrelationMismatch { .. }))
        ));
        assert!(matches!(
            conn.encode(&mut out, 9, &MetadataRequest::default()),
            Err(ConnError::Poisoned(_))
        ));
        conn.reset();
        assert!(conn
            .encode(&mut out, 9, &MetadataRequest::default())
            .is_ok());
    }

    #[test]
    fn unexpected_response_and_wrong_api_poison() {
        let mut conn = Connection::new("t");
        let meta = MetadataResponse::default();
        assert_eq!(
            conn.decode::<MetadataRequest>(response(&meta, 9, 0)),
            Err(ConnError::UnexpectedResponse)
        );
        let mut conn = Connection::new("t");
        let mut out = BytesMut::new();
        conn.encode(&mut out, 9, &MetadataRequest::default())
            .unwrap();
        assert!(matches!(
            conn.decode::<FetchRequest>(response(&meta, 9, 0)),
            Err(ConnError::WrongApi { .. })
        ));
    }

    #[test]
    fn in_flight_is_bounded() {
        let mut conn = Connection::new("t");
        let mut out = BytesMut::new();
        for _ in 0..SOURCE_IN_FLIGHT_MAX {
            conn.encode(&mut out, 9, &MetadataRequest::default())
                .unwrap();
        }
        assert!(matches!(
            conn.encode(&mut out, 9, &MetadataRequest::default()),
            Err(ConnError::TooManyInFlight(_))
        ));
    }

    #[test]
    fn throttle_keeps_the_later_deadline() {
        let mut conn = Connection::new("t");
        let now = Instant::now();
        let later = now + std::time::Duration::from_millis(50);
        conn.throttle(later);
        conn.throttle(now + std::time::Duration::from_millis(10));
        assert_eq!(conn.throttled_until(now), Some(later));
        assert_eq!(conn.throttled_until(later), None);
    }
}
