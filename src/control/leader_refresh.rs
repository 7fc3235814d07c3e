//! Finding a partition's leader again when a shard asks (`MirrorEvent::LeaderWanted`): a
//! leader or topic error from the source, or a lost connection to the broker it fetched from.
//!
//! The look-up itself (`look_up`, bounded by the source's request timeout) runs on a source
//! worker in the control plane (`ShardDataPlane`), and on the static mode's driver thread;
//! this module keeps the schedule: which partitions are wanted, which are being looked up
//! (one look-up per source in flight), and when to ask again. Each wanted partition is looked
//! up in the source's metadata; once it has a leader the answer goes back
//! to its shard as `MirrorMsg::Releader` (the shard re-homes it on that broker's connection,
//! from its log end, or fails it if the topic id changed). A partition without a leader, a
//! topic missing from the metadata (deleted, maybe about to be recreated) and an unreachable
//! source are all retried with a growing delay: the shard keeps the partition waiting, and
//! nothing is appended meanwhile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::control::fault::Fault;
use crate::control::source_catalog::Deadline;
use crate::fetch::fetcher::FetchConfig;
use crate::fetch::versions::Versions;
use std::sync::Arc;

use crate::fetch::security::SourceSecurity;
use crate::ids::{LeaderEpoch, TopicPartition};
use crate::limits::{LEADER_REFRESH_MS_MAX, LEADER_REFRESH_MS_MIN};
use crate::runtime::mirror_shard::SourceSpec;

/// How to reach a partition's source cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceAccess {
    pub bootstrap_servers: Vec<String>,
    pub client_id: String,
    pub request_timeout_ms: u32,
    /// The mirror's TLS/SASL settings: look-ups authenticate like its fetches.
    pub security: Arc<SourceSecurity>,
}

// Hashing a subset of the fields that `Eq` compares keeps equal values' hashes equal; the
// security settings (which hold a rustls config) have no hash of their own.
impl std::hash::Hash for SourceAccess {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bootstrap_servers.hash(state);
        self.client_id.hash(state);
        self.request_timeout_ms.hash(state);
    }
}

/// A partition's leader as the source's metadata names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderFound {
    pub tp: TopicPartition,
    pub source: SourceSpec,
    pub topic_id: Uuid,
    pub leader_epoch: LeaderEpoch,
}

#[derive(Debug)]
struct Wanted {
    access: SourceAccess,
    attempts: u32,
    next: Instant,
    /// Part of a look-up that has not answered yet.
    asked: bool,
}

/// ApiVersions per broker address; one connect per broker, not per refresh. Shared with the
/// workers that look leaders up.
pub type VersionsCache = std::sync::Arc<Mutex<HashMap<String, Versions>>>;

/// One look-up's answer: one per partition asked, or an error for the whole source.
pub type LookUp = Result<Vec<Result<LeaderFound, String>>, Fault>;

/// Partitions waiting for their leader, and the versions of brokers already asked.
#[derive(Debug)]
pub struct LeaderRefresh {
    fetch: FetchConfig,
    wanted: HashMap<TopicPartition, Wanted>,
    versions: VersionsCache,
}

fn delay(attempts: u32) -> Duration {
    let ms = LEADER_REFRESH_MS_MIN
        .saturating_mul(1 << attempts.min(16))
        .min(LEADER_REFRESH_MS_MAX);
    Duration::from_millis(ms)
}

impl LeaderRefresh {
    pub fn new(fetch: FetchConfig) -> LeaderRefresh {
        LeaderRefresh {
            fetch,
            wanted: HashMap::new(),
            versions: VersionsCache::default(),
        }
    }

    pub fn fetch_config(&self) -> FetchConfig {
        self.fetch
    }

    /// The versions cache, for look-ups run elsewhere.
    pub fn versions(&self) -> VersionsCache {
        std::sync::Arc::clone(&self.versions)
    }

    /// A shard asked for `tp`'s leader; asked at once (a repeated ask keeps its schedule).
    pub fn want(&mut self, tp: TopicPartition, access: SourceAccess, now: Instant) {
        self.wanted.entry(tp).or_insert(Wanted {
            access,
            attempts: 0,
            next: now,
            asked: false,
        });
    }

    /// The partition left its shard (removed or failed): stop looking.
    pub fn forget(&mut self, tp: &TopicPartition) {
        self.wanted.remove(tp);
    }

    pub fn pending(&self) -> usize {
        self.wanted.len()
    }

    /// Puts an answer back (its shard's mailbox was full): sent again on the next round.
    pub fn retry_soon(&mut self, found: &LeaderFound, access: SourceAccess, now: Instant) {
        self.wanted.insert(
            found.tp.clone(),
            Wanted {
                access,
                attempts: 0,
                next: now + Duration::from_millis(LEADER_REFRESH_MS_MIN),
                asked: false,
            },
        );
    }

    /// The partitions whose time has come, grouped by source, now marked as asked (a source
    /// whose look-up is still out gets nothing new until it answers: `settle`).
    // The key's hash and equality use only plain fields and an `Arc` pointer's target that is
    // never mutated after construction (rustls' config caches are interior, not identity).
    #[allow(clippy::mutable_key_type)]
    pub fn take_due(&mut self, now: Instant) -> Vec<(SourceAccess, Vec<TopicPartition>)> {
        let asking: Vec<SourceAccess> = self
            .wanted
            .values()
            .filter(|w| w.asked)
            .map(|w| w.access.clone())
            .collect();
        let mut by_source: HashMap<SourceAccess, Vec<TopicPartition>> = HashMap::new();
        for (tp, w) in &mut self.wanted {
            if w.next <= now && !w.asked && !asking.contains(&w.access) {
                w.asked = true;
                by_source
                    .entry(w.access.clone())
                    .or_default()
                    .push(tp.clone());
            }
        }
        by_source.into_iter().collect()
    }

    /// A look-up's answer for `tps`: the leaders found (no longer wanted) with the access
    /// used; the others are asked again after a growing delay.
    pub fn settle(
        &mut self,
        access: &SourceAccess,
        tps: &[TopicPartition],
        answer: LookUp,
        now: Instant,
    ) -> Vec<(LeaderFound, SourceAccess)> {
        for tp in tps {
            if let Some(w) = self.wanted.get_mut(tp) {
                w.asked = false;
            }
        }
        let mut found = Vec::new();
        match answer {
            Ok(answers) => {
                for (tp, answer) in tps.iter().zip(answers) {
                    match answer {
                        Ok(f) => {
                            // Forgotten meanwhile (removed, failed): the answer is dropped.
                            if self.wanted.remove(tp).is_some() {
                                found.push((f, access.clone()));
                            }
                        }
                        Err(why) => {
                            if let Some(wait) = self.postpone(tp, now) {
                                tracing::warn!(
                                    partition = %tp, %why, retry_in_ms = wait.as_millis() as u64,
                                    "source leader not known yet; the partition waits"
                                );
                            }
                        }
                    }
                }
            }
            Err(why) => {
                // The whole source did not answer: one line for all its partitions (one per
                // partition was 16,384 lines per retry at that scale).
                let waits: Vec<Duration> =
                    tps.iter().filter_map(|tp| self.postpone(tp, now)).collect();
                if let (Some(first), Some(longest)) = (tps.first(), waits.iter().max()) {
                    tracing::warn!(
                        partitions = waits.len(), %first, why = %why.message,
                        retry_in_ms = longest.as_millis() as u64,
                        "source leaders not known yet; the partitions wait"
                    );
                }
            }
        }
        found
    }

    /// Looks up every partition whose time has come on this thread, one metadata request per
    /// source (the static mode's driver). Returns the leaders found with the access used.
    pub fn run_due(&mut self, now: Instant) -> Vec<(LeaderFound, SourceAccess)> {
        let mut found = Vec::new();
        for (access, tps) in self.take_due(now) {
            let answer = look_up(self.fetch, &self.versions, &access, &tps);
            found.extend(self.settle(&access, &tps, answer, now));
        }
        found
    }

    /// Asks for `tp` again after a growing delay; the delay, if it is still wanted.
    fn postpone(&mut self, tp: &TopicPartition, now: Instant) -> Option<Duration> {
        let w = self.wanted.get_mut(tp)?;
        let wait = delay(w.attempts);
        w.attempts = w.attempts.saturating_add(1);
        w.next = now + wait;
        Some(wait)
    }
}

/// One answer per partition in `tps`, or an error for the whole source. Every connection is
/// over within the source's request timeout (`access.request_timeout_ms`), so a black-holed
/// source costs one bounded call.
pub fn look_up(
    fetch: FetchConfig,
    versions: &VersionsCache,
    access: &SourceAccess,
    tps: &[TopicPartition],
) -> LookUp {
    let by = Deadline::after_ms(u64::from(access.request_timeout_ms));
    let mut topics: Vec<&str> = tps.iter().map(|tp| tp.topic.as_str()).collect();
    topics.sort_unstable();
    topics.dedup();
    let md = by
        .first_answer(
            &access.bootstrap_servers,
            &access.client_id,
            &access.security,
            |c| c.metadata(Some(&topics)),
        )
        .map_err(|mut f| {
            // A refused login is named as it is; otherwise no server answered.
            if f.retryable {
                f.message = format!("no bootstrap server answered: {}", f.message);
            }
            f
        })?;
    // Indexed once: looking each partition up in the answer's lists made a look-up of N
    // partitions of one topic N²/2 comparisons (50 million at 10,000).
    let known: HashMap<&str, _> = md
        .topics
        .iter()
        .filter(|t| !crate::fetch::metadata::is_unknown_topic(t.error))
        .map(|t| {
            let parts: HashMap<i32, _> = t.partitions.iter().map(|p| (p.partition, p)).collect();
            (t.name.as_str(), (t, parts))
        })
        .collect();
    let mut answers = Vec::with_capacity(tps.len());
    for tp in tps {
        let answer = (|| {
            let (t, parts) = known
                .get(tp.topic.as_str())
                .ok_or_else(|| format!("topic {} is not on the source", tp.topic))?;
            let p = parts
                .get(&tp.partition)
                .ok_or_else(|| format!("{tp} is not on the source"))?;
            let leader = p
                .leader
                .filter(|_| p.error == 0)
                .ok_or_else(|| format!("{tp} has no leader (error {})", p.error))?;
            let b = md
                .broker(leader)
                .ok_or_else(|| format!("leader {leader} is not in the broker list"))?;
            let addr = format!("{}:{}", b.host, b.port);
            let v = versions_of(versions, &addr, access, by)?;
            Ok(LeaderFound {
                tp: tp.clone(),
                source: SourceSpec {
                    broker_id: leader,
                    addr,
                    versions: v,
                    fetch,
                    client_id: access.client_id.clone(),
                    request_timeout_ms: access.request_timeout_ms,
                    security: Arc::clone(&access.security),
                },
                topic_id: t.topic_id,
                leader_epoch: p.leader_epoch,
            })
        })();
        answers.push(answer);
    }
    Ok(answers)
}

fn versions_of(
    cache: &VersionsCache,
    addr: &str,
    access: &SourceAccess,
    by: Deadline,
) -> Result<Versions, String> {
    if let Some(v) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(addr) {
        return Ok(*v);
    }
    let v = by
        .connect(addr, &access.client_id, &access.security)
        .map_err(|e| by.fault(addr, &e).message)?
        .versions;
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(addr.to_string(), v);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_grows_and_is_capped() {
        assert_eq!(delay(0), Duration::from_millis(LEADER_REFRESH_MS_MIN));
        assert_eq!(delay(1), Duration::from_millis(2 * LEADER_REFRESH_MS_MIN));
        assert_eq!(delay(40), Duration::from_millis(LEADER_REFRESH_MS_MAX));
    }

    #[test]
    fn unreachable_source_postpones_and_keeps_the_partition() {
        let mut r = LeaderRefresh::new(FetchConfig::default());
        let tp = TopicPartition::new("t", 0);
        let access = SourceAccess {
            security: Default::default(),
            // Port 1 on loopback: nothing listens there, the connect is refused at once.
            bootstrap_servers: vec!["127.0.0.1:1".to_string()],
            client_id: "test".to_string(),
            request_timeout_ms: 1000,
        };
        let now = Instant::now();
        r.want(tp.clone(), access, now);
        assert!(r.run_due(now).is_empty());
        assert_eq!(r.pending(), 1);
        // Not due again before its delay.
        assert!(r.run_due(now).is_empty());
        r.forget(&tp);
        assert_eq!(r.pending(), 0);
    }
}
