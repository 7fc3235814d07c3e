//! Where clients are told to connect: each listener's advertised `host:port`. Metadata and
//! FindCoordinator answer with the address of the listener the request came in on
//! (`Session::listener`), as a Kafka broker does, so a client that bootstrapped over `SSL`
//! keeps talking TLS and one on `PLAINTEXT` is not sent to the TLS port.

use std::sync::Arc;

/// The advertised addresses of an endpoint's listeners, in configuration order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    /// (listener name, host, port); never empty.
    listeners: Vec<(Arc<str>, String, i32)>,
}

impl Advertised {
    /// One listener named `PLAINTEXT` (the `[kafka] listen/advertised` form, and tests).
    pub fn single(host: impl Into<String>, port: i32) -> Arc<Advertised> {
        Arc::new(Advertised {
            listeners: vec![(Arc::from("PLAINTEXT"), host.into(), port)],
        })
    }

    /// `listeners` as (name, host, port); `None` when empty.
    pub fn new(listeners: Vec<(Arc<str>, String, i32)>) -> Option<Arc<Advertised>> {
        (!listeners.is_empty()).then(|| Arc::new(Advertised { listeners }))
    }

    /// The address of the listener named `listener`; the first listener's for a name not
    /// served (requests that did not come from a socket).
    pub fn of(&self, listener: &str) -> (&str, i32) {
        let (_, host, port) = self
            .listeners
            .iter()
            .find(|(name, _, _)| &**name == listener)
            .unwrap_or(&self.listeners[0]);
        (host, *port)
    }
}

/// Rewrites the address of every coordinator kmirror named in `resp` (node `NODE_ID`; errors
/// name node -1 and keep it) to `host:port`.
pub fn point_coordinator_at(
    resp: &mut kafka_protocol::messages::FindCoordinatorResponse,
    host: &str,
    port: i32,
) {
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::protocol::StrBytes;
    let ours = BrokerId(crate::serve::NODE_ID);
    // v0-3 answer in the top-level fields, v4+ in `coordinators` only (setting a top-level
    // host there is refused by the encoder, and the default node id may equal ours).
    if resp.coordinators.is_empty() && resp.node_id == ours {
        resp.host = StrBytes::from_string(host.to_owned());
        resp.port = port;
    }
    for c in resp.coordinators.iter_mut().filter(|c| c.node_id == ours) {
        c.host = StrBytes::from_string(host.to_owned());
        c.port = port;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v4+ answer (transactional producers send v6) names its coordinators in the array only:
    /// pointing it at a listener must leave the v0-3 fields alone so that it still encodes.
    #[test]
    fn a_v4_answer_still_encodes_after_pointing_it_at_a_listener() {
        use kafka_protocol::messages::find_coordinator_response::Coordinator;
        use kafka_protocol::messages::{BrokerId, FindCoordinatorResponse};
        use kafka_protocol::protocol::{Encodable, StrBytes};
        let mut r = FindCoordinatorResponse::default();
        r.coordinators = vec![Coordinator::default()
            .with_key(StrBytes::from_static_str("txn-1"))
            .with_node_id(BrokerId(crate::serve::NODE_ID))];
        point_coordinator_at(&mut r, "h2", 2);
        assert_eq!(r.coordinators[0].host.as_str(), "h2");
        let mut buf = bytes::BytesMut::new();
        r.encode(&mut buf, 6).expect("a v6 answer encodes");
        // v0-3: the top-level fields.
        let mut old =
            FindCoordinatorResponse::default().with_node_id(BrokerId(crate::serve::NODE_ID));
        point_coordinator_at(&mut old, "h1", 1);
        assert_eq!((old.host.as_str(), old.port), ("h1", 1));
        old.encode(&mut buf, 3).expect("a v3 answer encodes");
    }

    #[test]
    fn each_listener_has_its_address_and_unknown_names_get_the_first() {
        let a = Advertised::new(vec![
            (Arc::from("PLAIN"), "h1".into(), 1),
            (Arc::from("SECURE"), "h2".into(), 2),
        ])
        .unwrap();
        assert_eq!(a.of("SECURE"), ("h2", 2));
        assert_eq!(a.of("PLAIN"), ("h1", 1));
        assert_eq!(a.of("OTHER"), ("h1", 1));
        assert!(Advertised::new(Vec::new()).is_none());
    }
}
