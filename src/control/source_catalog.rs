//! `SourceCatalog` over the blocking Kafka client: each call opens a connection with the
//! mirror's own bootstrap servers and `client.id` (never shared between mirrors), asks for all
//! topics' metadata, and closes it.

use crate::control::controller::{Fault, SourceCatalog, SourceTopic, SourceView};
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_security::{fault_of, security_of};
use crate::fetch::blocking::BlockingClient;

/// Reads source metadata with a fresh blocking connection per call.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockingSourceCatalog;

impl SourceCatalog for BlockingSourceCatalog {
    fn describe(&mut self, mirror: &MirrorDefinition) -> Result<SourceView, Fault> {
        let security = security_of(&mirror.source)?;
        let mut errors = Vec::new();
        for addr in &mirror.source.bootstrap_servers {
            let result = BlockingClient::connect_secure(addr, &mirror.source.client_id, &security)
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
                // Another bootstrap server would refuse the same credentials.
                Err(e) if e.is_authentication() => return Err(fault_of(addr, &e)),
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        Err(Fault::from(errors.join("; ")))
    }
}
