//! Fetch sessions (KIP-227) of the synthetic source, so benchmarks measure what a real broker
//! costs a client: the broker's rules are `serve::fetch_sessions` (the same cache kmirror's own
//! endpoint keeps for its consumers); this module only adapts them to the synthetic source's
//! plan-then-encode responses. A source built `refusing()` behaves like a broker whose session
//! cache is full: full fetches get session id 0, incremental ones FETCH_SESSION_ID_NOT_FOUND.

use std::sync::Arc;

use kafka_protocol::messages::FetchRequest;

use super::fetch_response::Planned;
use crate::serve::fetch_sessions::{
    requested, Context, FetchSessions, Outcome, SessionStats, FETCH_SESSION_ID_NOT_FOUND,
    NO_SESSION,
};

/// The source's session cache, shared by its connection threads (a session is not tied to a
/// connection), or none when sessions are refused.
#[derive(Debug, Clone)]
pub struct SynthSessions {
    cache: Option<Arc<FetchSessions>>,
}

impl SynthSessions {
    /// Sessions granted as a Kafka broker grants them, with kmirror's endpoint bounds.
    pub fn granted() -> SynthSessions {
        SynthSessions {
            cache: Some(FetchSessions::new()),
        }
    }

    /// Every session refused (the behaviour of a broker whose cache is full).
    pub fn refusing() -> SynthSessions {
        SynthSessions { cache: None }
    }

    /// What the cache did so far (all zero when refusing).
    pub fn stats(&self) -> SessionStats {
        self.cache.as_ref().map(|c| c.stats()).unwrap_or_default()
    }

    /// Applies the request's session fields: which partitions to read, or a top-level error.
    pub fn begin(&self, version: i16, request: &FetchRequest) -> Context {
        match &self.cache {
            Some(c) => c.begin(version, request),
            None if version >= 7 && request.session_id != NO_SESSION => {
                Context::Error(FETCH_SESSION_ID_NOT_FOUND)
            }
            None => Context::Sessionless(requested(version, request)),
        }
    }

    /// After the partitions of `context` were planned (same order): the session id to answer
    /// with and which planned partitions the response carries (`None`: all), or the top-level
    /// error to answer instead.
    pub fn finish(
        &self,
        version: i16,
        context: &Context,
        planned: &[Planned],
    ) -> Result<(i32, Option<Vec<bool>>), i16> {
        let outcomes = || {
            planned
                .iter()
                .map(Planned::outcome)
                .collect::<Vec<Outcome>>()
        };
        match (context, &self.cache) {
            (Context::Full(wanted), Some(c)) => {
                Ok((c.finish_full(version, wanted, &outcomes()), None))
            }
            (Context::Incremental { id, epoch, .. }, Some(c)) => c
                .finish_incremental(*id, *epoch, &outcomes())
                .map(|keep| (*id, Some(keep))),
            (Context::Error(code), _) => Err(*code),
            _ => Ok((NO_SESSION, None)),
        }
    }
}

/// The partitions a context reads (none for an error).
pub fn wanted(context: &Context) -> &[crate::serve::fetch_sessions::Wanted] {
    match context {
        Context::Sessionless(w) | Context::Full(w) => w,
        Context::Incremental { wanted, .. } => wanted,
        Context::Error(_) => &[],
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use bytes::Bytes;
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
    use kafka_protocol::messages::{FetchResponse, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Decodable, StrBytes};

    use super::*;
    use crate::bench::fetch_response::{self, ResponseFrame};
    use crate::bench::records::Catalog;
    use crate::bench::{SynthCodec, SynthSpec};

    const V: i16 = 12; // by name, flexible

    fn catalog(batches: u64) -> Catalog {
        let mut c = Catalog::new(SynthSpec {
            topics: vec!["a".into()],
            partitions: 4,
            codec: SynthCodec::Lz4,
            records_per_batch: Some(10),
            ..SynthSpec::default()
        })
        .unwrap();
        c.batches_per_partition = Some(batches);
        c
    }

    fn request(parts: &[(i32, i64)], id: i32, epoch: i32) -> FetchRequest {
        let mut t = FetchTopic::default();
        t.topic = TopicName(StrBytes::from_static_str("a"));
        for &(p, off) in parts {
            t.partitions.push(
                FetchPartition::default()
                    .with_partition(p)
                    .with_fetch_offset(off)
                    .with_partition_max_bytes(1 << 20),
            );
        }
        FetchRequest::default()
            .with_max_bytes(i32::MAX)
            .with_session_id(id)
            .with_session_epoch(epoch)
            .with_topics(if parts.is_empty() { vec![] } else { vec![t] })
    }

    /// One request through the source's path (begin, plan, finish, encode), decoded with
    /// kafka-protocol as a client would.
    fn answer(c: &Catalog, s: &SynthSessions, req: &FetchRequest) -> FetchResponse {
        let ctx = s.begin(V, req);
        let mut planned = Vec::new();
        fetch_response::plan(
            c,
            V,
            wanted(&ctx),
            req.max_bytes,
            Instant::now(),
            &mut planned,
        );
        let mut frame = ResponseFrame::default();
        match s.finish(V, &ctx, &planned) {
            Ok((id, keep)) => fetch_response::encode(
                c,
                7,
                V,
                id,
                wanted(&ctx),
                &planned,
                keep.as_deref(),
                &mut frame,
                &mut Vec::new(),
            )
            .unwrap(),
            Err(code) => fetch_response::encode_error(c, 7, V, code, &mut frame).unwrap(),
        }
        let mut bytes = Bytes::from(frame.to_vec(c.template.body_after_offset()));
        let _ = bytes.split_to(4);
        ResponseHeader::decode(&mut bytes, 1).unwrap();
        let r = FetchResponse::decode(&mut bytes, V).unwrap();
        assert!(bytes.is_empty());
        r
    }

    fn partitions(r: &FetchResponse) -> Vec<i32> {
        r.responses
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.partition_index))
            .collect()
    }

    #[test]
    fn incremental_fetches_carry_only_partitions_with_news() {
        let c = catalog(3);
        let s = SynthSessions::granted();
        let end = 30; // 3 batches of 10
        let full = answer(
            &c,
            &s,
            &request(&[(0, 0), (1, 0), (2, end), (3, end)], 0, 0),
        );
        assert_eq!(full.error_code, 0);
        let id = full.session_id;
        assert_ne!(id, 0, "a session is granted");
        assert_eq!(
            partitions(&full),
            vec![0, 1, 2, 3],
            "a full fetch answers all"
        );
        // Partition 0 and 1 moved to their ends; 2 and 3 were at theirs already. Nothing
        // changed for 2 and 3 since the client heard of them: they are left out.
        let inc = answer(&c, &s, &request(&[(0, end), (1, end)], id, 1));
        assert_eq!((inc.error_code, inc.session_id), (0, id));
        assert_eq!(partitions(&inc), Vec::<i32>::new(), "no news anywhere");
        // An empty incremental request still reads every partition of the session.
        let poll = answer(&c, &s, &request(&[], id, 2));
        assert_eq!((poll.error_code, partitions(&poll)), (0, vec![]));
        // Rewinding partition 1 brings its records, and only it is answered.
        let rewound = answer(&c, &s, &request(&[(1, 10)], id, 3));
        assert_eq!(partitions(&rewound), vec![1]);
        let recs = rewound.responses[0].partitions[0].records.as_ref().unwrap();
        assert_eq!(recs.len(), 2 * c.template.size());
        assert_eq!(s.stats().counts.incremental_fetches, 3);
    }

    #[test]
    fn session_errors_follow_the_brokers_rules() {
        let c = catalog(3);
        let s = SynthSessions::granted();
        let full = answer(&c, &s, &request(&[(0, 0)], 0, 0));
        let id = full.session_id;
        // A wrong epoch, an unknown id: top-level errors, no partitions, session id 0.
        let wrong = answer(&c, &s, &request(&[], id, 5));
        assert_eq!(wrong.error_code, 71, "INVALID_FETCH_SESSION_EPOCH");
        assert!(wrong.responses.is_empty());
        let unknown = answer(&c, &s, &request(&[], id.wrapping_add(1), 1));
        assert_eq!(unknown.error_code, 70, "FETCH_SESSION_ID_NOT_FOUND");
        // The right epoch still works after the errors.
        assert_eq!(answer(&c, &s, &request(&[], id, 1)).error_code, 0);
        // Forgetting the last partition ends the session; its id is then unknown.
        let mut forget = request(&[], id, 2);
        forget.forgotten_topics_data = vec![ForgottenTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("a")))
            .with_partitions(vec![0])];
        assert_eq!(answer(&c, &s, &forget).error_code, 0);
        assert_eq!(answer(&c, &s, &request(&[], id, 3)).error_code, 70);
        // A FINAL (epoch -1) full fetch opens no session.
        assert_eq!(answer(&c, &s, &request(&[(0, 0)], 0, -1)).session_id, 0);
    }

    #[test]
    fn a_refusing_source_answers_full_fetches_without_a_session() {
        let c = catalog(3);
        let s = SynthSessions::refusing();
        let full = answer(&c, &s, &request(&[(0, 0)], 0, 0));
        assert_eq!((full.error_code, full.session_id), (0, 0));
        assert_eq!(partitions(&full), vec![0]);
        let inc = answer(&c, &s, &request(&[], 5, 1));
        assert_eq!(inc.error_code, 70, "FETCH_SESSION_ID_NOT_FOUND");
    }
}
