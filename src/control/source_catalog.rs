//! `SourceCatalog` over the blocking Kafka client: each call opens a connection with the
//! mirror's own bootstrap servers and `client.id` (never shared between mirrors), asks for all
//! topics' metadata, and closes it.

use crate::control::controller::{SourceCatalog, SourceTopic, SourceView};
use crate::control::mirror_def::{MirrorDefinition, SecurityProtocol};
use crate::fetch::blocking::BlockingClient;

/// Reads source metadata with a fresh blocking connection per call.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockingSourceCatalog;

impl SourceCatalog for BlockingSourceCatalog {
    fn describe(&mut self, mirror: &MirrorDefinition) -> Result<SourceView, String> {
        let protocol = mirror.source.security_protocol;
        if protocol != SecurityProtocol::Plaintext {
            // Named plainly so the operator knows it is kmirror's gap, not their config.
            return Err(format!(
                "security.protocol {protocol} is not supported by kmirror's source client yet (only PLAINTEXT)"
            ));
        }
        let mut errors = Vec::new();
        for addr in &mirror.source.bootstrap_servers {
            let result = BlockingClient::connect(addr, &mirror.source.client_id)
                .and_then(|mut c| c.metadata(None));
            match result {
                Ok(md) => {
                    let topics = md
                        .topics
                        .into_iter()
                        .filter(|t| t.error == 0)
                        .map(|t| SourceTopic {
                            partitions: t.partitions.len() as i32,
                            name: t.name,
                            topic_id: t.topic_id,
                            internal: t.is_internal,
                        })
                        .collect();
                    return Ok(SourceView {
                        cluster_id: md.cluster_id,
                        topics,
                    });
                }
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        Err(errors.join("; "))
    }
}
