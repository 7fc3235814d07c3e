use super::*;
use crate::control::group_sync::{self, GroupSyncSchedule, LocalLogs};
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_catalog::Deadline;
use crate::control::state::Command;
use crate::control::topic_configs::SourceConfigEntry;
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// The source sync with its answers applied (inline workers).
    fn sync_now(&mut self) -> Result<(), ControlError> {
        self.sync();
        self.apply_results()
    }
}

#[derive(Clone)]
struct FakeSource(
    Arc<Mutex<Result<SourceView, Fault>>>,
    /// Each topic's DescribeConfigs entries (a topic not here: the source's error).
    Arc<Mutex<BTreeMap<String, Vec<SourceConfigEntry>>>>,
    /// Its tail of each partition, for re-point checks.
    Arc<Mutex<BTreeMap<TopicPartition, crate::control::lineage::SourceTail>>>,
);

impl SourceCatalog for FakeSource {
    fn describe(&self, _: &MirrorDefinition, _: Deadline) -> Result<SourceView, Fault> {
        self.0.lock().unwrap().clone()
    }
    fn topic_configs(
        &self,
        _: &MirrorDefinition,
        topics: &[&str],
        _: Deadline,
    ) -> Result<BTreeMap<String, Result<Vec<SourceConfigEntry>, String>>, Fault> {
        self.0.lock().unwrap().clone()?;
        let known = self.1.lock().unwrap();
        Ok(topics
            .iter()
            .map(|t| {
                let e = known
                    .get(*t)
                    .cloned()
                    .ok_or_else(|| "UNKNOWN_TOPIC_OR_PARTITION".to_owned());
                ((*t).to_owned(), e)
            })
            .collect())
    }
    fn list_offsets(
        &self,
        _: &MirrorDefinition,
        tps: &[TopicPartition],
        _: OffsetQuery,
        _: Deadline,
    ) -> Result<Vec<(TopicPartition, Listed)>, Fault> {
        self.0.lock().unwrap().clone()?;
        Ok(tps
            .iter()
            .map(|tp| (tp.clone(), Listed::At(Offset(120))))
            .collect())
    }
    fn history(
        &self,
        _: &MirrorDefinition,
        tails: &[(TopicPartition, crate::control::lineage::LocalTail)],
        _: Deadline,
    ) -> Result<BTreeMap<TopicPartition, crate::control::lineage::SourceTail>, Fault> {
        let known = self.2.lock().unwrap();
        Ok(tails
            .iter()
            .filter_map(|(tp, _)| known.get(tp).map(|t| (tp.clone(), t.clone())))
            .collect())
    }
}

/// Records which partitions have a fetcher; each removal reports log end 100.
#[derive(Clone, Default)]
struct FakeData {
    active: Rc<RefCell<BTreeSet<TopicPartition>>>,
    adds: Rc<RefCell<u32>>,
    fail_adds: Rc<RefCell<bool>>,
    failures: Rc<RefCell<Vec<(TopicPartition, Fault)>>>,
    promoted: Rc<RefCell<Vec<TopicPartition>>>,
    fail_promotes: Rc<RefCell<bool>>,
    /// Promotion checkpoints written, and whether writing one fails.
    checkpoints: Rc<RefCell<u32>>,
    /// Partitions handed to prepare_logs (created together before their adds).
    prepared: Rc<RefCell<usize>>,
    fail_checkpoints: Rc<RefCell<bool>>,
    writable: Rc<RefCell<BTreeSet<TopicPartition>>>,
    /// The config each topic was last given.
    configs: Rc<RefCell<BTreeMap<String, LogConfig>>>,
    /// Local logs' tails, for re-point checks.
    tails: Rc<RefCell<BTreeMap<TopicPartition, crate::control::lineage::LocalTail>>>,
    /// Our own cluster id, as the endpoint would tell it.
    own_id: Rc<RefCell<Option<String>>>,
}

impl DataPlane for FakeData {
    fn add(
        &mut self,
        _: &MirrorDefinition,
        tp: &TopicPartition,
        _: Uuid,
        _: StartFrom,
    ) -> Result<(), Fault> {
        if *self.fail_adds.borrow() {
            return Err("connection refused".into());
        }
        *self.adds.borrow_mut() += 1;
        self.active.borrow_mut().insert(tp.clone());
        Ok(())
    }
    fn prepare_logs(&mut self, partitions: &[(TopicPartition, Uuid)]) -> Result<usize, String> {
        *self.prepared.borrow_mut() += partitions.len();
        Ok(partitions.len())
    }
    fn remove(&mut self, tp: &TopicPartition) -> Result<Offset, String> {
        self.active.borrow_mut().remove(tp);
        Ok(Offset(100))
    }
    fn configure(&mut self, topic: &str, config: &LogConfig) -> Result<(), String> {
        self.configs
            .borrow_mut()
            .insert(topic.to_owned(), config.clone());
        Ok(())
    }
    fn promote(&mut self, tp: &TopicPartition) -> Result<Promotion, String> {
        if *self.fail_promotes.borrow() {
            return Err(format!("{tp}: disk full"));
        }
        self.promoted.borrow_mut().push(tp.clone());
        Ok(Promotion {
            leader_epoch: crate::ids::LeaderEpoch(1),
            aborted: Vec::new(),
            log_end: Offset(100),
        })
    }
    fn checkpoint_promotions(&mut self) -> Result<(), String> {
        if *self.fail_checkpoints.borrow() {
            return Err("checkpoint: disk full".to_owned());
        }
        *self.checkpoints.borrow_mut() += 1;
        Ok(())
    }
    fn writable(&mut self, tp: &TopicPartition) -> Result<(), String> {
        self.writable.borrow_mut().insert(tp.clone());
        Ok(())
    }
    fn local_partitions(&self) -> Vec<TopicPartition> {
        self.tails.borrow().keys().cloned().collect()
    }
    fn own_cluster_id(&self) -> Option<String> {
        self.own_id.borrow().clone()
    }
    fn local_tail(
        &self,
        tp: &TopicPartition,
    ) -> Option<Result<crate::control::lineage::LocalTail, String>> {
        self.tails.borrow().get(tp).cloned().map(Ok)
    }
    fn poll_failures(&mut self) -> Vec<(TopicPartition, Fault)> {
        std::mem::take(&mut *self.failures.borrow_mut())
    }
    fn progress(&self, _: &TopicPartition) -> Progress {
        Progress {
            local_log_end: Some(90),
            source_high_watermark: Some(100),
            source_high_watermark_at_ms: Some(now_ms() - 200),
            newest_timestamp_ms: Some(now_ms() - 1500),
            throttled_ms: None,
            skipped_records: 0,
            stalled: None,
            unclean: Default::default(),
        }
    }
}

fn topic(name: &str, partitions: i32) -> SourceTopic {
    SourceTopic {
        name: name.into(),
        topic_id: Uuid::from_u128(name.len() as u128 + 1),
        partitions,
        internal: false,
    }
}

fn view(cluster: &str) -> SourceView {
    SourceView {
        cluster_id: Some(cluster.into()),
        topics: vec![
            topic("orders", 2),
            topic("payments", 1),
            topic("__consumer_offsets", 3),
        ],
    }
}

fn props() -> BTreeMap<String, String> {
    [("bootstrap.servers".to_owned(), "src:9092".to_owned())].into()
}

struct Rig {
    dir: tempfile::TempDir,
    source: FakeSource,
    data: FakeData,
}

impl Rig {
    fn new() -> Rig {
        Rig {
            dir: tempfile::tempdir().unwrap(),
            source: FakeSource(
                Arc::new(Mutex::new(Ok(view("c1")))),
                Arc::new(Mutex::new(
                    ["orders", "payments", "orders-eu", "refunds"]
                        .into_iter()
                        .map(|t| (t.to_owned(), Vec::new()))
                        .collect(),
                )),
                Arc::default(),
            ),
            data: FakeData::default(),
        }
    }

    fn open(&self) -> Controller<FakeSource, FakeData> {
        // Each open is a fresh process: the data plane starts empty.
        self.data.active.borrow_mut().clear();
        let store = StateLog::open(self.dir.path()).unwrap();
        let mut c = Controller::open(
            store,
            RetryPolicy::default(),
            self.source.clone(),
            self.data.clone(),
        )
        .unwrap();
        // The periodic source calls run at once, so each tick sees its own answers.
        c.use_inline_workers();
        c
    }

    fn active(&self) -> Vec<String> {
        self.data
            .active
            .borrow()
            .iter()
            .map(|t| t.to_string())
            .collect()
    }
}

fn state<S: SourceCatalog>(c: &Controller<S, FakeData>, t: &str, p: i32) -> Option<StateName> {
    c.partition_state("m1", &TopicPartition::new(t, p))
}

#[test]
fn lifecycle_persists_across_restarts_in_every_state() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    assert_eq!(c.mirror_epoch("m1"), Some(MirrorEpoch(1)));
    let r = c.start("m1", "orders,__.*", None).unwrap();
    assert_eq!(
        r.changed,
        ["orders-0", "orders-1"],
        "internal topics stay excluded"
    );
    assert_eq!(state(&c, "orders", 0), Some(StateName::Mirroring));
    assert_eq!(rig.active(), ["orders-0", "orders-1"]);
    drop(c); // kill -9 while MIRRORING

    let mut c = rig.open();
    assert_eq!(
        c.mirror_epoch("m1"),
        Some(MirrorEpoch(2)),
        "epoch grows per start"
    );
    assert_eq!(state(&c, "orders", 1), Some(StateName::Mirroring));
    assert_eq!(
        rig.active(),
        ["orders-0", "orders-1"],
        "fetchers handed back"
    );

    c.command("m1", "orders", Command::Pause).unwrap();
    assert_eq!(state(&c, "orders", 0), Some(StateName::Paused));
    assert!(rig.active().is_empty());
    drop(c);
    let mut c = rig.open();
    assert_eq!(state(&c, "orders", 0), Some(StateName::Paused));
    assert!(
        rig.active().is_empty(),
        "a paused partition stays without fetcher"
    );

    c.command("m1", "ord.*", Command::Resume).unwrap();
    assert_eq!(state(&c, "orders", 0), Some(StateName::Mirroring));
    assert_eq!(rig.active().len(), 2);

    let err = c.delete("m1").unwrap_err();
    assert!(err.to_string().contains("orders-0 (MIRRORING)"), "{err}");

    c.command("m1", ".*", Command::Stop).unwrap();
    assert_eq!(state(&c, "orders", 1), Some(StateName::Stopped));
    let rows = c.describe(Some("m1")).unwrap();
    assert_eq!(rows[0].last_mirror_epoch, Some(3));
    assert_eq!(rows[0].last_end_offset, Some(100));
    drop(c);
    let mut c = rig.open();
    assert_eq!(state(&c, "orders", 1), Some(StateName::Stopped));
    assert_eq!(
        c.describe(Some("m1")).unwrap()[1].last_end_offset,
        Some(100)
    );
    c.delete("m1").unwrap();
    c.close().unwrap();
    let c = rig.open();
    assert!(c.list().is_empty(), "tombstones removed the mirror");
}

/// A source with one group that committed offset 42 on every partition it is asked about
/// (or no answer at all), counting its rounds.
#[derive(Clone, Default)]
struct FakeGroups {
    rounds: Arc<Mutex<u32>>,
    dead: Arc<Mutex<bool>>,
}

impl group_sync::SourceGroups for FakeGroups {
    fn read(
        &self,
        _: &MirrorDefinition,
        _: &dyn Fn(&str) -> bool,
        topics: &BTreeSet<String>,
        _: std::time::Instant,
    ) -> Result<Vec<group_sync::SourceGroup>, String> {
        *self.rounds.lock().unwrap() += 1;
        if *self.dead.lock().unwrap() {
            return Err("connection refused".into());
        }
        let offsets = topics
            .iter()
            .flat_map(|t| (0..2).map(move |p| TopicPartition::new(t.as_str(), p)))
            .map(|tp| group_sync::SourceOffset {
                tp,
                offset: Offset(42),
                leader_epoch: crate::ids::LeaderEpoch(1),
                metadata: String::new(),
            })
            .collect();
        Ok(vec![group_sync::SourceGroup {
            group: "app".into(),
            offsets,
        }])
    }
}

struct Bounds;
impl LocalLogs for Bounds {
    fn bounds(&self, _: &TopicPartition) -> Option<group_sync::LocalBounds> {
        Some(group_sync::LocalBounds {
            log_start: Offset(0),
            log_end: Offset(100),
            leader_epoch: crate::ids::LeaderEpoch(1),
        })
    }
    fn epoch_before(&self, _: &TopicPartition, _: Offset) -> crate::ids::LeaderEpoch {
        crate::ids::LeaderEpoch(1)
    }
}

type Coord = crate::serve::groups::GroupCoordinator<crate::serve::groups::MemoryStore>;

fn attach(c: &mut Controller<FakeSource, FakeData>, groups: &FakeGroups) -> Arc<Mutex<Coord>> {
    let coord = Arc::new(Mutex::new(
        Coord::open(
            crate::serve::groups::CoordinatorConfig::new(0, "h", 1),
            crate::serve::groups::MemoryStore::default(),
        )
        .unwrap(),
    ));
    c.attach_group_sync(GroupSyncPlane {
        source: Arc::new(groups.clone()),
        local: Box::new(Bounds),
        sink: Box::new(Arc::clone(&coord)),
        schedule: GroupSyncSchedule::default(),
    });
    coord
}

use std::sync::{Arc, Mutex};

#[test]
fn group_offsets_sync_on_tick_for_mirroring_partitions_and_once_more_at_stop() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "orders", None).unwrap();
    let groups = FakeGroups::default();
    let coord = attach(&mut c, &groups);
    let committed = |p: i32| {
        coord
            .lock()
            .unwrap()
            .committed("app", &TopicPartition::new("orders", p))
            .map(|o| o.offset)
    };
    c.tick(1_000).unwrap();
    assert_eq!(
        (committed(0), committed(1)),
        (Some(Offset(42)), Some(Offset(42)))
    );
    c.tick(2_000).unwrap();
    assert_eq!(
        *groups.rounds.lock().unwrap(),
        1,
        "next round only after 30 s"
    );
    c.tick(31_000).unwrap();
    assert_eq!(*groups.rounds.lock().unwrap(), 2);
    // Stop: one more sync before the partitions fail over, even off-schedule.
    c.command("m1", "orders", Command::Stop).unwrap();
    assert_eq!(*groups.rounds.lock().unwrap(), 3);
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));
}

#[test]
fn stop_with_a_dead_source_skips_the_last_group_sync() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "orders", None).unwrap();
    let groups = FakeGroups::default();
    let coord = attach(&mut c, &groups);
    *groups.dead.lock().unwrap() = true;
    c.command("m1", "orders", Command::Stop).unwrap();
    assert_eq!(*groups.rounds.lock().unwrap(), 1, "tried once");
    assert_eq!(
        state(&c, "orders", 0),
        Some(StateName::Stopped),
        "failover went on"
    );
    assert!(coord
        .lock()
        .unwrap()
        .committed("app", &TopicPartition::new("orders", 0))
        .is_none());
}

#[test]
fn stop_promotes_before_stopped_and_a_failed_promotion_or_checkpoint_is_finished_later() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "orders", None).unwrap();
    *rig.data.fail_promotes.borrow_mut() = true;
    c.command("m1", "orders", Command::Stop).unwrap();
    assert!(rig.active().is_empty(), "fetchers are removed first");
    assert_eq!(
        state(&c, "orders", 0),
        Some(StateName::Stopping),
        "never STOPPED (writable) without promotion"
    );
    c.tick(now_ms()).unwrap();
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopping));
    drop(c); // kill -9 while STOPPING

    *rig.data.fail_promotes.borrow_mut() = false;
    // Promoted, but the checkpoint that makes the promotions durable fails: still STOPPING.
    *rig.data.fail_checkpoints.borrow_mut() = true;
    let mut c = rig.open();
    c.tick(now_ms()).unwrap();
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopping));
    assert!(rig.data.writable.borrow().is_empty(), "nothing writable");
    *rig.data.fail_checkpoints.borrow_mut() = false;
    c.tick(now_ms()).unwrap();
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));
    assert_eq!(state(&c, "orders", 1), Some(StateName::Stopped));
    let promoted: BTreeSet<String> = rig
        .data
        .promoted
        .borrow()
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(
        promoted,
        BTreeSet::from(["orders-0".into(), "orders-1".into()])
    );
    assert_eq!(
        c.describe(Some("m1")).unwrap()[0].last_end_offset,
        Some(100)
    );
}

#[test]
fn describe_reports_lag_and_list_the_source() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "payments", None).unwrap();
    let rows = c.describe(None).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].lag, Some(10));
    let secs = rows[0].lag_seconds.unwrap();
    assert!(
        (1.5..60.0).contains(&secs),
        "lag of a record stored 1.5 s ago: {secs}"
    );
    // Paused: no fetcher, so the high watermark comes from the source (ListOffsets), listed in
    // the background: the first describe shows what the fetcher saw last, with no age...
    c.command("m1", "payments", Command::Pause).unwrap();
    let rows = c.describe(None).unwrap();
    assert_eq!(
        (
            rows[0].source_offset,
            rows[0].lag,
            rows[0].source_offset_age_ms
        ),
        (Some(100), Some(10), None)
    );
    // ...the next one the listing's answer, with how old it is.
    let rows = c.describe(None).unwrap();
    assert_eq!((rows[0].source_offset, rows[0].lag), (Some(120), Some(30)));
    assert!(rows[0]
        .source_offset_age_ms
        .is_some_and(|a| (0..60_000).contains(&a)));
    let list = c.list();
    assert_eq!(list[0].topics, 1);
    assert_eq!(list[0].source_cluster_id.as_deref(), Some("c1"));
    assert_eq!(list[0].source_bootstrap_servers, "src:9092");
}

#[test]
fn errors_name_the_problem() {
    let rig = Rig::new();
    let mut c = rig.open();
    assert_eq!(
        c.start("nope", "x", None).unwrap_err().to_string(),
        "unknown mirror \"nope\""
    );
    c.create("m1", &props()).unwrap();
    assert!(matches!(
        c.create("m1", &props()),
        Err(ControlError::MirrorExists(_))
    ));
    assert!(c
        .start("m1", "orders-(", None)
        .unwrap_err()
        .to_string()
        .starts_with("bad regex \"orders-(\""));
    assert!(matches!(
        c.command("m1", "orders", Command::Pause),
        Err(ControlError::NoMatch { .. })
    ));
    c.create("m2", &props()).unwrap();
    c.start("m1", "orders", None).unwrap();
    assert_eq!(
        c.start("m2", "orders", None).unwrap_err().to_string(),
        "topic orders is already mirrored by m1"
    );
    *rig.source.0.lock().unwrap() = Err("connection refused".into());
    assert_eq!(
        c.create("m3", &props()).unwrap_err().to_string(),
        "source of mirror m3 is unreachable: connection refused"
    );
    // A rejected command changes nothing: resume of a MIRRORING partition is a no-op,
    // pause of a STOPPED one is refused for all.
    c.command("m1", "orders", Command::Stop).unwrap();
    let err = c.command("m1", "orders", Command::Pause).unwrap_err();
    assert_eq!(err.status(), 409);
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));
}

#[test]
fn changed_cluster_id_fails_the_mirror_for_good() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "orders", None).unwrap();
    *rig.source.0.lock().unwrap() = Ok(view("other"));
    let err = c.start("m1", "payments", None).unwrap_err();
    assert!(matches!(err, ControlError::ClusterChanged { .. }));
    let rows = c.describe(Some("m1")).unwrap();
    assert!(rows
        .iter()
        .all(|r| r.state == StateName::Failed && r.retry_attempt == -1));
    assert!(rig.active().is_empty());
    c.tick(i64::MAX).unwrap();
    assert_eq!(state(&c, "orders", 0), Some(StateName::Failed));
}

#[test]
fn sync_follows_new_topics_added_partitions_and_deletions() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "orders.*", None).unwrap();
    assert_eq!(rig.active(), ["orders-0", "orders-1"]);
    {
        let mut v = rig.source.0.lock().unwrap();
        let v = v.as_mut().unwrap();
        v.topics[0].partitions = 3; // orders grew
        v.topics.push(topic("orders-eu", 1)); // a new matching topic
        v.topics.push(topic("refunds", 1)); // not matching
    }
    c.sync_now().unwrap();
    assert_eq!(
        rig.active(),
        ["orders-0", "orders-1", "orders-2", "orders-eu-0"]
    );
    assert_eq!(state(&c, "orders", 2), Some(StateName::Mirroring));
    assert_eq!(state(&c, "refunds", 0), None);
    // The saved patterns survive a restart and keep being followed.
    drop(c);
    let mut c = rig.open();
    rig.source
        .0
        .lock()
        .unwrap()
        .as_mut()
        .unwrap()
        .topics
        .retain(|t| t.name != "orders-eu");
    c.sync_now().unwrap();
    let row = c
        .describe(Some("m1"))
        .unwrap()
        .into_iter()
        .find(|r| r.topic == "orders-eu")
        .unwrap();
    assert_eq!(row.state, StateName::Failed);
    assert_eq!(row.retry_attempt, -1);
    assert_eq!(row.error_message.as_deref(), Some(SOURCE_TOPIC_DELETED));
    assert!(!rig.active().contains(&"orders-eu-0".to_owned()));
    // A deleted topic is not resurrected by the next round, and stop still works.
    c.sync_now().unwrap();
    assert_eq!(state(&c, "orders-eu", 0), Some(StateName::Failed));
    c.command("m1", "orders-eu", Command::Stop).unwrap();
    assert_eq!(state(&c, "orders-eu", 0), Some(StateName::Stopped));
}

// Goal: a source sync that finds thousands of new partitions (a topic grown with
// `kafka-topics --alter`) and a deleted topic writes `__mirror_state` a few times, not once or
// twice per partition, and every new partition's state is still on disk after a restart.
// Method: grow a mirrored topic from 1 to N partitions and delete another, sync, count the
// controller's appends, reopen and read the states back.
#[test]
fn a_sync_that_finds_many_new_partitions_writes_mirror_state_per_step_not_per_partition() {
    const N: i32 = 600;
    let rig = Rig::new();
    *rig.source.0.lock().unwrap() = Ok(SourceView {
        cluster_id: Some("c1".into()),
        topics: vec![topic("big", 1), topic("gone", 1)],
    });
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "big|gone", None).unwrap();
    {
        let mut v = rig.source.0.lock().unwrap();
        let v = v.as_mut().unwrap();
        v.topics[0].partitions = N;
        v.topics.retain(|t| t.name != "gone");
    }
    let before = c.state_writes();
    c.sync_now().unwrap();
    let writes = c.state_writes() - before;
    assert!(
        (1..=3).contains(&writes),
        "a sync adding {} partitions and failing one took {writes} __mirror_state writes",
        N - 1
    );
    assert_eq!(state(&c, "big", N - 1), Some(StateName::Mirroring));
    assert_eq!(rig.active().len(), N as usize);
    drop(c);
    let c = rig.open();
    for p in 0..N {
        assert_eq!(state(&c, "big", p), Some(StateName::Mirroring), "big-{p}");
    }
    assert_eq!(state(&c, "gone", 0), Some(StateName::Failed));
}

#[test]
fn data_plane_failures_fail_the_partition_and_retry() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "payments", None).unwrap();
    let tp = TopicPartition::new("payments", 0);
    rig.data.active.borrow_mut().remove(&tp);
    rig.data.failures.borrow_mut().push((
        tp.clone(),
        Fault {
            message: "append failed: disk full".into(),
            retryable: true,
            timed_out: false,
        },
    ));
    let now = now_ms();
    c.tick(now).unwrap();
    let row = &c.describe(Some("m1")).unwrap()[0];
    assert_eq!(row.state, StateName::Failed);
    assert_eq!(
        row.error_message.as_deref(),
        Some("append failed: disk full")
    );
    assert_eq!(row.retry_attempt, 1);
    // Survives a restart, then retries once the backoff has passed.
    drop(c);
    let mut c = rig.open();
    assert_eq!(state(&c, "payments", 0), Some(StateName::Failed));
    c.tick(now + 5_000).unwrap();
    assert_eq!(state(&c, "payments", 0), Some(StateName::Mirroring));
    assert_eq!(rig.active(), ["payments-0"]);
}

#[test]
fn divergence_fails_the_partition_without_retry() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "payments", None).unwrap();
    let tp = TopicPartition::new("payments", 0);
    rig.data.active.borrow_mut().remove(&tp);
    let why = "source log diverged from ours: the source topic was deleted and recreated";
    rig.data.failures.borrow_mut().push((
        tp.clone(),
        Fault {
            message: why.into(),
            retryable: false,
            timed_out: false,
        },
    ));
    c.tick(now_ms()).unwrap();
    let row = &c.describe(Some("m1")).unwrap()[0];
    assert_eq!(row.state, StateName::Failed);
    assert_eq!(row.error_message.as_deref(), Some(why));
    assert_eq!(row.retry_attempt, -1);
    // No automatic retry, however long we wait: fetching again would not help.
    c.tick(i64::MAX).unwrap();
    assert_eq!(state(&c, "payments", 0), Some(StateName::Failed));
    assert!(rig.active().is_empty());
}

#[test]
fn failed_fetcher_start_retries_after_backoff() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    *rig.data.fail_adds.borrow_mut() = true;
    c.start("m1", "payments", None).unwrap();
    let row = &c.describe(Some("m1")).unwrap()[0];
    assert_eq!(row.state, StateName::Failed);
    assert_eq!(row.retry_attempt, 1);
    assert_eq!(row.error_message.as_deref(), Some("connection refused"));
    *rig.data.fail_adds.borrow_mut() = false;
    c.tick(now_ms() + 1_000).unwrap();
    assert_eq!(state(&c, "payments", 0), Some(StateName::Mirroring));
    assert_eq!(rig.active(), ["payments-0"]);
}

fn dynamic(name: &str, value: &str) -> SourceConfigEntry {
    SourceConfigEntry {
        name: name.into(),
        value: Some(value.into()),
        source: crate::control::topic_configs::SOURCE_DYNAMIC_TOPIC,
    }
}

#[test]
fn topic_configs_are_copied_persisted_replayed_and_bad_ones_kept_out() {
    let rig = Rig::new();
    rig.source.1.lock().unwrap().insert(
        "orders".into(),
        vec![
            dynamic("retention.ms", "60000"),
            dynamic("cleanup.policy", "compact"),
            dynamic("min.insync.replicas", "2"),
            // A kmirror source's lineage: recorded as the chain, not copied.
            dynamic("kmirror.lineage", "up:2"),
        ],
    );
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "orders", None).unwrap();
    let applied = rig.data.configs.borrow()["orders"].clone();
    assert_eq!(applied.retention_ms, Some(60_000));
    assert!(!applied.cleanup.delete && applied.cleanup.compact);
    assert_eq!(
        applied.topic_configs.keys().collect::<Vec<_>>(),
        ["cleanup.policy", "kmirror.lineage", "retention.ms"],
        "min.insync.replicas is never copied"
    );
    assert_eq!(
        applied.topic_configs["kmirror.lineage"], "up:2,c1:1",
        "the source's chain and our own link are served"
    );
    // A change on the source is applied by the next sync.
    rig.source.1.lock().unwrap().get_mut("orders").unwrap()[0] = dynamic("retention.ms", "120000");
    c.sync_now().unwrap();
    assert_eq!(
        rig.data.configs.borrow()["orders"].retention_ms,
        Some(120_000)
    );
    // A value kmirror cannot apply leaves the previous config and shows in describe.
    rig.source.1.lock().unwrap().get_mut("orders").unwrap()[0] = dynamic("retention.ms", "0");
    c.sync_now().unwrap();
    assert_eq!(
        rig.data.configs.borrow()["orders"].retention_ms,
        Some(120_000)
    );
    let row = c.describe(Some("m1")).unwrap().remove(0);
    let why = row.config_error.expect("the refused config is reported");
    assert!(why.starts_with("retention.ms=0"), "{why}");
    assert_eq!(row.state, StateName::Mirroring);
    // A restart applies the stored configs before the partitions get fetchers, without
    // asking the source.
    drop(c);
    rig.data.configs.borrow_mut().clear();
    *rig.source.0.lock().unwrap() = Err("connection refused".into());
    let c = rig.open();
    assert_eq!(
        rig.data.configs.borrow()["orders"].retention_ms,
        Some(120_000)
    );
    assert_eq!(rig.active(), ["orders-0", "orders-1"]);
    // Deleting the mirror drops its stored configs.
    drop(c);
    *rig.source.0.lock().unwrap() = Ok(view("c1"));
    let mut c = rig.open();
    c.command("m1", "orders", Command::Stop).unwrap();
    c.delete("m1").unwrap();
    drop(c);
    rig.data.configs.borrow_mut().clear();
    let _c = rig.open();
    assert!(rig.data.configs.borrow().is_empty());
}

/// A source that answers like `view("c1")` until frozen; frozen, every call hangs until its
/// deadline and then fails as a timeout, as a black-holed broker does.
#[derive(Clone, Default)]
struct FreezableSource {
    frozen: Arc<std::sync::atomic::AtomicBool>,
    calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl FreezableSource {
    fn answer<T>(&self, by: Deadline, ok: impl FnOnce() -> T) -> Result<T, Fault> {
        use std::sync::atomic::Ordering;
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.frozen.load(Ordering::Relaxed) {
            std::thread::sleep(by.at.saturating_duration_since(std::time::Instant::now()));
            return Err(Fault::timed_out("src:9092", by.ms));
        }
        Ok(ok())
    }
    fn freeze(&self) {
        self.frozen
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl SourceCatalog for FreezableSource {
    fn describe(&self, _: &MirrorDefinition, by: Deadline) -> Result<SourceView, Fault> {
        self.answer(by, || view("c1"))
    }
    fn topic_configs(
        &self,
        _: &MirrorDefinition,
        topics: &[&str],
        by: Deadline,
    ) -> Result<BTreeMap<String, Result<Vec<SourceConfigEntry>, String>>, Fault> {
        self.answer(by, || {
            topics
                .iter()
                .map(|t| ((*t).to_owned(), Ok(Vec::new())))
                .collect()
        })
    }
    fn list_offsets(
        &self,
        _: &MirrorDefinition,
        tps: &[TopicPartition],
        _: OffsetQuery,
        by: Deadline,
    ) -> Result<Vec<(TopicPartition, Listed)>, Fault> {
        self.answer(by, || {
            tps.iter()
                .map(|tp| (tp.clone(), Listed::At(Offset(120))))
                .collect()
        })
    }
}

/// Group reads that hang until their deadline once frozen.
#[derive(Clone, Default)]
struct FreezableGroups(FreezableSource);

impl group_sync::SourceGroups for FreezableGroups {
    fn read(
        &self,
        _: &MirrorDefinition,
        _: &dyn Fn(&str) -> bool,
        topics: &BTreeSet<String>,
        deadline: std::time::Instant,
    ) -> Result<Vec<group_sync::SourceGroup>, String> {
        let by = Deadline {
            at: deadline,
            io: deadline.saturating_duration_since(std::time::Instant::now()),
            ms: 0,
        };
        self.0
            .answer(by, || {
                vec![group_sync::SourceGroup {
                    group: "app".into(),
                    offsets: topics
                        .iter()
                        .map(|t| group_sync::SourceOffset {
                            tp: TopicPartition::new(t.as_str(), 0),
                            offset: Offset(42),
                            leader_epoch: crate::ids::LeaderEpoch(1),
                            metadata: String::new(),
                        })
                        .collect(),
                }]
            })
            .map_err(|f| f.message)
    }
}

type Frozen = Controller<FreezableSource, FakeData>;

/// A controller over a freezable source with threaded workers (as in the real control loop)
/// and a 2 s source deadline, mirroring `orders` with the group sync attached; the last group
/// sync at stop is bounded by 300 ms.
fn frozen_rig(dir: &std::path::Path, data: &FakeData) -> (Frozen, FreezableSource) {
    let source = FreezableSource::default();
    let store = StateLog::open(dir).unwrap();
    let mut c =
        Controller::open(store, RetryPolicy::default(), source.clone(), data.clone()).unwrap();
    c.set_source_timeout_ms(2_000);
    let coord = Arc::new(Mutex::new(
        Coord::open(
            crate::serve::groups::CoordinatorConfig::new(0, "h", 1),
            crate::serve::groups::MemoryStore::default(),
        )
        .unwrap(),
    ));
    c.attach_group_sync(GroupSyncPlane {
        source: Arc::new(FreezableGroups(source.clone())),
        local: Box::new(Bounds),
        sink: Box::new(coord),
        schedule: GroupSyncSchedule::default(),
    });
    (c, source)
}

/// `frozen_rig` mirroring `topics` as mirror m1 (last group sync bounded by 300 ms), then the
/// source frozen.
fn frozen_mirror(
    dir: &std::path::Path,
    data: &FakeData,
    topics: &str,
) -> (Frozen, FreezableSource) {
    let (mut c, source) = frozen_rig(dir, data);
    let mut p = props();
    p.insert("sync.group.offsets.final.timeout.ms".into(), "300".into());
    c.create("m1", &p).unwrap();
    c.start("m1", topics, None).unwrap();
    source.freeze();
    (c, source)
}

/// Liveness bound for control-thread work while the source hangs: well under the 2 s source
/// deadline, so a call that waited on the source would fail it.
const NEVER_WAITS: std::time::Duration = std::time::Duration::from_millis(1_000);

#[test]
fn a_frozen_source_blocks_no_tick_describe_or_command_and_piles_up_no_calls() {
    let dir = tempfile::tempdir().unwrap();
    let data = FakeData::default();
    let (mut c, _source) = frozen_mirror(dir.path(), &data, "orders");
    c.command("m1", "orders", Command::Pause).unwrap();
    let t0 = std::time::Instant::now();
    for round in 0..20 {
        let started = std::time::Instant::now();
        // Due every round: the source sync, the group sync and the idle listing all start.
        c.set_sync_interval_ms(1);
        c.tick(now_ms() + 31_000 * (round + 1)).unwrap();
        let rows = c.describe(Some("m1")).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(
            started.elapsed() < NEVER_WAITS,
            "tick + describe took {:?}",
            started.elapsed()
        );
        // One call per kind and mirror at most, however many rounds ask.
        assert!(c.workers().in_flight() <= 3, "{:?}", c.workers());
    }
    assert!(t0.elapsed() < std::time::Duration::from_secs(2));
    // An operator command's ask runs on a worker and times out there, never here.
    let (def, ask) = c.create_ask("m2", &props()).unwrap();
    let asked = std::time::Instant::now();
    let rx = ask.spawn(c.workers()).unwrap();
    c.tick(now_ms()).unwrap();
    assert!(asked.elapsed() < NEVER_WAITS);
    let answer = rx.blocking_recv().unwrap();
    let err = c.create_finish(def, answer).unwrap_err();
    assert_eq!(err.status(), 504, "{err}");
    assert!(
        err.to_string().contains("did not answer within 2000 ms"),
        "{err}"
    );
    assert!(c.mirror_names() == ["m1"]);
}

#[test]
fn stop_with_a_frozen_source_skips_the_last_group_sync_and_fails_over() {
    let dir = tempfile::tempdir().unwrap();
    let data = FakeData::default();
    let (mut c, _source) = frozen_mirror(dir.path(), &data, "orders");
    let (report, last) = c.command_begin("m1", "orders", Command::Stop).unwrap();
    let mut last = last.expect("a last group sync to run");
    assert_eq!(last.timeout_ms, 300);
    // While its group read is out, ticks leave the STOPPING partitions alone (the sync must
    // see them before they fail over), and never wait.
    let rx = last.ask.take().unwrap().spawn(c.workers()).unwrap();
    let started = std::time::Instant::now();
    c.tick(now_ms()).unwrap();
    assert!(started.elapsed() < NEVER_WAITS);
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopping));
    let answer = rx.blocking_recv().unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_millis(300 + 5_000),
        "the read ends at its deadline"
    );
    let report = c.command_finish(report, last, Some(answer)).unwrap();
    let said = report.group_sync.unwrap();
    assert!(said.starts_with("skipped: "), "{said}");
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));
    assert_eq!(state(&c, "orders", 1), Some(StateName::Stopped));
}

#[test]
fn a_stop_whose_answer_never_comes_is_reported_and_a_restart_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = FakeData::default();
    let (mut c, _source) = frozen_mirror(dir.path(), &data, "orders,payments");
    let (report, last) = c.command_begin("m1", "orders", Command::Stop).unwrap();
    // The admin API gave up waiting (`None`): the report says why, the failover goes on.
    let report = c.command_finish(report, last.unwrap(), None).unwrap();
    assert_eq!(
        report.group_sync.as_deref(),
        Some("skipped: source did not answer within 300 ms (sync.group.offsets.final.timeout.ms)")
    );
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));

    // A stop interrupted before its finish (a crash): after the restart, with the source
    // still frozen, the partition fails over without anything asking the source.
    let (_, last) = c.command_begin("m1", "payments", Command::Stop).unwrap();
    assert!(last.is_some());
    assert_eq!(state(&c, "payments", 0), Some(StateName::Stopping));
    drop(c);
    data.active.borrow_mut().clear();
    let (mut c, source) = frozen_rig(dir.path(), &data);
    source.freeze();
    let started = std::time::Instant::now();
    c.tick(now_ms()).unwrap();
    assert!(started.elapsed() < NEVER_WAITS);
    assert_eq!(state(&c, "payments", 0), Some(StateName::Stopped));
    assert_eq!(state(&c, "orders", 1), Some(StateName::Stopped));
    assert!(data
        .writable
        .borrow()
        .contains(&TopicPartition::new("payments", 0)));
}

// Goal: a lifecycle command over many partitions writes `__mirror_state` a few times (one
// append per step: the command's transitions, then what the data plane completed), never once
// per partition, and every partition's state is still on disk (a restart sees it).
#[test]
fn lifecycle_commands_write_mirror_state_per_step_not_per_partition() {
    const N: i32 = 600;
    let rig = Rig::new();
    *rig.source.0.lock().unwrap() = Ok(SourceView {
        cluster_id: Some("c1".into()),
        topics: vec![topic("big", N)],
    });
    rig.source
        .1
        .lock()
        .unwrap()
        .insert("big".into(), Vec::new());
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    let mut steps: Vec<(&str, u64)> = Vec::new();
    let mut last = c.state_writes();
    let mut count = |c: &Controller<FakeSource, FakeData>, last: &mut u64, what: &'static str| {
        steps.push((what, c.state_writes() - *last));
        *last = c.state_writes();
    };
    let r = c.start("m1", "big", None).unwrap();
    assert_eq!(r.changed.len(), N as usize);
    assert_eq!(
        *rig.data.prepared.borrow(),
        N as usize,
        "the logs are prepared together"
    );
    count(&c, &mut last, "start");
    c.command("m1", "big", Command::Pause).unwrap();
    assert_eq!(state(&c, "big", N - 1), Some(StateName::Paused));
    count(&c, &mut last, "pause");
    c.command("m1", "big", Command::Resume).unwrap();
    assert_eq!(state(&c, "big", N - 1), Some(StateName::Mirroring));
    count(&c, &mut last, "resume");
    c.command("m1", "big", Command::Pause).unwrap();
    count(&c, &mut last, "pause again");
    drop(c);
    let mut c = rig.open();
    for p in 0..N {
        assert_eq!(state(&c, "big", p), Some(StateName::Paused), "big-{p}");
    }
    last = c.state_writes();
    let checkpoints = *rig.data.checkpoints.borrow();
    c.command("m1", "big", Command::Stop).unwrap();
    for p in 0..N {
        assert_eq!(state(&c, "big", p), Some(StateName::Stopped), "big-{p}");
    }
    assert_eq!(
        *rig.data.checkpoints.borrow() - checkpoints,
        1,
        "one recovery-point checkpoint for the promotions of {N} partitions"
    );
    count(&c, &mut last, "stop");
    drop(c);
    let c = rig.open();
    assert_eq!(state(&c, "big", N / 2), Some(StateName::Stopped));
    for (what, writes) in &steps {
        // At most: the mirror's patterns (start), the transitions, the topic's copied configs
        // (start, one per topic), what the data plane completed.
        assert!(
            (1..=4).contains(writes),
            "{what} of {N} partitions took {writes} __mirror_state writes: {steps:?}"
        );
    }
}

/// Goal: `repoint` moves a mirror to a new source only when every partition's history agrees,
/// and otherwise changes nothing; the lineage survives a restart. Method: fake tails (ours
/// ending at 100 with batch 90..=99) and fake source tails, one partition first disagreeing.
#[test]
fn repoint_moves_only_when_every_history_agrees_and_keeps_the_lineage() {
    use crate::control::audit::scrub::BatchId;
    use crate::control::lineage::{LocalTail, SourceTail};
    use crate::log::epoch_cache::EpochEntry;
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "orders", None).unwrap();
    let batch = |crc| BatchId {
        base_offset: 90,
        last_offset: 99,
        leader_epoch: 0,
        crc,
        max_timestamp_ms: 0,
    };
    for p in 0..2 {
        let tp = TopicPartition::new("orders", p);
        rig.data.tails.borrow_mut().insert(
            tp.clone(),
            LocalTail {
                topic_id: Some(topic("orders", 2).topic_id),
                log_start: Offset(0),
                log_end: Offset(100),
                last_batch: Some(batch(7)),
                epochs: vec![EpochEntry {
                    epoch: crate::ids::LeaderEpoch(0),
                    start_offset: Offset(0),
                }],
            },
        );
        let theirs = SourceTail {
            topic_id: Some(topic("orders", 2).topic_id),
            log_start: Some(Offset(0)),
            batch_at_ours: Some(batch(if p == 0 { 7 } else { 8 })),
            epoch_end: Some((crate::ids::LeaderEpoch(0), Offset(150))),
            error: None,
        };
        rig.source.2.lock().unwrap().insert(tp, theirs);
    }
    let new_props: BTreeMap<String, String> =
        [("bootstrap.servers".to_owned(), "other:9092".to_owned())].into();
    let before = c.list();
    *rig.source.0.lock().unwrap() = Ok(view("c2"));
    let err = c.repoint("m1", &new_props).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.status(), 409);
    assert!(
        text.contains("orders-1") && !text.contains("orders-0:") && text.contains("differs"),
        "{text}"
    );
    assert_eq!(c.list(), before, "a refused repoint changed the mirror");
    assert_eq!(rig.active(), ["orders-0", "orders-1"]);

    rig.source
        .2
        .lock()
        .unwrap()
        .get_mut(&TopicPartition::new("orders", 1))
        .unwrap()
        .batch_at_ours = Some(batch(7));
    let r = c.repoint("m1", &new_props).unwrap();
    assert_eq!(r.source_cluster_id.as_deref(), Some("c2"));
    assert_eq!(
        r.partitions,
        [("orders-0".to_owned(), 100), ("orders-1".to_owned(), 100)]
    );
    assert_eq!(r.lineage.len(), 1);
    assert_eq!(r.lineage[0].cluster_id.as_deref(), Some("c1"));
    assert_eq!(r.lineage[0].bootstrap_servers, "src:9092");
    assert_eq!(
        rig.active(),
        ["orders-0", "orders-1"],
        "fetchers not resumed"
    );
    // The topic's chain: c1 (a stock source: no upstream) under the first epoch, then c2.
    let link = |id: &str, e: i32| crate::control::lineage::chain::Link {
        cluster_id: Some(id.into()),
        mirror_epoch: e,
    };
    let chain = vec![
        link("c1", before[0].mirror_epoch),
        link("c2", r.mirror_epoch),
    ];
    assert_eq!(r.topic_lineage["orders"], chain);
    assert_eq!(
        rig.data.configs.borrow()["orders"].topic_configs["kmirror.lineage"],
        format!("c1:{},c2:{}", before[0].mirror_epoch, r.mirror_epoch),
        "the chain is not served"
    );
    drop(c);
    let mut c = rig.open();
    let after = c.list();
    assert_eq!(after[0].source_bootstrap_servers, "other:9092");
    assert_eq!(after[0].source_cluster_id.as_deref(), Some("c2"));
    assert_eq!(after[0].lineage, r.lineage);
    assert!(after[0].mirror_epoch > before[0].mirror_epoch);
    for row in c.describe(Some("m1")).unwrap() {
        assert_eq!(row.lineage, chain, "chain lost by the restart");
    }

    // A source that mirrors orders from us ("me" in its chain) is refused though its bytes
    // agree, and nothing changes.
    *rig.data.own_id.borrow_mut() = Some("me".into());
    *rig.source.0.lock().unwrap() = Ok(view("c3"));
    rig.source.1.lock().unwrap().insert(
        "orders".into(),
        vec![SourceConfigEntry {
            name: "kmirror.lineage".into(),
            value: Some("c1:1,me:4".into()),
            source: 1,
        }],
    );
    let before = c.list();
    let err = c.repoint("m1", &props()).unwrap_err().to_string();
    assert!(
        err.contains("mirrors this topic from us")
            && err.contains("orders-0")
            && !err.contains("differs"),
        "{err}"
    );
    assert_eq!(c.list(), before);
}

mod acl_sync;
